//! The subcommands and the API calls behind them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use jetsched_shared::config::NatsArgs;
use jetsched_shared::error::{ApiError, ErrorReply};
use jetsched_shared::names::{DEFAULT_PREFIX, Names};
use jetsched_shared::wire::HDR_CREATE_ONLY;
use serde_json::{Value, json};

use crate::output;

/// jetsched: submit, inspect and control scheduled tasks over NATS.
#[derive(Debug, Parser)]
#[command(name = "jetsched", version)]
pub(crate) struct Cli {
    #[command(flatten)]
    nats: NatsArgs,
    /// Prefix of every subject, stream and bucket.
    #[arg(long, env = "JETSCHED_PREFIX", default_value = DEFAULT_PREFIX, global = true)]
    prefix: String,
    /// Print raw JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or update tasks from JSON or YAML files (one spec, an array, or YAML `---`
    /// documents), a directory of *.json/*.yaml/*.yml, or `-` for stdin.
    Apply {
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        /// Fail for tasks that already exist instead of updating them.
        #[arg(long)]
        create_only: bool,
    },
    /// Show one task (`namespace/id`, or `id` in namespace `default`).
    Get { task: String },
    /// List tasks.
    Ls {
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// `key=value`; repeat to require several labels.
        #[arg(long = "label", short = 'l')]
        labels: Vec<String>,
    },
    /// Delete a task.
    Rm { task: String },
    /// Pause a task: it stops firing until resumed.
    Pause { task: String },
    /// Resume a paused task.
    Resume { task: String },
    /// Dispatch one run of a task now.
    Trigger { task: String },
    /// Preview the next fire times of a stored task, or of a spec file with --file.
    Next {
        task: Option<String>,
        #[arg(long = "file", short = 'f', conflicts_with = "task")]
        file: Option<PathBuf>,
        #[arg(short = 'c', long = "count", default_value_t = 10)]
        count: usize,
        /// RFC 3339 instant to start from [default: now].
        #[arg(long)]
        after: Option<String>,
    },
    /// Show events (task changes, fires, runs, leader changes) from the event stream.
    Events(EventsArgs),
    /// Recent executions of a task, from the event stream: nominal vs actual time, attempts,
    /// worker, outcome.
    Runs {
        task: String,
        /// How many past events of the task to read.
        #[arg(long, default_value_t = 500)]
        last: u64,
    },
    /// Leader and term, live replicas, queue depths, dead letters and streams.
    Status,
    /// Dead letters: runs that exhausted their retries or failed for good.
    #[command(subcommand)]
    Dlq(DlqCommand),
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// List dead letters (oldest first), optionally of one task or queue.
    Ls {
        #[command(flatten)]
        filter: DlqFilter,
    },
    /// Show one dead letter with its whole attempt history.
    Show { sequence: u64 },
    /// Run dead letters again (new execution id, trigger `replay`) and remove them from the DLQ:
    /// one by sequence, or every entry matching a filter at a bounded rate.
    Replay {
        sequence: Option<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        /// Entries replayed per second in a bulk replay.
        #[arg(long)]
        rate: Option<u32>,
    },
    /// Delete dead letters: one by sequence, every entry matching a filter, or --all.
    Purge {
        sequence: Option<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
struct DlqFilter {
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

    fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut body = serde_json::Map::new();
        if let Some(task) = &self.task {
            let (namespace, id) = split_task(task);
            body.insert("namespace".into(), json!(namespace));
            body.insert("task_id".into(), json!(id));
        }
        if let Some(namespace) = &self.namespace {
            body.insert("namespace".into(), json!(namespace));
        }
        if let Some(queue) = &self.queue {
            body.insert("queue".into(), json!(queue));
        }
        body
    }
}

#[derive(Debug, Args)]
struct EventsArgs {
    /// Keep printing new events.
    #[arg(long)]
    follow: bool,
    /// Only events of this task (`namespace/id`).
    #[arg(long)]
    task: Option<String>,
    /// How many past events to show first.
    #[arg(long, default_value_t = 20)]
    last: u64,
}

/// Why a command failed: the API said no (exit 1), or anything else (exit 2).
pub(crate) enum Failure {
    Api(ApiError),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Other(error)
    }
}

struct Api {
    client: async_nats::Client,
    names: Names,
}

impl Api {
    async fn call(&self, endpoint: &str, body: Vec<u8>, headers: HeaderMap) -> Result<Value, Failure> {
        self.request(self.names.task_api_subject(endpoint), body, headers).await
    }

