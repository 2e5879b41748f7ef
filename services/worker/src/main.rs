//! `jetsched-worker`: executes dispatched runs (http, nats and, when allowed, shell executors).

use std::process::ExitCode;

use clap::Parser;
use jetsched_shared::config::EXIT_INVALID_CONFIG;
use jetsched_shared::{shutdown, telemetry};
use jetsched_worker::{Config, Handlers, build};

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(invalid) = config.validate() {
        eprintln!("{invalid}");
        return ExitCode::from(EXIT_INVALID_CONFIG);
    }
    let telemetry = match telemetry::start("jetsched-worker", &config.common) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(EXIT_INVALID_CONFIG);
        }
    };
    let token = shutdown::on_signals();
    let worker = match build(config, Handlers::new()).await {
        Ok(worker) => worker,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot start the worker");
            return ExitCode::FAILURE;
        }
    };
    let code = match worker.run(token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "worker stopped with an error");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
