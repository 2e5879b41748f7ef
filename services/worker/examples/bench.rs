//! End-to-end throughput of no-op runs (embedded no-op handler) with 1, 2 and 4 in-process
//! worker replicas, against raw JetStream publish + pull + ack of the same number of messages,
//! measured in the same run against the same server.
//!
//! `cargo run --release -p jetsched-worker --example bench -- --nats-url nats://127.0.0.1:4222`
//! (a scratch server: it creates streams under the prefixes `benchraw` and `bench<n>`).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, AckKind, message::PublishMessage, stream};
use clap::Parser;
use futures::StreamExt;
use jetsched_shared::names::{self, Names};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{Dispatch, Trigger, scheduled_execution_id};
use jetsched_worker::{Config, Handlers, Outcome, RunContext, RunEvents, RunRecords, build};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Runs per measurement.
    #[arg(long, default_value_t = 20_000)]
    runs: i64,
    /// Worker replica counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    workers: Vec<usize>,
    /// Concurrency of each worker replica.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Run events the workers publish: all, outcomes, failures.
    #[arg(long, value_enum, default_value_t = RunEvents::All)]
    run_events: RunEvents,
    /// When run records are written: eager, lazy.
    #[arg(long, value_enum, default_value_t = RunRecords::Eager)]
    run_records: RunRecords,
    /// Pid of the `nats-server` process (same machine): adds its CPU time per message.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Publish window (unacknowledged publishes in flight).
    #[arg(long, default_value_t = 256)]
    window: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = async_nats::connect(&args.nats_url).await.context("connect")?;
    let js = jetstream::new(client.clone());
    println!(
        "runs per measurement: {}, run events: {:?}, run records: {:?}",
        args.runs, args.run_events, args.run_records
    );
    let messages = dispatches(args.runs)?;
    let before = Cpu::now(args.server_pid);
    let raw = raw(&js, &args, &messages).await?;
    let cpu = Cpu::now(args.server_pid).since(&before, args.runs);
    println!("raw publish + pull + ack: {:>8.0} msg/s ({:.3} µs/msg){cpu}", raw, 1e6 / raw);
    let before = Cpu::now(args.server_pid);
    let floor = raw_with_records(&js, &args, &messages).await?;
    let cpu = Cpu::now(args.server_pid).since(&before, args.runs);
    println!(
        "raw + record read and create per message: {:>8.0} msg/s = {:>5.1}% of raw ({:.3} µs/msg){cpu}",
        floor,
        100.0 * floor / raw,
        1e6 / floor
    );
    for &n in &args.workers {
        let before = Cpu::now(args.server_pid);
        let rate = workers(&js, &args, n, &messages).await?;
        let cpu = Cpu::now(args.server_pid).since(&before, args.runs);
        println!(
            "{n} worker(s): {:>8.0} runs/s = {:>5.1}% of raw ({:.1} µs/run, overhead {:.1} µs/run){cpu}",
            rate,
            100.0 * rate / raw,
            1e6 / rate,
            1e6 / rate - 1e6 / raw
        );
    }
    Ok(())
}

