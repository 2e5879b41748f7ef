//! Dependencies: a parent's verdict stored → its child's dispatch stored, against the steady
//! scenario's fire lag in the same run; then a fan-in of many parents into one child and a
//! fan-out of one parent into many children, with the time and the registry's memory.
//!
//! The registry runs as a process (its memory is read from `/proc`); the parents' verdicts are
//! written into the runs bucket as a worker writes them (a final run record), so what is timed
//! is the dependency engine alone: the record reaching the registry's durable consumer, the
//! child's wait written with compare-and-set, the dispatch stored. The times are taken by core
//! subscriptions in this process on the records' subject and the children's dispatch subjects.

mod ordinary;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{RunRecord, RunStatus, Trigger};
use jetsched_tests::{ChildProcess, NatsServer};
use serde_json::{Value, json};

use crate::scheduler::{self, Firing, SteadyArgs};
use crate::system::{Lag, rss_mib, service_bin, service_env};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Verdict → dispatch samples of a chain of one parent and one child.
    #[arg(long, default_value_t = 1000)]
    pub(crate) samples: usize,
    /// Parents of the fan-in's one child.
    #[arg(long, default_value_t = 1000)]
    pub(crate) fan_in: usize,
    /// Children of the fan-out's one parent.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) fan_out: usize,
    /// The steady scenario measured in the same run: its fire lag is the reference.
    #[command(flatten)]
    pub(crate) firing: Firing,
    /// Seconds of the steady scenario.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Ordinary no-op runs per phase, without and then with a child in the deployment.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) ordinary_runs: usize,
}

const NS: &str = "chain";

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let steady = scheduler::steady(SteadyArgs { firing: args.firing.clone(), seconds: args.seconds }).await?;
    let server = NatsServer::start().await;
    let mut registry = registry(&server.url())?;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    wait_for_api(&client, &names).await?;
    let runs = loop {
        if let Ok(runs) = js.get_key_value(names.runs_bucket()).await {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Ordinary runs before any task has `after`, then with this first child.
    let ordinary = ordinary::measure(&server, &js, registry.pid(), args.ordinary_runs, || async {
        put(&client, &names, &parent("p")).await?;
        put(&client, &names, &child("c", &["p"])).await?;
        Ok(())
    })
    .await?;

    // One parent, one child: verdict stored → dispatch stored, one at a time.
    let mut dispatches = client.subscribe(names.dispatch_subject("default", NS, "c")).await?;
    client.flush().await?;
    let base = Utc::now().timestamp_millis();
    let mut lags_us = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let record = verdict("p", base + i as i64);
        let started = Instant::now();
        runs.put(&record.execution_id, serde_json::to_vec(&record)?.into()).await?;
        let stored = started.elapsed();
        tokio::time::timeout(Duration::from_secs(10), dispatches.next())
            .await
            .with_context(|| format!("no dispatch of the child for verdict {i}"))?
            .context("dispatch subscription ended")?;
        lags_us.push(i64::try_from((started.elapsed() - stored).as_micros())?);
    }
    let chain = Lag::from_micros(lags_us);
    let steady_ms = |q: &str| steady["lag"][q].as_f64().context("the steady scenario's lag");
    let (steady_p50, steady_p99) = (steady_ms("p50_ms")?, steady_ms("p99_ms")?);
    eprintln!(
        "chain: verdict stored → child dispatched p50 {:.2} / p99 {:.2} ms over {} (steady fire lag p50 {:.2} / p99 {:.2} ms)",
        chain.p50_ms, chain.p99_ms, chain.samples, steady_p50, steady_p99
    );

    // Fan-in: N parents, one child; every parent's verdict of one nominal time.
    let parents: Vec<String> = (0..args.fan_in).map(|i| format!("in{i}")).collect();
    put_all(&client, &names, parents.iter().map(|id| parent(id)).collect()).await?;
    let refs: Vec<&str> = parents.iter().map(String::as_str).collect();
    put(&client, &names, &child("join", &refs)).await?;
    let mut joined = client.subscribe(names.dispatch_subject("default", NS, "join")).await?;
    client.flush().await?;
    let rss_before = rss_mib(registry.pid());
    let nominal = Utc::now().timestamp_millis();
    let started = Instant::now();
    for id in &parents {
        let record = verdict(id, nominal);
        runs.put(&record.execution_id, serde_json::to_vec(&record)?.into()).await?;
    }
    let written = started.elapsed();
    tokio::time::timeout(Duration::from_secs(600), joined.next())
        .await
        .context("no dispatch of the fan-in's child")?
        .context("dispatch subscription ended")?;
    let fan_in_s = started.elapsed().as_secs_f64();
    let fan_in_rss = rss_mib(registry.pid());
    eprintln!(
        "fan-in: {} parents → 1 child in {fan_in_s:.2} s (verdicts written in {:.2} s); registry RSS {rss_before:.0} → {fan_in_rss:.0} MiB",
        parents.len(),
        written.as_secs_f64()
    );

    // Fan-out: one parent, N children.
    put(&client, &names, &parent("root")).await?;
    let children: Vec<Value> = (0..args.fan_out).map(|i| child(&format!("out{i}"), &["root"])).collect();
    put_all(&client, &names, children).await?;
    let mut fanned = client.subscribe(format!("{}.dispatch.default.{NS}.*", names.prefix())).await?;
    client.flush().await?;
    let rss_before_out = rss_mib(registry.pid());
    let record = verdict("root", Utc::now().timestamp_millis());
    let started = Instant::now();
    runs.put(&record.execution_id, serde_json::to_vec(&record)?.into()).await?;
    let mut seen = 0;
    while seen < args.fan_out {
        tokio::time::timeout(Duration::from_secs(120), fanned.next())
            .await
            .with_context(|| format!("{seen} of {} children dispatched", args.fan_out))?
            .context("dispatch subscription ended")?;
        seen += 1;
    }
    let fan_out_s = started.elapsed().as_secs_f64();
    let fan_out_rss = rss_mib(registry.pid());
    eprintln!(
        "fan-out: 1 parent → {} children in {fan_out_s:.2} s ({:.0} children/s); registry RSS {rss_before_out:.0} → {fan_out_rss:.0} MiB",
        args.fan_out,
        args.fan_out as f64 / fan_out_s
    );
    // `graph` of the fan-out's parent: the first children described, the rest counted.
    let asked = Instant::now();
    let graph = client
        .request(
            names.task_api_subject("graph"),
            serde_json::to_vec(&json!({"namespace": NS, "id": "root"}))?.into(),
        )
        .await?;
    let graph_ms = asked.elapsed().as_secs_f64() * 1e3;
    let graph: Value = serde_json::from_slice(&graph.payload)?;
    let (described, total) =
        (graph["children"].as_array().map_or(0, Vec::len), graph["children_total"].clone());
    eprintln!("graph of the fan-out's parent: {described} children described of {total} in {graph_ms:.1} ms");
    registry.sigterm();
    Ok(json!({
        "graph": {"ms": graph_ms, "children_described": described, "children_total": total},
        "chain": {"samples": chain.samples, "lag": chain,
                  "steady_lag": {"p50_ms": steady_p50, "p99_ms": steady_p99},
                  "p99_ratio_to_steady": chain.p99_ms / steady_p99},
        "fan_in": {"parents": args.fan_in, "seconds": fan_in_s, "verdicts_written_seconds": written.as_secs_f64(),
                   "registry_rss_mib_before": rss_before, "registry_rss_mib_after": fan_in_rss},
        "fan_out": {"children": args.fan_out, "seconds": fan_out_s,
                    "registry_rss_mib_before": rss_before_out, "registry_rss_mib_after": fan_out_rss},
        "ordinary": ordinary,
        "steady": steady,
    }))
}