    async fn request(&self, subject: String, body: Vec<u8>, headers: HeaderMap) -> Result<Value, Failure> {
        let reply = tokio::time::timeout(
            Duration::from_secs(15),
            self.client.request_with_headers(subject.clone(), headers, body.into()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no reply on {subject} within 15s"))?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => {
                anyhow::anyhow!("nobody serves {subject}: is jetsched-registry running?")
            }
            _ => anyhow::anyhow!("request {subject}: {e}"),
        })?;
        let value: Value = serde_json::from_slice(&reply.payload).context("reply is not JSON")?;
        if value.get("error").is_some() {
            let reply: ErrorReply = serde_json::from_value(value).context("error reply")?;
            return Err(Failure::Api(reply.error));
        }
        Ok(value)
    }

    async fn dlq_call(&self, endpoint: &str, body: Value) -> Result<Value, Failure> {
        let subject = self.names.dlq_api_subject(endpoint);
        self.request(subject, body.to_string().into_bytes(), HeaderMap::new()).await
    }

    async fn task_call(&self, endpoint: &str, task: &str) -> Result<Value, Failure> {
        let (namespace, id) = split_task(task);
        self.call(
            endpoint,
            json!({"namespace": namespace, "id": id}).to_string().into_bytes(),
            HeaderMap::new(),
        )
        .await
    }
}

/// `namespace/id`, or `id` in namespace `default`.
pub(crate) fn split_task(task: &str) -> (&str, &str) {
    task.split_once('/').unwrap_or(("default", task))
}

pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let names = Names::new(&cli.prefix).map_err(Failure::Api)?;
    let client = cli.nats.connect("jetsched-cli").await?;
    let api = Api { client: client.clone(), names: names.clone() };
    let json_out = cli.json;
    let result = match cli.command {
        Command::Apply { files, create_only } => apply(&api, &files, create_only, json_out).await,
        Command::Get { task } => api.task_call("get", &task).await.map(|v| output::pretty(&v)),
        Command::Ls { namespace, labels } => list(&api, namespace, &labels, json_out).await,
        Command::Rm { task } => {
            api.task_call("delete", &task).await.map(|v| done(json_out, &v, &format!("{task} deleted")))
        }
        Command::Pause { task } => {
            api.task_call("pause", &task).await.map(|v| done(json_out, &v, &format!("{task} paused")))
        }
        Command::Resume { task } => {
            api.task_call("resume", &task).await.map(|v| done(json_out, &v, &format!("{task} resumed")))
        }
        Command::Trigger { task } => api.task_call("trigger", &task).await.map(|v| {
            let message =
                format!("{task} triggered: execution {}", v["execution_id"].as_str().unwrap_or("?"));
            done(json_out, &v, &message)
        }),
        Command::Next { task, file, count, after } => next(&api, task, file, count, after, json_out).await,
        Command::Events(args) => events(&client, &names, args).await,
        Command::Runs { task, last } => crate::inspect::runs(&client, &names, &task, last, json_out).await,
        Command::Status => crate::inspect::status(&client, &names, json_out).await,
        Command::Dlq(command) => dlq(&api, command, json_out).await,
    };
    let _ = client.flush().await;
    result
}

fn done(json_out: bool, value: &Value, message: &str) {
    if json_out { output::pretty(value) } else { println!("{message}") }
}

fn read_specs(path: &Path) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("read stdin")?;
        push_specs(&mut out, "-", &text)?;
    } else if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("read directory {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml" || x == "yml"))
            .collect();
        entries.sort();
        for entry in entries {
            out.extend(read_specs(&entry)?);
        }
    } else {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        push_specs(&mut out, &path.display().to_string(), &text)?;
    }
    Ok(out)
}

/// A file holds one spec, an array of specs, or (YAML) several `---` documents of either.
fn push_specs(out: &mut Vec<(String, Value)>, source: &str, text: &str) -> anyhow::Result<()> {
    let documents: Vec<Value> = if text.trim_start().starts_with(['{', '[']) {
        vec![serde_json::from_str(text).with_context(|| format!("{source} is not valid JSON"))?]
    } else {
        use serde::Deserialize;
        serde_norway::Deserializer::from_str(text)
            .map(Value::deserialize)
            .collect::<Result<_, _>>()
            .with_context(|| format!("{source} is neither JSON nor valid YAML"))?
    };
    let many = documents.len() > 1;
    for (d, document) in documents.into_iter().enumerate() {
        let name = if many { format!("{source}#{d}") } else { source.to_string() };
        match document {
            Value::Array(items) => {
                out.extend(items.into_iter().enumerate().map(|(i, v)| (format!("{name}[{i}]"), v)))
            }
            Value::Null => {}
            other => out.push((name, other)),
        }
    }
    Ok(())
}

