//! `jetsched-alerter`: turns events, dead letters, queue depths and the leader lease into alerts.

use std::process::ExitCode;

use jetsched_alerter::{Config, build};
use jetsched_shared::config::EXIT_INVALID_CONFIG;
use jetsched_shared::{shutdown, telemetry};

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::load().unwrap_or_else(|error| error.exit());
    if let Err(invalid) = config.validate() {
        eprintln!("{invalid}");
        return ExitCode::from(EXIT_INVALID_CONFIG);
    }
    let telemetry = match telemetry::start("jetsched-alerter", &config.common) {
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
            tracing::error!(error = format!("{error:#}"), "cannot start the alerter");
            return ExitCode::FAILURE;
        }
    };
    let code = match service.run(token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "alerter stopped with an error");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}
