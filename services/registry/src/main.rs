//! `jetsched-registry`: the task API (NATS micro service) and the durable intake consumer.

use std::process::ExitCode;

use clap::Parser;
use jetsched_registry::{Config, build};
use jetsched_shared::service;

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    let valid = config.validate().map(|()| config);
    service::main(
        "jetsched-registry",
        valid,
        |config| &config.common,
        build,
        |service, shutdown| service.run(shutdown),
    )
    .await
}
