//! `jetsched backfill --dry-run` against a real registry and nats-server: a year of an hourly
//! task across both DST changes of two zones, planned exactly once per nominal time, and the
//! times that already have a run skipped, or rerun as `--reprocess` says, from the run records.

mod execution;
mod rules;

use jetsched_shared::backfill;
use jetsched_shared::names::Names;
use jetsched_tests::spec;
use serde_json::{Value, json};

use crate::cli::{jetsched, json_out};
use crate::registry::{Served, served};

const FROM: &str = "2026-01-01T00:00:00Z";
const TO: &str = "2027-01-01T00:00:00Z";

async fn plan(url: &str, task: &str, extra: &[&str]) -> Value {
    let mut args = vec!["backfill", task, "--from", FROM, "--to", TO, "--dry-run", "--json"];
    args.extend_from_slice(extra);
    json_out(&jetsched(url, &args).await)
}

#[tokio::test]
async fn a_dry_run_plans_a_year_of_hourly_times_once_each_and_skips_those_with_runs() {
    let Served { server, registry: _registry, js, api, .. } = served(|_| {}).await;
    let url = server.url();
    let names = Names::default();
    let runs = js.get_key_value(names.runs_bucket()).await.unwrap();
    for (id, zone, gap, fold) in [
        ("berlin", "Europe/Berlin", "2026-03-29T01:00:00.000Z", "2026-10-25T00:00:00.000Z"),
        ("new-york", "America/New_York", "2026-03-08T07:00:00.000Z", "2026-11-01T05:00:00.000Z"),
    ] {
        api.store(&spec("history", id).cron_in("0 0 * * * *", zone).json()).await;
        let task = format!("history/{id}");
        let planned = plan(&url, &task, &[]).await;
        let summary = &planned["summary"];
        assert_eq!(
            (&summary["times"], &summary["dispatch"], &summary["skip"]),
            (&json!(8759), &json!(8759), &json!(0)),
            "{zone}: every wall hour once (the repeated hour of the fold fires once): {summary}"
        );
        assert_eq!((&summary["dst_gaps"], &summary["dst_folds"]), (&json!(1), &json!(1)), "{summary}");
        let rows = planned["plan"].as_array().unwrap();
        let times: Vec<&str> = rows.iter().map(|row| row["nominal_time"].as_str().unwrap()).collect();
        let mut distinct = times.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), times.len(), "each nominal time once");
        assert!(times.windows(2).all(|w| w[0] < w[1]), "oldest first");
        let mark = |at: &str| rows.iter().find(|row| row["nominal_time"] == at).map(|row| row["dst"].clone());
        assert_eq!((mark(gap), mark(fold)), (Some(json!("gap")), Some(json!("fold"))), "{zone}");

        // Two times already ran: one succeeded, one failed; their records are keyed by the
        // live schedule's execution id.
        let record = |status: &str| json!({"status": status}).to_string().into_bytes();
        for (at, status) in [("2026-02-01T00:00:00Z", "succeeded"), ("2026-02-01T01:00:00Z", "failed")] {
            let ms = chrono::DateTime::parse_from_rfc3339(at).unwrap().timestamp_millis();
            let (_, execution_id) = backfill::ids("history", id, ms, None);
            runs.put(&execution_id, record(status).into()).await.unwrap();
        }
        let again = plan(&url, &task, &[]).await;
        assert_eq!((&again["summary"]["dispatch"], &again["summary"]["skip"]), (&json!(8757), &json!(2)));
        let failed = plan(&url, &task, &["--reprocess", "failed"]).await;
        let reruns: Vec<&Value> =
            failed["plan"].as_array().unwrap().iter().filter(|row| row["decision"] == "rerun").collect();
        assert_eq!(reruns.len(), 1, "exactly the failed time reruns");
        assert_eq!(
            (&reruns[0]["nominal_time"], &reruns[0]["run"]),
            (&json!("2026-02-01T01:00:00.000Z"), &json!("failed"))
        );
        let backwards = plan(&url, &task, &["--backwards"]).await;
        assert_eq!(backwards["plan"][0]["nominal_time"], "2026-12-31T23:00:00.000Z", "newest first");
    }

    let refused =
        jetsched(&url, &["backfill", "history/berlin", "--from", TO, "--to", FROM, "--dry-run"]).await;
    assert_eq!(refused.status.code(), Some(1), "a reversed range is refused");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("to"), "names the field");
}
