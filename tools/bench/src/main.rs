//! `jetsched-bench`: bounded load scenarios against a nats-server it starts itself, each
//! measured beside raw JetStream doing the equivalent work in the same run. Prints a table
//! and a JSON report.

mod accounts;
mod args;
mod backfill;
mod breakers;
mod chain;
mod console;
mod e2e;
mod events;
mod failover;
mod limits;
mod priority;
mod raw;
mod registry;
mod scheduler;
mod schedules;
mod soak;
mod stats;
mod system;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand, ValueEnum};
use jetsched_shared::config::LogFormat;
use jetsched_shared::telemetry::{self, TraceSettings};
use serde_json::{Value, json};

use crate::args::{Clients, Rounds, Tasks};

#[derive(Debug, Parser)]
#[command(name = "jetsched-bench", about = "Measure jetsched against raw JetStream on this machine")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Also write the JSON report to this file.
    #[arg(long, global = true)]
    json: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Registry `put` throughput and latency with concurrent clients, beside raw concurrent KV puts.
    Registry(registry::Args),
    /// The API and a run's path from a team's account (service and stream imports) against the
    /// same from the services' account, in alternating rounds.
    Accounts(accounts::Args),
    /// Raw JetStream baselines: pipelined publish with message ids, pull + ack.
    Raw(raw::Args),
    /// N one-shot tasks due at the same second: time to dispatch all, lag, ratio to raw publishing
    /// and to the server's own message schedules of N messages due at one second.
    Burst(scheduler::BurstArgs),
    /// N interval tasks firing at a steady rate: lag percentiles.
    Steady(scheduler::SteadyArgs),
    /// A backfill of N nominal times against the burst of N one-shots in the same run, with the
    /// live schedule's fire lag before and while it runs (not part of `all`).
    Backfill(backfill::Args),
    /// Dependencies: a parent's verdict stored → its child's dispatch stored (p50, p99) against
    /// the steady scenario's fire lag in the same run; a fan-in of 1,000 parents into one
    /// child and a fan-out of one parent into 10,000 children, with time and the registry's
    /// memory (not part of `all`).
    Chain(chain::Args),
    /// No-op runs end to end with 1, 2, 4 worker replicas, against raw publish + pull + ack. With
    /// more than one round, each ratio is taken within its round and the median is reported
    /// beside every round's share of the ceiling (the machine's speed drifts between phases more
    /// than a change moves it).
    E2e(e2e::Args),
    /// No-op runs behind a closed circuit breaker against none (A/B rounds), and the time from
    /// a breaker's threshold crossed to the last call of a failing task, over many trials.
    Breakers(breakers::Args),
    /// No-op runs under a rate limit that never binds against none (A/B rounds), and the rate
    /// and per-second counts of runs paced by a binding limit (default 1,000/s).
    Limits(limits::Args),
    /// Run events told by many deliveries in flight, in fast-ingest batches against one
    /// publish per event (A/B rounds on fresh servers): events/s and CPU per event.
    Events(events::Args),
    /// A critical stream behind a low backlog, against the same load on one lane (A/B rounds).
    Priority(priority::Args),
    /// Leader kill -9 to the next dispatch, over repeated kills of real scheduler processes, with
    /// tasks firing every second.
    Failover(failover::Args),
    /// Graceful leader stop during steady firing; a warm follower takes over: fire lag around it.
    Handover(scheduler::HandoverArgs),
    /// Load time and resident memory of a scheduler process with N tasks, against a raw watch.
    Scale(scheduler::ScaleArgs),
    /// Every service as a process at a sustained run rate for minutes: memory flat, fire lag
    /// not growing (not part of `all`).
    Soak(soak::Args),
    /// The console with 100,000 tasks and 1,000,000 run events: every page's median time and
    /// the process's memory (not part of `all`).
    Console(console::Args),
    /// Every scenario at one size; one table and one JSON report.
    All(AllArgs),
    /// A local OTLP/HTTP receiver that takes spans and counts them, for measuring the cost of
    /// trace export (run a scenario beside it with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing here).
    TraceSink(TraceSinkArgs),
}

