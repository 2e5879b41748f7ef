//! Rate limits: what a limit that never binds costs, and how exactly a binding one paces.
//!
//! - cost: no-op runs through in-process workers, every run under a rate limit too high to
//!   bind (one key shared by every run, so every run reserves a start with compare-and-set),
//!   against the same runs without one, alternating A/B rounds on one server (fresh prefix per
//!   round);
//! - accuracy: `--seconds × --limit` runs dispatched at once under a limit of `--limit` per
//!   second to the same kind of workers; the calls counted in every whole second after the
//!   first, and the rate from the first call to the last.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// The binding limit of the accuracy measurement, runs per second.
    #[arg(long, default_value_t = 1000)]
    pub(crate) limit: u32,
    /// How long the accuracy measurement's runs last at the limit.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
}

impl Defaults for Args {}

/// Unacknowledged publishes in flight.
const WINDOW: usize = 256;

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..args.rounds.rounds {
        for limited in [false, true] {
            let rate = throughput(&js, &server.url(), &args, round, limited).await?;
            let label = if limited { "non-binding rate limit" } else { "no limit" };
            eprintln!("limits: round {}: {label}: {rate:.0} runs/s", round + 1);
            if limited { with.push(rate) } else { without.push(rate) }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratio = mean(&with) / mean(&without);
    eprintln!(
        "limits: mean {:.0} runs/s under a non-binding limit, {:.0} without: {:.1}% ({:+.1}%)",
        mean(&with),
        mean(&without),
        100.0 * ratio,
        100.0 * (ratio - 1.0)
    );
    let accuracy = accuracy(&js, &server.url(), &args).await?;
    Ok(json!({
        "scenario": "limits",
        "runs": args.runs.runs,
        "workers": args.pool.workers,
        "concurrency": args.pool.concurrency,
        "without_limit_runs_per_second": without,
        "non_binding_limit_runs_per_second": with,
        "ratio": ratio,
        "accuracy": accuracy,
    }))
}

fn spec(rate_limit: Option<serde_json::Value>) -> anyhow::Result<TaskSpec> {
    let mut value = json!({
        "id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"},
        "retry": {"max_attempts": 1},
    });
    if let Some(rate_limit) = rate_limit {
        value["rate_limit"] = rate_limit;
    }
    TaskSpec::parse_value(value).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The scenario's workers on `prefix`: a no-op handler recording when each call started.
async fn start_workers(
    url: &str,
    prefix: &str,
    args: &Args,
    calls: &Arc<Mutex<Vec<SystemTime>>>,
) -> anyhow::Result<Workers> {
    Workers::start(url, prefix, args.pool.workers, args.pool.concurrency, || {
        let calls = calls.clone();
        Handlers::new().register("noop", move |_run: RunContext| {
            calls.lock().expect("calls").push(SystemTime::now());
            async { Outcome::ok() }
        })
    })
    .await
}

/// Publishes `count` dispatches of `task` with a bounded window of acknowledgements.
async fn publish(
    js: &jetstream::Context,
    names: &Names,
    task: &TaskSpec,
    count: usize,
) -> anyhow::Result<()> {
    let mut pending = std::collections::VecDeque::with_capacity(WINDOW);
    for nominal_ms in 0..count as i64 {
        let origin = Origin::Scheduled { nominal_ms, term: 1, catchup: false };
        let built = dispatch::build(names, Target::of(task, 1), origin, SpecBody::Spec(task))?;
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
    Ok(())
}

/// One throughput round: `--runs` no-op runs, under a non-binding limit or none, drained by the
/// workers; runs per second from the first publish to the last call.
async fn throughput(
    js: &jetstream::Context,
    url: &str,
    args: &Args,
    round: usize,
    limited: bool,
) -> anyhow::Result<f64> {
    let prefix = format!("lim{}{round}", if limited { "l" } else { "n" });
    let names = Names::new(&prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let limit =
        limited.then(|| json!({"key": "bench", "limit": 1_000_000, "period": "1s", "burst": 1_000_000}));
    let task = spec(limit)?;
    let calls: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let workers = start_workers(url, &prefix, args, &calls).await?;
    let started = Instant::now();
    publish(js, &names, &task, args.runs.runs).await?;
    let deadline = Instant::now() + Duration::from_secs(120 + args.runs.runs as u64 / 500);
    while calls.lock().expect("calls").len() < args.runs.runs {
        if Instant::now() > deadline {
            bail!("workers did not run {} runs in time", args.runs.runs);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    workers.stop().await?;
    remove_phase(js, &names).await;
    Ok(args.runs.runs as f64 / elapsed.as_secs_f64())
}

/// `--seconds × --limit` runs at once under a limit of `--limit` per second: the calls in each
/// whole second after the first, and the rate between the first call and the last.
async fn accuracy(js: &jetstream::Context, url: &str, args: &Args) -> anyhow::Result<serde_json::Value> {
    let prefix = "limacc";
    let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let calls: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let workers = start_workers(url, prefix, args, &calls).await?;
    let task = spec(Some(json!({"key": "acc", "limit": args.limit, "period": "1s"})))?;
    let total = args.limit as usize * args.seconds as usize;
    publish(js, &names, &task, total).await?;
    let deadline = Instant::now() + Duration::from_secs(args.seconds * 3 + 60);
    while calls.lock().expect("calls").len() < total {
        if Instant::now() > deadline {
            bail!("workers did not run {total} runs in time");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    workers.stop().await?;
    remove_phase(js, &names).await;
    let mut times: Vec<f64> = calls
        .lock()
        .expect("calls")
        .iter()
        .map(|t| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for t in &times {
        *per_second.entry(t.floor() as i64).or_default() += 1;
    }
    let (first, last) = (times[0], times[times.len() - 1]);
    // The rate over the run: N - 1 intervals between the first call and the last.
    let rate = (times.len() - 1) as f64 / (last - first).max(1e-9);
    let whole: Vec<usize> = {
        let (a, b) = (first.floor() as i64, last.floor() as i64);
        (a + 1..b).map(|s| per_second.get(&s).copied().unwrap_or(0)).collect()
    };
    let limit = f64::from(args.limit);
    let worst = whole.iter().map(|&n| (n as f64 / limit - 1.0).abs()).fold(0.0, f64::max);
    eprintln!(
        "limits: {total} runs at a limit of {} /s: {rate:.1} runs/s first to last call ({:+.2}%); \
         whole seconds {whole:?}, worst {:.2}% off",
        args.limit,
        100.0 * (rate / limit - 1.0),
        100.0 * worst
    );
    Ok(json!({
        "limit": args.limit,
        "runs": total,
        "rate": rate,
        "rate_ratio": rate / limit,
        "whole_seconds": whole,
        "worst_second_off": worst,
    }))
}
