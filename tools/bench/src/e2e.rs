//! End-to-end no-op runs, from dispatch published to run acked, with 1, 2, 4 in-process worker
//! replicas (embedded no-op handler), against raw JetStream on the same server in the same run:
//!
//! - raw: publish + pull + ack of the same dispatch messages (same bytes, same `Nats-Msg-Id`s,
//!   same publish window);
//! - ceiling: raw plus one run-record create per message before the ack, with the workers'
//!   concurrency: what any worker that stores a record per run can at most reach;
//! - floor: raw plus the two run-record operations the redelivery guarantee needs per message
//!   (read the key, create it) before the ack, with the workers' concurrency;
//! - ceiling with an event: the ceiling plus one event stored per message (published before the
//!   ack, its acknowledgement awaited after it): what any worker that also stores a
//!   `run.succeeded` event per run, as the default settings do, can at most reach.
//!
//! Every phase gets fresh streams; the dispatch bodies are built once, outside the timings.
//! CPU time per message of this process (client and workers) and of the server comes from
//! `/proc` (Linux); the messages the server received and sent per run, from its `/varz`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::pull, message::PublishMessage};
use bytes::Bytes;
use futures::StreamExt;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use jetsched_worker::{Config, Handlers, Outcome, RunContext, RunEvents, RunRecords, build};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::args::{Defaults, Rounds, Runs};
use crate::stats::median;
use crate::system::cpu_seconds;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) runs: Runs<Args>,
    /// Worker replica counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) workers: Vec<usize>,
    /// Concurrency of each worker replica (and of the floor phase).
    #[arg(long, default_value_t = 64)]
    pub(crate) concurrency: usize,
    /// Run events the workers publish: all, outcomes, failures.
    #[arg(long, value_enum, default_value_t = RunEvents::All)]
    pub(crate) run_events: RunEvents,
    /// When run records are written: deferred, eager, lazy.
    #[arg(long, value_enum, default_value_t = RunRecords::Deferred)]
    pub(crate) run_records: RunRecords,
    // Each round measures every phase: with more than one, each ratio is taken within its
    // round and the median is reported beside every round's share of the ceiling (the
    // machine's speed drifts between phases more than a change moves it).
    #[command(flatten)]
    pub(crate) rounds: Rounds<Args>,
}

impl Defaults for Args {
    const RUNS: &'static str = "20000";
    const ROUNDS: &'static str = "1";
}

impl Args {
    /// The default settings with `runs` runs and `workers` replica counts.
    pub(crate) fn sized(runs: usize, workers: Vec<usize>) -> Args {
        Args {
            runs: Runs::new(runs),
            workers,
            concurrency: 64,
            run_events: RunEvents::All,
            run_records: RunRecords::Deferred,
            rounds: Rounds::new(1),
        }
    }
}

/// Unacknowledged publishes in flight, in every phase.
const WINDOW: usize = 256;

/// One dispatch message as the scheduler builds it: body, message id and headers.
pub(crate) type Prepared = PublishMessage;

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let messages = dispatches(args.runs.runs)?;
    let mut rounds = Vec::new();
    for round in 1..=args.rounds.rounds.max(1) {
        if args.rounds.rounds > 1 {
            eprintln!("e2e: round {round} of {}", args.rounds.rounds);
        }
        rounds.push(one_round(&js, &server, &args, &messages).await?);
    }
    let mut report = json!({
        "scenario": "e2e",
        "runs": args.runs.runs,
        "concurrency": args.concurrency,
        "run_events": format!("{:?}", args.run_events).to_lowercase(),
        "run_records": format!("{:?}", args.run_records).to_lowercase(),
    });
    if let [only] = rounds.as_slice() {
        merge(&mut report, only);
        return Ok(report);
    }
    let summary = summarize(&rounds);
    let percent = |value: &serde_json::Value| 100.0 * value.as_f64().unwrap_or(f64::NAN);
    let each = |values: &serde_json::Value| {
        let rounds = values.as_array().into_iter().flatten();
        rounds.map(|r| format!("{:.1}%", percent(r))).collect::<Vec<_>>().join(", ")
    };
    for row in summary["replicas"].as_array().into_iter().flatten() {
        eprintln!(
            "e2e: {} worker(s), median of {} rounds: {:.1}% of the ceiling (rounds: {}), {:.1}% of the ceiling with an event (rounds: {}), {:.1}% of raw",
            row["workers"],
            rounds.len(),
            percent(&row["ratio_to_ceiling"]),
            each(&row["ratios_to_ceiling"]),
            percent(&row["ratio_to_event_ceiling"]),
            each(&row["ratios_to_event_ceiling"]),
            percent(&row["ratio_to_raw"]),
        );
    }
    merge(&mut report, &summary);
    report["rounds"] = serde_json::Value::Array(rounds);
    Ok(report)
}