#[derive(Debug, clap::Args)]
struct TraceSinkArgs {
    /// Port to listen on (127.0.0.1).
    #[arg(long, default_value_t = 4318)]
    port: u16,
    /// How long to run before printing what it received.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Size {
    /// Seconds per scenario: for CI smoke tests.
    Tiny,
    /// A few minutes in all.
    Small,
    /// The published sizes (100k burst, 100k steady at 1k/s, 1M tasks, 20 kills).
    Full,
}

#[derive(Debug, clap::Args)]
struct AllArgs {
    #[arg(long, value_enum, default_value_t = Size::Small)]
    size: Size,
}

async fn all(size: Size) -> anyhow::Result<Value> {
    // (registry puts, raw msgs, burst, steady tasks, rate, seconds, e2e runs, workers, kills, scale)
    let (puts, raw, burst, steady, rate, seconds, runs, workers, kills, scale) = match size {
        Size::Tiny => (2_000, 5_000, 2_000, 1_000, 200, 3, 2_000, vec![1, 2], 2, 5_000),
        Size::Small => (20_000, 50_000, 20_000, 20_000, 1_000, 10, 10_000, vec![1, 2, 4], 5, 100_000),
        Size::Full => (50_000, 100_000, 100_000, 100_000, 1_000, 20, 20_000, vec![1, 2, 4], 20, 1_000_000),
    };
    let mut report = serde_json::Map::new();
    report.insert("raw".into(), raw::run(raw::Args { messages: raw, window: 512 }).await?);
    report.insert(
        "registry".into(),
        registry::run(registry::Args { puts, clients: Clients::new(64), connections: 8, in_process: false })
            .await?,
    );
    report.insert(
        "burst".into(),
        scheduler::burst(scheduler::BurstArgs { tasks: Tasks::new(burst), window: 512 }).await?,
    );
    report.insert(
        "steady".into(),
        scheduler::steady(scheduler::SteadyArgs {
            firing: scheduler::Firing { tasks: Tasks::new(steady), rate },
            seconds,
        })
        .await?,
    );
    report.insert("e2e".into(), e2e::run(e2e::Args::sized(runs, workers)).await?);
    report.insert(
        "failover".into(),
        failover::run(failover::Args { tasks: Tasks::new(100), kills, lease_ms: 3000, stops: 3 }).await?,
    );
    let (tasks, rate, seconds) = match size {
        Size::Tiny => (1_000, 200, 2),
        Size::Small => (20_000, 1_000, 5),
        Size::Full => (100_000, 1_000, 10),
    };
    report.insert(
        "handover".into(),
        scheduler::handover(scheduler::HandoverArgs {
            firing: scheduler::Firing { tasks: Tasks::new(tasks), rate },
            seconds,
        })
        .await?,
    );
    let rounds = if matches!(size, Size::Full) { 3 } else { 1 };
    report.insert(
        "scale".into(),
        scheduler::scale(scheduler::ScaleArgs { tasks: Tasks::new(scale), rounds: Rounds::new(rounds) })
            .await?,
    );
    print_summary(&report);
    Ok(json!({"size": format!("{size:?}").to_lowercase(), "scenarios": report}))
}

