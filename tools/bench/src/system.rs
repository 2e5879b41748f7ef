//! Pieces shared by the scenarios: task specs, bulk task writes, dispatch-stream readers, the
//! raw pipelined publish baseline, in-process workers and the teardown of a phase's streams
//! and buckets, lag percentiles and service binaries for process scenarios.

use std::future::IntoFuture;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use bytes::Bytes;
use chrono::DateTime;
use futures::StreamExt;
use jetsched_shared::names::{Names, dispatch_msg_id, task_key};
use jetsched_shared::topology::Topology;
use jetsched_shared::wire::HDR_NOMINAL_TIME;
use jetsched_worker::{Config, Handlers, build};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Namespace of every benchmark task.
pub(crate) const NS: &str = "bench";

/// A task spec with a nats executor (nothing consumes dispatches in scheduler scenarios).
pub(crate) fn spec(id: &str, schedule: serde_json::Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "id": id, "namespace": NS, "schedule": schedule,
            "executor": {"kind": "nats", "subject": "bench.run"}, "misfire": "fire_all",
        }))
        .expect("spec serializes"),
    )
}

/// Writes task specs straight into the tasks bucket (pipelined, 256 in flight).
pub(crate) async fn write_tasks(
    topology: &Topology,
    specs: Vec<(String, Bytes)>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let kv = &topology.tasks;
    let results: Vec<_> = futures::stream::iter(specs)
        .map(|(id, body)| async move { kv.put(task_key(NS, &id), body).await })
        .buffer_unordered(256)
        .collect()
        .await;
    for result in results {
        result.context("put task")?;
    }
    Ok(started.elapsed())
}

pub(crate) async fn wait_leader(topology: &Topology, names: &Names) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = topology.leader.get(names.leader_key()).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no scheduler became leader within 60 s")
}

pub(crate) async fn dispatch_count(js: &jetstream::Context, names: &Names) -> anyhow::Result<u64> {
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    Ok(stream.info().await?.state.messages)
}

/// (nominal ms, stored-at µs) of every message in the dispatch stream, without removing any.
pub(crate) async fn read_dispatch_times(
    js: &jetstream::Context,
    names: &Names,
) -> anyhow::Result<Vec<(i64, i64)>> {
    let messages =
        jetsched_tests::read_stream(js, &names.dispatch_stream(), Duration::from_secs(120)).await?;
    // The raw baseline's messages (queue `raw`, no nominal time) are not dispatches.
    let raw = names.dispatch_subject("raw", NS, "");
    messages
        .iter()
        .filter(|message| !message.subject.starts_with(raw.as_str()))
        .map(|message| {
            let nominal = message
                .headers
                .as_ref()
                .and_then(|h| h.get(HDR_NOMINAL_TIME))
                .map(|v| v.to_string())
                .context("nominal header")?;
            let nominal = DateTime::parse_from_rfc3339(&nominal)?.timestamp_millis();
            let stored = message.info().map_err(|e| anyhow::anyhow!("{e}"))?.published.unix_timestamp_nanos();
            Ok((nominal, (stored / 1000) as i64))
        })
        .collect()
}

/// Pipelined publishes with message ids (`window` in flight) of `n` dispatch-sized messages
/// to the dispatch subjects of `names`: the raw baseline of a dispatch burst.
pub(crate) async fn raw_publish_with_ids(
    js: &jetstream::Context,
    names: &Names,
    n: usize,
    window: usize,
    tag: &str,
) -> anyhow::Result<Duration> {
    let body = Bytes::from(vec![b'x'; 420]);
    let started = Instant::now();
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..n {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                let _: jetstream::publish::PublishAck = result?;
            }
        }
        let id = format!("{tag}{i}");
        let ack = js
            .send_publish(
                names.dispatch_subject("raw", NS, &id),
                jetstream::message::PublishMessage::build()
                    .message_id(dispatch_msg_id(NS, &id, 0))
                    .payload(body.clone()),
            )
            .await?;
        pending.push(ack.into_future());
    }
    while let Some(result) = pending.next().await {
        result?;
    }
    Ok(started.elapsed())
}

