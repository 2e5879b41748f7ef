//! What a run event costs: `--units` units of work in flight (a worker's deliveries), each
//! telling one event at a time and waiting until it is stored, as a worker's delivery does,
//! through the workers' publisher with its events in fast-ingest batches and with one publish
//! and acknowledgement per event, alternating for `--rounds` rounds on fresh servers. Reports
//! events/s, CPU per event of the server and of this process, and the server's messages per
//! event, each batched figure against the one-by-one figure of the same round.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind};
use jetsched_tests::NatsServer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{Defaults, Rounds};
use crate::e2e::Cpu;
use crate::stats::median;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Events per phase.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) events: usize,
    /// Units of work in flight, each telling one event at a time.
    #[arg(long, default_value_t = 256)]
    pub(crate) units: usize,
    // Each round runs both phases, one after the other.
    #[command(flatten)]
    pub(crate) rounds: Rounds<Args>,
}

impl Defaults for Args {}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let mut rounds = Vec::new();
    for round in 1..=args.rounds.rounds.max(1) {
        let alone = phase(&args, false).await?;
        let batched = phase(&args, true).await?;
        let ratio = |field: &str| batched[field].as_f64().zip(alone[field].as_f64()).map(|(b, a)| b / a);
        eprintln!(
            "events: round {round}: batched {:.2}x the events/s, {:.2}x the server's CPU per event of one by one",
            ratio("per_second").unwrap_or(f64::NAN),
            ratio("server").unwrap_or(f64::NAN),
        );
        rounds.push(json!({
            "alone": alone,
            "batched": batched,
            "rate_ratio": ratio("per_second"),
            "server_cpu_ratio": ratio("server"),
            "client_cpu_ratio": ratio("client"),
        }));
    }
    let medians = |field: &str| median(rounds.iter().filter_map(|r| r[field].as_f64()).collect());
    Ok(json!({
        "scenario": "events",
        "events": args.events,
        "units": args.units,
        "rate_ratio": medians("rate_ratio"),
        "server_cpu_ratio": medians("server_cpu_ratio"),
        "client_cpu_ratio": medians("client_cpu_ratio"),
        "rounds": rounds,
    }))
}

/// One phase on a fresh server: every unit tells its share of the events.
async fn phase(args: &Args, batched: bool) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    topology::ensure(&js, &names, &TopologyArgs::default()).await?;
    let mut publisher = EventPublisher::with_metrics(js, names, &prometheus::Registry::new())?;
    if batched {
        publisher = publisher.with_batches(client.clone()).await?;
    }
    let units = args.units.max(1);
    let each = args.events.div_ceil(units);
    let total = each * units;
    let before = Cpu::now(&server).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..units)
        .map(|unit| {
            let publisher = publisher.clone();
            tokio::spawn(async move {
                let stop = CancellationToken::new();
                for i in 0..each {
                    let mut events = publisher.batch();
                    events.emit(Event::new(EventKind::RunSucceeded, "bench", format!("u{unit}-{i}"))).await;
                    events.flush(Duration::from_secs(30), &stop).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let elapsed = started.elapsed();
    let used = Cpu::now(&server).await.since(&before, total);
    let rate = total as f64 / elapsed.as_secs_f64();
    let label = if batched { "in batches" } else { "one by one" };
    eprintln!("events: {label}: {rate:.0} events/s{used}; {} given up", publisher.failed_total());
    // CPU µs per event of the server and of this process, the server's messages per event.
    let mut report = used.json();
    report["per_second"] = json!(rate);
    report["given_up"] = json!(publisher.failed_total());
    Ok(report)
}
