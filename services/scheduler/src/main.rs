//! `jetsched-scheduler`: leader-elected timing wheel that dispatches every fire exactly once.

use std::process::ExitCode;

use clap::Parser;
use jetsched_scheduler::{Config, build};
use jetsched_shared::config::EXIT_INVALID_CONFIG;
use jetsched_shared::{shutdown, telemetry};

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
    let telemetry = match telemetry::start("jetsched-scheduler", &config.common) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(EXIT_INVALID_CONFIG);
        }
    };
    let token = shutdown::on_signals();
    let scheduler = match build(config).await {
        Ok(scheduler) => scheduler,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot start the scheduler");
            return ExitCode::FAILURE;
        }
    };
    let code = match scheduler.run(token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "scheduler stopped with an error");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
