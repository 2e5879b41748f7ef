//! What a backfill applies besides its range, end to end (a registry, a scheduler process, a
//! worker whose handler records every run): the task's business calendars (an excluded day gets
//! no run, a day shifted onto the next fire runs once, the dry run says why for each), and
//! `--overlap` (`buffer-one` runs one at a time with nothing skipped, `skip` skips the times
//! whose turn comes while a run is going, a policy that cancels runs is refused by name).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jetsched_tests::{App, eventually, spec};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};

use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};
use crate::scheduler::{spawn_scheduler, tasks_loaded};

const NS: &str = "office";
const FINISH: Duration = Duration::from_secs(60);

/// Every run the handler saw: nominal time (RFC 3339) → runs, and the most at once.
#[derive(Clone, Default)]
struct Ran {
    runs: Arc<Mutex<BTreeMap<(String, String), u32>>>,
    running: Arc<Mutex<(u32, u32)>>,
}

impl Ran {
    /// The runs of `task`'s nominal times in 2025 (the backfilled year: a live fire of the
    /// test's own day is left out).
    fn of(&self, task: &str) -> BTreeMap<String, u32> {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .filter(|((t, at), _)| t == task && at.starts_with("2025-"))
            .map(|((_, at), n)| (at.clone(), *n))
            .collect()
    }

    fn most_at_once(&self) -> u32 {
        self.running.lock().unwrap().1
    }

    /// Waits until no run is going, then counts the most at once afresh.
    async fn settle(&self) {
        eventually(FINISH, "no run going", || async { self.running.lock().unwrap().0 == 0 }).await;
        self.running.lock().unwrap().1 = 0;
    }
}

/// The handler `record`: counts the run of its nominal time and how many run at once; it
/// takes `hold` to finish.
fn handlers(ran: Ran, hold: Duration) -> Handlers {
    Handlers::new().register("record", move |run: RunContext| {
        let ran = ran.clone();
        async move {
            let at = run.nominal_time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            *ran.runs.lock().unwrap().entry((run.task_id.clone(), at)).or_default() += 1;
            {
                let mut running = ran.running.lock().unwrap();
                running.0 += 1;
                running.1 = running.1.max(running.0);
            }
            tokio::time::sleep(hold).await;
            ran.running.lock().unwrap().0 -= 1;
            Outcome::ok()
        }
    })
}

async fn finished(url: &str, id: &str) -> Value {
    eventually(FINISH, &format!("backfill {id} finished"), || async {
        let status = json_out(&jetsched(url, &["--json", "backfill", "status", id]).await);
        (status["state"] == "finished").then_some(status)
    })
    .await
}