fn print_summary(report: &serde_json::Map<String, Value>) {
    let f = |scenario: &str, path: &str| {
        report.get(scenario).and_then(|v| v.pointer(path)).and_then(Value::as_f64).unwrap_or(f64::NAN)
    };
    eprintln!();
    eprintln!("{:<12} {:<48} {:>12} {:>12}", "scenario", "measure", "value", "vs raw");
    let row = |scenario: &str, what: &str, value: f64, ratio: Option<f64>| {
        let ratio = ratio.map(|r| format!("{r:.2}x")).unwrap_or_default();
        eprintln!("{scenario:<12} {what:<48} {value:>12.1} {ratio:>12}");
    };
    row("raw", "publish with msg ids, msg/s", f("raw", "/publish_with_ids_per_second"), None);
    row("raw", "pull + ack, msg/s", f("raw", "/pull_ack_per_second"), None);
    row(
        "registry",
        "put new tasks, puts/s",
        f("registry", "/phases/1/per_second"),
        Some(f("registry", "/ratio_to_raw")),
    );
    row(
        "burst",
        "time to dispatch all, ms",
        f("burst", "/dispatch_all_ms"),
        Some(f("burst", "/ratio_to_raw")),
    );
    row("burst", "lag p50, ms", f("burst", "/lag/p50_ms"), None);
    row("burst", "lag p99, ms", f("burst", "/lag/p99_ms"), None);
    row("steady", "fires/s", f("steady", "/fires_per_second"), None);
    row("steady", "lag p50, ms", f("steady", "/lag/p50_ms"), None);
    row("steady", "lag p99, ms", f("steady", "/lag/p99_ms"), None);
    if let Some(replicas) = report.get("e2e").and_then(|v| v.get("replicas")).and_then(Value::as_array) {
        for r in replicas {
            let n = r["workers"].as_u64().unwrap_or(0);
            row(
                "e2e",
                &format!("{n} worker(s), runs/s"),
                r["runs_per_second"].as_f64().unwrap_or(f64::NAN),
                r["ratio_to_raw"].as_f64(),
            );
        }
    }
    row("failover", "kill -9 to next dispatch p50, ms", f("failover", "/gap/p50_ms"), None);
    row("failover", "kill -9 to next dispatch p99, ms", f("failover", "/gap/p99_ms"), None);
    row("handover", "graceful stop: fire lag p99, ms", f("handover", "/lag/p99_ms"), None);
    row("handover", "graceful stop: fire lag max, ms", f("handover", "/lag/max_ms"), None);
    row(
        "scale",
        "floor (watch + spec parse), ms",
        f("scale", "/floor_ms"),
        Some(f("scale", "/floor_to_raw")),
    );
    row("scale", "scheduler load, ms", f("scale", "/load_ms"), Some(f("scale", "/ratio_to_raw")));
    row(
        "scale",
        "scheduler load, ms (ratio: vs the floor)",
        f("scale", "/load_ms"),
        Some(f("scale", "/ratio_to_floor")),
    );
    row("scale", "scheduler RSS, MiB", f("scale", "/rss_mib"), None);
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // In-process services (the workers of `e2e`, the scheduler of `steady`) export spans when
    // the standard OpenTelemetry variables ask for it, as the binaries do; otherwise nothing is
    // installed and the services log nothing.
    let settings = TraceSettings::from_env("jetsched-bench", "bench")
        .map_err(|problems| anyhow::anyhow!(problems.join("; ")))?;
    let telemetry = match settings.exporter {
        Some(_) => Some(telemetry::init(LogFormat::Plain, &settings)?),
        None => None,
    };
    let report = match cli.scenario {
        Scenario::Registry(args) => registry::run(args).await?,
        Scenario::Accounts(args) => accounts::run(args).await?,
        Scenario::Raw(args) => raw::run(args).await?,
        Scenario::Burst(args) => scheduler::burst(args).await?,
        Scenario::Steady(args) => scheduler::steady(args).await?,
        Scenario::Backfill(args) => backfill::run(args).await?,
        Scenario::Chain(args) => chain::run(args).await?,
        Scenario::E2e(args) => e2e::run(args).await?,
        Scenario::Breakers(args) => breakers::run(args).await?,
        Scenario::Limits(args) => limits::run(args).await?,
        Scenario::Failover(args) => failover::run(args).await?,
        Scenario::Priority(args) => priority::run(args).await?,
        Scenario::Events(args) => events::run(args).await?,
        Scenario::Handover(args) => scheduler::handover(args).await?,
        Scenario::Scale(args) => scheduler::scale(args).await?,
        Scenario::Soak(args) => soak::run(args).await?,
        Scenario::Console(args) => console::run(args).await?,
        Scenario::All(args) => all(args.size).await?,
        Scenario::TraceSink(args) => trace_sink(args).await,
    };
    if let Some(telemetry) = telemetry {
        let dropped = jetsched_shared::telemetry::spans_dropped();
        telemetry.shutdown().await;
        eprintln!("trace export: {dropped} spans dropped");
    }
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = cli.json {
        std::fs::write(&path, &text)?;
    }
    Ok(())
}

async fn trace_sink(args: TraceSinkArgs) -> Value {
    let receiver = jetsched_tests::otlp::OtlpReceiver::start_on(args.port).await;
    eprintln!("trace sink: listening on {}", receiver.endpoint());
    tokio::time::sleep(std::time::Duration::from_secs(args.seconds)).await;
    serde_json::json!({"scenario": "trace-sink", "requests": receiver.requests(), "spans": receiver.spans().len()})
}
