//! `jetsched-bench`: bounded load scenarios against a nats-server it starts itself, each
//! measured beside raw JetStream doing the equivalent work in the same run. Prints a table
//! and a JSON report.

mod registry;
mod stats;

use clap::{Parser, Subcommand};

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let report = match cli.scenario {
        Scenario::Registry(args) => registry::run(args).await?,
    };
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = cli.json {
        std::fs::write(&path, &text)?;
    }
    Ok(())
}
