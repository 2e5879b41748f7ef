//! The system status assembled from JetStream: lease, presence pings, consumers, streams.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::partition;
use jetsched_shared::presence;
use jetsched_shared::priority::Priority;
use jetsched_shared::wire::{LeaderRecord, format_time};
use serde::Serialize;

use crate::api::Failure;
use crate::output::{self, outln};

/// The roles `status` looks for, in the order it shows them.
const ROLES: [&str; 4] = ["registry", "scheduler", "worker", "alerter"];
/// Width of the labels of `status`'s summary lines.
const LABEL: usize = 14;

/// The lease holder as `status` reports it.
#[derive(Serialize)]
struct Leader {
    instance: String,
    /// Revision of the `create` that won the lease: the same for as long as one leader holds.
    /// An older scheduler's record has none: then the key's latest revision, as before.
    term: u64,
    acquired_at: String,
    /// When the lease was last written (acquired or renewed): the entry's timestamp.
    renewed_at: String,
    lease_ms: u64,
    /// The lease key's latest revision (grows with every renewal).
    revision: u64,
    #[serde(skip)]
    term_recorded: bool,
}

#[derive(Serialize)]
struct Queue {
    consumer: String,
    pending: u64,
    ack_pending: usize,
    redelivered: usize,
    waiting_pulls: usize,
}

#[derive(Serialize)]
#[serde(untagged)]
enum StreamView {
    Found { stream: String, messages: u64, bytes: u64, consumers: usize, replicas: usize },
    Missing { stream: String, error: String },
}

#[derive(Serialize)]
struct Status {
    leader: Option<Leader>,
    /// The topology's number of partitions, as the dispatch stream records it (`None`: a
    /// deployment made before partitions were recorded, or no dispatch stream).
    partitions: Option<u16>,
    /// Instances per role that answered the presence ping.
    replicas: BTreeMap<&'static str, Vec<String>>,
    queues: Vec<Queue>,
    /// Each lane of each queue (one worker consumer per priority), most urgent first.
    lanes: Vec<Lane>,
    dead_letters: Option<u64>,
    streams: Vec<StreamView>,
}

#[derive(Serialize)]
struct Lane {
    queue: String,
    priority: Priority,
    pending: u64,
}

async fn leader(js: &jetstream::Context, names: &Names) -> anyhow::Result<Option<Leader>> {
    let Ok(kv) = js.get_key_value(names.leader_bucket()).await else { return Ok(None) };
    let Some(entry) = kv.entry(names.leader_key()).await.context("read the leader lease")? else {
        return Ok(None);
    };
    if entry.operation != jetstream::kv::Operation::Put {
        return Ok(None);
    }
    let Ok(record) = serde_json::from_slice::<LeaderRecord>(&entry.value) else { return Ok(None) };
    let nanos = entry.created.unix_timestamp_nanos();
    let renewed = DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX));
    Ok(Some(Leader {
        instance: record.instance,
        term: if record.term == 0 { entry.revision } else { record.term },
        acquired_at: format_time(record.acquired_at),
        renewed_at: format_time(renewed),
        lease_ms: record.lease_ms,
        revision: entry.revision,
        term_recorded: record.term != 0,
    }))
}