/// A registry process on `url`.
fn registry(url: &str) -> anyhow::Result<ChildProcess> {
    let mut command = std::process::Command::new(service_bin("jetsched-registry")?);
    command.env("NATS_URL", url).args(["--instance-id", "bench-registry", "--admin-addr", "127.0.0.1:0"]);
    if let Some((name, value)) = service_env() {
        command.env(name, value);
    }
    Ok(ChildProcess::spawn_command("bench-registry", command))
}

async fn wait_for_api(client: &async_nats::Client, names: &Names) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let asked = client.request(names.task_api_subject("list"), "{}".into()).await;
        if asked.is_ok() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("the registry did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn parent(id: &str) -> Value {
    json!({"id": id, "namespace": NS, "schedule": {"every": "24h"}, "executor": {"kind": "nats", "subject": "bench.none"}})
}

fn child(id: &str, parents: &[&str]) -> Value {
    json!({"id": id, "namespace": NS, "after": {"tasks": parents, "within": "1h"}, "executor": {"kind": "nats", "subject": "bench.none"}})
}

async fn put(client: &async_nats::Client, names: &Names, spec: &Value) -> anyhow::Result<()> {
    let reply = client.request(names.task_api_subject("put"), serde_json::to_vec(spec)?.into()).await?;
    let reply: Value = serde_json::from_slice(&reply.payload)?;
    if reply.get("error").is_some() {
        bail!("put {}: {reply}", spec["id"]);
    }
    Ok(())
}

/// Puts `specs`, 64 at a time.
async fn put_all(client: &async_nats::Client, names: &Names, specs: Vec<Value>) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> =
        futures::stream::iter(specs.iter().map(|spec| put(client, names, spec)))
            .buffer_unordered(64)
            .collect()
            .await;
    results.into_iter().collect()
}

/// The final record of a run of `task` for `nominal_ms`, succeeded, as a worker writes it.
fn verdict(task: &str, nominal_ms: i64) -> RunRecord {
    let now = Utc::now();
    let nominal = DateTime::from_timestamp_millis(nominal_ms).unwrap_or(now);
    RunRecord {
        execution_id: jetsched_shared::wire::fresh_execution_id(),
        namespace: NS.to_string(),
        task_id: task.to_string(),
        queue: "default".to_string(),
        nominal_time: nominal,
        trigger: Trigger::Manual,
        status: RunStatus::Succeeded,
        attempt: 1,
        worker: "bench".to_string(),
        started: now,
        first_started: now,
        finished: Some(now),
        error: None,
        release_at: None,
        reason: None,
        reruns: 0,
        failures: 0,
        attempts: Vec::new(),
        trace_id: None,
        replay_of: None,
        result: None,
    }
}
