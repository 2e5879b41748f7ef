//! Scheduler scenarios with the scheduler in-process: burst (N one-shots due the same second,
//! against the server's own message schedules of N messages due the same second and raw
//! pipelined publishing with ids of N messages, in the same run), steady (N
//! interval tasks spread to a fire rate: lag), and scale (load time and resident memory of a
//! real scheduler process with N tasks, against a raw `watch_with_history` and against the
//! same watch with every value parsed as a spec, the floor of any validating loader).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_scheduler::{Config, DEFAULT_PUBLISH_WINDOW, build};
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::names::task_key;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::topology::{self, Topology, TopologyArgs};
use jetsched_shared::wire::{FireState, format_time};
use jetsched_tests::NatsServer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{Defaults, Rounds, Tasks};
use crate::schedules::{self, CpuMeter};
use crate::system::{
    Lag, NS, cpu_seconds, dispatch_count, http_get, raw_publish_with_ids, read_dispatch_times, rss_mib,
    service_bin, spec, spread_schedules, wait_leader, write_tasks,
};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BurstArgs {
    // One-shot tasks due at the same second.
    #[command(flatten)]
    pub(crate) tasks: Tasks<BurstArgs>,
    /// Scheduler publish window (and the raw and schedule baselines'; at most 5000, the
    /// JetStream publishes async-nats lets await their ack at once; the scheduler's default)
    #[arg(long, default_value_t = DEFAULT_PUBLISH_WINDOW, value_parser = clap::builder::RangedI64ValueParser::<usize>::new().range(1..=5000))]
    pub(crate) window: usize,
}

/// Interval tasks firing at a steady rate (steady and handover).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Firing {
    // Interval tasks, spread so that `rate` fire per second.
    #[command(flatten)]
    pub(crate) tasks: Tasks<Firing>,
    /// Fires per second over all the tasks.
    #[arg(long, default_value_t = 1000)]
    pub(crate) rate: usize,
}

impl Defaults for BurstArgs {}

impl Defaults for Firing {}

impl Defaults for ScaleArgs {
    const TASKS: &'static str = "1000000";
}

