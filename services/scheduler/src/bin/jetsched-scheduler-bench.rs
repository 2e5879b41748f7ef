//! Load generator for the scheduler against a running nats-server: burst (N tasks due in the
//! same second, against raw pipelined JetStream publishing with message ids in the same run),
//! steady (N tasks spread to a fire rate, lag percentiles) and scale (load time of N tasks
//! against a raw `watch_with_history`, resident memory) and handover (steady firing while the
//! leader shuts down gracefully and a warm follower takes over: fire lag around the handover).
//!
//! `nats-server -js -sd /tmp/bench -p 4333 &` then
//! `cargo run --release -p jetsched-scheduler --bin jetsched-scheduler-bench -- --nats-url nats://127.0.0.1:4333 burst --tasks 100000`.
//! Each run starts from empty streams and buckets under its own prefix.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::pull};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use jetsched_scheduler::{Config, build};
use jetsched_shared::config::{CommonArgs, NatsArgs};
use jetsched_shared::names::{Names, dispatch_msg_id, task_key};
use jetsched_shared::topology::{self, Topology, TopologyArgs};
use jetsched_shared::wire::{FireState, HDR_NOMINAL_TIME, format_time};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "jetsched-scheduler-bench")]
struct Args {
    #[arg(long = "nats-url", env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    url: String,
    /// Scheduler publish window.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Publish a fire.dispatched event per fire (off by default: measures dispatch alone).
    #[arg(long)]
    events: bool,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// N one-shot tasks due at the same second.
    Burst {
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
    },
    /// N periodic tasks spread so that `rate` fire per second; measure for `seconds`.
    Steady {
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
        #[arg(long, default_value_t = 1000)]
        rate: usize,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
    /// Steady firing of N tasks with N stored fire states; the leader stops gracefully after
    /// `seconds` and a follower (started earlier) takes over: lag of the fires around it.
    Handover {
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
        #[arg(long, default_value_t = 1000)]
        rate: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Cost of `TaskSpec::parse` alone (no NATS), for comparison with the load figures.
    Parse {
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
    },
    /// N registered tasks: load time against a raw watch, and resident memory.
    Scale {
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
        /// Reuse the tasks of a previous run (a fresh process measures resident memory alone).
        #[arg(long)]
        no_write: bool,
    },
}

const NS: &str = "bench";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Mode::Parse { tasks } = args.mode {
        let specs: Vec<Bytes> = (0..tasks)
            .map(|i| {
                let anchor = DateTime::from_timestamp_millis(i as i64).expect("anchor");
                spec(&format!("t{i}"), json!({"every": "1h", "anchor": format_time(anchor)}))
            })
            .collect();
        let started = Instant::now();
        for body in &specs {
            jetsched_shared::spec::TaskSpec::parse(body).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let elapsed = started.elapsed();
        println!(
            "parse: {tasks} specs in {elapsed:?} ({:.2} µs each)",
            elapsed.as_secs_f64() * 1e6 / tasks as f64
        );
        return Ok(());
    }
    let client = async_nats::connect(args.url.as_str()).await.context("connect")?;
    let js = jetstream::new(client.clone());
    match args.mode {
        Mode::Burst { tasks } => burst(&args.url, &js, args.window, args.events, tasks).await?,
        Mode::Steady { tasks, rate, seconds } => {
            steady(&args.url, &js, args.window, args.events, tasks, rate, seconds).await?
        }
        Mode::Handover { tasks, rate, seconds } => {
            handover(&args.url, &js, args.window, tasks, rate, seconds).await?
        }
        Mode::Parse { .. } => {}
        Mode::Scale { tasks, no_write } => scale(&args.url, &js, args.window, tasks, no_write).await?,
    }
    client.drain().await?;
    Ok(())
}

/// Deletes every stream and bucket of `prefix`, then creates them afresh.
async fn fresh(js: &jetstream::Context, prefix: &str) -> anyhow::Result<(Names, Topology)> {
    let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let args = TopologyArgs::default();
    for stream in topology::stream_configs(&names, &args) {
        let _ = js.delete_stream(&stream.name).await;
    }
    for bucket in topology::bucket_configs(&names, &args) {
        let _ = js.delete_key_value(&bucket.bucket).await;
    }
    let topology = topology::ensure(js, &names, &args).await?;
    Ok((names, topology))
}

fn config(url: &str, prefix: &str, window: usize, events: bool) -> Config {
    let mut config = Config::for_tests(url);
    config.nats = NatsArgs::plain(url);
    config.common = CommonArgs { prefix: prefix.to_string(), ..CommonArgs::for_tests("bench") };
    config.publish_window = window;
    config.fire_events = events;
    config
}

fn spec(id: &str, schedule: serde_json::Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "id": id, "namespace": NS, "schedule": schedule,
            "executor": {"kind": "nats", "subject": "bench.run"}, "misfire": "fire_all",
        }))
        .expect("json"),
    )
}

