//! The start-up every service shares: names and instance id from the common settings, the
//! readiness checks, the admin port (bound here, served by the service's `run`), the NATS
//! connection (followed by readiness) and its JetStream context, then the topology.

use std::net::SocketAddr;

use anyhow::Context;
use async_nats::jetstream;

use crate::admin::{AdminServer, Readiness};
use crate::config::{CommonArgs, NatsArgs};
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
    /// Messages buffered per subscription (see [`NatsArgs::connect_buffered`]).
    pub subscription_capacity: usize,
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
        common: &CommonArgs,
        nats: &NatsArgs,
        metrics: prometheus::Registry,
    ) -> anyhow::Result<Base> {
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
        let client = nats
            .connect_buffered(&format!("jetsched-{} {instance}", role.name), role.subscription_capacity)
            .await?;
        readiness.watch_connection(client.clone());
        let js = jetstream::new(client.clone());
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
