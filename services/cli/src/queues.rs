//! `jetsched queues` and `jetsched queue pause|resume`: whole queues paused and resumed by
//! operators through the registry's queue API. Workers pull nothing from a paused queue's
//! lanes; the scheduler keeps dispatching into it, so its runs wait in the stream.

use anyhow::Context;
use clap::Subcommand;
use jetsched_shared::wire::{QueueInfo, QueueListReply, QueueReply, QueueRequest, format_time};
use serde_json::Value;

use crate::api::{Api, Failure};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Pause a queue: every worker stops pulling from its lanes within a second; runs already
    /// started finish; new runs wait in the stream until the resume.
    Pause {
        /// The queue, as task specs name it (`default`).
        queue: String,
        /// Why (shown by `jetsched queues` and the console until the resume).
        #[arg(long)]
        reason: Option<String>,
        /// Who is pausing, recorded with the state and the `queue.paused` event.
        #[arg(long, env = "USER")]
        by: Option<String>,
    },
    /// Resume a paused queue: workers pull its waiting runs again.
    Resume {
        /// The queue, as task specs name it (`default`).
        queue: String,
        /// Who is resuming, recorded with the state and the `queue.resumed` event.
        #[arg(long, env = "USER")]
        by: Option<String>,
    },
}

const HEADER: [&str; 7] = ["QUEUE", "STATE", "REASON", "BY", "SINCE", "WAITING", "IN FLIGHT"];

/// `jetsched queues`: every queue as a table, or the reply as JSON.
pub(crate) async fn list(api: &Api, json_out: bool) -> Result<(), Failure> {
    let reply: Value = api.queue("list", &serde_json::json!({})).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let QueueListReply { queues } = serde_json::from_value(reply).context("list reply")?;
    output::table(&HEADER, &queues.iter().map(row).collect::<Vec<_>>());
    Ok(())
}

/// `jetsched queue pause|resume <queue>`.
pub(crate) async fn run(api: &Api, command: QueueCommand, json_out: bool) -> Result<(), Failure> {
    let (endpoint, request) = match command {
        QueueCommand::Pause { queue, reason, by } => ("pause", QueueRequest { queue, reason, by }),
        QueueCommand::Resume { queue, by } => ("resume", QueueRequest { queue, reason: None, by }),
    };
    let reply: Value = api.queue(endpoint, &request).await?;
    let QueueReply { queue, changed } = serde_json::from_value(reply.clone()).context("queue reply")?;
    let message = match (queue.paused, changed) {
        (true, true) => format!("queue {} paused", queue.queue),
        (true, false) => format!("queue {} was paused already", queue.queue),
        (false, true) => format!("queue {} resumed", queue.queue),
        (false, false) => format!("queue {} was not paused", queue.queue),
    };
    output::done(json_out, &reply, &message);
    Ok(())
}

fn row(info: &QueueInfo) -> Vec<String> {
    vec![
        info.queue.clone(),
        if info.paused { "paused" } else { "running" }.to_string(),
        info.reason.clone().unwrap_or_default(),
        info.by.clone().filter(|_| info.paused).unwrap_or_default(),
        info.at.filter(|_| info.paused).map(format_time).unwrap_or_default(),
        info.waiting.to_string(),
        info.in_flight.to_string(),
    ]
}
