//! `jetsched backfill <ns/id> --from T1 --to T2 --dry-run`: the plan of a backfill, every nominal
//! time of the task's schedule in `[from, to)` with its DST mark and what a backfill would do
//! with it (dispatch, skip a time that has a run, rerun it when `--reprocess` asks), decided
//! from the run records keyed by each time's execution id.

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use std::collections::BTreeSet;

use jetsched_shared::backfill::{self, Decision, DstMark, Reprocess};
use jetsched_shared::calendar::{Calendar, CalendarRef, Calendars, Fate, Refusal, fate_of, schedule_zone};
use jetsched_shared::error::ErrorCode;
use jetsched_shared::names::Names;
use jetsched_shared::schedule::Schedule;
use jetsched_shared::wire::{RunStatus, format_time};
use serde_json::{Value, json};

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, outln};

/// Run records read at once.
const READS_IN_FLIGHT: usize = 64;

/// What a dry run plans.
pub(crate) struct PlanArgs {
    pub(crate) task: String,
    pub(crate) from: DateTime<Utc>,
    pub(crate) to: DateTime<Utc>,
    pub(crate) reprocess: Reprocess,
    pub(crate) backwards: bool,
}

/// Prints the plan: one line per nominal time, then the counts.
pub(crate) async fn print(
    client: &async_nats::Client,
    names: &Names,
    api: &Api,
    args: PlanArgs,
    json_out: bool,
) -> Result<(), Failure> {
    let task = task_ref(&args.task);
    let reply: Value = api.task_in("get", &task.namespace, &task).await?;
    let schedule = Schedule::parse_value(&reply["task"]["schedule"])
        .map_err(|errors| anyhow::anyhow!("the stored schedule does not parse: {errors:?}"))?;
    let times = backfill::nominal_times(&schedule, args.from, args.to, args.backwards)?;
    let refs = match reply["task"].get("calendars") {
        None | Some(Value::Null) => Vec::new(),
        Some(list) => CalendarRef::read_list(list, "calendars")
            .map_err(|errors| anyhow::anyhow!("the stored calendars do not parse: {errors:?}"))?,
    };
    let calendars = calendars_of(api, &task.namespace, &refs).await?;
    let zone_of_schedule = schedule_zone(&schedule);
    let fates: Vec<Fate> =
        times.iter().map(|time| fate_of(&schedule, zone_of_schedule, &refs, &calendars, time.at)).collect();
    let runs = async_nats::jetstream::new(client.clone())
        .get_key_value(names.runs_bucket())
        .await
        .context("open the run records")?;
    let statuses: Vec<Option<RunStatus>> = futures::stream::iter(times.iter())
        .map(|time| {
            let (_, execution_id) =
                backfill::ids(&task.namespace, &task.id, time.at.timestamp_millis(), None);
            let runs = &runs;
            async move {
                let entry = runs.get(&execution_id).await.context("read a run record")?;
                Ok::<_, anyhow::Error>(entry.and_then(|bytes| {
                    let record: Value = serde_json::from_slice(&bytes).ok()?;
                    serde_json::from_value(record.get("status")?.clone()).ok()
                }))
            }
        })
        .buffered(READS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let zone = match &schedule {
        Schedule::Cron(cron) => Some(cron.timezone()),
        _ => None,
    };
    let decisions: Vec<Decision> = fates
        .iter()
        .zip(&statuses)
        .map(|(fate, status)| {
            backfill::decide_with(args.reprocess, !matches!(fate, Fate::Runs { .. }), *status)
        })
        .collect();
    let rows: Vec<Value> = times
        .iter()
        .zip(&statuses)
        .zip(decisions.iter().zip(&fates))
        .map(|((time, status), (decision, fate))| {
            json!({
                "nominal_time": format_time(time.at),
                "local_time": zone.map(|tz| time.at.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S %Z").to_string()),
                "dst": time.dst,
                "run": status,
                "decision": decision,
                "calendar": calendar_note(fate),
            })
        })
        .collect();
    let count = |wanted: Decision| decisions.iter().filter(|d| **d == wanted).count();
    let marks = |mark: DstMark| times.iter().filter(|t| t.dst == Some(mark)).count();
    let summary = json!({
        "task": format!("{}/{}", task.namespace, task.id),
        "times": rows.len(),
        "dispatch": count(Decision::Dispatch),
        "skip": count(Decision::Skip),
        "rerun": count(Decision::Rerun),
        "calendar": count(Decision::Calendar),
        "dst_gaps": marks(DstMark::Gap),
        "dst_folds": marks(DstMark::Fold),
    });
    if json_out {
        output::pretty(&json!({"summary": summary, "plan": rows}));
        return Ok(());
    }
    let text = |value: &Value| value.as_str().unwrap_or("-").to_string();
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            ["nominal_time", "local_time", "decision", "run", "dst", "calendar"]
                .iter()
                .map(|k| text(&row[*k]))
                .collect()
        })
        .collect();
    output::table(&["NOMINAL (UTC)", "LOCAL", "WOULD", "RUN", "DST", "CALENDAR"], &table);
    outln!(
        "{} times: {} to dispatch, {} skipped (a run exists), {} to rerun, {} left out by calendars; {} DST gaps, {} folds",
        summary["times"],
        summary["dispatch"],
        summary["skip"],
        summary["rerun"],
        summary["calendar"],
        summary["dst_gaps"],
        summary["dst_folds"]
    );
    Ok(())
}

/// What the task's calendars do with a time, in words (`None`: nothing).
fn calendar_note(fate: &Fate) -> Option<String> {
    let by =
        |r: &Refusal| format!("calendar {} ({}, {})", r.calendar, r.date.format("%Y-%m-%d"), r.why.as_str());
    match fate {
        Fate::Runs { shifted: None } => None,
        Fate::Runs { shifted: Some((refusal, at)) } => {
            Some(format!("shifted to {}: {}", format_time(*at), by(refusal)))
        }
        Fate::Skipped(refusal) => Some(format!("excluded: {}", by(refusal))),
        Fate::Merged { into, shifted_to } => Some(format!(
            "runs once with the fire of {}, shifted to {}",
            format_time(*into),
            format_time(*shifted_to)
        )),
    }
}

/// The calendars `refs` name and their bases, read through the calendar API (one the
/// namespace does not have refuses nothing, as the scheduler takes it).
async fn calendars_of(api: &Api, namespace: &str, refs: &[CalendarRef]) -> Result<Calendars, Failure> {
    let mut wanted: Vec<String> = refs.iter().map(|r| r.name.clone()).collect();
    let mut seen = BTreeSet::new();
    let mut found = Calendars::default();
    while let Some(name) = wanted.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let reply: Value = match api
            .calendar("get", Some(namespace), &json!({"namespace": namespace, "name": name}))
            .await
        {
            Ok(reply) => reply,
            Err(Failure::Api(errors)) if errors.first().code == ErrorCode::NotFound => continue,
            Err(failure) => return Err(failure),
        };
        let calendar = Calendar::parse_value(&reply["calendar"])
            .map_err(|errors| anyhow::anyhow!("calendar {name} does not parse: {errors:?}"))?;
        wanted.extend(calendar.base.iter().cloned());
        found.insert(calendar);
    }
    Ok(found)
}
