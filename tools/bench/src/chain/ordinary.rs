//! What a child in the deployment costs the runs of every other task: once some task has
//! `after`, every run record written is delivered to a registry replica (the verdicts
//! consumer), which reads it and drops it unless its task has children. Ordinary no-op runs go
//! through one in-process worker before any task has `after`, then again once one child
//! exists; each phase twice, in that order (the machine warms up: the first phases are the
//! slower ones if anything). Reported: runs/s, the registry's CPU per run, and the server's.

use std::time::{Duration, Instant};

use anyhow::bail;
use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_tests::NatsServer;
use jetsched_worker::{Config, Handlers, Outcome, RunContext, build};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::e2e::{Cpu, dispatches_from, drain_limit, run_through};
use crate::stats::median;
use crate::system::cpu_seconds;

/// Rounds of each phase.
const ROUNDS: usize = 2;

/// One phase: `runs` no-op runs from publish to the dispatch stream drained.
struct Phase {
    runs_per_second: f64,
    registry_cpu_us_per_run: Option<f64>,
    server_cpu_us_per_run: Option<f64>,
    /// How long after the worker the registry had handled every record (0 without a child).
    registry_behind_ms: f64,
}

/// Measures the ordinary runs without a child, then puts `with_child` (the caller stores a
/// parent and a child and returns once the registry consumes verdicts), then with it.
pub(crate) async fn measure<F, Fut>(
    server: &NatsServer,
    js: &jetstream::Context,
    registry_pid: u32,
    runs: usize,
    with_child: F,
) -> anyhow::Result<Value>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let shutdown = CancellationToken::new();
    let mut config = Config::for_tests(&server.url(), "bench-ordinary");
    config.concurrency = 64;
    let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
    let worker = tokio::spawn(build(config, handlers).await?.run(shutdown.clone()));
    let without = rounds(server, js, registry_pid, runs, 0, "without a child").await?;
    with_child().await?;
    let second = (ROUNDS * runs) as i64;
    let with = rounds(server, js, registry_pid, runs, second, "with a child in the deployment").await?;
    shutdown.cancel();
    worker.await??;
    let summary = |phases: &[Phase]| {
        json!({
            "runs_per_second": median(phases.iter().map(|p| p.runs_per_second).collect()),
            "registry_cpu_us_per_run": median(phases.iter().filter_map(|p| p.registry_cpu_us_per_run).collect()),
            "server_cpu_us_per_run": median(phases.iter().filter_map(|p| p.server_cpu_us_per_run).collect()),
            "registry_behind_ms": median(phases.iter().map(|p| p.registry_behind_ms).collect()),
            "rounds_runs_per_second": phases.iter().map(|p| p.runs_per_second).collect::<Vec<_>>(),
        })
    };
    let (without, with) = (summary(&without), summary(&with));
    let ratio = with["runs_per_second"].as_f64().unwrap_or(f64::NAN)
        / without["runs_per_second"].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "chain: ordinary runs with a child in the deployment: {:.1}% of the runs/s without",
        100.0 * ratio
    );
    Ok(json!({"runs": runs, "without_child": without, "with_child": with, "ratio_with_to_without": ratio}))
}

/// `ROUNDS` phases of `runs` runs, nominal times from `first` on.
async fn rounds(
    server: &NatsServer,
    js: &jetstream::Context,
    registry_pid: u32,
    runs: usize,
    first: i64,
    label: &str,
) -> anyhow::Result<Vec<Phase>> {
    let mut measured = Vec::new();
    for round in 0..ROUNDS {
        let messages = dispatches_from(first + (round * runs) as i64, runs)?;
        let phase = one(server, js, registry_pid, &messages).await?;
        eprintln!(
            "chain: ordinary runs {label}: {:.0} runs/s; registry CPU {:.1} µs/run, caught up {:.0} ms after the worker; server CPU {:.1} µs/run",
            phase.runs_per_second,
            phase.registry_cpu_us_per_run.unwrap_or(f64::NAN),
            phase.registry_behind_ms,
            phase.server_cpu_us_per_run.unwrap_or(f64::NAN)
        );
        measured.push(phase);
    }
    Ok(measured)
}

async fn one(
    server: &NatsServer,
    js: &jetstream::Context,
    registry_pid: u32,
    messages: &[crate::e2e::Prepared],
) -> anyhow::Result<Phase> {
    let names = Names::default();
    let registry = registry_pid.to_string();
    let (cpu, registry_cpu) = (Cpu::now(server).await, cpu_seconds(&registry));
    let elapsed = run_through(js, &names, messages).await?;
    let deadline = Instant::now() + drain_limit(messages.len());
    // The registry's share: what it spent on the records, read once it has handled them all.
    let drained = Instant::now();
    let runs_stream = Names::kv_stream(&names.runs_bucket());
    if let Ok(mut verdicts) = js
        .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(
            names.after_verdicts_consumer(),
            runs_stream,
        )
        .await
    {
        while let Ok(info) = verdicts.info().await {
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("the registry did not handle the run records in time");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let registry_behind_ms = drained.elapsed().as_secs_f64() * 1e3;
    let per_run = |now: Option<f64>, then: Option<f64>| {
        now.zip(then).map(|(n, t)| (n - t) * 1e6 / messages.len() as f64)
    };
    let server_cpu = Cpu::now(server).await.since(&cpu, messages.len()).json();
    Ok(Phase {
        runs_per_second: messages.len() as f64 / elapsed.as_secs_f64(),
        registry_cpu_us_per_run: per_run(cpu_seconds(&registry), registry_cpu),
        server_cpu_us_per_run: server_cpu["server"].as_f64(),
        registry_behind_ms,
    })
}