impl Firing {
    /// Writes the interval tasks (ids `<prefix><i>`) to the tasks bucket; returns their
    /// interval in milliseconds.
    pub(crate) async fn write(&self, topology: &Topology, prefix: &str) -> anyhow::Result<u64> {
        let (interval_ms, schedules) = spread_schedules(self.tasks.tasks, self.rate);
        let specs = schedules
            .into_iter()
            .enumerate()
            .map(|(i, schedule)| (format!("{prefix}{i}"), spec(&format!("{prefix}{i}"), schedule)))
            .collect();
        write_tasks(topology, specs).await?;
        Ok(interval_ms)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SteadyArgs {
    #[command(flatten)]
    pub(crate) firing: Firing,
    /// Measured seconds (after a warm-up of 3 s).
    #[arg(long, default_value_t = 20)]
    pub(crate) seconds: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HandoverArgs {
    #[command(flatten)]
    pub(crate) firing: Firing,
    /// Seconds of steady firing before the leader stops.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ScaleArgs {
    // Registered tasks the scheduler loads.
    #[command(flatten)]
    pub(crate) tasks: Tasks<ScaleArgs>,
    // Each round runs the raw watch, the floor (watch + spec parse) and the scheduler's load
    // over the same bucket.
    #[command(flatten)]
    pub(crate) rounds: Rounds<ScaleArgs>,
}

pub(crate) async fn start(url: &str) -> anyhow::Result<(Names, Topology, jetstream::Context)> {
    let js = jetstream::new(async_nats::connect(url).await.context("connect")?);
    let names = Names::default();
    let topology = topology::ensure(&js, &names, &TopologyArgs::default()).await?;
    Ok((names, topology, js))
}

pub(crate) fn config(url: &str, window: usize) -> Config {
    let mut config = Config::for_tests(url);
    config.publish_window = window;
    config.fire_events = false;
    config
}

pub(crate) async fn burst(args: BurstArgs) -> anyhow::Result<serde_json::Value> {
    let n = args.tasks.tasks;
    // The server's own schedules first, on a server of their own, with bodies the size of
    // jetsched's dispatches.
    let body_len = dispatch_body_len()?;
    let server_burst = schedules::server_burst(n, args.window, body_len).await?;
    let baseline = server_burst.lag;
    eprintln!(
        "burst baseline: the server's message schedules: {n} due at once (schedules published in {:.0} ms) \
         generated within {:.1} ms of the due second (lag p50 {:.1} / p99 {:.1} ms)",
        server_burst.publish.as_secs_f64() * 1000.0,
        baseline.max_ms,
        baseline.p50_ms,
        baseline.p99_ms
    );

    let server = NatsServer::start().await;
    let (names, topology, js) = start(&server.url()).await?;
    let scheduler = build(config(&server.url(), args.window)).await?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(scheduler.run(shutdown.clone()));
    wait_leader(&topology, &names).await?;
    let due = schedules::due_second(n)?;
    let due_ms = due.timestamp_millis();
    let specs =
        (0..n).map(|i| (format!("b{i}"), spec(&format!("b{i}"), json!({"at": format_time(due)})))).collect();
    let wrote = write_tasks(&topology, specs).await?;
    if Utc::now().timestamp_millis() > due_ms - 500 {
        bail!("writing {n} tasks took {wrote:?}: past the due second; the machine is too slow for this size");
    }
    schedules::sleep_until_before(due).await;
    let meter = CpuMeter::start(&server);
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 1000);
    while dispatch_count(&js, &names).await? < n as u64 {
        if Instant::now() > deadline {
            bail!("only {} of {n} dispatched", dispatch_count(&js, &names).await?);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = meter.stop();
    shutdown.cancel();
    handle.await??;
    let times = read_dispatch_times(&js, &names).await?;
    let lags: Vec<i64> = times.iter().map(|&(nominal, stored)| stored - nominal * 1000).collect();
    let lag = Lag::from_micros(lags);
    // Raw baseline in the same run: the same count, window and stream.
    let meter = CpuMeter::start(&server);
    let raw = raw_publish_with_ids(&js, &names, n, args.window, "r").await?;
    let raw_cpu = meter.stop();
    let all_ms = lag.max_ms;
    let raw_ms = raw.as_secs_f64() * 1000.0;
    let ratio = if raw_ms > 0.0 { all_ms / raw_ms } else { 0.0 };
    let to_schedules = if baseline.max_ms > 0.0 { all_ms / baseline.max_ms } else { 0.0 };
    let first = if all_ms < baseline.max_ms { "jetsched" } else { "server schedules" };
    eprintln!(
        "burst: {n} tasks due at once dispatched within {all_ms:.1} ms of the due second (lag p50 {:.1} / p99 {:.1} / max {:.1} ms); \
         raw pipelined publish with ids of {n}: {raw_ms:.1} ms; ratio {ratio:.2}",
        lag.p50_ms, lag.p99_ms, lag.max_ms
    );
    eprintln!(
        "burst against the server's schedules: all within {all_ms:.1} ms against {:.1} ms ({to_schedules:.3}x, {first} first); \
         p50 {:.1} against {:.1} ms, p99 {:.1} against {:.1} ms",
        baseline.max_ms, lag.p50_ms, baseline.p50_ms, lag.p99_ms, baseline.p99_ms
    );
    eprintln!(
        "burst CPU seconds (client / server): jetsched {:.2} / {:.2}, raw publish {:.2} / {:.2}, server's schedules {:.2} / {:.2}",
        cpu.client_s,
        cpu.server_s,
        raw_cpu.client_s,
        raw_cpu.server_s,
        server_burst.cpu.client_s,
        server_burst.cpu.server_s
    );
    Ok(json!({
        "scenario": "burst",
        "tasks": n,
        "dispatched": times.len(),
        "write_seconds": wrote.as_secs_f64(),
        "dispatch_all_ms": all_ms,
        "lag": lag,
        "raw_publish_with_ids_ms": raw_ms,
        "ratio_to_raw": ratio,
        "cpu": cpu,
        "raw_cpu": raw_cpu,
        "schedules": {
            "publish_ms": server_burst.publish.as_secs_f64() * 1000.0,
            "body_bytes": body_len,
            "lag": baseline,
            "cpu": server_burst.cpu,
        },
        "ratio_to_schedules": to_schedules,
        "first": first,
    }))
}

/// Body size of one of the burst's dispatches (the baseline's messages carry as many bytes).
fn dispatch_body_len() -> anyhow::Result<usize> {
    let json = spec("b0", json!({"at": format_time(Utc::now())}));
    let parsed = TaskSpec::parse(&json).map_err(|e| anyhow::anyhow!("bench spec: {e:?}"))?;
    let origin = Origin::Scheduled { nominal_ms: Utc::now().timestamp_millis(), term: 1, catchup: false };
    let message = dispatch::build(&Names::default(), Target::of(&parsed, 1), origin, SpecBody::Json(&json))?;
    Ok(message.message.outbound_message(message.subject).payload.len())
}

pub(crate) async fn steady(args: SteadyArgs) -> anyhow::Result<serde_json::Value> {
    let n = args.firing.tasks.tasks;
    let server = NatsServer::start().await;
    let (names, topology, js) = start(&server.url()).await?;
    let scheduler = build(config(&server.url(), DEFAULT_PUBLISH_WINDOW)).await?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(scheduler.run(shutdown.clone()));
    wait_leader(&topology, &names).await?;
    let interval_ms = args.firing.write(&topology, "s").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // This process only sleeps meanwhile: its CPU is the leader's.
    let cpu = CpuMeter::start(&server);
    let from = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let to = Utc::now().timestamp_millis();
    let cpu = cpu.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    handle.await??;
    let times = read_dispatch_times(&js, &names).await?;
    let lags: Vec<i64> = times
        .iter()
        .filter(|&&(nominal, _)| nominal >= from && nominal < to)
        .map(|&(nominal, stored)| stored - nominal * 1000)
        .collect();
    let expected = ((to - from) as f64 / 1000.0) * args.firing.rate as f64;
    let lag = Lag::from_micros(lags);
    let rate = lag.samples as f64 / ((to - from) as f64 / 1000.0);
    let fires = (rate * (to - from) as f64 / 1000.0).max(1.0);
    let (leader_us, server_us) = (cpu.client_s * 1e6 / fires, cpu.server_s * 1e6 / fires);
    eprintln!(
        "steady: {n} tasks, {rate:.0} fires/s (asked {}), lag p50 {:.2} / p99 {:.2} / max {:.2} ms, \
         CPU a fire: leader {leader_us:.1} µs, server {server_us:.1} µs",
        args.firing.rate, lag.p50_ms, lag.p99_ms, lag.max_ms
    );
    Ok(json!({
        "scenario": "steady",
        "tasks": n,
        "interval_ms": interval_ms,
        "seconds": args.seconds,
        "fires_per_second": rate,
        "expected_fires": expected.round(),
        "lag": lag,
        "leader_cpu_us_per_fire": leader_us,
        "server_cpu_us_per_fire": server_us,
    }))
}

/// Steady firing over N tasks with N stored fire states; the leader stops gracefully and a
/// follower started beside it (its tasks and fire state already loaded) takes over: fire lag
/// of the fires around the handover.
pub(crate) async fn handover(args: HandoverArgs) -> anyhow::Result<serde_json::Value> {
    let n = args.firing.tasks.tasks;
    let server = NatsServer::start().await;
    let (names, topology, js) = start(&server.url()).await?;
    args.firing.write(&topology, "h").await?;
    // One stored fire state per task (as after a long run), all at "now": nothing to catch up.
    let state = bytes::Bytes::from(serde_json::to_vec(&FireState {
        last_nominal_fire: Utc::now(),
        next_fire: None,
        fires: 1,
        last_execution_id: None,
        revision: 1,
    })?);
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let (kv, state) = (topology.state.clone(), state.clone());
            async move { kv.put(task_key(NS, &format!("h{i}")), state).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for result in results {
        result.context("put fire state")?;
    }
    let replica = |instance: &str| {
        let mut config = config(&server.url(), DEFAULT_PUBLISH_WINDOW);
        config.shared.common.instance_id = Some(instance.to_string());
        config
    };
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let a = tokio::spawn(build(replica("bench-a")).await?.run(stop_a.clone()));
    wait_leader(&topology, &names).await?;
    let b = tokio::spawn(build(replica("bench-b")).await?.run(stop_b.clone()));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let handover_ms = Utc::now().timestamp_millis();
    let stopping = Instant::now();
    stop_a.cancel();
    a.await??;
    let stop_ms = stopping.elapsed().as_secs_f64() * 1000.0;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop_b.cancel();
    b.await??;
    let times = read_dispatch_times(&js, &names).await?;
    let around: Vec<(i64, i64)> = times
        .iter()
        .copied()
        .filter(|&(nominal, _)| nominal >= handover_ms - 500 && nominal < handover_ms + 4000)
        .collect();
    let first_after_ms = around
        .iter()
        .filter(|&&(nominal, _)| nominal >= handover_ms)
        .map(|&(_, stored)| stored as f64 / 1000.0 - handover_ms as f64)
        .fold(f64::NAN, f64::min);
    let lag = Lag::from_micros(around.iter().map(|&(nominal, stored)| stored - nominal * 1000).collect());
    eprintln!(
        "handover: {n} tasks at {} fires/s; old leader stopped in {stop_ms:.0} ms; first fire after the stop \
         stored {first_after_ms:.0} ms after it; lag of the fires within -0.5 s..+4 s: p50 {:.2} / p99 {:.2} / max {:.2} ms",
        args.firing.rate, lag.p50_ms, lag.p99_ms, lag.max_ms
    );
    Ok(json!({
        "scenario": "handover",
        "tasks": n,
        "rate": args.firing.rate,
        "stop_ms": stop_ms,
        "first_fire_after_stop_ms": first_after_ms,
        "lag": lag,
    }))
}

pub(crate) async fn scale(args: ScaleArgs) -> anyhow::Result<serde_json::Value> {
    let n = args.tasks.tasks;
    let server = NatsServer::start().await;
    let server_pid = server.pid().map(|pid| pid.to_string());
    let server_cpu = || server_pid.as_deref().and_then(cpu_seconds).unwrap_or(0.0);
    let (_names, topology, _js) = start(&server.url()).await?;
    let specs = (0..n)
        .map(|i| {
            let anchor = DateTime::from_timestamp_millis((i as u64 * 3_600_000 / n.max(1) as u64) as i64)
                .expect("anchor");
            let id = format!("t{i}");
            (id.clone(), spec(&id, json!({"every": "1h", "anchor": format_time(anchor)})))
        })
        .collect();
    let wrote = write_tasks(&topology, specs).await?;
    eprintln!("scale: {n} tasks written in {:.1} s", wrote.as_secs_f64());

    // Rounds alternate the raw watch, the floor and the scheduler, so all see the same
    // machine state.
    let mut rounds = Vec::new();
    for round in 1..=args.rounds.rounds.max(1) {
        // Raw: one ordered watch delivering the last value of every key.
        let raw = watch_all(&topology, false, &server_cpu).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Floor: the same watch, each value validated as a spec where it arrives: what any
        // scheduler that refuses an invalid spec does at least, before it keeps a thing.
        let floor = watch_all(&topology, true, &server_cpu).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;

        let (cpu, loaded) = (server_cpu(), load_scheduler(&server.url()).await?);
        let ratio = loaded.ready.as_secs_f64() / raw.elapsed.as_secs_f64();
        let to_floor = loaded.ready.as_secs_f64() / floor.elapsed.as_secs_f64();
        let floor_to_raw = floor.elapsed.as_secs_f64() / raw.elapsed.as_secs_f64();
        eprintln!(
            "scale round {round}: raw watch_with_history {} keys in {:.0} ms (server CPU {:.1} s, client CPU {:.1} s); \
             floor (raw + spec parse) {:.0} ms ({floor_to_raw:.2}x raw; server CPU {:.1} s, client CPU {:.1} s); \
             scheduler ready in {:.0} ms ({ratio:.2}x raw, {to_floor:.2}x the floor; its CPU {:.1} s, server CPU {:.1} s); \
             RSS {:.0} MiB, {:.0} MiB 2 s later",
            raw.keys,
            raw.elapsed.as_secs_f64() * 1000.0,
            raw.server_cpu_s,
            raw.client_cpu_s,
            floor.elapsed.as_secs_f64() * 1000.0,
            floor.server_cpu_s,
            floor.client_cpu_s,
            loaded.ready.as_secs_f64() * 1000.0,
            loaded.cpu_s,
            server_cpu() - cpu,
            loaded.rss_mib,
            loaded.rss_settled_mib,
        );
        rounds.push(json!({
            "raw_watch_ms": raw.elapsed.as_secs_f64() * 1000.0,
            "raw_watch_keys": raw.keys,
            "raw_server_cpu_s": raw.server_cpu_s,
            "raw_client_cpu_s": raw.client_cpu_s,
            "floor_ms": floor.elapsed.as_secs_f64() * 1000.0,
            "floor_to_raw": floor_to_raw,
            "floor_server_cpu_s": floor.server_cpu_s,
            "floor_client_cpu_s": floor.client_cpu_s,
            "load_ms": loaded.ready.as_secs_f64() * 1000.0,
            "ratio_to_raw": ratio,
            "ratio_to_floor": to_floor,
            "scheduler_cpu_s": loaded.cpu_s,
            "rss_mib": loaded.rss_mib,
            "rss_mib_settled": loaded.rss_settled_mib,
        }));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let median = |key: &str| crate::stats::median(rounds.iter().filter_map(|r| r[key].as_f64()).collect());
    let (raw_ms, load_ms, rss) = (median("raw_watch_ms"), median("load_ms"), median("rss_mib"));
    let (floor_ms, floor_to_raw) = (median("floor_ms"), median("floor_to_raw"));
    let (ratio, to_floor) = (median("ratio_to_raw"), median("ratio_to_floor"));
    if rounds.len() > 1 {
        eprintln!(
            "scale: median of {} rounds: raw {raw_ms:.0} ms, floor {floor_ms:.0} ms ({floor_to_raw:.2}x raw), \
             scheduler {load_ms:.0} ms, ratio {ratio:.2}x raw, {to_floor:.2}x the floor; RSS {rss:.0} MiB",
            rounds.len()
        );
    }
    Ok(json!({
        "scenario": "scale",
        "tasks": n,
        "raw_watch_ms": raw_ms,
        "floor_ms": floor_ms,
        "floor_to_raw": floor_to_raw,
        "load_ms": load_ms,
        "ratio_to_raw": ratio,
        "ratio_to_floor": to_floor,
        "rss_mib": rss,
        "rounds": rounds,
    }))
}

/// One ordered watch over the tasks bucket, read to its end.
struct Watched {
    keys: usize,
    elapsed: Duration,
    server_cpu_s: f64,
    /// CPU seconds of this process meanwhile.
    client_cpu_s: f64,
}

/// Reads the last value of every key of the tasks bucket with one `watch_with_history`,
/// validating each as a spec when `parse` (a value that is not one fails the phase).
async fn watch_all(
    topology: &Topology,
    parse: bool,
    server_cpu: &impl Fn() -> f64,
) -> anyhow::Result<Watched> {
    let own = std::process::id().to_string();
    let client_cpu = || cpu_seconds(&own).unwrap_or(0.0);
    let (server, client, started) = (server_cpu(), client_cpu(), Instant::now());
    let mut watch = topology.tasks.watch_with_history(">").await?;
    let mut keys = 0usize;
    while let Some(entry) = watch.next().await {
        let entry = entry?;
        keys += 1;
        if parse {
            let spec =
                TaskSpec::parse(&entry.value).map_err(|e| anyhow::anyhow!("task {}: {e}", entry.key))?;
            std::hint::black_box(spec);
        }
        if entry.delta == 0 {
            break;
        }
    }
    let elapsed = started.elapsed();
    Ok(Watched { keys, elapsed, server_cpu_s: server_cpu() - server, client_cpu_s: client_cpu() - client })
}

/// What one scheduler process took to load the tasks bucket.
struct Loaded {
    /// From spawn until `/readyz` reports the tasks loaded.
    ready: Duration,
    /// CPU seconds the process used until then.
    cpu_s: f64,
    rss_mib: f64,
    rss_settled_mib: f64,
}

/// Starts a real scheduler process, waits until it is ready, samples its memory and kills it.
async fn load_scheduler(url: &str) -> anyhow::Result<Loaded> {
    let admin = jetsched_tests::free_addr();
    let started = Instant::now();
    let mut child = Command::new(service_bin("jetsched-scheduler")?)
        .envs(crate::system::service_env())
        .env("NATS_URL", url)
        .env("RUST_LOG", "warn")
        .args(["--instance-id", "bench-scale", "--admin-addr", &admin.to_string(), "--fire-events", "false"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn jetsched-scheduler")?;
    let ready = loop {
        if http_get(admin, "/readyz").await.is_ok_and(|r| r.contains("\"ready\":true")) {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            bail!("scheduler not ready after 600 s");
        }
        if let Some(status) = child.try_wait()? {
            bail!("scheduler exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let cpu_s = cpu_seconds(&child.id().to_string()).unwrap_or(0.0);
    let rss_loaded = rss_mib(child.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_settled_mib = rss_mib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    Ok(Loaded { ready, cpu_s, rss_mib: rss_loaded, rss_settled_mib })
}
