//! `jetsched cancel`: cancel one run by its execution id, or a task's runs not started yet,
//! through the registry's namespaced run API (`<prefix>.api.runs.cancel.<namespace>`,
//! `<prefix>.api.runs.cancel-task.<namespace>`).

use anyhow::Context;
use clap::Args;
use jetsched_shared::names::{CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT};
use jetsched_shared::wire::{CancelOutcome, CancelReply, CancelRequest, CancelTaskReply, CancelTaskRequest};
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, outln};

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// The run to cancel: its execution id (as `jetsched runs`, the events and the console
    /// show it), `namespace/execution_id` for a run outside namespace `default`.
    #[arg(required_unless_present = "task", conflicts_with = "task")]
    run: Option<String>,
    /// Cancel the runs of this task (`namespace/id`) that have not started: held by an open
    /// breaker and queued (both unless --held or --queued says which).
    #[arg(long)]
    task: Option<String>,
    /// With --task: cancel the task's held runs.
    #[arg(long, requires = "task")]
    held: bool,
    /// With --task: cancel the task's queued runs.
    #[arg(long, requires = "task")]
    queued: bool,
    /// Why (recorded in the run record and the `run.cancelled` event).
    #[arg(long)]
    reason: Option<String>,
    /// Who is cancelling, recorded with the reason.
    #[arg(long, env = "USER")]
    by: Option<String>,
}

/// `jetsched cancel`: prints what was cancelled; a run that had ended already is a refusal
/// (exit 1), like every error the registry answers.
pub(crate) async fn run(api: &Api, args: CancelArgs, json_out: bool) -> Result<(), Failure> {
    let CancelArgs { run, task, held, queued, reason, by } = args;
    if let Some(task) = task {
        let task = task_ref(&task);
        let request = CancelTaskRequest {
            namespace: Some(task.namespace.clone()),
            id: task.id.clone(),
            held,
            queued,
            reason,
            by,
        };
        let reply: Value = api.runs(CANCEL_TASK_ENDPOINT, &task.namespace, &request).await?;
        if json_out {
            output::pretty(&reply);
            return Ok(());
        }
        let CancelTaskReply { namespace, id, runs } =
            serde_json::from_value(reply).context("cancel-task reply")?;
        let cancelled = runs.iter().filter(|run| run.outcome == CancelOutcome::Cancelled).count();
        for run in &runs {
            outln!("{}", describe(run));
        }
        outln!("{namespace}/{id}: {}", output::count(cancelled as u64, "run cancelled", "runs cancelled"));
        return Ok(());
    }
    let run = run.unwrap_or_default();
    let (namespace, execution_id) = run.split_once('/').unwrap_or(("default", run.as_str()));
    let request = CancelRequest {
        execution_id: execution_id.to_string(),
        namespace: Some(namespace.to_string()),
        reason,
        by,
    };
    let reply: Value = api.runs(CANCEL_ENDPOINT, namespace, &request).await?;
    let cancel: CancelReply = serde_json::from_value(reply.clone()).context("cancel reply")?;
    if json_out {
        output::pretty(&reply);
    } else {
        outln!("{}", describe(&cancel));
    }
    match cancel.outcome {
        CancelOutcome::Finished => Err(Failure::Reported(format!(
            "run {} had ended already ({}): nothing cancelled",
            cancel.execution_id,
            cancel.status.as_str()
        ))),
        _ => Ok(()),
    }
}

/// One line about what a cancel did to a run.
fn describe(run: &CancelReply) -> String {
    let task = format!("{}/{}", run.namespace, run.task_id);
    match run.outcome {
        CancelOutcome::Cancelled => {
            let was = run.was.as_deref().unwrap_or("not started");
            format!("run {} of {task} cancelled ({was}): it will not start", run.execution_id)
        }
        CancelOutcome::Cancelling => {
            format!("run {} of {task} is running: its worker is stopping it", run.execution_id)
        }
        CancelOutcome::Finished => {
            format!("run {} of {task} had ended already: {}", run.execution_id, run.status.as_str())
        }
    }
}
