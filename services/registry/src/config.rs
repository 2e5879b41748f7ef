//! Registry configuration: every setting is a flag and an environment variable.

use std::net::SocketAddr;

use clap::Parser;
use jetsched_shared::config::{CommonArgs, NatsArgs};
use jetsched_shared::topology::TopologyArgs;

/// The jetsched task registry: validates specs, stores them in the tasks bucket with
/// compare-and-set, serves the task API and applies fire-and-forget submissions.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-registry", version)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// Largest accepted spec (bytes); also capped by the server's max payload.
    #[arg(long, env = "JETSCHED_REGISTRY_MAX_SPEC_BYTES", default_value_t = 64 * 1024)]
    pub max_spec_bytes: usize,
    /// API requests handled concurrently by this replica.
    #[arg(long, env = "JETSCHED_REGISTRY_CONCURRENCY", default_value_t = 256)]
    pub concurrency: usize,
}

/// Default admin listener of the registry.
pub const DEFAULT_ADMIN_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9101);

impl Config {
    /// A configuration for a server at `url` with defaults, an ephemeral admin port (tests).
    pub fn for_tests(url: &str) -> Config {
        Config {
            nats: NatsArgs::plain(url),
            common: CommonArgs::for_tests("registry-test"),
            topology: TopologyArgs::default(),
            max_spec_bytes: 64 * 1024,
            concurrency: 256,
        }
    }
}
