//! `jetsched-worker`: executes dispatched runs (http, nats and, when allowed, shell executors).

use std::process::ExitCode;

use clap::Parser;
use jetsched_shared::service;
use jetsched_worker::{Config, Handlers, build};

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    let valid = config.validate().map(|()| config);
    service::main(
        "jetsched-worker",
        valid,
        |config| &config.common,
        |config| build(config, Handlers::new()),
        |service, shutdown| service.run(shutdown),
    )
    .await
}
