//! The console at scale: 100,000 task specs put straight into the tasks bucket (the registry's
//! validated puts would take minutes at this size; the specs are valid ones), 1,000,000 run
//! events published to the events stream over the last 24 hours (what the run history reads),
//! a registry in-process (task pages, breakers), and the real `jetsched-console` process; every
//! page is timed (median of N requests) and the console's resident memory read.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_registry::{Config, build};
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind, Trigger};
use jetsched_tests::{NatsServer, admin_get, free_addr, memory_kib};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::args::{Defaults, Tasks};
use crate::system::{NS, service_bin, write_tasks};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    // Task specs put in the tasks bucket.
    #[command(flatten)]
    pub(crate) tasks: Tasks<Args>,
    /// Run events in the events stream, spread over the last 24 hours.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) runs: usize,
    /// Requests per page (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) requests: usize,
}

impl Defaults for Args {}

/// Targets: every page's median, the console's resident memory.
const PAGE_TARGET: Duration = Duration::from_millis(200);
const RSS_TARGET_MIB: u64 = 150;
/// Unacknowledged publishes in flight.
const WINDOW: usize = 256;
/// Every this many tasks names one of ten shared breaker keys.
const BREAKER_EVERY: usize = 100;

fn task_id(n: usize) -> String {
    format!("task-{n:06}")
}

fn spec(n: usize) -> Bytes {
    let mut spec = json!({
        "id": task_id(n), "namespace": NS, "schedule": {"every": if n.is_multiple_of(2) { "1h" } else { "10m" }},
        "executor": {"kind": "http", "method": "POST", "url": "http://reports.internal/run"},
        "labels": {"team": format!("t{}", n % 10)}, "paused": n.is_multiple_of(7),
    });
    if n.is_multiple_of(BREAKER_EVERY) {
        spec["breaker"] = json!({"key": format!("api-{}", n / BREAKER_EVERY % 10), "window": "2m"});
    }
    Bytes::from(serde_json::to_vec(&spec).expect("spec serializes"))
}

/// Run `n` of `total`, at its place in the last 24 hours: every third failed.
fn run_event(n: usize, total: usize, tasks: usize, start: DateTime<Utc>) -> Event {
    let time = start + chrono::Duration::milliseconds((n as i64) * 86_400_000 / total.max(1) as i64);
    let failed = n.is_multiple_of(3);
    Event {
        time,
        nominal_time: Some(time),
        trigger: Some(Trigger::Schedule),
        execution_id: Some(format!("bench-{n:07}")),
        attempt: Some(1),
        worker: Some("bench-worker".into()),
        duration_ms: Some(5),
        error: failed.then(|| "HTTP 503".to_string()),
        ..Event::new(
            if failed { EventKind::RunFailed } else { EventKind::RunSucceeded },
            NS,
            task_id(n % tasks),
        )
    }
}

/// Publishes the run events in time order, `WINDOW` acknowledgements in flight.
async fn publish_runs(js: &jetstream::Context, names: &Names, args: &Args) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let start = Utc::now() - chrono::Duration::hours(24);
    let mut acks = futures::stream::iter(0..args.runs)
        .map(|n| {
            let event = run_event(n, args.runs, args.tasks.tasks, start);
            let subject = names.event_subject(event.kind.as_str(), &event.namespace, &event.task_id);
            let payload = Bytes::from(serde_json::to_vec(&event).expect("event serializes"));
            async move { js.publish(subject, payload).await?.await.map_err(anyhow::Error::from) }
        })
        .buffered(WINDOW);
    while let Some(ack) = acks.next().await {
        ack.context("publish a run event")?;
    }
    Ok(started.elapsed())
}