async fn apply(api: &Api, files: &[PathBuf], create_only: bool, json_out: bool) -> Result<(), Failure> {
    let mut specs = Vec::new();
    for file in files {
        specs.extend(read_specs(file)?);
    }
    let mut headers = HeaderMap::new();
    if create_only {
        headers.insert(HDR_CREATE_ONLY, "true");
    }
    // Many specs: 32 puts in flight, results reported in input order, a progress bar on a terminal.
    let progress = (specs.len() > 20 && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| indicatif::ProgressBar::new(specs.len() as u64));
    let results = futures::stream::iter(specs.into_iter().map(|(source, spec)| {
        let headers = headers.clone();
        async move { (source, api.call("put", spec.to_string().into_bytes(), headers).await) }
    }))
    .buffered(32);
    futures::pin_mut!(results);
    let mut failed = None;
    while let Some((source, result)) = results.next().await {
        if let Some(bar) = &progress {
            bar.inc(1);
        }
        let print = |line: String| match &progress {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        };
        match result {
            Ok(reply) if json_out => print(reply.to_string()),
            Ok(reply) => print(format!(
                "{}/{} applied (revision {})",
                reply["task"]["namespace"].as_str().unwrap_or("?"),
                reply["task"]["id"].as_str().unwrap_or("?"),
                reply["revision"]
            )),
            Err(Failure::Api(error)) => {
                eprintln!("{source}: {error}");
                failed = Some(error);
            }
            Err(other) => return Err(other),
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    match failed {
        Some(error) => Err(Failure::Api(error)),
        None => Ok(()),
    }
}

async fn list(
    api: &Api,
    namespace: Option<String>,
    labels: &[String],
    json_out: bool,
) -> Result<(), Failure> {
    let mut label_map = serde_json::Map::new();
    for label in labels {
        let (k, v) =
            label.split_once('=').ok_or_else(|| anyhow::anyhow!("--label {label:?}: use key=value"))?;
        label_map.insert(k.to_string(), Value::String(v.to_string()));
    }
    let mut tasks = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let body = json!({"namespace": namespace, "labels": label_map, "limit": 1000, "cursor": cursor});
        let page = api.call("list", body.to_string().into_bytes(), HeaderMap::new()).await?;
        tasks.extend(page["tasks"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    if json_out {
        output::pretty(&Value::Array(tasks));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let task = &t["task"];
            vec![
                format!("{}/{}", task["namespace"].as_str().unwrap_or(""), task["id"].as_str().unwrap_or("")),
                output::schedule(&task["schedule"]),
                task["executor"]["kind"].as_str().unwrap_or("").to_string(),
                task["queue"].as_str().unwrap_or("").to_string(),
                if task["paused"] == true { "paused" } else { "active" }.to_string(),
                t["revision"].to_string(),
            ]
        })
        .collect();
    output::table(&["TASK", "SCHEDULE", "EXECUTOR", "QUEUE", "STATE", "REVISION"], &rows);
    Ok(())
}

async fn next(
    api: &Api,
    task: Option<String>,
    file: Option<PathBuf>,
    count: usize,
    after: Option<String>,
    json_out: bool,
) -> Result<(), Failure> {
    let mut body = json!({"count": count, "after": after});
    match (task, file) {
        (Some(task), None) => {
            let (namespace, id) = split_task(&task);
            body["namespace"] = json!(namespace);
            body["id"] = json!(id);
        }
        (None, Some(file)) => {
            let mut specs = read_specs(&file)?;
            if specs.len() != 1 {
                return Err(
                    anyhow::anyhow!("{} holds {} specs; give one", file.display(), specs.len()).into()
                );
            }
            body["spec"] = specs.remove(0).1;
        }
        _ => return Err(anyhow::anyhow!("give a task (namespace/id) or --file").into()),
    }
    let reply = api.call("next", body.to_string().into_bytes(), HeaderMap::new()).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let utc = reply["times"].as_array().cloned().unwrap_or_default();
    let local = reply["local_times"].as_array().cloned().unwrap_or_default();
    let zone = reply["timezone"].as_str().unwrap_or("UTC").to_string();
    let mut previous_offset: Option<String> = None;
    let rows: Vec<Vec<String>> = utc
        .iter()
        .zip(local.iter())
        .map(|(u, l)| {
            let l = l.as_str().unwrap_or("").to_string();
            let offset = l.get(l.len().saturating_sub(6)..).unwrap_or("").to_string();
            let note = match &previous_offset {
                Some(prev) if *prev != offset => format!("offset change {prev} -> {offset}"),
                _ => String::new(),
            };
            previous_offset = Some(offset);
            vec![u.as_str().unwrap_or("").to_string(), l, note]
        })
        .collect();
    output::table(&["UTC", &format!("LOCAL ({zone})"), ""], &rows);
    Ok(())
}

async fn events(client: &async_nats::Client, names: &Names, args: EventsArgs) -> Result<(), Failure> {
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(names.events_stream()).await.context("open the events stream")?;
    let info = stream.info().await.context("events stream info")?;
    let last = info.state.last_sequence;
    let filter = match &args.task {
        Some(task) => {
            let (namespace, id) = split_task(task);
            names.event_subject("*.*", namespace, id)
        }
        None => names.events_wildcard(),
    };
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
        println!("{}", event);
        if !args.follow && pending == 0 {
            break;
        }
    }
    Ok(())
}

async fn dlq(api: &Api, command: DlqCommand, json_out: bool) -> Result<(), Failure> {
    match command {
        DlqCommand::Ls { filter } => {
            let mut entries = Vec::new();
            let mut cursor: Option<u64> = None;
            loop {
                let mut body = filter.to_json();
                body.insert("limit".into(), json!(1000));
                if let Some(cursor) = cursor {
                    body.insert("cursor".into(), json!(cursor));
                }
                let page = api.dlq_call("list", Value::Object(body)).await?;
                entries.extend(page["entries"].as_array().cloned().unwrap_or_default());
                match page["next_cursor"].as_u64() {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            if json_out {
                output::pretty(&Value::Array(entries));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    let entry = &e["entry"];
                    let text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
                    vec![
                        e["sequence"].to_string(),
                        format!("{}/{}", text(&entry["namespace"]), text(&entry["task_id"])),
                        text(&entry["queue"]),
                        text(&entry["execution_id"]),
                        text(&entry["nominal_time"]),
                        entry["attempts"].as_array().map(Vec::len).unwrap_or(0).to_string(),
                        text(&entry["reason"]).chars().take(60).collect(),
                    ]
                })
                .collect();
            output::table(&["SEQ", "TASK", "QUEUE", "EXECUTION", "NOMINAL", "ATTEMPTS", "REASON"], &rows);
            Ok(())
        }
        DlqCommand::Show { sequence } => {
            output::pretty(&api.dlq_call("get", json!({"sequence": sequence})).await?);
            Ok(())
        }
        DlqCommand::Replay { sequence, filter, rate } => {
            let mut body = filter.to_json();
            match (sequence, filter.is_empty()) {
                (Some(sequence), true) => {
                    body.insert("sequence".into(), json!(sequence));
                }
                (None, false) => {
                    if let Some(rate) = rate {
                        body.insert("rate".into(), json!(rate));
                    }
                }
                _ => {
                    return Err(anyhow::anyhow!(
                        "give a sequence or a filter (--task, --namespace, --queue)"
                    )
                    .into());
                }
            }
            let reply = api.dlq_call("replay", Value::Object(body)).await?;
            if json_out {
                output::pretty(&reply);
            } else {
                for r in reply["replayed"].as_array().into_iter().flatten() {
                    println!(
                        "dead letter {} replayed as execution {}",
                        r["sequence"],
                        r["execution_id"].as_str().unwrap_or("?")
                    );
                }
                for f in reply["failed"].as_array().into_iter().flatten() {
                    eprintln!(
                        "dead letter {} not replayed: {}",
                        f["sequence"],
                        f["error"].as_str().unwrap_or("?")
                    );
                }
            }
            Ok(())
        }
        DlqCommand::Purge { sequence, filter, all } => {
            let mut body = filter.to_json();
            match (sequence, filter.is_empty(), all) {
                (Some(sequence), true, false) => {
                    body.insert("sequence".into(), json!(sequence));
                }
                (None, false, false) => {}
                (None, true, true) => {
                    body.insert("all".into(), json!(true));
                }
                _ => return Err(anyhow::anyhow!("give one of: a sequence, a filter, or --all").into()),
            }
            let reply = api.dlq_call("purge", Value::Object(body)).await?;
            done(json_out, &reply, &format!("{} dead letter(s) purged", reply["purged"]));
            Ok(())
        }
    }
}