/// One measurement of every phase: raw, ceiling, floor, then the workers for each replica
/// count, each ratio to the phases of this same round.
async fn one_round(
    js: &jetstream::Context,
    server: &NatsServer,
    args: &Args,
    messages: &[Prepared],
) -> anyhow::Result<serde_json::Value> {
    let (raw, raw_cpu) = phase(js, server, messages, Records::None).await?;
    eprintln!("e2e: {}: {raw:.0} msg/s{raw_cpu}", Records::None.label());
    let (ceiling_records, floor_records, event_records) = (
        Records::Create(args.concurrency),
        Records::ReadCreate(args.concurrency),
        Records::CreateEvent(args.concurrency),
    );
    let (ceiling, ceiling_cpu) = phase(js, server, messages, ceiling_records).await?;
    let (floor, floor_cpu) = phase(js, server, messages, floor_records).await?;
    let (event_ceiling, event_cpu) = phase(js, server, messages, event_records).await?;
    for (records, rate, cpu) in [
        (ceiling_records, ceiling, &ceiling_cpu),
        (floor_records, floor, &floor_cpu),
        (event_records, event_ceiling, &event_cpu),
    ] {
        eprintln!("e2e: {}: {rate:.0} msg/s = {:.1}% of raw{cpu}", records.label(), 100.0 * rate / raw);
    }

    let mut rows = Vec::new();
    for &n in &args.workers {
        let cpu = Cpu::now(server).await;
        let rate = workers(js, &server.url(), args, n, messages).await?;
        let used = Cpu::now(server).await.since(&cpu, args.runs.runs);
        let overhead_us = 1e6 / rate - 1e6 / raw;
        eprintln!(
            "e2e: {n} worker(s): {rate:.0} runs/s = {:.1}% of raw, {:.1}% of the ceiling, {:.1}% of the floor, {:.1}% of the ceiling with an event (overhead {overhead_us:.1} µs/run){used}",
            100.0 * rate / raw,
            100.0 * rate / ceiling,
            100.0 * rate / floor,
            100.0 * rate / event_ceiling,
        );
        rows.push(json!({
            "workers": n,
            "runs_per_second": rate,
            "ratio_to_raw": rate / raw,
            "ratio_to_ceiling": rate / ceiling,
            "ratio_to_floor": rate / floor,
            "ratio_to_event_ceiling": rate / event_ceiling,
            "overhead_us_per_run": overhead_us,
            "cpu_us_per_run": used.json(),
        }));
    }
    Ok(json!({
        "raw_per_second": raw,
        "raw_cpu_us_per_message": raw_cpu.json(),
        "ceiling_per_second": ceiling,
        "ceiling_ratio_to_raw": ceiling / raw,
        "ceiling_cpu_us_per_message": ceiling_cpu.json(),
        "floor_per_second": floor,
        "floor_ratio_to_raw": floor / raw,
        "floor_cpu_us_per_message": floor_cpu.json(),
        "event_ceiling_per_second": event_ceiling,
        "event_ceiling_ratio_to_raw": event_ceiling / raw,
        "event_ceiling_cpu_us_per_message": event_cpu.json(),
        "replicas": rows,
    }))
}

