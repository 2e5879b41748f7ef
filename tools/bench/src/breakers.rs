//! Circuit breakers: what a closed breaker costs and how fast an open one stops calls.
//!
//! - cost: no-op runs through in-process workers, every run behind a closed breaker against
//!   the same runs without one, alternating A/B rounds on one server (fresh prefix per round);
//! - stop: runs of an always-failing handler dispatched at a steady rate to the same workers,
//!   one fresh breaker per trial; the time from the attempt that makes the window trip the
//!   threshold (the `min_runs`-th failure) to the last call that started, over many trials.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use async_nats::jetstream;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use crate::args::{Defaults, Pool, Rounds, Runs};
use crate::stats::Figures;
use crate::system::{Workers, remove_phase};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    // Runs of each throughput measurement.
    #[command(flatten)]
    pub(crate) runs: Runs<Args>,
    // Each round runs both variants (interleaved: without, with, without, ...).
    #[command(flatten)]
    pub(crate) rounds: Rounds<Args>,
    #[command(flatten)]
    pub(crate) pool: Pool<Args>,
    /// Trials of the stop measurement.
    #[arg(long, default_value_t = 30)]
    pub(crate) trials: usize,
    /// Failing runs dispatched per second during a stop trial.
    #[arg(long, default_value_t = 200)]
    pub(crate) rate: u64,
}

impl Defaults for Args {}

/// Unacknowledged publishes in flight.
const WINDOW: usize = 256;

/// The breaker's `min_runs` in the stop trials (every attempt fails, so the threshold is
/// crossed by the `MIN_RUNS`-th failure).
const MIN_RUNS: usize = 20;

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let mut without = Vec::new();
    let mut with = Vec::new();
    for round in 0..args.rounds.rounds {
        for breaker in [false, true] {
            let rate = throughput(&js, &server.url(), &args, round, breaker).await?;
            let label = if breaker { "closed breaker" } else { "no breaker" };
            eprintln!("breakers: round {}: {label}: {rate:.0} runs/s", round + 1);
            if breaker { with.push(rate) } else { without.push(rate) }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratio = mean(&with) / mean(&without);
    eprintln!(
        "breakers: mean {:.0} runs/s with a closed breaker, {:.0} without: {:.1}% ({:+.1}%)",
        mean(&with),
        mean(&without),
        100.0 * ratio,
        100.0 * (ratio - 1.0)
    );
    let stop = stop_latency(&js, &server.url(), &args).await?;
    Figures::print_table(std::slice::from_ref(&stop));
    Ok(json!({
        "scenario": "breakers",
        "runs": args.runs.runs,
        "workers": args.pool.workers,
        "concurrency": args.pool.concurrency,
        "without_breaker_runs_per_second": without,
        "closed_breaker_runs_per_second": with,
        "ratio": ratio,
        "stop": stop,
    }))
}

fn spec(id: &str, handler: &str, breaker: Option<serde_json::Value>) -> anyhow::Result<TaskSpec> {
    let mut value = json!({
        "id": id, "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": handler},
        "retry": {"max_attempts": 1},
    });
    if let Some(breaker) = breaker {
        value["breaker"] = breaker;
    }
    TaskSpec::parse_value(value).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The scenario's workers on `prefix`: a no-op handler and a failing one that records when
/// each call started.
async fn start_workers(
    url: &str,
    prefix: &str,
    args: &Args,
    calls: &Arc<Mutex<Vec<Instant>>>,
) -> anyhow::Result<Workers> {
    Workers::start(url, prefix, args.pool.workers, args.pool.concurrency, || {
        let calls = calls.clone();
        Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() }).register(
            "down",
            move |_run: RunContext| {
                calls.lock().expect("calls").push(Instant::now());
                async { Outcome::permanent("down") }
            },
        )
    })
    .await
}

/// One throughput round: `--runs` no-op runs, behind a closed breaker or not, drained by
/// the workers; runs per second from the first publish to an empty dispatch stream.
async fn throughput(
    js: &jetstream::Context,
    url: &str,
    args: &Args,
    round: usize,
    breaker: bool,
) -> anyhow::Result<f64> {
    let prefix = format!("brk{}{round}", if breaker { "b" } else { "n" });
    let names = Names::new(&prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    // A breaker that never trips on no-op runs: every attempt is counted and merged all the same.
    let breaker = breaker.then(|| json!({"key": "bench", "min_runs": 1000000}));
    let task = spec("noop", "noop", breaker)?;
    let messages = (0..args.runs.runs as i64)
        .map(|nominal_ms| {
            let origin = Origin::Scheduled { nominal_ms, term: 1, catchup: false };
            Ok(dispatch::build(&names, Target::of(&task, 1), origin, SpecBody::Spec(&task))?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let workers = start_workers(url, &prefix, args, &Arc::default()).await?;
    let started = Instant::now();
    let mut pending = std::collections::VecDeque::with_capacity(WINDOW);
    for built in messages {
        pending.push_back(js.send_publish(built.subject, built.message).await?);
        if pending.len() >= WINDOW
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    let deadline = Instant::now() + Duration::from_secs(120 + args.runs.runs as u64 / 500);
    while stream.info().await?.state.messages > 0 {
        if Instant::now() > deadline {
            bail!("workers did not drain {} runs in time", args.runs.runs);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    workers.stop().await?;
    remove_phase(js, &names).await;
    Ok(args.runs.runs as f64 / elapsed.as_secs_f64())
}

/// Trials of a failing task behind a fresh breaker each: the time from the `MIN_RUNS`-th
/// failed call (the threshold crossed) to the start of the last call (no probe comes within
/// a trial: `open_for` is a minute).
async fn stop_latency(js: &jetstream::Context, url: &str, args: &Args) -> anyhow::Result<Figures> {
    let prefix = "brkstop";
    let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let workers = start_workers(url, prefix, args, &calls).await?;
    let started = Instant::now();
    let mut samples = Vec::new();
    let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    for trial in 0..args.trials {
        calls.lock().expect("calls").clear();
        let breaker = json!({"min_runs": MIN_RUNS, "failure_rate": 0.5, "window": "1m", "open_for": "1m", "on_open": "skip"});
        let task = spec(&format!("down{trial}"), "down", Some(breaker))?;
        // Dispatch at the rate until the threshold was crossed a second ago.
        let mut crossed: Option<Instant> = None;
        let mut n = 0i64;
        let mut next = tokio::time::Instant::now();
        loop {
            let origin = Origin::Scheduled { nominal_ms: n, term: 1, catchup: false };
            let built = dispatch::build(&names, Target::of(&task, 1), origin, SpecBody::Spec(&task))?;
            js.send_publish(built.subject, built.message).await?;
            n += 1;
            if crossed.is_none() {
                crossed = calls.lock().expect("calls").get(MIN_RUNS - 1).copied();
            }
            if crossed.is_some_and(|at| at.elapsed() > Duration::from_secs(1)) {
                break;
            }
            if n > args.rate as i64 * 30 {
                bail!("trial {trial}: the breaker never stopped the calls");
            }
            next += period;
            tokio::time::sleep_until(next).await;
        }
        let (Some(crossed), Some(last)) = (crossed, calls.lock().expect("calls").last().copied()) else {
            bail!("trial {trial}: no calls recorded");
        };
        samples.push(last.saturating_duration_since(crossed));
    }
    let figures = Figures::from_samples(
        &format!("threshold crossed → last call ({} workers)", args.pool.workers),
        samples,
        started.elapsed(),
    );
    workers.stop().await?;
    remove_phase(js, &names).await;
    Ok(figures)
}
