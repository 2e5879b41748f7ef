//! `jetsched-scheduler`: leader-elected timing wheel that dispatches every fire exactly once.

use std::process::ExitCode;

use clap::Parser;
use jetsched_scheduler::{Config, build};
use jetsched_shared::service;

/// mimalloc: fewer allocator lock waits and less CPU than glibc malloc on the hot paths.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    let valid = config.validate().map(|()| config);
    service::main(
        "jetsched-scheduler",
        valid,
        |config| &config.common,
        build,
        |service, shutdown| service.run(shutdown),
    )
    .await
}
