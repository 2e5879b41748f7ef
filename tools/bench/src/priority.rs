//! Priority lanes under load: a backlog of `low` no-op runs published into the low lane as fast
//! as possible while a steady stream of `critical` runs arrives, drained by in-process worker
//! replicas (default settings, weighted policy); against the same load on one lane (every run
//! `normal`, where the critical runs wait in the FIFO behind the backlog). Rounds alternate the
//! two setups, each on fresh streams of its own prefix.
//!
//! A critical run's wait is from its publish (the instant just before the bench sends it) to
//! its handler's start, both read from this process's monotonic clock. Throughput is every run
//! (backlog and critical) over the time from the first backlog publish to the dispatch stream
//! empty (every run acked).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use async_nats::jetstream::{self, message::PublishMessage};
use chrono::Utc;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};

use crate::args::{Defaults, Pool, Rounds};
use crate::e2e::publish_all;
use crate::stats::Figures;
use crate::system::{Workers, remove_phase};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// No-op runs queued in the backlog (the `low` lane, or `normal` on one lane).
    #[arg(long, default_value_t = 200_000)]
    pub(crate) backlog: usize,
    /// Critical runs per second, published while the backlog drains.
    #[arg(long, default_value_t = 20)]
    pub(crate) rate: u32,
    // The worker's default concurrency.
    #[command(flatten)]
    pub(crate) pool: Pool<Args>,
    // Each round runs the lanes, then one lane.
    #[command(flatten)]
    pub(crate) rounds: Rounds<Args>,
}

impl Defaults for Args {
    const WORKERS: &'static str = "4";
    const CONCURRENCY: &'static str = "32";
}

/// Which setup a phase measures.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Setup {
    /// Backlog `low`, stream `critical`.
    Lanes,
    /// Backlog and stream both `normal`.
    OneLane,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Lanes => "lanes",
            Setup::OneLane => "one lane",
        }
    }

    /// The priorities of the backlog's and the stream's specs.
    fn priorities(self) -> (&'static str, &'static str) {
        match self {
            Setup::Lanes => ("low", "critical"),
            Setup::OneLane => ("normal", "normal"),
        }
    }
}

/// Publish instants (and whether the backlog was still being published then) and start
/// instants of the critical runs, by execution id.
#[derive(Default)]
struct Critical {
    sent: HashMap<String, (Instant, bool)>,
    started: HashMap<String, Instant>,
}

/// One phase's figures.
struct Phase {
    waits: Figures,
    /// Of the critical runs sent while the backlog was still being published.
    during_publish: Figures,
    /// Of the critical runs sent after the whole backlog was stored.
    after_publish: Figures,
    runs: usize,
    runs_per_second: f64,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.rate > 0 && args.pool.workers > 0 && args.rounds.rounds > 0,
        "rate, workers, rounds ≥ 1"
    );
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let mut rounds = Vec::new();
    let mut rows = Vec::new();
    for round in 1..=args.rounds.rounds {
        let mut pair = serde_json::Map::new();
        for setup in [Setup::Lanes, Setup::OneLane] {
            let prefix = format!("prio{round}{}", if setup == Setup::Lanes { "l" } else { "n" });
            let phase = measure(&js, &server.url(), &args, setup, &prefix).await?;
            let (w, d, a) = (&phase.waits, &phase.during_publish, &phase.after_publish);
            eprintln!(
                "priority round {round}, {}: {:.0} runs/s; critical wait p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} runs); p99 while the backlog was published {:.1} ms ({} runs), after {:.1} ms ({} runs)",
                setup.label(),
                phase.runs_per_second,
                w.p50_ms,
                w.p99_ms,
                w.max_ms,
                w.operations,
                d.p99_ms,
                d.operations,
                a.p99_ms,
                a.operations,
            );
            let mut figures = phase.waits.clone();
            figures.what = format!("round {round}, {}: critical wait", setup.label());
            rows.push((figures, phase.runs_per_second));
            let key = if setup == Setup::Lanes { "lanes" } else { "one_lane" };
            pair.insert(
                key.into(),
                json!({
                    "runs": phase.runs,
                    "runs_per_second": phase.runs_per_second,
                    "critical_runs": phase.waits.operations,
                    "critical_wait": percentiles(&phase.waits),
                    "critical_wait_during_backlog_publish": percentiles(&phase.during_publish),
                    "critical_wait_after_backlog_publish": percentiles(&phase.after_publish),
                }),
            );
        }
        rounds.push(Value::Object(pair));
    }
    print_table(&rows);
    let median = |setup: &str, pointer: &str| {
        crate::stats::median(
            rounds.iter().filter_map(|r| r[setup].pointer(pointer).and_then(Value::as_f64)).collect(),
        )
    };
    let summary = json!({
        "lanes_critical_p99_ms_median": median("lanes", "/critical_wait/p99_ms"),
        "lanes_runs_per_second_median": median("lanes", "/runs_per_second"),
        "one_lane_critical_p99_ms_median": median("one_lane", "/critical_wait/p99_ms"),
        "one_lane_runs_per_second_median": median("one_lane", "/runs_per_second"),
    });
    Ok(json!({
        "scenario": "priority",
        "backlog": args.backlog,
        "critical_per_second": args.rate,
        "workers": args.pool.workers,
        "concurrency": args.pool.concurrency,
        "wait_measured": "publish to handler start",
        "rounds": rounds,
        "summary": summary,
    }))
}