async fn backfill(url: &str, task: &str, from: &str, to: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--json", "backfill", task, "--from", from, "--to", to];
    args.extend_from_slice(extra);
    json_out(&jetsched(url, &args).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backfill_follows_the_tasks_calendars_and_its_dry_run_says_why() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    let ran = Ran::default();
    let _worker = App::worker(
        jetsched_worker::Config::for_tests(&url, "bf-cal-worker"),
        handlers(ran.clone(), Duration::ZERO),
    )
    .await;
    let holidays = json!({
        "namespace": NS, "name": "de-holidays", "zone": "Europe/Berlin",
        "holidays": ["2025-12-25", "2025-12-26"], "working_days": ["mon", "tue", "wed", "thu", "fri"],
    });
    let stored = api.call(api.names().calendar_api_namespaced("put", NS), holidays).await;
    assert!(stored.get("error").is_none(), "{stored}");
    // Weekdays at 09:00 Berlin: one task skips the holidays, the other shifts them to the next
    // business day (Thu 25th to Mon 29th; Fri 26th and Mon 29th's own fire run with it).
    for (id, rule) in [("excluded", "exclude"), ("shifted", "shift_next_business_day")] {
        let task = spec(NS, id)
            .cron_in("0 0 9 * * MON-FRI", "Europe/Berlin")
            .handler("record")
            .field("calendars", json!([{"name": "de-holidays", "rule": rule}]))
            .json();
        api.store(&task).await;
    }
    let scheduler = spawn_scheduler(&url, "bf-cal", Duration::from_secs(2));
    tasks_loaded(&scheduler).await;
    let (from, to) = ("2025-12-22T00:00:00Z", "2026-01-01T00:00:00Z");

    let plan = backfill(&url, "office/excluded", from, to, &["--dry-run"]).await;
    let summary = &plan["summary"];
    assert_eq!(
        (&summary["times"], &summary["dispatch"], &summary["calendar"]),
        (&json!(8), &json!(6), &json!(2))
    );
    let christmas =
        plan["plan"].as_array().unwrap().iter().find(|row| row["nominal_time"] == "2025-12-25T08:00:00.000Z");
    let christmas = christmas.expect("Christmas is a nominal time");
    assert_eq!(christmas["decision"], "calendar");
    assert_eq!(christmas["calendar"], "excluded: calendar de-holidays (2025-12-25, holiday)", "{christmas}");
    let shifted = backfill(&url, "office/shifted", from, to, &["--dry-run"]).await;
    let note = |at: &str| {
        shifted["plan"].as_array().unwrap().iter().find(|row| row["nominal_time"] == at).cloned().unwrap()
    };
    assert_eq!(note("2025-12-25T08:00:00.000Z")["decision"], "dispatch");
    assert!(
        note("2025-12-25T08:00:00.000Z")["calendar"]
            .as_str()
            .unwrap()
            .starts_with("shifted to 2025-12-29T08:00:00")
    );
    assert_eq!(note("2025-12-29T08:00:00.000Z")["decision"], "calendar");
    assert_eq!(
        note("2025-12-29T08:00:00.000Z")["calendar"],
        "runs once with the fire of 2025-12-26T08:00:00.000Z, shifted to 2025-12-29T08:00:00.000Z"
    );

    for task in ["office/excluded", "office/shifted"] {
        let started = backfill(&url, task, from, to, &[]).await;
        let done = finished(&url, started["id"].as_str().unwrap()).await;
        assert_eq!((&done["dispatched"], &done["calendar"]), (&json!(6), &json!(2)), "{task}: {done}");
    }
    let weekdays = |days: &[u32]| -> BTreeMap<String, u32> {
        days.iter().map(|day| (format!("2025-12-{day:02}T08:00:00Z"), 1)).collect()
    };
    for task in ["excluded", "shifted"] {
        eventually(FINISH, &format!("the runs of {task}"), || async { ran.of(task).len() >= 6 }).await;
    }
    assert_eq!(ran.of("excluded"), weekdays(&[22, 23, 24, 29, 30, 31]), "no run on the holidays");
    assert_eq!(
        ran.of("shifted"),
        weekdays(&[22, 23, 24, 25, 30, 31]),
        "Christmas once, for the 26th and 29th too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlap_buffer_one_runs_a_backfill_one_at_a_time_and_skip_skips_while_a_run_goes() {
    let Served { server, registry: _registry, api, .. } = served(|_| {}).await;
    let url = server.url();
    let ran = Ran::default();
    let mut config = jetsched_worker::Config::for_tests(&url, "bf-overlap-worker");
    config.concurrency = 16;
    let _worker = App::worker(config, handlers(ran.clone(), Duration::from_millis(300))).await;
    for id in ["buffered", "skipping"] {
        api.store(&spec(NS, id).every("1h").handler("record").json()).await;
    }
    let scheduler = spawn_scheduler(&url, "bf-overlap", Duration::from_secs(2));
    tasks_loaded(&scheduler).await;
    let (from, to) = ("2025-06-01T00:00:00Z", "2025-06-01T08:00:00Z");

    let buffered =
        backfill(&url, "office/buffered", from, to, &["--overlap", "buffer-one", "--max-active", "8"]).await;
    assert_eq!(buffered["overlap"], "buffer_one", "{buffered}");
    let done = finished(&url, buffered["id"].as_str().unwrap()).await;
    assert_eq!((&done["dispatched"], &done["overlapped"]), (&json!(8), &json!(0)), "{done}");
    eventually(FINISH, "the last buffered run", || async { ran.of("buffered").len() == 8 }).await;
    assert!(ran.of("buffered").values().all(|n| *n == 1), "each time once");
    assert_eq!(ran.most_at_once(), 1, "one run at a time, though 8 were allowed");
    ran.settle().await;

    let skipping =
        backfill(&url, "office/skipping", from, to, &["--overlap", "skip", "--max-active", "8"]).await;
    let done = finished(&url, skipping["id"].as_str().unwrap()).await;
    let (dispatched, overlapped) =
        (done["dispatched"].as_u64().unwrap(), done["overlapped"].as_u64().unwrap());
    assert_eq!(dispatched + overlapped, 8, "{done}");
    assert!(dispatched >= 1 && overlapped >= 1, "the first time runs, times meanwhile are skipped: {done}");
    eventually(FINISH, "the skipping backfill's runs", || async {
        ran.of("skipping").len() as u64 == dispatched
    })
    .await;
    assert_eq!(ran.most_at_once(), 1, "skip never runs two at once");

    // A policy that cancels runs is refused by name, through the API; the CLI knows only the three.
    let refused = api
        .call(
            api.names().backfill_api_namespaced("start", NS),
            json!({"id": "buffered", "from": from, "to": to, "overlap": "cancel_other", "max_active": 1001}),
        )
        .await;
    let errors = refused["errors"].as_array().unwrap_or_else(|| panic!("refused: {refused}"));
    let fields: Vec<&str> = errors.iter().filter_map(|e| e["field"].as_str()).collect();
    assert!(fields.contains(&"overlap") && fields.contains(&"max_active"), "every problem: {refused}");
    assert!(refused.to_string().contains("which a backfill never does"), "{refused}");
    let cli =
        jetsched(&url, &["backfill", "office/buffered", "--from", from, "--to", to, "--overlap", "replace"])
            .await;
    assert_eq!(cli.status.code(), Some(2), "a usage error");
}
