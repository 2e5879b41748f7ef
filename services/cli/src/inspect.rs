//! Read-only views assembled from JetStream: a task's recent runs (from the event stream) and
//! the system status (lease, presence pings, consumers, streams).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::presence;
use jetsched_shared::wire::{Event, EventKind, LeaderRecord, format_time};
use serde_json::{Value, json};

use crate::commands::{Failure, split_task};
use crate::output;

/// Reads up to `last` events matching `filter`, oldest first, without waiting for new ones.
async fn recent_events(
    js: &jetstream::Context,
    names: &Names,
    filter: String,
    last: u64,
) -> anyhow::Result<Vec<Event>> {
    let mut stream = js.get_stream(names.events_stream()).await.context("open the events stream")?;
    let state = stream.info().await.context("events stream info")?.state.clone();
    if state.messages == 0 {
        return Ok(Vec::new());
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: state.last_sequence.saturating_sub(last.saturating_mul(20)).max(1),
            },
            ..Default::default()
        })
        .await
        .context("create an ordered consumer on the events stream")?;
    let mut messages = consumer.messages().await.context("read events")?;
    let mut out = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), messages.next()).await {
        let message = message.context("read event")?;
        if let Ok(event) = serde_json::from_slice::<Event>(&message.payload) {
            out.push(event);
        }
        if message.info().map(|i| i.pending).unwrap_or(0) == 0 {
            break;
        }
    }
    let keep = out.len().saturating_sub(last as usize);
    Ok(out.split_off(keep))
}

#[derive(Default)]
struct RunView {
    nominal: Option<String>,
    dispatched: Option<String>,
    trigger: String,
    attempts: u32,
    worker: String,
    outcome: String,
    duration_ms: Option<u64>,
    error: String,
}