fn percentiles(f: &Figures) -> Value {
    json!({"runs": f.operations, "p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "max_ms": f.max_ms})
}

fn print_table(rows: &[(Figures, f64)]) {
    eprintln!();
    eprintln!(
        "{:<36} {:>9} {:>10} {:>10} {:>10} {:>12}",
        "phase", "critical", "p50 ms", "p99 ms", "max ms", "all runs/s"
    );
    for (w, rate) in rows {
        eprintln!(
            "{:<36} {:>9} {:>10.1} {:>10.1} {:>10.1} {:>12.0}",
            w.what, w.operations, w.p50_ms, w.p99_ms, w.max_ms, rate
        );
    }
}

/// A no-op task `id` of `priority` in namespace `bench`.
fn task(id: &str, priority: &str) -> anyhow::Result<TaskSpec> {
    let text = format!(
        r#"{{"id": "{id}", "namespace": "bench", "schedule": {{"every": "1h"}}, "priority": "{priority}",
        "executor": {{"kind": "handler", "name": "noop"}}}}"#
    );
    TaskSpec::parse(text.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The backlog's dispatches (all to one lane subject), built by the shared builder.
fn backlog(names: &Names, spec: &TaskSpec, runs: usize) -> anyhow::Result<(String, Vec<PublishMessage>)> {
    let mut subject = String::new();
    let messages = (0..runs as i64)
        .map(|nominal_ms| {
            let origin = Origin::Scheduled { nominal_ms, term: 1, catchup: false };
            let built = dispatch::build(names, Target::of(spec, 1), origin, SpecBody::Spec(spec))?;
            subject = built.subject;
            Ok(built.message)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((subject, messages))
}

/// One phase on fresh streams under `prefix`: workers up, backlog and critical stream
/// published, until every run is acked.
async fn measure(
    js: &jetstream::Context,
    url: &str,
    args: &Args,
    setup: Setup,
    prefix: &str,
) -> anyhow::Result<Phase> {
    let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let (backlog_priority, critical_priority) = setup.priorities();
    let backlog_spec = task("backlog", backlog_priority)?;
    let critical_spec = task("critical", critical_priority)?;
    // Built before the timings.
    let (subject, messages) = backlog(&names, &backlog_spec, args.backlog)?;

    let critical = Arc::new(Mutex::new(Critical::default()));
    let publishing = Arc::new(AtomicBool::new(true));
    let backlog_done = Arc::new(AtomicUsize::new(0));
    let workers = Workers::start(url, prefix, args.pool.workers, args.pool.concurrency, || {
        let (critical, backlog_done) = (critical.clone(), backlog_done.clone());
        Handlers::new().register("noop", move |run: RunContext| {
            if run.task_id == "critical" {
                critical.lock().unwrap().started.entry(run.execution_id).or_insert_with(Instant::now);
            } else {
                backlog_done.fetch_add(1, Ordering::Relaxed);
            }
            async { Outcome::ok() }
        })
    })
    .await?;

    let started = Instant::now();
    // Bounds the whole phase: a stalled drain ends it with an error rather than hanging.
    let deadline = started + Duration::from_secs(120 + args.backlog as u64 / 500);
    let stream_task = {
        let (js, names, critical, backlog_done, publishing) =
            (js.clone(), names.clone(), critical.clone(), backlog_done.clone(), publishing.clone());
        let (backlog, rate) = (args.backlog, args.rate);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut acks = Vec::new();
            while backlog_done.load(Ordering::Relaxed) < backlog {
                if Instant::now() > deadline {
                    let done = backlog_done.load(Ordering::Relaxed);
                    bail!("the workers started {done} of {backlog} backlog runs before the deadline");
                }
                tick.tick().await;
                let origin = Origin::Manual { at: Utc::now() };
                let built = dispatch::build(
                    &names,
                    Target::of(&critical_spec, 1),
                    origin,
                    SpecBody::Spec(&critical_spec),
                )?;
                let during = publishing.load(Ordering::Relaxed);
                critical.lock().unwrap().sent.insert(built.execution_id, (Instant::now(), during));
                acks.push(js.send_publish(built.subject, built.message).await?);
            }
            for ack in acks {
                ack.await?;
            }
            anyhow::Ok(())
        })
    };
    publish_all(js, &subject, &messages).await?;
    publishing.store(false, Ordering::Relaxed);
    drop(messages);
    stream_task.await??;

    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    loop {
        let all_started = {
            let c = critical.lock().unwrap();
            c.started.len() >= c.sent.len()
        };
        if all_started && stream.info().await?.state.messages == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{}: the workers did not drain {} runs in time", setup.label(), args.backlog);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    workers.stop().await?;
    remove_phase(js, &names).await;

    let critical = critical.lock().unwrap();
    let waits: Vec<(Duration, bool)> = critical
        .sent
        .iter()
        .filter_map(|(id, (sent, during))| {
            critical.started.get(id).map(|at| (at.saturating_duration_since(*sent), *during))
        })
        .collect();
    anyhow::ensure!(waits.len() == critical.sent.len(), "every critical run started");
    let runs = args.backlog + waits.len();
    let part = |during: bool| waits.iter().filter(|(_, d)| *d == during).map(|(w, _)| *w).collect();
    Ok(Phase {
        during_publish: Figures::from_samples("during", part(true), elapsed),
        after_publish: Figures::from_samples("after", part(false), elapsed),
        waits: Figures::from_samples("critical wait", waits.iter().map(|(w, _)| *w).collect(), elapsed),
        runs,
        runs_per_second: runs as f64 / elapsed.as_secs_f64(),
    })
}
