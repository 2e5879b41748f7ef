//! A test server with jetsched's topology (streams and buckets) already there, as another
//! service would have created it: the preamble of every test that drives one part alone.

use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, Topology, TopologyArgs};

use crate::NatsServer;

/// A single-node server with the topology of `args`, and a connection to it. The server stops
/// when dropped: a test that takes the parts binds `server` too (`server: _server` at least).
pub struct WithTopology {
    pub server: NatsServer,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub topology: Topology,
    /// The default names the topology was made with.
    pub names: Names,
}

/// Starts a server (test logging on) and ensures the topology of `args` with the default names.
pub async fn server_with_topology(args: TopologyArgs) -> WithTopology {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let (js, topology) = ensure_topology(&client, &args).await;
    WithTopology { server, client, js, topology, names: Names::default() }
}

/// Ensures the topology of `args` with the default names over `client` (a server's or a
/// cluster's connection).
pub async fn ensure_topology(
    client: &async_nats::Client,
    args: &TopologyArgs,
) -> (jetstream::Context, Topology) {
    let js = jetstream::new(client.clone());
    let topology = topology::ensure(&js, &Names::default(), args).await.expect("the topology");
    (js, topology)
}

/// The default topology with a leader lease of `lease`.
pub fn with_lease(lease: std::time::Duration) -> TopologyArgs {
    TopologyArgs { lease, ..TopologyArgs::default() }
}
