//! `jetsched dlq`: list, show, replay and purge dead letters through the registry's DLQ API.

use clap::{Args, Subcommand};
use jetsched_shared::wire::DlqRequest;
use serde::Deserialize;
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, outln};

#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters (oldest first), optionally of one task or queue.
    Ls {
        #[command(flatten)]
        filter: DlqFilter,
    },
    /// Show one dead letter: its facts, its spec in words and every attempt (`--json`: the
    /// entry as stored).
    Show {
        /// The entry's sequence in the dead-letter stream (as `dlq ls` shows it).
        sequence: u64,
        /// The entry's namespace: the request goes to that namespace's subject, and the entry
        /// must belong to it.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Run dead letters again (new execution id, trigger `replay`) and remove them from the DLQ:
    /// one by sequence, or every entry matching a filter at a bounded rate.
    Replay {
        /// One entry's sequence (as `dlq ls` shows it), instead of a filter.
        sequence: Option<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        /// Entries replayed per second in a bulk replay.
        #[arg(long)]
        rate: Option<u32>,
        /// The lane of the new runs (critical, high, normal, low) instead of each entry's own.
        #[arg(long)]
        priority: Option<String>,
    },
    /// Delete dead letters: one by sequence, every entry matching a filter, or --all.
    Purge {
        /// One entry's sequence (as `dlq ls` shows it), instead of a filter or --all.
        sequence: Option<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        /// Every dead letter.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct DlqFilter {
    /// Only entries of this task (`namespace/id`).
    #[arg(long)]
    task: Option<String>,
    /// Only entries of this namespace.
    #[arg(long, conflicts_with = "task")]
    namespace: Option<String>,
    /// Only entries of this queue.
    #[arg(long)]
    queue: Option<String>,
}

impl DlqFilter {
    fn is_empty(&self) -> bool {
        self.task.is_none() && self.namespace.is_none() && self.queue.is_none()
    }

    /// A request selecting the filter's entries.
    fn request(&self) -> DlqRequest {
        let task = self.task.as_deref().map(task_ref);
        DlqRequest {
            namespace: task.as_ref().map(|t| t.namespace.clone()).or_else(|| self.namespace.clone()),
            task_id: task.map(|t| t.id),
            queue: self.queue.clone(),
            ..DlqRequest::default()
        }
    }
}

/// A page of `list`.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    entries: Vec<Value>,
    #[serde(default)]
    next_cursor: Option<u64>,
}

/// The fields of a listed dead letter a table shows.
#[derive(Deserialize)]
struct Listed {
    sequence: u64,
    entry: EntryView,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct EntryView {
    namespace: String,
    task_id: String,
    queue: String,
    execution_id: String,
    nominal_time: String,
    attempts: Vec<Value>,
    reason: String,
}

#[derive(Deserialize)]
struct ReplayReply {
    #[serde(default)]
    replayed: Vec<Replayed>,
    #[serde(default)]
    failed: Vec<NotReplayed>,
}

#[derive(Deserialize)]
struct Replayed {
    sequence: u64,
    execution_id: String,
}

#[derive(Deserialize)]
struct NotReplayed {
    sequence: u64,
    error: String,
}

#[derive(Deserialize)]
struct Purged {
    purged: u64,
}

pub(crate) async fn run(api: &Api, command: DlqCommand, json_out: bool) -> Result<(), Failure> {
    match command {
        DlqCommand::Ls { filter } => list(api, &filter, json_out).await,
        DlqCommand::Show { sequence, namespace } => {
            let request = DlqRequest { sequence: Some(sequence), namespace, ..DlqRequest::default() };
            let reply = api.dlq::<Value>("get", &request).await?;
            if json_out {
                output::pretty(&reply)
            } else {
                crate::text::dead_letter(&reply)
            }
            Ok(())
        }
        DlqCommand::Replay { sequence, filter, rate, priority } => {
            let mut request = filter.request();
            request.priority = priority;
            match (sequence, filter.is_empty()) {
                (Some(sequence), true) => request.sequence = Some(sequence),
                (None, false) => request.rate = rate,
                _ => {
                    let usage = "give a sequence or a filter (--task, --namespace, --queue)";
                    return Err(anyhow::anyhow!(usage).into());
                }
            }
            let reply: Value = api.dlq("replay", &request).await?;
            if json_out {
                output::pretty(&reply);
                return Ok(());
            }
            let reply: ReplayReply = serde_json::from_value(reply).map_err(anyhow::Error::from)?;
            for r in reply.replayed {
                outln!("dead letter {} replayed as execution {}", r.sequence, r.execution_id);
            }
            for f in reply.failed {
                eprintln!("dead letter {} not replayed: {}", f.sequence, f.error);
            }
            Ok(())
        }
        DlqCommand::Purge { sequence, filter, all } => {
            let mut request = filter.request();
            match (sequence, filter.is_empty(), all) {
                (Some(sequence), true, false) => request.sequence = Some(sequence),
                (None, false, false) => {}
                (None, true, true) => request.all = true,
                _ => return Err(anyhow::anyhow!("give one of: a sequence, a filter, or --all").into()),
            }
            let reply: Value = api.dlq("purge", &request).await?;
            let Purged { purged } = serde_json::from_value(reply.clone()).map_err(anyhow::Error::from)?;
            let message = format!("{} purged", output::count(purged, "dead letter", "dead letters"));
            output::done(json_out, &reply, &message);
            Ok(())
        }
    }
}

async fn list(api: &Api, filter: &DlqFilter, json_out: bool) -> Result<(), Failure> {
    let mut request = DlqRequest { limit: Some(1000), ..filter.request() };
    let entries = crate::api::every_page(async |cursor| {
        request.cursor = cursor;
        let page: Page = api.dlq("list", &request).await?;
        Ok((page.entries, page.next_cursor))
    })
    .await?;
    if json_out {
        output::pretty(&Value::Array(entries));
        return Ok(());
    }
    let mut rows = Vec::with_capacity(entries.len());
    for entry in entries {
        let Listed { sequence, entry: e } = serde_json::from_value(entry).map_err(anyhow::Error::from)?;
        rows.push(vec![
            sequence.to_string(),
            format!("{}/{}", e.namespace, e.task_id),
            e.queue,
            e.execution_id,
            e.nominal_time,
            e.attempts.len().to_string(),
            e.reason.chars().take(60).collect(),
        ]);
    }
    output::table(&["SEQ", "TASK", "QUEUE", "EXECUTION", "NOMINAL", "ATTEMPTS", "REASON"], &rows);
    Ok(())
}
