//! Flow control: what a limit that never binds costs, how exactly a binding rate limit paces,
//! and how fast a concurrency slot passes to a waiting run.
//!
//! - cost: no-op runs through in-process workers, every run under a rate limit too high to
//!   bind (one key shared by every run, so every run reserves a start), then under a
//!   concurrency limit too high to bind (one key: every run takes and frees a slot with
//!   compare-and-set), against the same runs without one, alternating rounds on one server
//!   (fresh prefix per round);
//! - accuracy: `--seconds × --limit` runs dispatched at once under a limit of `--limit` per
//!   second to the same kind of workers; the calls counted in every whole second after the
//!   first, and the rate from the first call to the last;
//! - hand-over ([`handover`]): runs queued on a key of limit 1 across the workers, from a run's
//!   end to the next run's start on another worker.

mod handover;

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
    /// Runs queued at once on a key of concurrency limit 1 for the hand-over measurement.
    #[arg(long, default_value_t = 200)]
    pub(crate) handovers: usize,
}

/// The limit every run of a throughput round is under (none binds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    None,
    Rate,
    Concurrency,
}

impl Limit {
    fn label(self) -> &'static str {
        match self {
            Limit::None => "no limit",
            Limit::Rate => "non-binding rate limit",
            Limit::Concurrency => "non-binding concurrency limit",
        }
    }
}

impl Defaults for Args {}

/// Unacknowledged publishes in flight.
const WINDOW: usize = 256;

/// Numbers the rounds' prefixes (each round of each variant on a fresh one).
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let (mut without, mut rated, mut slotted) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds.rounds {
        for limit in [Limit::None, Limit::Rate, Limit::None, Limit::Concurrency] {
            let rate = throughput(&js, &server.url(), &args, round, limit).await?;
            eprintln!("limits: round {}: {}: {rate:.0} runs/s", round + 1, limit.label());
            match limit {
                Limit::None => without.push(rate),
                Limit::Rate => rated.push(rate),
                Limit::Concurrency => slotted.push(rate),
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ratio = mean(&rated) / mean(&without);
    let concurrency_ratio = mean(&slotted) / mean(&without);
    for (limit, with, ratio) in
        [(Limit::Rate, &rated, ratio), (Limit::Concurrency, &slotted, concurrency_ratio)]
    {
        eprintln!(
            "limits: mean {:.0} runs/s under a {}, {:.0} without: {:.1}% ({:+.1}%)",
            mean(with),
            limit.label(),
            mean(&without),
            100.0 * ratio,
            100.0 * (ratio - 1.0)
        );
    }
    let accuracy = accuracy(&js, &server.url(), &args).await?;
    let handover = handover::measure(&js, &server.url(), &args).await?;
    Ok(json!({
        "scenario": "limits",
        "runs": args.runs.runs,
        "workers": args.pool.workers,
        "concurrency": args.pool.concurrency,
        "without_limit_runs_per_second": without,
        "non_binding_limit_runs_per_second": rated,
        "ratio": ratio,
        "non_binding_concurrency_runs_per_second": slotted,
        "concurrency_ratio": concurrency_ratio,
        "accuracy": accuracy,
        "handover": handover,
    }))
}

/// The no-op task, with `limit` set as the field `field` (`rate_limit`, `concurrency`).
fn spec_with(field: &str, limit: Option<serde_json::Value>) -> anyhow::Result<TaskSpec> {
    let mut value = json!({
        "id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"},
        "retry": {"max_attempts": 1},
    });
    if let Some(limit) = limit {
        value[field] = limit;
    }
    TaskSpec::parse_value(value).map_err(|e| anyhow::anyhow!("{e}"))
}

fn spec(rate_limit: Option<serde_json::Value>) -> anyhow::Result<TaskSpec> {
    spec_with("rate_limit", rate_limit)
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
pub(crate) async fn publish(
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
    limit: Limit,
) -> anyhow::Result<f64> {
    let tag = match limit {
        Limit::None => "n",
        Limit::Rate => "l",
        Limit::Concurrency => "c",
    };
    let prefix = format!("lim{tag}{round}x{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let names = Names::new(&prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let task = match limit {
        Limit::None => spec(None)?,
        Limit::Rate => {
            spec(Some(json!({"key": "bench", "limit": 1_000_000, "period": "1s", "burst": 1_000_000})))?
        }
        Limit::Concurrency => spec_with("concurrency", Some(json!({"key": "bench", "limit": 10_000})))?,
    };
    let calls: Arc<Mutex<Vec<SystemTime>>> = Arc::default();
    let workers = start_workers(url, &prefix, args, &calls).await?;
    let started = Instant::now();
    publish(js, &names, &task, args.runs.runs).await?;
    // A variant far slower than the others is measured on the runs done by its deadline.
    let deadline = Instant::now() + Duration::from_secs(60 + args.runs.runs as u64 / 500);
    let mut done = 0;
    while done < args.runs.runs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
        done = calls.lock().expect("calls").len();
    }
    let elapsed = started.elapsed();
    if done < args.runs.runs {
        eprintln!("limits: {}: only {done} of {} runs in {elapsed:.0?}", limit.label(), args.runs.runs);
    }
    workers.stop().await?;
    remove_phase(js, &names).await;
    Ok(done as f64 / elapsed.as_secs_f64())
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