/// In-process workers on one prefix, stopped together.
pub(crate) struct Workers {
    shutdown: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Workers {
    /// `count` workers on `prefix` (instances `<prefix>-<i>`), each with `concurrency` permits
    /// and the handlers `handlers` makes for it.
    pub(crate) async fn start(
        url: &str,
        prefix: &str,
        count: usize,
        concurrency: usize,
        mut handlers: impl FnMut() -> Handlers,
    ) -> anyhow::Result<Workers> {
        let shutdown = CancellationToken::new();
        let mut handles = Vec::with_capacity(count);
        for i in 0..count {
            let mut config = Config::for_tests(url, &format!("{prefix}-{i}"));
            config.shared.common.prefix = prefix.to_string();
            config.concurrency = concurrency;
            let worker = build(config, handlers()).await?;
            handles.push(tokio::spawn(worker.run(shutdown.clone())));
        }
        Ok(Workers { shutdown, handles })
    }

    /// Stops every worker and waits for each to finish; the first error of any.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for handle in self.handles {
            handle.await??;
        }
        Ok(())
    }
}

/// Removes what a phase on `names` left behind: the dispatch, dead-letter and event streams
/// and the runs and breakers buckets (best effort: one that is already gone is fine).
pub(crate) async fn remove_phase(js: &jetstream::Context, names: &Names) {
    for stream in [names.dispatch_stream(), names.dlq_stream(), names.events_stream()] {
        let _ = js.delete_stream(stream).await;
    }
    for bucket in [names.runs_bucket(), names.breakers_bucket()] {
        let _ = js.delete_key_value(bucket).await;
    }
}

/// Schedules of `n` interval tasks that together fire `rate` times per second: every task
/// every `n / rate` seconds, anchors spread evenly over that interval. Returns the interval.
pub(crate) fn spread_schedules(n: usize, rate: usize) -> (u64, Vec<serde_json::Value>) {
    let interval_ms = (n as u64 * 1000 / rate.max(1) as u64).max(1);
    let schedules = (0..n)
        .map(|i| {
            let anchor = chrono::DateTime::from_timestamp_millis((i as u64 * interval_ms / n as u64) as i64)
                .expect("anchor in range");
            json!({"every": format!("{interval_ms}ms"), "anchor": jetsched_shared::wire::format_time(anchor)})
        })
        .collect();
    (interval_ms, schedules)
}

/// Lag percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Lag {
    pub(crate) samples: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl Lag {
    pub(crate) fn from_micros(mut lags_us: Vec<i64>) -> Lag {
        lags_us.sort_unstable();
        let at = |q: f64| {
            if lags_us.is_empty() {
                return 0.0;
            }
            lags_us[((lags_us.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
        };
        Lag { samples: lags_us.len(), p50_ms: at(0.5), p99_ms: at(0.99), max_ms: at(1.0) }
    }
}

/// The allocator setting the deployment files give every service process (`deploy/Dockerfile`,
/// `deploy/local.sh`, the systemd environment file): mimalloc returns freed memory at once.
/// Nothing when this process's environment sets the delay itself (the child inherits it).
pub(crate) fn service_env() -> Option<(&'static str, &'static str)> {
    std::env::var_os(PURGE_DELAY).is_none().then_some((PURGE_DELAY, "0"))
}

const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// A workspace service binary next to this one (`target/<profile>/`), else under
/// `target/release` or `target/debug` of the current directory.
pub(crate) fn service_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(name));
        if dir.file_name().is_some_and(|n| n == "deps")
            && let Some(up) = dir.parent()
        {
            candidates.push(up.join(name));
        }
    }
    candidates.push(PathBuf::from("target/release").join(name));
    candidates.push(PathBuf::from("target/debug").join(name));
    candidates.into_iter().find(|p| p.is_file()).with_context(|| {
        format!("{name} not found next to jetsched-bench: build it first (`cargo build --release --workspace --bins`)")
    })
}

/// CPU seconds (user + system) used so far by process `pid` (or `self`), from
/// `/proc/<pid>/stat` (clock ticks of 10 ms).
pub(crate) fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Resident memory of process `pid` in MiB (Linux; 0 when unknown).
pub(crate) fn rss_mib(pid: u32) -> f64 {
    status_mib(&proc_status(pid), "VmRSS:").unwrap_or(0.0)
}

/// Resident memory of process `pid` in MiB, all of it (`VmRSS`, 0 when unknown) and its
/// anonymous part (`RssAnon`: heap, stacks, buffers, NaN when unknown), from one read. The rest
/// of `VmRSS` is mostly the mapped pages of the process's own binary (`RssFile`).
pub(crate) fn rss_and_anon_mib(pid: u32) -> (f64, f64) {
    let status = proc_status(pid);
    (status_mib(&status, "VmRSS:").unwrap_or(0.0), status_mib(&status, "RssAnon:").unwrap_or(f64::NAN))
}

fn proc_status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

/// A `kB` field of `/proc/<pid>/status` in MiB.
fn status_mib(status: &str, field: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Body of an HTTP/1.0 GET (the admin endpoints).
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}