async fn write_tasks(topology: &Topology, specs: Vec<(String, Bytes)>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(specs)
        .map(|(id, body)| {
            let kv = topology.tasks.clone();
            async move { kv.put(task_key(NS, &id), body).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for result in results {
        result.context("put task")?;
    }
    Ok(started.elapsed())
}

async fn wait_leader(topology: &Topology, names: &Names) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = topology.leader.get(names.leader_key()).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no leader")
}

async fn dispatch_count(js: &jetstream::Context, names: &Names) -> anyhow::Result<u64> {
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    Ok(stream.info().await?.state.messages)
}

/// (nominal ms, stored-at ns) of every message in the dispatch stream.
async fn read_dispatch_times(js: &jetstream::Context, names: &Names) -> anyhow::Result<Vec<(i64, i128)>> {
    let stream = js.get_stream(names.dispatch_stream()).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 10_000_000,
            ack_wait: Duration::from_secs(600),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await?;
    let mut out = Vec::new();
    loop {
        let mut batch =
            consumer.fetch().max_messages(5000).expires(Duration::from_millis(500)).messages().await?;
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            got += 1;
            let nominal = message
                .headers
                .as_ref()
                .and_then(|h| h.get(HDR_NOMINAL_TIME))
                .map(|v| v.to_string())
                .context("nominal header")?;
            let nominal = DateTime::parse_from_rfc3339(&nominal)?.timestamp_millis();
            let stored = message.info().map_err(|e| anyhow::anyhow!("{e}"))?.published.unix_timestamp_nanos();
            out.push((nominal, stored));
        }
        if got == 0 {
            break;
        }
    }
    let _ = stream.delete_consumer(&consumer.cached_info().name).await;
    Ok(out)
}

fn percentiles(label: &str, mut lags_us: Vec<i64>) {
    if lags_us.is_empty() {
        println!("{label}: no samples");
        return;
    }
    lags_us.sort_unstable();
    let at = |q: f64| lags_us[((lags_us.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    println!(
        "{label}: n={} p50={:.3} ms p90={:.3} ms p99={:.3} ms max={:.3} ms",
        lags_us.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}

async fn burst(
    url: &str,
    js: &jetstream::Context,
    window: usize,
    events: bool,
    n: usize,
) -> anyhow::Result<()> {
    let prefix = "benchburst";
    let (names, topology) = fresh(js, prefix).await?;
    let scheduler = build(config(url, prefix, window, events)).await?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(scheduler.run(shutdown.clone()));
    wait_leader(&topology, &names).await?;
    let due_ms = (Utc::now().timestamp_millis() / 1000 + 3 + (n / 20_000) as i64) * 1000;
    let due = DateTime::from_timestamp_millis(due_ms).context("due")?;
    let specs =
        (0..n).map(|i| (format!("b{i}"), spec(&format!("b{i}"), json!({"at": format_time(due)})))).collect();
    let wrote = write_tasks(&topology, specs).await?;
    println!("burst: wrote {n} tasks in {wrote:?}; all due at {}", format_time(due));
    let deadline = Instant::now() + Duration::from_secs(120);
    while dispatch_count(js, &names).await? < n as u64 {
        if Instant::now() > deadline {
            bail!("only {} of {n} dispatched", dispatch_count(js, &names).await?);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    handle.await??;
    let times = read_dispatch_times(js, &names).await?;
    let lags: Vec<i64> =
        times.iter().map(|&(nominal, stored)| (stored / 1000 - i128::from(nominal) * 1000) as i64).collect();
    let all = lags.iter().copied().max().unwrap_or_default();
    println!(
        "burst: scheduler dispatched {} fires in {:.1} ms after the due second",
        times.len(),
        all as f64 / 1000.0
    );
    percentiles("burst lag (stored - nominal)", lags);

    // Raw baseline in the same run: pipelined publishes with message ids, same window, same
    // stream kind, same body size.
    let raw_prefix = "benchraw";
    let (raw_names, _) = fresh(js, raw_prefix).await?;
    let body = Bytes::from(vec![b'x'; 420]);
    let started = Instant::now();
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..n {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                let _: async_nats::jetstream::publish::PublishAck = result?;
            }
        }
        let id = format!("r{i}");
        let ack = js
            .send_publish(
                raw_names.dispatch_subject("default", NS, &id),
                jetstream::message::PublishMessage::build()
                    .message_id(dispatch_msg_id(NS, &id, due_ms))
                    .payload(body.clone()),
            )
            .await?;
        pending.push(ack.into_future());
    }
    while let Some(result) = pending.next().await {
        result?;
    }
    let raw = started.elapsed();
    println!(
        "burst: raw pipelined publish with msg ids of {n} messages: {:.1} ms (target for the scheduler: {:.1} ms)",
        raw.as_secs_f64() * 1000.0,
        raw.as_secs_f64() * 1500.0
    );
    Ok(())
}

async fn steady(
    url: &str,
    js: &jetstream::Context,
    window: usize,
    events: bool,
    n: usize,
    rate: usize,
    seconds: u64,
) -> anyhow::Result<()> {
    let prefix = "benchsteady";
    let (names, topology) = fresh(js, prefix).await?;
    let scheduler = build(config(url, prefix, window, events)).await?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(scheduler.run(shutdown.clone()));
    wait_leader(&topology, &names).await?;
    let interval_ms = (n as u64 * 1000 / rate as u64).max(1);
    let specs = (0..n)
        .map(|i| {
            let anchor =
                DateTime::from_timestamp_millis((i as u64 * interval_ms / n as u64) as i64).expect("anchor");
            let id = format!("s{i}");
            let schedule = json!({"every": format!("{interval_ms}ms"), "anchor": format_time(anchor)});
            (id.clone(), spec(&id, schedule))
        })
        .collect();
    let wrote = write_tasks(&topology, specs).await?;
    println!("steady: wrote {n} tasks (every {interval_ms} ms, spread) in {wrote:?}");
    // Let the watch deliver every registration and the first state writes settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let from = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let to = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    handle.await??;
    let times = read_dispatch_times(js, &names).await?;
    let lags: Vec<i64> = times
        .iter()
        .filter(|&&(nominal, _)| nominal >= from && nominal < to)
        .map(|&(nominal, stored)| (stored / 1000 - i128::from(nominal) * 1000) as i64)
        .collect();
    println!(
        "steady: {:.0} fires/s measured over {seconds} s",
        lags.len() as f64 / ((to - from) as f64 / 1000.0)
    );
    percentiles("steady lag (stored - nominal)", lags);
    Ok(())
}

async fn handover(
    url: &str,
    js: &jetstream::Context,
    window: usize,
    n: usize,
    rate: usize,
    seconds: u64,
) -> anyhow::Result<()> {
    let prefix = "benchhandover";
    let (names, topology) = fresh(js, prefix).await?;
    let interval_ms = (n as u64 * 1000 / rate as u64).max(1);
    let specs = (0..n)
        .map(|i| {
            let anchor =
                DateTime::from_timestamp_millis((i as u64 * interval_ms / n as u64) as i64).expect("anchor");
            let id = format!("h{i}");
            let schedule = json!({"every": format!("{interval_ms}ms"), "anchor": format_time(anchor)});
            (id.clone(), spec(&id, schedule))
        })
        .collect();
    let wrote = write_tasks(&topology, specs).await?;
    // One stored fire state per task (as after a long run), all at "now": nothing to catch up.
    let state = Bytes::from(serde_json::to_vec(&FireState {
        last_nominal_fire: Utc::now(),
        next_fire: None,
        fires: 1,
        last_execution_id: None,
        revision: 1,
    })?);
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let kv = topology.state.clone();
            let state = state.clone();
            async move { kv.put(task_key(NS, &format!("h{i}")), state).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for result in results {
        result.context("put fire state")?;
    }
    println!("handover: wrote {n} tasks and {n} fire states in {wrote:?} (+ states)");
    let mut first = config(url, prefix, window, false);
    first.common.instance_id = Some("bench-a".into());
    let mut second = config(url, prefix, window, false);
    second.common.instance_id = Some("bench-b".into());
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let a = tokio::spawn(build(first).await?.run(stop_a.clone()));
    wait_leader(&topology, &names).await?;
    let b = tokio::spawn(build(second).await?.run(stop_b.clone()));
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let handover_ms = Utc::now().timestamp_millis();
    let stopping = Instant::now();
    stop_a.cancel();
    a.await??;
    println!("handover: old leader stopped in {:?}", stopping.elapsed());
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop_b.cancel();
    b.await??;
    let times = read_dispatch_times(js, &names).await?;
    let around: Vec<(i64, i128)> = times
        .iter()
        .copied()
        .filter(|&(nominal, _)| nominal >= handover_ms - 500 && nominal < handover_ms + 4000)
        .collect();
    let first_after = around
        .iter()
        .filter(|&&(nominal, _)| nominal >= handover_ms)
        .map(|&(_, stored)| stored / 1_000_000)
        .min()
        .unwrap_or_default();
    println!(
        "handover: first fire after the stop stored {} ms after it",
        first_after - i128::from(handover_ms)
    );
    let lags = around.iter().map(|&(nominal, stored)| (stored / 1000 - i128::from(nominal) * 1000) as i64);
    percentiles("handover lag (nominal within -0.5 s..+4 s of the stop)", lags.collect());
    Ok(())
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

async fn scale(
    url: &str,
    js: &jetstream::Context,
    window: usize,
    n: usize,
    no_write: bool,
) -> anyhow::Result<()> {
    let prefix = "benchscale";
    if no_write {
        let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let topology = topology::ensure(js, &names, &TopologyArgs::default()).await?;
        return load(url, js, window, n, &names, &topology).await;
    }
    let (names, topology) = fresh(js, prefix).await?;
    let specs = (0..n)
        .map(|i| {
            let anchor =
                DateTime::from_timestamp_millis((i as u64 * 3_600_000 / n as u64) as i64).expect("anchor");
            let id = format!("t{i}");
            (id.clone(), spec(&id, json!({"every": "1h", "anchor": format_time(anchor)})))
        })
        .collect();
    let wrote = write_tasks(&topology, specs).await?;
    println!("scale: wrote {n} tasks in {wrote:?}");
    load(url, js, window, n, &names, &topology).await
}

async fn load(
    url: &str,
    js: &jetstream::Context,
    window: usize,
    n: usize,
    names: &Names,
    topology: &Topology,
) -> anyhow::Result<()> {
    let prefix = names.prefix().to_string();
    let _ = js;
    let started = Instant::now();
    let mut watch = topology.tasks.watch_with_history(">").await?;
    let mut count = 0usize;
    while let Some(entry) = watch.next().await {
        let entry = entry?;
        count += 1;
        if entry.delta == 0 {
            break;
        }
    }
    let raw = started.elapsed();
    drop(watch);
    println!("scale: raw watch_with_history delivered {count} keys in {:.0} ms", raw.as_secs_f64() * 1000.0);

    let before = rss_mib();
    let started = Instant::now();
    let scheduler = build(config(url, &prefix, window, false)).await?;
    let admin = scheduler.admin_addr();
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(scheduler.run(shutdown.clone()));
    loop {
        if http_get(admin, "/readyz").await.is_ok_and(|r| r.contains("\"ready\":true")) {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("not loaded after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let load = started.elapsed();
    println!(
        "scale: scheduler loaded {n} tasks in {:.0} ms ({:.2}x raw); RSS {:.0} MiB (was {:.0} MiB before start)",
        load.as_secs_f64() * 1000.0,
        load.as_secs_f64() / raw.as_secs_f64(),
        rss_mib(),
        before
    );
    wait_leader(topology, names).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("scale: RSS {:.0} MiB as leader", rss_mib());
    shutdown.cancel();
    handle.await??;
    Ok(())
}
