//! The subcommands and the API calls behind them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use jetsched_shared::config::NatsArgs;
use jetsched_shared::names::{DEFAULT_PREFIX, Names};
use jetsched_shared::wire::{NextReply, NextRequest};
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::breakers::BreakerCommand;
use crate::dlq::DlqCommand;
use crate::files::read_specs;
use crate::limits::LimitCommand;
use crate::output::{self, outln};
use crate::queues::QueueCommand;
use crate::tasks::{Filters, StateFilter, Stored};
use crate::trigger::TriggerFields;

/// jetsched: submit, inspect and control scheduled tasks over NATS.
#[derive(Debug, Parser)]
#[command(name = "jetsched", version)]
pub(crate) struct Cli {
    #[command(flatten)]
    nats: NatsArgs,
    /// Prefix of every subject, stream and bucket.
    #[arg(long, env = "JETSCHED_PREFIX", default_value = DEFAULT_PREFIX, global = true)]
    prefix: String,
    /// Print JSON, exactly as the API answers, instead of readable text and tables.
    #[arg(long, global = true)]
    json: bool,
    /// Prefix of reply subjects (default `_INBOX`); a team confined to a namespace uses its own.
    #[arg(long = "nats-inbox-prefix", env = "NATS_INBOX_PREFIX", global = true)]
    inbox_prefix: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or update tasks from JSON or YAML files (one spec, an array, or YAML `---`
    /// documents), a directory of *.json/*.yaml/*.yml, or `-` for stdin.
    Apply {
        /// A spec file (JSON or YAML), a directory of them, or `-` for stdin; repeat for more.
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        /// Fail for tasks that already exist instead of updating them.
        #[arg(long)]
        create_only: bool,
    },
    /// Show one task (`namespace/id`, or `id` in namespace `default`): its state, schedule in
    /// words, executor and settings as aligned lines; the stored spec with `--json`.
    Get {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
    },
    /// List tasks: schedule, state (active, paused, completed), next and last fire, last
    /// outcome, success rate over the last runs, priority, breaker and queue.
    Ls {
        /// Only tasks of this namespace.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// `key=value`; repeat to require several labels.
        #[arg(long = "label", short = 'l')]
        labels: Vec<String>,
        /// Only tasks in this state.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only tasks of this priority.
        #[arg(long, value_parser = ["critical", "high", "normal", "low"])]
        priority: Option<String>,
    },
    /// Delete a task. Asks first on a terminal; elsewhere `--yes` is required.
    Rm {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
        /// Delete without asking (required when standard input is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Pause a task: it stops firing until resumed.
    Pause {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
        /// Why (shown by `get` and `ls` until the task is resumed).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused task.
    Resume {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
    },
    /// Dispatch one run of a task now (or join its pending run when the task debounces).
    Trigger {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
        /// The lane of this run (critical, high, normal, low) instead of the task's priority.
        #[arg(long)]
        priority: Option<String>,
        /// JSON given to the run instead of the spec's body or payload; `@FILE` reads it from a file.
        #[arg(long)]
        payload: Option<String>,
        /// Run at most once per key: a trigger with the key of an earlier one within its TTL
        /// answers that one's execution and runs nothing.
        #[arg(long)]
        dedupe_key: Option<String>,
        /// How long the key holds (whole seconds, 1s to 7d; default 10m).
        #[arg(long, requires = "dedupe_key")]
        dedupe_ttl: Option<String>,
    },
    /// A task's dependencies: its rule, its parents and children (`after`) with the last run
    /// of each, and its recent waits for its parents (what each still misses).
    Graph {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
    },
    /// Preview the next fire times of a stored task, or of a spec file with --file; for a task
    /// with `after`, what it waits for.
    Next {
        /// A stored task: `namespace/id`, or `id` in namespace `default`.
        task: Option<String>,
        /// A spec file (JSON or YAML) holding one spec, instead of a stored task.
        #[arg(long = "file", short = 'f', conflicts_with = "task")]
        file: Option<PathBuf>,
        /// How many fire times to show.
        #[arg(short = 'c', long = "count", default_value_t = 10)]
        count: usize,
        /// RFC 3339 instant to start from [default: now].
        #[arg(long, value_parser = crate::api::parse_instant)]
        after: Option<DateTime<Utc>>,
    },
    /// Show events (task changes, fires, runs, leader changes) from the event stream, one line
    /// each (time, kind, task, execution, detail); one JSON object per line with `--json`.
    Events(EventsArgs),
    /// Recent executions of a task, from the event stream: nominal time and dispatch lag,
    /// attempts, worker, outcome, the whole run's duration; within 100 columns unless --wide.
    Runs {
        /// The task: `namespace/id`, or `id` in namespace `default`.
        task: String,
        /// How many past events of the task to read.
        #[arg(long, default_value_t = 500)]
        last: u64,
        /// Every id and time in full, with the trace id, however wide the table gets.
        #[arg(long)]
        wide: bool,
    },
    /// Leader and term, live replicas, queue depths, dead letters and streams.
    Status,
    /// Dead letters: runs that exhausted their retries or failed for good.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Circuit breakers shared by the workers: state, failure rate, counts, open until, the
    /// consecutive failures of a task's own, and the tasks using each.
    Breakers,
    /// One circuit breaker: show it, or reset it (closed, counts cleared).
    #[command(subcommand)]
    Breaker(BreakerCommand),
    /// Every queue: paused or running, why, and the runs waiting and in flight in its lanes.
    Queues,
    /// Pause or resume a whole queue: workers stop pulling from a paused queue's lanes.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Cancel a run (queued, held or running), or a task's runs not started yet (--task).
    Cancel(crate::cancel::CancelArgs),
    /// Backfill a task: dispatch every nominal time of a range once (`status`, `list`, `cancel`; `--dry-run` plans).
    Backfill(crate::backfill::BackfillArgs),
    /// Business calendars of a namespace: `apply` (with compare-and-set), `get`, `ls`, `rm`.
    #[command(subcommand)]
    Calendar(crate::calendars::CalendarCommand),
    /// Concurrency limits: each key's limit, slots in use, runs waiting; `set`/`clear` an override.
    Limits {
        #[command(subcommand)]
        command: Option<LimitCommand>,
    },
}

#[derive(Debug, Args)]
struct EventsArgs {
    /// Keep printing new events.
    #[arg(long)]
    follow: bool,
    /// Only events of this task (`namespace/id`): its last `--last` events, through the registry.
    #[arg(long)]
    task: Option<String>,
    /// Only events of this namespace, read the way a team confined to it may: its live
    /// subjects and an events consumer filtered to it (no stream-wide reads).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// How many past events to show first.
    #[arg(long, default_value_t = 20)]
    last: u64,
}

pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let names = Names::new(&cli.prefix)?;
    // Asked (or refused) before connecting: nothing is sent unless the deletion is confirmed.
    if let Command::Rm { task, yes } = &cli.command {
        confirm_delete(task, *yes)?;
    }
    let client = cli.nats.connect_with_inbox_prefix("jetsched-cli", cli.inbox_prefix.as_deref()).await?;
    let api = Api::new(client.clone(), names.clone());
    let json_out = cli.json;
    let result = match cli.command {
        Command::Apply { files, create_only } => apply(&api, &files, create_only, json_out).await,
        Command::Get { task } => crate::tasks::get(&api, &task, json_out).await,
        Command::Ls { namespace, labels, state, queue, priority } => {
            let filters = Filters { state, queue, priority };
            crate::tasks::list(&api, namespace, &labels, &filters, json_out).await
        }
        Command::Rm { task, .. } => control(&api, "delete", &task, "deleted", json_out).await,
        Command::Pause { task, reason } => pause(&api, &task, reason, json_out).await,
        Command::Resume { task } => control(&api, "resume", &task, "resumed", json_out).await,
        Command::Trigger { task, priority, payload, dedupe_key, dedupe_ttl } => {
            let fields = TriggerFields { priority, payload, dedupe_key, dedupe_ttl };
            crate::trigger::trigger(&api, &task, fields, json_out).await
        }
        Command::Next { task, file, count, after } => next(&api, task, file, count, after, json_out).await,
        Command::Graph { task } => crate::graph::graph(&api, &task, json_out).await,
        // One namespace or one task: the registry reads the last events of just those.
        Command::Events(EventsArgs { namespace: Some(namespace), task, last, follow }) => {
            let task = task.as_deref();
            crate::tenant::events(&api, &client, &names, &namespace, task, last, follow, json_out).await
        }
        Command::Events(EventsArgs { namespace: None, task: Some(task), last, follow }) => {
            let namespace = task_ref(&task).namespace;
            crate::tenant::events(&api, &client, &names, &namespace, Some(&task), last, follow, json_out)
                .await
        }
        Command::Events(args) => events(&client, &names, args, json_out).await,
        Command::Runs { task, last, wide } => {
            crate::runs::runs(&api, &client, &names, &task, last, wide, json_out).await
        }
        Command::Status => crate::inspect::status(&client, &names, json_out).await,
        Command::Dlq(command) => crate::dlq::run(&api, command, json_out).await,
        Command::Breakers => crate::breakers::list(&api, json_out).await,
        Command::Breaker(command) => crate::breakers::run(&api, command, json_out).await,
        Command::Queues => crate::queues::list(&api, json_out).await,
        Command::Queue(command) => crate::queues::run(&api, command, json_out).await,
        Command::Limits { command } => crate::limits::run(&api, command, json_out).await,
        Command::Calendar(command) => crate::calendars::run(&api, command, json_out).await,
        Command::Cancel(args) => crate::cancel::run(&api, args, json_out).await,
        Command::Backfill(args) => crate::backfill::run(&client, &names, &api, args, json_out).await,
    };
    let _ = client.flush().await;
    result
}

/// `rm` asks `delete ns/id? [y/N]` on a terminal unless `--yes`; without a terminal and without
/// `--yes` it refuses (exit 2), so a script never deletes by accident nor hangs on a prompt.
fn confirm_delete(task: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let reference = task_ref(task);
    let name = format!("{}/{}", reference.namespace, reference.id);
    let stdin = std::io::stdin();
    if !std::io::IsTerminal::is_terminal(&stdin) {
        return Err(anyhow::anyhow!(
            "not deleting {name}: standard input is not a terminal to confirm on; pass --yes to delete"
        )
        .into());
    }
    eprint!("delete {name}? [y/N] ");
    let mut answer = String::new();
    stdin.read_line(&mut answer).context("read the answer")?;
    match answer.trim() {
        "y" | "Y" | "yes" | "Yes" | "YES" => Ok(()),
        _ => Err(Failure::Reported(format!("{name} not deleted"))),
    }
}

/// `delete`, `pause` or `resume` one task.
async fn control(api: &Api, endpoint: &str, task: &str, did: &str, json_out: bool) -> Result<(), Failure> {
    let reference = task_ref(task);
    let reply: Value = api.task_in(endpoint, &reference.namespace, &reference).await?;
    output::done(json_out, &reply, &format!("{task} {did}"));
    crate::graph::left_waiting(json_out, &reply);
    Ok(())
}

/// Calls task `endpoint` on `task` (`<namespace>/<id>`) with the string `field` of the
/// request set to `value` when there is one.
async fn task_call(
    api: &Api,
    endpoint: &str,
    task: &str,
    field: &str,
    value: Option<String>,
) -> Result<Value, Failure> {
    let reference = task_ref(task);
    let mut request = serde_json::json!({"namespace": reference.namespace, "id": reference.id});
    if let Some(value) = value {
        request[field] = Value::String(value);
    }
    api.task_in(endpoint, &reference.namespace, &request).await
}

/// `pause`, with the reason recorded as the task's `paused_reason`.
async fn pause(api: &Api, task: &str, reason: Option<String>, json_out: bool) -> Result<(), Failure> {
    let reply = task_call(api, "pause", task, "reason", reason).await?;
    output::done(json_out, &reply, &format!("{task} paused"));
    crate::graph::left_waiting(json_out, &reply);
    Ok(())
}

async fn apply(api: &Api, files: &[PathBuf], create_only: bool, json_out: bool) -> Result<(), Failure> {
    let mut specs = Vec::new();
    for file in files {
        specs.extend(read_specs(file)?);
    }
    let total = specs.len();
    // Many specs: 32 puts in flight, results reported in input order, a progress bar on a terminal.
    let progress = (total > 20 && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| indicatif::ProgressBar::new(total as u64));
    let results = futures::stream::iter(
        specs.into_iter().map(|(source, spec)| async move { (source, api.put(&spec, create_only).await) }),
    )
    .buffered(32);
    futures::pin_mut!(results);
    let mut rejected = Vec::new();
    while let Some((source, result)) = results.next().await {
        if let Some(bar) = &progress {
            bar.inc(1);
        }
        let print = |line: String| match &progress {
            Some(bar) => bar.suspend(|| outln!("{line}")),
            None => outln!("{line}"),
        };
        match result {
            Ok(reply) if json_out => print(reply.to_string()),
            Ok(reply) => {
                let Stored { task, revision, .. } = serde_json::from_value(reply).context("put reply")?;
                print(format!("{}/{} applied (revision {revision})", task.namespace, task.id));
            }
            Err(Failure::Api(problems)) => {
                let report = || {
                    for problem in &problems {
                        eprintln!("{source}: {problem}");
                    }
                };
                match &progress {
                    Some(bar) => bar.suspend(report),
                    None => report(),
                }
                rejected.push(source);
            }
            Err(other) => return Err(other),
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    match rejected.as_slice() {
        [] => Ok(()),
        [source] if total == 1 => Err(Failure::Reported(format!("{source} rejected"))),
        _ => Err(Failure::Reported(format!(
            "{} of {} rejected: {}",
            rejected.len(),
            output::count(total as u64, "spec", "specs"),
            rejected.join(", ")
        ))),
    }
}

async fn next(
    api: &Api,
    task: Option<String>,
    file: Option<PathBuf>,
    count: usize,
    after: Option<DateTime<Utc>>,
    json_out: bool,
) -> Result<(), Failure> {
    let mut request = NextRequest { count: Some(count), after, ..NextRequest::default() };
    match (task, file) {
        (Some(task), None) => {
            let task = task_ref(&task);
            request.namespace = Some(task.namespace);
            request.id = Some(task.id);
        }
        (None, Some(file)) => {
            let mut specs = read_specs(&file)?;
            if specs.len() != 1 {
                return Err(
                    anyhow::anyhow!("{} holds {} specs; give one", file.display(), specs.len()).into()
                );
            }
            request.spec = Some(specs.remove(0).1);
        }
        _ => return Err(anyhow::anyhow!("give a task (namespace/id) or --file").into()),
    }
    let namespace = match (&request.namespace, &request.spec) {
        (Some(namespace), _) => namespace.clone(),
        (None, Some(spec)) => crate::api::spec_namespace(spec).to_string(),
        (None, None) => "default".to_string(),
    };
    let reply: Value = api.task_in("next", &namespace, &request).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let NextReply { timezone, times, local_times, ends_by, last_fire, notes, waits_for } =
        serde_json::from_value(reply).context("next reply")?;
    if !waits_for.is_empty() {
        // A task with `after` has no fires of its own: what it waits for.
        for line in waits_for {
            println!("{line}");
        }
        return Ok(());
    }
    let mut notes = notes.into_iter();
    let mut previous_offset: Option<String> = None;
    let rows: Vec<Vec<String>> = times
        .into_iter()
        .zip(local_times)
        .map(|(utc, local)| {
            let offset = local.get(local.len().saturating_sub(6)..).unwrap_or("").to_string();
            let note = match &previous_offset {
                Some(prev) if *prev != offset => format!("offset change {prev} -> {offset}"),
                _ => String::new(),
            };
            previous_offset = Some(offset);
            let calendar = notes.next().unwrap_or_default();
            let note = [note, calendar].into_iter().filter(|n| !n.is_empty()).collect::<Vec<_>>().join("; ");
            vec![utc, local, note]
        })
        .collect();
    output::table(&["UTC", &format!("LOCAL ({timezone})"), ""], &rows);
    if let Some(reason) = ends_by {
        let last = last_fire.map_or_else(String::new, |last| format!(" (last fire {last})"));
        println!("no fire after that: the task ends by {reason}{last}");
    }
    Ok(())
}

async fn events(
    client: &async_nats::Client,
    names: &Names,
    args: EventsArgs,
    json_out: bool,
) -> Result<(), Failure> {
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(names.events_stream()).await.context("open the events stream")?;
    let info = stream.info().await.context("events stream info")?;
    let last = info.state.last_sequence;
    let filter = names.events_wildcard();
    let start = last.saturating_sub(args.last).max(1);
    if !args.follow && info.state.messages == 0 {
        return Ok(());
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: if last == 0 {
                DeliverPolicy::New
            } else {
                DeliverPolicy::ByStartSequence { start_sequence: start }
            },
            ..Default::default()
        })
        .await
        .context("create an ordered consumer on the events stream")?;
    let mut messages = consumer.messages().await.context("read events")?;
    loop {
        let next = if args.follow {
            messages.next().await
        } else {
            match tokio::time::timeout(Duration::from_millis(500), messages.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        };
        let Some(message) = next else { break };
        let message = message.context("read event")?;
        let pending = message.info().map(|i| i.pending).unwrap_or(0);
        let event: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
        crate::text::print_event(&event, json_out);
        if !args.follow && pending == 0 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every subcommand, positional and flag says what it is for in `--help`.
    #[test]
    fn every_subcommand_and_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for argument in command.get_arguments() {
                if argument.get_help().is_none() && argument.get_long_help().is_none() {
                    missing.push(format!("{path} {}", argument.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(here.clone());
                }
                walk(sub, &here, missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut missing = Vec::new();
        walk(&command, "jetsched", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }
}