/// The medians of several rounds: each phase's rate, and per replica count its rate and its
/// ratios (each ratio taken within its round first), with every round's ratio to the ceiling.
fn summarize(rounds: &[serde_json::Value]) -> serde_json::Value {
    let median_of =
        |pointer: &str| median(rounds.iter().filter_map(|r| r.pointer(pointer)?.as_f64()).collect());
    let mut replicas = Vec::new();
    let first = rounds[0]["replicas"].as_array().cloned().unwrap_or_default();
    for (i, row) in first.iter().enumerate() {
        let field = |name: &str| -> Vec<f64> {
            rounds.iter().filter_map(|r| r["replicas"].get(i)?.get(name)?.as_f64()).collect()
        };
        let per_round = field("ratio_to_ceiling");
        replicas.push(json!({
            "workers": row["workers"],
            "runs_per_second": median(field("runs_per_second")),
            "ratio_to_raw": median(field("ratio_to_raw")),
            "ratio_to_ceiling": median(per_round.clone()),
            "ratio_to_floor": median(field("ratio_to_floor")),
            "ratio_to_event_ceiling": median(field("ratio_to_event_ceiling")),
            "ratios_to_ceiling": per_round,
            "ratios_to_event_ceiling": field("ratio_to_event_ceiling"),
        }));
    }
    json!({
        "raw_per_second": median_of("/raw_per_second"),
        "ceiling_per_second": median_of("/ceiling_per_second"),
        "ceiling_ratio_to_raw": median_of("/ceiling_ratio_to_raw"),
        "floor_per_second": median_of("/floor_per_second"),
        "floor_ratio_to_raw": median_of("/floor_ratio_to_raw"),
        "event_ceiling_per_second": median_of("/event_ceiling_per_second"),
        "event_ceiling_ratio_to_raw": median_of("/event_ceiling_ratio_to_raw"),
        "replicas": replicas,
    })
}

