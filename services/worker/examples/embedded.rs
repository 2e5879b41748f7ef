//! A program embedding the jetsched worker with its own named handlers.
//!
//! Run it like the stock worker (same flags and environment), e.g.
//! `cargo run -p jetsched-worker --example embedded -- --queue default`, then submit a task
//! with `"executor": {"kind": "handler", "name": "noop"}` (or `echo`, `flaky`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use jetsched_shared::service;
use jetsched_worker::{Config, Handlers, Outcome, RunContext, build};

/// Logs the payload and succeeds.
async fn echo(run: RunContext) -> Outcome {
    tracing::info!(execution = %run.execution_id, payload = ?run.payload, "echo");
    Outcome::ok()
}

/// Fails the first attempts (payload `{"fail_times": n}`, default 2), then succeeds.
async fn flaky(run: RunContext) -> Outcome {
    let fail_times =
        run.payload.as_ref().and_then(|p| p.get("fail_times")).and_then(|v| v.as_u64()).unwrap_or(2);
    if u64::from(run.attempt) <= fail_times {
        return Outcome::Retry { error: format!("attempt {} fails on purpose", run.attempt), after: None };
    }
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(10)) => Outcome::ok(),
        _ = run.cancel.cancelled() => Outcome::retry("cancelled"),
    }
}

/// The stock worker's start-up (configuration checked, telemetry, signals, `build`, `run`),
/// with this program's handlers registered.
#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    let valid = config.validate().map(|()| config);
    let handlers = Handlers::new()
        .register("noop", |_run: RunContext| async { Outcome::ok() })
        .register("echo", echo)
        .register("flaky", flaky);
    service::main(
        "jetsched-worker-embedded",
        valid,
        |config| &config.shared.common,
        |config| build(config, handlers),
        |worker, shutdown| worker.run(shutdown),
    )
    .await
}
