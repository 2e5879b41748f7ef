//! The start-up every service shares: names and instance id from the common settings, the
//! readiness checks, the admin port (bound here, served by the service's `run`), the NATS
//! connection (tried again while no server answers) and JetStream (both followed by readiness)
//! and its JetStream context, then the topology.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use async_nats::{Client, ConnectError, ConnectErrorKind, jetstream};

use crate::admin::{AdminServer, Readiness};
use crate::backoff::{Backoff, GaveUp};
use crate::config::{CommonArgs, DEFAULT_SUBSCRIPTION_CAPACITY, NatsArgs, ServiceArgs};
use crate::names::Names;
use crate::topology::{self, Topology, TopologyArgs};

/// How one service starts.
#[derive(Debug, Clone, Copy)]
pub struct Role {
    /// `registry`, `scheduler`, ...: the connection is named `jetsched-<name> <instance>`.
    pub name: &'static str,
    /// The admin address when `--admin-addr` is not given.
    pub default_admin: SocketAddr,
    /// The service's own readiness checks (not ready until it sets them), besides
    /// `topology` and the connection's.
    pub checks: &'static [&'static str],
    /// Messages buffered per subscription (see [`crate::config::NatsArgs::connect_buffered`]).
    pub subscription_capacity: usize,
}

impl Role {
    /// Service `name` with its default admin address and its own readiness checks, buffering
    /// async-nats' default per subscription.
    pub const fn new(name: &'static str, default_admin: SocketAddr, checks: &'static [&'static str]) -> Role {
        Role { name, default_admin, checks, subscription_capacity: DEFAULT_SUBSCRIPTION_CAPACITY }
    }

    /// The same role buffering `capacity` messages per subscription.
    pub const fn with_subscription_capacity(self, capacity: usize) -> Role {
        Role { subscription_capacity: capacity, ..self }
    }
}

/// A started service's common parts.
pub struct Base {
    pub names: Names,
    pub instance: String,
    pub readiness: Readiness,
    pub admin: AdminServer,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
}

impl Base {
    /// Binds the admin port (serving `metrics`) and connects to NATS.
    pub async fn start(
        role: Role,
        args: &ServiceArgs,
        metrics: prometheus::Registry,
    ) -> anyhow::Result<Base> {
        let ServiceArgs { nats, common, .. } = args;
        let names = common.names()?;
        let instance = common.instance_id();
        crate::telemetry::register_metrics(&metrics)?;
        let readiness = Readiness::new();
        readiness.set("topology", false);
        for check in role.checks {
            readiness.set(check, false);
        }
        let admin =
            AdminServer::bind(common.admin_addr_or(role.default_admin), metrics, readiness.clone()).await?;
        let name = format!("jetsched-{} {instance}", role.name);
        let client = connect(nats, &name, role.subscription_capacity, args.topology.topology_wait).await?;
        readiness.watch_connection(client.clone());
        let js = jetstream::new(client.clone());
        readiness.watch_jetstream(js.clone());
        Ok(Base { names, instance, readiness, admin, client, js })
    }

    /// Ensures the JetStream topology (idempotent) and marks the `topology` check ready.
    pub async fn ensure_topology(&self, args: &TopologyArgs) -> anyhow::Result<Topology> {
        let topology =
            topology::ensure(&self.js, &self.names, args).await.context("ensure JetStream topology")?;
        self.readiness.set("topology", true);
        Ok(topology)
    }
}

/// Connects, trying again while the servers cannot be reached (not started yet, restarting,
/// their name not resolving yet) for up to `wait` (`--topology-wait`): a service started before
/// NATS, or while it restarts, comes up with it instead of exiting. A refused authentication or
/// TLS handshake fails at once: trying again would not change it.
async fn connect(nats: &NatsArgs, name: &str, capacity: usize, wait: Duration) -> anyhow::Result<Client> {
    let deadline = tokio::time::Instant::now() + wait;
    let retryable = |error: &anyhow::Error, attempt: u32, pause: Duration| {
        let retry = unreachable(error);
        if retry {
            tracing::warn!(error = format!("{error:#}"), attempt, retry_in = ?pause, "NATS cannot be reached yet; retrying");
        }
        retry
    };
    Backoff::new(Duration::from_millis(250), Duration::from_secs(2))
        .retry_until(deadline, |_| nats.connect_buffered(name, capacity), retryable)
        .await
        .map_err(|gave_up| {
            let GaveUp { error, attempts, elapsed } = gave_up;
            if attempts > 1 {
                error.context(format!("NATS could not be reached in {elapsed:.1?} ({attempts} attempts)"))
            } else {
                error
            }
        })
}

/// Whether a connect failed because no server answered (rather than one refusing us).
fn unreachable(error: &anyhow::Error) -> bool {
    error.chain().filter_map(|cause| cause.downcast_ref::<ConnectError>()).any(|error| {
        matches!(error.kind(), ConnectErrorKind::Io | ConnectErrorKind::TimedOut | ConnectErrorKind::Dns)
    })
}

/// The body of every service's `main`, after parsing: a configuration that failed validation
/// exits with status 2 before anything starts; then telemetry, signal handling, `build` (all
/// fallible I/O) and `run` until a signal; a failure of either exits 1, logged once.
pub async fn main<C, S, B, R>(
    binary: &'static str,
    config: Result<C, crate::config::InvalidConfig>,
    common: fn(&C) -> &CommonArgs,
    build: impl FnOnce(C) -> B,
    run: impl FnOnce(S, tokio_util::sync::CancellationToken) -> R,
) -> std::process::ExitCode
where
    B: Future<Output = anyhow::Result<S>>,
    R: Future<Output = anyhow::Result<()>>,
{
    use std::process::ExitCode;
    let config = match config {
        Ok(config) => config,
        Err(invalid) => {
            eprintln!("{invalid}");
            return ExitCode::from(crate::config::EXIT_INVALID_CONFIG);
        }
    };
    let telemetry = match crate::telemetry::start(binary, common(&config)) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(crate::config::EXIT_INVALID_CONFIG);
        }
    };
    let token = crate::shutdown::on_signals();
    let code = match build(config).await {
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot start {binary}");
            ExitCode::FAILURE
        }
        Ok(service) => match run(service, token).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "{binary} stopped with an error");
                ExitCode::FAILURE
            }
        },
    };
    telemetry.shutdown().await;
    code
}

/// A service binary's whole `main.rs`: the mimalloc allocator (fewer allocator lock waits and
/// less CPU than glibc malloc on the hot paths) and a `main` that parses and validates `Config`
/// (through `$parse`, `Config::parse` by default) and hands it to [`main`]. The binary crate
/// depends on `mimalloc`, `clap` and `tokio`.
///
/// `service_main!("jetsched-registry", jetsched_registry::Config, jetsched_registry::build);`
#[macro_export]
macro_rules! service_main {
    ($binary:literal, $config:ty, $build:expr) => {
        $crate::service_main!($binary, $config, $build, <$config as clap::Parser>::parse());
    };
    ($binary:literal, $config:ty, $build:expr, $parse:expr) => {
        #[global_allocator]
        static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

        #[tokio::main]
        async fn main() -> std::process::ExitCode {
            let config: $config = $parse;
            let valid = config.validate().map(|()| config);
            $crate::service::main(
                $binary,
                valid,
                |config| &config.shared.common,
                $build,
                |service, shutdown| service.run(shutdown),
            )
            .await
        }
    };
}