/// Copies the fields of `from` (an object) into `into` (an object).
fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
    if let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) {
        into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

pub(crate) fn noop_spec() -> anyhow::Result<TaskSpec> {
    TaskSpec::parse(
        br#"{"id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"}}"#,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The dispatch messages of `runs` fires, built by the scheduler's builder (spec included).
fn dispatches(runs: usize) -> anyhow::Result<Vec<Prepared>> {
    dispatches_from(0, runs)
}

/// The dispatch messages of `runs` fires of nominal times `first_ms`, `first_ms + 1`, ...
pub(crate) fn dispatches_from(first_ms: i64, runs: usize) -> anyhow::Result<Vec<Prepared>> {
    let spec = noop_spec()?;
    let names = Names::default();
    (first_ms..first_ms + runs as i64)
        .map(|nominal_ms| {
            let origin = Origin::Scheduled { nominal_ms, term: 1, catchup: false };
            Ok(dispatch::build(&names, Target::of(&spec, 1), origin, SpecBody::Spec(&spec))?.message)
        })
        .collect()
}

/// Publishes `messages` to `subject` with their ids, `WINDOW` in flight.
pub(crate) async fn publish_all(
    js: &jetstream::Context,
    subject: &str,
    messages: &[Prepared],
) -> anyhow::Result<()> {
    let mut pending = std::collections::VecDeque::with_capacity(WINDOW);
    for message in messages {
        pending.push_back(js.send_publish(subject.to_string(), message.clone()).await?);
        if pending.len() >= WINDOW
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    Ok(())
}

/// What the raw pipeline does with each message's run-record key before the ack.
#[derive(Clone, Copy)]
enum Records {
    /// Nothing: publish + pull + ack.
    None,
    /// Create it, `concurrency` messages at a time: the ceiling of a worker storing records.
    Create(usize),
    /// Read it, then create it, `concurrency` messages at a time: the floor of what a worker
    /// must do to recognise a redelivery.
    ReadCreate(usize),
    /// Create it and store an event, `concurrency` messages at a time: the ceiling of a worker
    /// storing a record and an outcome event per run.
    CreateEvent(usize),
}

impl Records {
    fn concurrency(self) -> Option<usize> {
        match self {
            Records::None => None,
            Records::Create(n) | Records::ReadCreate(n) | Records::CreateEvent(n) => Some(n),
        }
    }

    /// The phase's stream name.
    fn stream(self) -> &'static str {
        match self {
            Records::None => "BENCHRAW",
            Records::Create(_) => "BENCHCEILING",
            Records::ReadCreate(_) => "BENCHFLOOR",
            Records::CreateEvent(_) => "BENCHEVENTCEILING",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Records::None => "raw publish + pull + ack",
            Records::Create(_) => "ceiling (raw + run record create)",
            Records::ReadCreate(_) => "floor (raw + run record read and create)",
            Records::CreateEvent(_) => "ceiling with an event (ceiling + one event stored)",
        }
    }
}

/// One raw phase ([`queue`]): its rate and the CPU per message it took.
async fn phase(
    js: &jetstream::Context,
    server: &NatsServer,
    messages: &[Prepared],
    records: Records,
) -> anyhow::Result<(f64, CpuPer)> {
    let cpu = Cpu::now(server).await;
    let rate = queue(js, messages, records).await?;
    Ok((rate, Cpu::now(server).await.since(&cpu, messages.len())))
}

/// Raw JetStream: a work-queue stream, one pull consumer acking every message, with
/// `records` done per message before its ack.
async fn queue(js: &jetstream::Context, messages: &[Prepared], records: Records) -> anyhow::Result<f64> {
    let read = matches!(records, Records::ReadCreate(_));
    let event = matches!(records, Records::CreateEvent(_));
    let name = records.stream();
    let records = records.concurrency();
    let bucket = format!("{name}_RUNS");
    let _ = js.delete_stream(name).await;
    let _ = js.delete_key_value(&bucket).await;
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.to_string(),
            subjects: vec![format!("{}.>", name.to_lowercase())],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("raw".to_string()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 10_000,
            ..Default::default()
        })
        .await?;
    // Shared, not cloned per message: a store's clone copies its stream's info.
    let kv = match records {
        Some(_) => Some(Arc::new(
            js.create_key_value(jetstream::kv::Config {
                bucket: bucket.clone(),
                history: 1,
                max_age: Duration::from_secs(7 * 24 * 3600),
                ..Default::default()
            })
            .await?,
        )),
        None => None,
    };
    let events = format!("{name}_EVENTS");
    if event {
        let _ = js.delete_stream(&events).await;
        js.create_stream(jetstream::stream::Config {
            name: events.clone(),
            subjects: vec![format!("{}.>", events.to_lowercase())],
            ..Default::default()
        })
        .await?;
    }
    let event_subject = format!("{}.run.succeeded", events.to_lowercase());
    let runs = messages.len();
    let started = Instant::now();
    let events_js = js.clone();
    let consume = tokio::spawn(async move {
        let batch = records.unwrap_or(256);
        let mut pulled = consumer.stream().max_messages_per_batch(batch).messages().await?;
        let permits = Arc::new(tokio::sync::Semaphore::new(records.unwrap_or(1)));
        let tasks = TaskTracker::new();
        let record = Bytes::from(vec![b'r'; 400]);
        for n in 0..runs {
            let Some(message) = pulled.next().await else { break };
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            let Some(kv) = kv.clone() else {
                message.ack_with(AckKind::Ack).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                continue;
            };
            let permit = permits.clone().acquire_owned().await?;
            let record = record.clone();
            let (js, event_subject) = (events_js.clone(), event_subject.clone());
            tasks.spawn(async move {
                let _permit = permit;
                let result = async {
                    let key = format!("run{n}");
                    if read {
                        let found = kv.entry(key.as_str()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                        anyhow::ensure!(found.is_none(), "fresh key");
                    }
                    kv.create(key.as_str(), record.clone()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    let stored = match event {
                        true => Some(js.publish(event_subject, record).await?),
                        false => None,
                    };
                    message.ack_with(AckKind::Ack).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    if let Some(stored) = stored {
                        stored.await?;
                    }
                    anyhow::Ok(())
                }
                .await;
                if let Err(error) = result {
                    eprintln!("e2e {name}: {error:#}");
                }
            });
        }
        tasks.close();
        tasks.wait().await;
        anyhow::Ok(())
    });
    publish_all(js, &format!("{}.q.bench.noop", name.to_lowercase()), messages).await?;
    consume.await??;
    let elapsed = started.elapsed();
    js.delete_stream(name).await?;
    if records.is_some() {
        js.delete_key_value(&bucket).await?;
    }
    if event {
        js.delete_stream(&events).await?;
    }
    Ok(runs as f64 / elapsed.as_secs_f64())
}

/// Starts `n` in-process workers with a no-op handler, publishes the dispatches and waits
/// until the dispatch stream is empty (every run acked).
async fn workers(
    js: &jetstream::Context,
    url: &str,
    args: &Args,
    n: usize,
    messages: &[Prepared],
) -> anyhow::Result<f64> {
    let prefix = format!("bench{n}");
    let names = Names::new(&prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for i in 0..n {
        let mut config = Config::for_tests(url, &format!("bench-{i}"));
        config.shared.common.prefix = prefix.clone();
        config.concurrency = args.concurrency;
        config.run_events = args.run_events;
        config.run_records = args.run_records;
        let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
        let worker = build(config, handlers).await?;
        handles.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let elapsed = run_through(js, &names, messages).await?;
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    for stream in [names.dispatch_stream(), names.dlq_stream(), names.events_stream()] {
        let _ = js.delete_stream(stream).await;
    }
    let _ = js.delete_key_value(names.runs_bucket()).await;
    Ok(messages.len() as f64 / elapsed.as_secs_f64())
}

/// Publishes the no-op dispatches `messages` on `names`' dispatch subject and waits until
/// the dispatch stream is empty (every run acked); how long that took.
pub(crate) async fn run_through(
    js: &jetstream::Context,
    names: &Names,
    messages: &[Prepared],
) -> anyhow::Result<Duration> {
    let spec = noop_spec()?;
    let subject = names.dispatch_subject(&spec.queue, &spec.namespace, &spec.id);
    let started = Instant::now();
    publish_all(js, &subject, messages).await?;
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    let deadline = Instant::now() + drain_limit(messages.len());
    while stream.info().await?.state.messages > 0 {
        if Instant::now() > deadline {
            bail!("the workers did not drain {} runs in time", messages.len());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(started.elapsed())
}

/// How long `runs` runs may take to drain.
pub(crate) fn drain_limit(runs: usize) -> Duration {
    Duration::from_secs(120 + runs as u64 / 500)
}

/// CPU seconds used so far by this process and by the server ([`cpu_seconds`]), and the
/// messages the server received and sent so far (its `/varz`).
pub(crate) struct Cpu {
    bench: Option<f64>,
    server: Option<f64>,
    server_in: Option<f64>,
    server_out: Option<f64>,
}

/// CPU µs per message of a phase, and server messages in and out per message.
pub(crate) struct CpuPer {
    bench: Option<f64>,
    server: Option<f64>,
    server_in: Option<f64>,
    server_out: Option<f64>,
}

impl Cpu {
    pub(crate) async fn now(server: &NatsServer) -> Cpu {
        let varz = server.monitor_json("/varz").await.ok();
        let count = |field: &str| varz.as_ref().and_then(|varz| varz[field].as_f64());
        Cpu {
            bench: cpu_seconds("self"),
            server: server.pid().and_then(|pid| cpu_seconds(&pid.to_string())),
            server_in: count("in_msgs"),
            server_out: count("out_msgs"),
        }
    }

    pub(crate) fn since(&self, before: &Cpu, messages: usize) -> CpuPer {
        let per = |now: Option<f64>, then: Option<f64>, unit: f64| {
            now.zip(then).map(|(now, then)| (now - then) * unit / messages as f64)
        };
        CpuPer {
            bench: per(self.bench, before.bench, 1e6),
            server: per(self.server, before.server, 1e6),
            server_in: per(self.server_in, before.server_in, 1.0),
            server_out: per(self.server_out, before.server_out, 1.0),
        }
    }
}

impl CpuPer {
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({"server": self.server, "client": self.bench, "server_msgs_in": self.server_in, "server_msgs_out": self.server_out})
    }
}

impl std::fmt::Display for CpuPer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(server) = self.server {
            write!(f, "; server CPU {server:.1} µs/msg")?;
        }
        if let Some(bench) = self.bench {
            write!(f, "; client CPU {bench:.1} µs/msg")?;
        }
        if let Some((received, sent)) = self.server_in.zip(self.server_out) {
            write!(f, "; server msgs in/out {received:.2}/{sent:.2} per msg")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ceiling: f64, rate: f64) -> serde_json::Value {
        json!({
            "raw_per_second": 2.0 * ceiling,
            "ceiling_per_second": ceiling,
            "ceiling_ratio_to_raw": 0.5,
            "floor_per_second": 0.8 * ceiling,
            "floor_ratio_to_raw": 0.4,
            "replicas": [{
                "workers": 4,
                "runs_per_second": rate,
                "ratio_to_raw": rate / (2.0 * ceiling),
                "ratio_to_ceiling": rate / ceiling,
                "ratio_to_floor": rate / (0.8 * ceiling),
            }],
        })
    }

    #[test]
    fn rounds_are_summarized_by_the_median_of_their_own_ratios() {
        // A slow round (the machine busy in both phases) keeps its ratio; the median of the
        // ratios is not the ratio of the medians.
        let rounds = [round(20_000.0, 14_000.0), round(10_000.0, 8_000.0), round(30_000.0, 18_000.0)];
        let summary = summarize(&rounds);
        let row = &summary["replicas"][0];
        assert_eq!(row["workers"], 4);
        assert_eq!(row["ratio_to_ceiling"].as_f64(), Some(0.7));
        assert_eq!(row["runs_per_second"].as_f64(), Some(14_000.0));
        assert_eq!(row["ratios_to_ceiling"], json!([0.7, 0.8, 0.6]));
        assert_eq!(summary["ceiling_per_second"].as_f64(), Some(20_000.0));
    }
}