/// Publishes the same dispatch messages as the worker phases (same bytes, same message ids,
/// same window) while one pull consumer acks them.
async fn raw(
    js: &jetstream::Context,
    args: &Args,
    messages: &[(bytes::Bytes, String)],
) -> anyhow::Result<f64> {
    let name = "BENCHRAW";
    let _ = js.delete_stream(name).await;
    let stream = js
        .create_stream(stream::Config {
            name: name.to_string(),
            subjects: vec!["benchraw.>".to_string()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("raw".to_string()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 10_000,
            ..Default::default()
        })
        .await?;
    let runs = args.runs;
    let started = Instant::now();
    let consume = tokio::spawn(async move {
        let mut messages = consumer.stream().max_messages_per_batch(args_batch()).messages().await?;
        let mut acked = 0;
        while acked < runs {
            let Some(message) = messages.next().await else { break };
            message
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .ack_with(AckKind::Ack)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            acked += 1;
        }
        anyhow::Ok(())
    });
    let mut pending = std::collections::VecDeque::new();
    for (payload, msg_id) in messages {
        let message = PublishMessage::build().payload(payload.clone()).message_id(msg_id.as_str());
        pending.push_back(js.send_publish("benchraw.q.bench.noop", message).await?);
        if pending.len() >= args.window
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    consume.await??;
    let elapsed = started.elapsed();
    js.delete_stream(name).await?;
    Ok(runs as f64 / elapsed.as_secs_f64())
}

/// CPU seconds (user + system) used so far by this process and by the server, read from
/// `/proc/<pid>/stat` (Linux; clock ticks of 10 ms).
struct Cpu {
    bench: Option<f64>,
    server: Option<f64>,
}

impl Cpu {
    fn now(server_pid: Option<u32>) -> Cpu {
        let read = |pid: &str| -> Option<f64> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        };
        Cpu { bench: read("self"), server: server_pid.and_then(|pid| read(&pid.to_string())) }
    }

    /// CPU µs per message since `before`, as a suffix for the report line.
    fn since(&self, before: &Cpu, messages: i64) -> String {
        let per = |now: Option<f64>, then: Option<f64>| {
            now.zip(then).map(|(now, then)| (now - then) * 1e6 / messages as f64)
        };
        let mut text = String::new();
        if let Some(server) = per(self.server, before.server) {
            text.push_str(&format!("; server CPU {server:.1} µs/msg"));
        }
        if let Some(bench) = per(self.bench, before.bench) {
            text.push_str(&format!("; client CPU {bench:.1} µs/msg"));
        }
        text
    }
}

/// The JetStream floor of the fast configuration: as [`raw`], plus, per message and with
/// `concurrency` messages in flight, the two run-record operations the redelivery guarantee
/// needs (a direct read of the key, then a create) before the ack.
async fn raw_with_records(
    js: &jetstream::Context,
    args: &Args,
    messages: &[(bytes::Bytes, String)],
) -> anyhow::Result<f64> {
    let name = "BENCHRAWREC";
    let bucket = "BENCHRAWREC_RUNS";
    let _ = js.delete_stream(name).await;
    let _ = js.delete_key_value(bucket).await;
    let kv = js
        .create_key_value(jetstream::kv::Config {
            bucket: bucket.to_string(),
            history: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..Default::default()
        })
        .await?;
    let stream = js
        .create_stream(stream::Config {
            name: name.to_string(),
            subjects: vec!["benchrawrec.>".to_string()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("raw".to_string()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 10_000,
            ..Default::default()
        })
        .await?;
    let runs = args.runs;
    let concurrency = args.concurrency;
    let record = bytes::Bytes::from(vec![b'r'; 400]);
    let started = Instant::now();
    let consume = tokio::spawn(async move {
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
        let tasks = tokio_util::task::TaskTracker::new();
        let mut messages = consumer.stream().max_messages_per_batch(concurrency).messages().await?;
        for n in 0..runs {
            let permit = permits.clone().acquire_owned().await?;
            let Some(message) = messages.next().await else { break };
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            let (kv, record) = (kv.clone(), record.clone());
            tasks.spawn(async move {
                let _permit = permit;
                let result = async {
                    let key = format!("run{n}");
                    let found = kv.entry(key.as_str()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    anyhow::ensure!(found.is_none(), "fresh key");
                    kv.create(key.as_str(), record).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    message.ack_with(AckKind::Ack).await.map_err(|e| anyhow::anyhow!("{e}"))
                }
                .await;
                if let Err(error) = result {
                    eprintln!("raw + record: {error:#}");
                }
            });
        }
        tasks.close();
        tasks.wait().await;
        anyhow::Ok(())
    });
    let mut pending = std::collections::VecDeque::new();
    for (payload, msg_id) in messages {
        let message = PublishMessage::build().payload(payload.clone()).message_id(msg_id.as_str());
        pending.push_back(js.send_publish("benchrawrec.q.bench.noop", message).await?);
        if pending.len() >= args.window
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    consume.await??;
    let elapsed = started.elapsed();
    js.delete_stream(name).await?;
    js.delete_key_value(bucket).await?;
    Ok(runs as f64 / elapsed.as_secs_f64())
}

fn args_batch() -> usize {
    256
}

fn noop_spec() -> anyhow::Result<TaskSpec> {
    TaskSpec::parse(
        br#"{"id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"}}"#,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The dispatch payloads and message ids of `runs` fires, built once outside the timings.
fn dispatches(runs: i64) -> anyhow::Result<Vec<(bytes::Bytes, String)>> {
    let spec = noop_spec()?;
    (0..runs)
        .map(|nominal| {
            let dispatch = Dispatch {
                execution_id: scheduled_execution_id("bench", "noop", nominal),
                namespace: spec.namespace.clone(),
                task_id: spec.id.clone(),
                nominal_time: chrono::DateTime::from_timestamp_millis(nominal).context("time")?,
                trigger: Trigger::Schedule,
                term: 1,
                revision: 1,
                spec: spec.clone(),
            };
            Ok((serde_json::to_vec(&dispatch)?.into(), names::dispatch_msg_id("bench", "noop", nominal)))
        })
        .collect()
}

/// Starts `n` in-process workers with a no-op handler and times `runs` dispatches end to end.
async fn workers(
    js: &jetstream::Context,
    args: &Args,
    n: usize,
    messages: &[(bytes::Bytes, String)],
) -> anyhow::Result<f64> {
    let prefix = format!("bench{n}");
    let names = Names::new(&prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    for stream in [names.dispatch_stream(), names.dlq_stream(), names.events_stream()] {
        let _ = js.delete_stream(stream).await;
    }
    let _ = js.delete_key_value(names.runs_bucket()).await;
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for i in 0..n {
        let mut config = Config::for_tests(&args.nats_url, &format!("bench-{i}"));
        config.common.prefix = prefix.clone();
        config.concurrency = args.concurrency;
        config.run_events = args.run_events;
        config.run_records = args.run_records;
        let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
        let worker = build(config, handlers).await?;
        handles.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let spec = noop_spec()?;
    let subject = names.dispatch_subject(&spec.queue, &spec.namespace, &spec.id);
    let started = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    for (payload, msg_id) in messages {
        let message = PublishMessage::build().payload(payload.clone()).message_id(msg_id.as_str());
        pending.push_back(js.send_publish(subject.clone(), message).await?);
        if pending.len() >= args.window
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    loop {
        if stream.info().await?.state.messages == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    Ok(args.runs as f64 / elapsed.as_secs_f64())
}