/// The median of `requests` GETs of `path`, failing on any status but 200.
async fn time_page(http: SocketAddr, path: &str, requests: usize) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(requests);
    for _ in 0..requests.max(1) {
        let started = Instant::now();
        let reply = admin_get(http, path).await.with_context(|| format!("GET {path}"))?;
        times.push(started.elapsed());
        if reply.status != 200 {
            bail!("GET {path}: {}: {}", reply.status, reply.body.chars().take(500).collect::<String>());
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client);
    let names = Names::default();
    let topology = topology::ensure(&js, &names, &TopologyArgs::default()).await?;
    let specs = (0..args.tasks.tasks).map(|n| (task_id(n), spec(n))).collect();
    let tasks_put = write_tasks(&topology, specs).await?;
    eprintln!("console: {} specs put in {tasks_put:.1?}", args.tasks.tasks);
    let runs_put = publish_runs(&js, &names, &args).await?;
    eprintln!("console: {} run events published in {runs_put:.1?}", args.runs);

    let shutdown = CancellationToken::new();
    let registry = build(Config::for_tests(&server.url())).await?;
    let registry = tokio::spawn(registry.run(shutdown.clone()));
    let (http, admin) = (free_addr(), free_addr());
    let mut console = tokio::process::Command::new(service_bin("jetsched-console")?)
        .args([
            "--nats-url",
            &server.url(),
            "--http-addr",
            &http.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .context("start jetsched-console")?;
    let pid = console.id().context("console pid")?;
    let started = Instant::now();
    while !admin_get(admin, "/readyz").await.is_ok_and(|reply| reply.status == 200) {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the console did not index the tasks within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let indexed = started.elapsed();
    eprintln!("console: ready (every task indexed) in {indexed:.1?}");

    let hour = |hours_ago: i64| {
        (Utc::now() - chrono::Duration::hours(hours_ago)).format("%Y-%m-%dT%H:%M").to_string()
    };
    let middle = format!("bench-{:07}", args.runs / 2);
    let pages = [
        ("overview", "/".to_string()),
        ("tasks, first page", "/tasks".to_string()),
        ("tasks, id search", "/tasks?q=task-00012".to_string()),
        ("tasks, labels and state", "/tasks?label=team%3Dt3&state=paused".to_string()),
        ("tasks, last page", format!("/tasks?page={}", args.tasks.tasks.div_ceil(50))),
        ("a task", format!("/tasks/{NS}/{}", task_id(BREAKER_EVERY))),
        ("runs, newest", "/runs".to_string()),
        ("runs, failed", "/runs?outcome=failed".to_string()),
        ("runs, 12 h ago (1 h range)", format!("/runs?from={}&to={}", hour(12), hour(11))),
        ("runs, one task (sparse)", format!("/runs?task={}", task_id(12))),
        ("runs, one task, 12 h ago", format!("/runs?task={}&from={}&to={}", task_id(12), hour(13), hour(11))),
        ("a run", format!("/runs/{middle}")),
        ("dead letters", "/dlq".to_string()),
        ("events", "/events".to_string()),
        ("breakers", "/breakers".to_string()),
        ("a breaker", format!("/breakers/key.{NS}.api-1")),
    ];
    let mut rows = Vec::new();
    let mut misses = Vec::new();
    for (what, path) in &pages {
        let median = time_page(http, path, args.requests).await?;
        eprintln!("console: {what:<28} {:>8.1} ms  {path}", median.as_secs_f64() * 1000.0);
        if median > PAGE_TARGET {
            misses.push(format!("{what}: {median:?}"));
        }
        rows.push(json!({"page": what, "path": path, "median_ms": median.as_secs_f64() * 1000.0}));
    }
    let (rss, peak) = memory_kib(pid);
    let (rss, peak) = (rss / 1024, peak / 1024);
    eprintln!("console: RSS {rss} MiB (peak {peak} MiB), target < {RSS_TARGET_MIB} MiB");
    if !misses.is_empty() {
        eprintln!("console: over {PAGE_TARGET:?}: {}", misses.join(", "));
    }
    console.kill().await.ok();
    shutdown.cancel();
    registry.await??;
    Ok(json!({
        "scenario": "console",
        "tasks": args.tasks.tasks,
        "run_events": args.runs,
        "requests_per_page": args.requests,
        "tasks_put_s": tasks_put.as_secs_f64(),
        "run_events_published_s": runs_put.as_secs_f64(),
        "indexed_s": indexed.as_secs_f64(),
        "pages": rows,
        "rss_mib": rss,
        "peak_rss_mib": peak,
        "over_target": misses,
    }))
}