/// `12.3s`, `4m 05s`, `2h 10m`, `3d 4h` before `now`.
fn ago(then: &str, now: DateTime<Utc>) -> String {
    let Ok(then) = DateTime::parse_from_rfc3339(then) else { return "?".into() };
    let ms = (now - then.with_timezone(&Utc)).num_milliseconds().max(0);
    let s = ms / 1000;
    match s {
        0..60 => format!("{:.1}s ago", ms as f64 / 1000.0),
        60..3600 => format!("{}m {:02}s ago", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m ago", s / 3600, s / 60 % 60),
        _ => format!("{}d {}h ago", s / 86_400, s / 3600 % 24),
    }
}

pub(crate) async fn status(
    client: &async_nats::Client,
    names: &Names,
    json_out: bool,
) -> Result<(), Failure> {
    let js = jetstream::new(client.clone());
    let wait = Duration::from_millis(500);

    let mut replicas = BTreeMap::new();
    for role in ROLES {
        let found = presence::ping(client, &names.presence_service(role), wait).await?;
        let mut instances: Vec<String> = found
            .iter()
            .map(|r| r.metadata.get("instance").cloned().unwrap_or_else(|| r.id.clone()))
            .collect();
        instances.sort();
        replicas.insert(role, instances);
    }

    let mut queues = Vec::new();
    let mut lanes = Vec::new();
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
    let mut partitions = None;
    for name in stream_names {
        let mut stream = match js.get_stream(&name).await {
            Ok(stream) => stream,
            Err(error) => {
                streams.push(StreamView::Missing { stream: name, error: error.to_string() });
                continue;
            }
        };
        let info = stream.info().await.with_context(|| format!("{name} info"))?.clone();
        if name == names.dlq_stream() {
            dead_letters = Some(info.state.messages);
        }
        if name == names.dispatch_stream() {
            partitions = info.config.metadata.get(partition::METADATA_KEY).and_then(|n| n.parse().ok());
            let mut consumers = stream.consumers();
            while let Some(consumer) = consumers.next().await {
                let consumer = consumer.context("list dispatch consumers")?;
                if let Some((queue, priority)) = names.lane_of_worker_consumer(&consumer.name) {
                    lanes.push(Lane { queue: queue.to_string(), priority, pending: consumer.num_pending });
                }
                queues.push(Queue {
                    consumer: consumer.name,
                    pending: consumer.num_pending,
                    ack_pending: consumer.num_ack_pending,
                    redelivered: consumer.num_redelivered,
                    waiting_pulls: consumer.num_waiting,
                });
            }
        }
        streams.push(StreamView::Found {
            stream: name,
            messages: info.state.messages,
            bytes: info.state.bytes,
            consumers: info.state.consumer_count,
            replicas: info.config.num_replicas,
        });
    }
    // The lease last (the pings above take a while), so its renewal time is as fresh as it gets.
    let leader = leader(&js, names).await?;
    let read_at = Utc::now();
    lanes.sort_by(|a: &Lane, b: &Lane| (&a.queue, a.priority).cmp(&(&b.queue, b.priority)));
    let report = Status { leader, partitions, replicas, queues, lanes, dead_letters, streams };
    if json_out {
        output::pretty(&serde_json::to_value(&report).context("encode the status")?);
    } else {
        print_status(&report, read_at);
    }
    match report.unhealthy().as_slice() {
        [] => Ok(()),
        problems => Err(Failure::Reported(format!("unhealthy: {}", problems.join("; ")))),
    }
}

impl Status {
    /// What keeps the system from firing and recording runs: no leader, no registry, a stream
    /// missing. (No worker is not among them: a queue may be scaled to zero on purpose.)
    fn unhealthy(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.leader.is_none() {
            problems.push("no scheduler holds the lease".to_string());
        }
        if self.replicas.get("registry").is_none_or(Vec::is_empty) {
            problems.push("no registry answers".to_string());
        }
        for stream in &self.streams {
            if let StreamView::Missing { stream, .. } = stream {
                problems.push(format!("stream {stream} is missing"));
            }
        }
        problems
    }
}

fn print_status(report: &Status, now: DateTime<Utc>) {
    let line = |label: &str, text: String| outln!("{:<LABEL$}{text}", format!("{label}:"));
    match &report.leader {
        None => line("leader", "NONE (no scheduler holds the lease)".into()),
        Some(l) if !l.term_recorded => line(
            "leader",
            format!("{} (term {}, since {}, lease {} ms)", l.instance, l.term, l.acquired_at, l.lease_ms),
        ),
        Some(l) => {
            line("leader", format!("{} (term {}, lease {} ms)", l.instance, l.term, l.lease_ms));
            line("acquired", format!("{} ({})", l.acquired_at, ago(&l.acquired_at, now)));
            line("renewed", format!("{} ({})", l.renewed_at, ago(&l.renewed_at, now)));
        }
    }
    let partitions =
        report.partitions.map_or("? (not recorded)".into(), |n| format!("{n} (one lease for all)"));
    line("partitions", partitions);
    for role in ROLES {
        let instances = report.replicas.get(role).map(Vec::as_slice).unwrap_or_default();
        let list = if instances.is_empty() { String::new() } else { format!(" ({})", instances.join(", ")) };
        line(&output::plural(role), format!("{}{list}", instances.len()));
    }
    line("dead letters", report.dead_letters.map_or("?".into(), |n| n.to_string()));
    outln!();
    let rows: Vec<Vec<String>> = report
        .queues
        .iter()
        .map(|q| {
            let numbers = [q.pending, q.ack_pending as u64, q.redelivered as u64, q.waiting_pulls as u64];
            std::iter::once(q.consumer.clone()).chain(numbers.map(|n| n.to_string())).collect()
        })
        .collect();
    output::table(&["QUEUE CONSUMER", "PENDING", "ACK PENDING", "REDELIVERED", "WAITING PULLS"], &rows);
    outln!();
    let rows: Vec<Vec<String>> = report
        .lanes
        .iter()
        .map(|l| vec![l.queue.clone(), l.priority.to_string(), l.pending.to_string()])
        .collect();
    output::table(&["QUEUE", "PRIORITY", "PENDING"], &rows);
    outln!();
    let rows: Vec<Vec<String>> = report
        .streams
        .iter()
        .map(|s| match s {
            StreamView::Found { stream, messages, bytes, consumers, replicas } => vec![
                stream.clone(),
                messages.to_string(),
                bytes.to_string(),
                consumers.to_string(),
                replicas.to_string(),
            ],
            StreamView::Missing { stream, error } => vec![stream.clone(), format!("({error})")],
        })
        .collect();
    output::table(&["STREAM", "MESSAGES", "BYTES", "CONSUMERS", "REPLICAS"], &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z").unwrap().with_timezone(&Utc);
        assert_eq!(ago("2026-01-01T11:59:58.700Z", now), "1.3s ago");
        assert_eq!(ago("2026-01-01T11:55:55.000Z", now), "4m 05s ago");
        assert_eq!(ago("2026-01-01T09:50:00.000Z", now), "2h 10m ago");
        assert_eq!(ago("2025-12-29T08:00:00.000Z", now), "3d 4h ago");
        assert_eq!(ago("not a time", now), "?");
    }
}