pub(crate) async fn runs(
    client: &async_nats::Client,
    names: &Names,
    task: &str,
    last: u64,
    json_out: bool,
) -> Result<(), Failure> {
    let (namespace, id) = split_task(task);
    let js = jetstream::new(client.clone());
    let events = recent_events(&js, names, names.event_subject("*.*", namespace, id), last).await?;
    let mut runs: BTreeMap<String, RunView> = BTreeMap::new();
    let mut order = Vec::new();
    for event in events {
        let Some(execution) = event.execution_id.clone() else { continue };
        let run = runs.entry(execution.clone()).or_insert_with(|| {
            order.push(execution.clone());
            RunView::default()
        });
        if let Some(nominal) = event.nominal_time {
            run.nominal = Some(format_time(nominal));
        }
        if let Some(trigger) = event.trigger {
            run.trigger = trigger.as_str().to_string();
        }
        if let Some(worker) = &event.worker {
            run.worker = worker.clone();
        }
        if let Some(attempt) = event.attempt {
            run.attempts = run.attempts.max(attempt);
        }
        if event.duration_ms.is_some() {
            run.duration_ms = event.duration_ms;
        }
        if let Some(error) = &event.error {
            run.error = error.clone();
        }
        match event.kind {
            EventKind::FireDispatched => {
                run.dispatched = Some(format_time(event.time));
                if run.outcome.is_empty() {
                    run.outcome = "dispatched".into();
                }
            }
            EventKind::FireSkipped => {
                run.outcome = format!("skipped ({})", event.reason.as_deref().unwrap_or("?"))
            }
            EventKind::RunStarted => run.outcome = "running".into(),
            EventKind::RunSucceeded => run.outcome = "succeeded".into(),
            EventKind::RunFailed => run.outcome = "failed".into(),
            EventKind::RunRetrying => run.outcome = "retrying".into(),
            EventKind::RunDead => run.outcome = "dead-lettered".into(),
            _ => {}
        }
    }
    let views: Vec<(String, RunView)> =
        order.into_iter().filter_map(|id| runs.remove(&id).map(|view| (id, view))).collect();
    if json_out {
        let list: Vec<Value> = views
            .iter()
            .map(|(id, r)| {
                json!({"execution_id": id, "nominal_time": r.nominal, "dispatched_at": r.dispatched,
                       "trigger": r.trigger, "attempts": r.attempts, "worker": r.worker,
                       "outcome": r.outcome, "duration_ms": r.duration_ms, "error": r.error})
            })
            .collect();
        output::pretty(&Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = views
        .into_iter()
        .map(|(id, r)| {
            vec![
                id,
                r.nominal.unwrap_or_default(),
                r.dispatched.unwrap_or_default(),
                r.trigger,
                r.attempts.to_string(),
                r.worker,
                r.outcome,
                r.duration_ms.map(|d| format!("{d} ms")).unwrap_or_default(),
                r.error.chars().take(60).collect(),
            ]
        })
        .collect();
    output::table(
        &[
            "EXECUTION",
            "NOMINAL",
            "DISPATCHED",
            "TRIGGER",
            "ATTEMPTS",
            "WORKER",
            "OUTCOME",
            "DURATION",
            "ERROR",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn status(
    client: &async_nats::Client,
    names: &Names,
    json_out: bool,
) -> Result<(), Failure> {
    let js = jetstream::new(client.clone());
    let wait = Duration::from_millis(500);

    let leader = match js.get_key_value(names.leader_bucket()).await {
        Ok(kv) => match kv.entry(names.leader_key()).await.context("read the leader lease")? {
            Some(entry) if entry.operation == jetstream::kv::Operation::Put => {
                serde_json::from_slice::<LeaderRecord>(&entry.value).ok().map(|record| {
                    json!({"instance": record.instance, "term": entry.revision,
                           "acquired_at": format_time(record.acquired_at), "lease_ms": record.lease_ms})
                })
            }
            _ => None,
        },
        Err(_) => None,
    };

    let mut replicas = serde_json::Map::new();
    for role in ["registry", "scheduler", "worker", "alerter"] {
        let found = presence::ping(client, &names.presence_service(role), wait).await?;
        let mut instances: Vec<String> = found
            .iter()
            .map(|r| r.metadata.get("instance").cloned().unwrap_or_else(|| r.id.clone()))
            .collect();
        instances.sort();
        replicas.insert(role.to_string(), json!(instances));
    }

    let mut queues = Vec::new();
    let mut streams = Vec::new();
    let stream_names = [
        names.intake_stream(),
        names.dispatch_stream(),
        names.dlq_stream(),
        names.events_stream(),
        names.advisories_stream(),
        names.alerts_stream(),
    ];
    let mut dead_letters = None;
    for name in stream_names {
        let mut stream = match js.get_stream(&name).await {
            Ok(stream) => stream,
            Err(error) => {
                streams.push(json!({"stream": name, "error": error.to_string()}));
                continue;
            }
        };
        let info = stream.info().await.with_context(|| format!("{name} info"))?.clone();
        if name == names.dlq_stream() {
            dead_letters = Some(info.state.messages);
        }
        streams.push(json!({"stream": name, "messages": info.state.messages, "bytes": info.state.bytes,
                            "consumers": info.state.consumer_count, "replicas": info.config.num_replicas}));
        if name == names.dispatch_stream() {
            let mut consumers = stream.consumers();
            while let Some(consumer) = consumers.next().await {
                let consumer = consumer.context("list dispatch consumers")?;
                queues.push(json!({"consumer": consumer.name, "pending": consumer.num_pending,
                                   "ack_pending": consumer.num_ack_pending, "redelivered": consumer.num_redelivered,
                                   "waiting_pulls": consumer.num_waiting}));
            }
        }
    }
    let report = json!({"leader": leader, "replicas": replicas, "queues": queues,
                        "dead_letters": dead_letters, "streams": streams});
    if json_out {
        output::pretty(&report);
        return Ok(());
    }
    match &report["leader"] {
        Value::Null => println!("leader:      NONE (no scheduler holds the lease)"),
        l => println!(
            "leader:      {} (term {}, since {}, lease {} ms)",
            l["instance"].as_str().unwrap_or("?"),
            l["term"],
            l["acquired_at"].as_str().unwrap_or("?"),
            l["lease_ms"]
        ),
    }
    for (role, instances) in report["replicas"].as_object().into_iter().flatten() {
        let list: Vec<&str> = instances.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        println!(
            "{:<12} {} {}",
            format!("{role}s:"),
            list.len(),
            if list.is_empty() { String::new() } else { format!("({})", list.join(", ")) }
        );
    }
    println!("dead letters: {}", report["dead_letters"]);
    println!();
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            ["consumer", "pending", "ack_pending", "redelivered", "waiting_pulls"]
                .iter()
                .map(|k| q[*k].as_str().map(str::to_string).unwrap_or_else(|| q[*k].to_string()))
                .collect()
        })
        .collect();
    output::table(&["QUEUE CONSUMER", "PENDING", "ACK PENDING", "REDELIVERED", "WAITING PULLS"], &rows);
    println!();
    let rows: Vec<Vec<String>> = streams
        .iter()
        .map(|s| {
            ["stream", "messages", "bytes", "consumers", "replicas"]
                .iter()
                .map(|k| s[*k].as_str().map(str::to_string).unwrap_or_else(|| s[*k].to_string()))
                .collect()
        })
        .collect();
    output::table(&["STREAM", "MESSAGES", "BYTES", "CONSUMERS", "REPLICAS"], &rows);
    Ok(())
}
