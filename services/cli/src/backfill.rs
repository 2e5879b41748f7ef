//! `jetsched backfill`: start a backfill of a task's nominal times in `[from, to)` (the
//! scheduler leader dispatches them in batches, each time once), follow it (`status`, `list`)
//! or stop it (`cancel`); with `--dry-run`, only the plan ([`plan`]).

mod plan;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use jetsched_shared::backfill::{BackfillOverlap, Reprocess};
use jetsched_shared::names::{BACKFILL_CANCEL, BACKFILL_LIST, BACKFILL_START, BACKFILL_STATUS, Names};
use serde_json::{Value, json};

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, outln};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct BackfillArgs {
    #[command(subcommand)]
    action: Option<BackfillAction>,
    /// The task: `namespace/id`, or `id` in namespace `default`.
    #[arg(required = true)]
    task: Option<String>,
    /// First instant of the range (RFC 3339), included.
    #[arg(long, required = true, value_parser = crate::api::parse_instant)]
    from: Option<DateTime<Utc>>,
    /// End of the range (RFC 3339), excluded; not in the future (the live schedule fires those).
    #[arg(long, required = true, value_parser = crate::api::parse_instant)]
    to: Option<DateTime<Utc>>,
    /// Which times that already have a run run again.
    #[arg(long, value_enum, default_value_t = Reprocess::None)]
    reprocess: Reprocess,
    /// Runs of this backfill in flight at most (1 to 1000; default 10); 0: no bound (every time
    /// dispatched at once, the runs wait in the work queue for the workers).
    #[arg(long)]
    max_active: Option<i64>,
    /// Newest time first.
    #[arg(long)]
    backwards: bool,
    /// What a time does while a run of the task is going: dispatched anyway (`allow`, up to
    /// --max-active), skipped (`skip`), or dispatched once nothing of the task runs
    /// (`buffer-one`: one run at a time).
    #[arg(long, value_enum, default_value_t = BackfillOverlap::Allow)]
    overlap: BackfillOverlap,
    /// List the times and what would be skipped, with DST gaps and folds marked; dispatch nothing.
    #[arg(long)]
    dry_run: bool,
    /// The backfilled runs do not start the task's children (tasks with `after`); by default
    /// they do, as live runs do.
    #[arg(long)]
    no_chain: bool,
}

#[derive(Debug, Subcommand)]
enum BackfillAction {
    /// A backfill's state, cursor and counts.
    Status {
        /// The backfill's id (`<namespace>.<task>.<token>`, as `jetsched backfill` printed it).
        id: String,
    },
    /// The backfills of a task (`namespace/id`), newest first.
    List {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
    },
    /// Stop a running backfill: the batch being dispatched finishes, no further time is.
    Cancel {
        /// The backfill's id.
        id: String,
    },
}

/// Runs `jetsched backfill`.
pub(crate) async fn run(
    client: &async_nats::Client,
    names: &Names,
    api: &Api,
    args: BackfillArgs,
    json_out: bool,
) -> Result<(), Failure> {
    let BackfillArgs { action, task, from, to, reprocess, max_active, backwards, overlap, dry_run, no_chain } =
        args;
    match action {
        Some(BackfillAction::Status { id }) => {
            let reply: Value =
                api.backfill(BACKFILL_STATUS, namespace_of(&id), &json!({"backfill": id})).await?;
            show(&reply, json_out)
        }
        Some(BackfillAction::Cancel { id }) => {
            let reply: Value =
                api.backfill(BACKFILL_CANCEL, namespace_of(&id), &json!({"backfill": id})).await?;
            show(&reply, json_out)
        }
        Some(BackfillAction::List { task }) => {
            let task = task_ref(&task);
            let reply: Value = api.backfill(BACKFILL_LIST, &task.namespace, &json!({"id": task.id})).await?;
            list(&reply, json_out);
            Ok(())
        }
        None => {
            let (Some(task), Some(from), Some(to)) = (task, from, to) else {
                return Err(anyhow::anyhow!("backfill needs a task, --from and --to").into());
            };
            if dry_run {
                let args = plan::PlanArgs { task, from, to, reprocess, backwards };
                return plan::print(client, names, api, args, json_out).await;
            }
            let task = task_ref(&task);
            let request = json!({
                "id": task.id,
                "from": jetsched_shared::wire::format_time(from),
                "to": jetsched_shared::wire::format_time(to),
                "reprocess": reprocess,
                "max_active": max_active,
                "backwards": backwards,
                "overlap": overlap,
                "chain": !no_chain,
            });
            let reply: Value = api.backfill(BACKFILL_START, &task.namespace, &request).await?;
            if json_out {
                output::pretty(&reply);
            } else {
                outln!("{}", text(&reply["id"]));
            }
            Ok(())
        }
    }
}

/// The namespace of a backfill id (its first token).
fn namespace_of(id: &str) -> &str {
    id.split('.').next().unwrap_or_default()
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// One backfill, field by field.
fn show(reply: &Value, json_out: bool) -> Result<(), Failure> {
    if json_out {
        output::pretty(reply);
        return Ok(());
    }
    let object = reply.as_object().context("a backfill reply is an object")?;
    for key in [
        "id",
        "state",
        "from",
        "to",
        "backwards",
        "reprocess",
        "max_active",
        "overlap",
        "cursor",
        "total",
        "dispatched",
        "skipped",
        "rerun",
        "calendar",
        "overlapped",
        "started_at",
        "finished_at",
    ] {
        outln!("{key:<12} {}", text(object.get(key).unwrap_or(&Value::Null)));
    }
    let active = object.get("active").and_then(Value::as_array).map_or(0, Vec::len);
    outln!("{:<12} {active}", "in_flight");
    Ok(())
}

fn list(reply: &Value, json_out: bool) {
    if json_out {
        output::pretty(reply);
        return;
    }
    let rows: Vec<Vec<String>> = reply["backfills"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|b| {
            ["id", "state", "from", "to", "cursor", "total", "dispatched", "skipped", "rerun", "calendar"]
                .iter()
                .map(|k| text(&b[*k]))
                .collect()
        })
        .collect();
    output::table(
        &["ID", "STATE", "FROM", "TO", "CURSOR", "TOTAL", "DISPATCHED", "SKIPPED", "RERUN", "CALENDAR"],
        &rows,
    );
}
