//! Registry configuration: every setting is a flag and an environment variable; `validate`
//! reports every problem at once.

use std::net::SocketAddr;

use clap::Parser;
use jetsched_shared::config::{InvalidConfig, ServiceArgs, loopback};

use crate::quota::Quotas;

/// The jetsched task registry: validates specs, stores them in the tasks bucket with
/// compare-and-set, serves the task API and applies fire-and-forget submissions.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-registry", version, after_help = jetsched_shared::telemetry::ENV_HELP)]
pub struct Config {
    #[command(flatten)]
    pub shared: ServiceArgs,
    /// Largest accepted spec (bytes); also capped by the server's max payload.
    #[arg(long, env = "JETSCHED_REGISTRY_MAX_SPEC_BYTES", default_value_t = 64 * 1024)]
    pub max_spec_bytes: usize,
    /// Quotas per namespace: `<namespace>.<limit>=<value>`, `*` for every namespace without its
    /// own setting; limits `tasks` (tasks the namespace may hold) and `spec_bytes` (largest
    /// stored spec). Repeatable or comma-separated, e.g. `*.tasks=1000,billing.tasks=5000`.
    /// None by default.
    #[arg(long = "quota", env = "JETSCHED_REGISTRY_QUOTAS", value_delimiter = ',')]
    pub quotas: Vec<String>,
    /// API requests handled concurrently by this replica.
    #[arg(long, env = "JETSCHED_REGISTRY_CONCURRENCY", default_value_t = 256)]
    pub concurrency: usize,
    /// Let a task's `after` name parents in other namespaces. Off by default: a child hears
    /// of its parents' verdicts and receives their results, so with namespaces given to
    /// separate teams a task may only wait for tasks of its own namespace.
    #[arg(long, env = "JETSCHED_REGISTRY_AFTER_ACROSS_NAMESPACES")]
    pub after_across_namespaces: bool,
}

/// Default admin listener of the registry.
pub const DEFAULT_ADMIN_ADDR: SocketAddr = loopback(9101);

impl Config {
    /// A configuration for a server at `url` with defaults, an ephemeral admin port (tests).
    pub fn for_tests(url: &str) -> Config {
        Config {
            shared: ServiceArgs::for_tests(url, "registry-test"),
            max_spec_bytes: 64 * 1024,
            quotas: Vec::new(),
            concurrency: 256,
            after_across_namespaces: false,
        }
    }

    /// The quotas per namespace (malformed settings are reported by [`Config::validate`]).
    pub fn quotas(&self) -> Quotas {
        Quotas::parse(&self.quotas, &mut jetsched_shared::config::Problems::new())
    }

    /// Checks every setting (the shared ones too) and reports every problem at once.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = self.shared.problems();
        problems.at_least("max-spec-bytes", self.max_spec_bytes, 1);
        problems.at_least("concurrency", self.concurrency, 1);
        Quotas::parse(&self.quotas, &mut problems);
        problems.finish::<Config>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_problems_are_reported_together() {
        Config::parse_from(["jetsched-registry"]).validate().unwrap();
        Config::for_tests("nats://127.0.0.1:4222").validate().unwrap();
        let config = Config::parse_from(["jetsched-registry", "--prefix", "Bad", "--concurrency", "0"]);
        let text = config.validate().unwrap_err().to_string();
        assert!(text.contains("--prefix (JETSCHED_PREFIX)"), "{text}");
        assert!(
            text.contains("--concurrency (JETSCHED_REGISTRY_CONCURRENCY) = 0: must be at least 1"),
            "{text}"
        );
    }
}
