//! `jetsched-alerter`: turns events, dead letters, queue depths and the leader lease into alerts.

use std::process::ExitCode;

use jetsched_alerter::{Config, build};
use jetsched_shared::service;

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::load().unwrap_or_else(|error| error.exit());
    let valid = config.validate().map(|()| config);
    service::main(
        "jetsched-alerter",
        valid,
        |config| &config.common,
        build,
        |service, shutdown| service.run(shutdown),
    )
    .await
}
