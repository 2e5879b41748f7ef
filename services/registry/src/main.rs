//! `jetsched-registry`: the task API (NATS micro service) and the durable intake consumer.

use std::process::ExitCode;

use clap::Parser;
use jetsched_registry::{Config, build};
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
    let telemetry = match telemetry::start("jetsched-registry", &config.common) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(EXIT_INVALID_CONFIG);
        }
    };
    let token = shutdown::on_signals();
    let service = match build(config).await {
        Ok(service) => service,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot start the registry");
            return ExitCode::FAILURE;
        }
    };
    let code = match service.run(token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "registry stopped with an error");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
