//! `jetsched backfill <ns/id> --from T1 --to T2 --dry-run`: the plan of a backfill, every nominal
//! time of the task's schedule in `[from, to)` with its DST mark and what a backfill would do
//! with it (dispatch, skip a time that has a run, rerun it when `--reprocess` asks), decided
//! from the run records keyed by each time's execution id.

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::backfill::{self, Decision, DstMark, Reprocess};
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
    let rows: Vec<Value> = times
        .iter()
        .zip(&statuses)
        .map(|(time, status)| {
            json!({
                "nominal_time": format_time(time.at),
                "local_time": zone.map(|tz| time.at.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S %Z").to_string()),
                "dst": time.dst,
                "run": status,
                "decision": backfill::decide(args.reprocess, *status),
            })
        })
        .collect();
    let count = |decision: Decision| {
        times.iter().zip(&statuses).filter(|(_, s)| backfill::decide(args.reprocess, **s) == decision).count()
    };
    let marks = |mark: DstMark| times.iter().filter(|t| t.dst == Some(mark)).count();
    let summary = json!({
        "task": format!("{}/{}", task.namespace, task.id),
        "times": rows.len(),
        "dispatch": count(Decision::Dispatch),
        "skip": count(Decision::Skip),
        "rerun": count(Decision::Rerun),
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
            ["nominal_time", "local_time", "decision", "run", "dst"].iter().map(|k| text(&row[*k])).collect()
        })
        .collect();
    output::table(&["NOMINAL (UTC)", "LOCAL", "WOULD", "RUN", "DST"], &table);
    outln!(
        "{} times: {} to dispatch, {} skipped (a run exists), {} to rerun; {} DST gaps, {} folds",
        summary["times"],
        summary["dispatch"],
        summary["skip"],
        summary["rerun"],
        summary["dst_gaps"],
        summary["dst_folds"]
    );
    Ok(())
}
