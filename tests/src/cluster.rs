//! A 3-node JetStream cluster on loopback, for R3 streams and node-failure tests.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

use crate::monitor;
use crate::server::{ServerProcess, connect, free_ports, loopback, nats_server_bin, quote};

/// Number of nodes in a [`NatsCluster`].
pub const CLUSTER_SIZE: usize = 3;

/// Upper bound for the cluster to elect a JetStream meta leader after (re)start.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Three `nats-server`s with JetStream, routed to each other on loopback, each with its own
/// store dir. Killed on Drop.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Node>,
    // Declared last: dropped after the processes have been killed.
    dir: TempDir,
}

#[derive(Debug)]
struct Node {
    server_name: String,
    client_port: u16,
    monitor_port: u16,
    process: ServerProcess,
}

impl NatsCluster {
    /// Starts the three nodes and waits until every node sees the same JetStream meta leader
    /// and reports healthy, so R3 streams can be created right away (test logs on first).
    pub async fn start() -> Self {
        crate::init_test_logging();
        let bin = nats_server_bin();
        let dir = tempfile::Builder::new().prefix("jetsched-cluster-").tempdir().expect("create temp dir");
        let mut cluster = Self { nodes: Vec::new(), dir };
        for attempt in 0.. {
            // Replacing the nodes kills those of a failed attempt.
            cluster.nodes = configure(&cluster.dir);
            for node in &mut cluster.nodes {
                let _ = std::fs::remove_dir_all(cluster.dir.path().join(&node.server_name));
                node.process.spawn(bin);
            }
            match cluster.wait_ready(STARTUP_TIMEOUT).await {
                Ok(()) => break,
                // A picked port was taken in between: try again with new ports.
                Err(_)
                    if attempt < 4 && cluster.nodes.iter().any(|n| n.process.log_says_address_in_use()) => {}
                Err(error) => cluster.fail(&format!("cluster did not start: {error:#}")),
            }
        }
        cluster
    }

    /// Comma-separated client URLs of all nodes (the `NATS_URL` form).
    pub fn urls(&self) -> String {
        self.url_list().join(",")
    }

    /// Client URL of node `i` (0-based).
    pub fn url(&self, i: usize) -> String {
        format!("nats://{}", loopback(self.nodes[i].client_port))
    }

    /// Monitor URL of node `i`.
    pub fn monitor_url(&self, i: usize) -> String {
        format!("http://{}", loopback(self.nodes[i].monitor_port))
    }

    /// JetStream store dir of node `i`.
    pub fn store_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.nodes[i].server_name)
    }

    /// `server_name` of node `i` (`n1`, `n2`, `n3`).
    pub fn server_name(&self, i: usize) -> &str {
        &self.nodes[i].server_name
    }

    /// Process id of node `i`, `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].process.pid()
    }

    /// Log of node `i` so far.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].process.log()
    }

    /// A client that knows every node and fails over between them.
    pub async fn client(&self) -> async_nats::Client {
        connect(&self.url_list()).await
    }

    /// A client connected to node `i` only.
    pub async fn client_to(&self, i: usize) -> async_nats::Client {
        connect(&[self.url(i)]).await
    }

    /// GETs a monitor endpoint of node `i` and parses the JSON reply.
    pub async fn monitor_json(&self, i: usize, path_and_query: &str) -> anyhow::Result<serde_json::Value> {
        monitor::get_json(loopback(self.nodes[i].monitor_port), path_and_query).await
    }

    /// Index of the node that is the current JetStream meta leader, as seen by the first
    /// running node that knows one.
    pub async fn meta_leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.process.is_running() {
                continue;
            }
            if let Ok(Some(leader)) = self.meta_leader_seen_by(i).await {
                return self.nodes.iter().position(|n| n.server_name == leader);
            }
        }
        None
    }

    /// SIGKILL node `i` and reap it. Idempotent.
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Kills node `i` if it runs, starts it again with the same ports and store dir, and waits
    /// until it is healthy and sees a meta leader.
    pub async fn restart_node(&mut self, i: usize) {
        self.nodes[i].process.kill();
        let bin = nats_server_bin();
        for attempt in 0.. {
            self.nodes[i].process.spawn(bin);
            let node = &mut self.nodes[i];
            match node.process.wait_ready(node.monitor_port, STARTUP_TIMEOUT, false).await {
                Ok(()) => break,
                Err(_) if attempt < 40 && node.process.log_says_address_in_use() => {
                    node.process.kill();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(error) => self.fail(&format!("node {i} did not restart: {error:#}")),
            }
        }
        if let Err(error) = self.wait_ready(STARTUP_TIMEOUT).await {
            self.fail(&format!("cluster not ready after restarting node {i}: {error:#}"));
        }
    }

    fn url_list(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    async fn meta_leader_seen_by(&self, i: usize) -> anyhow::Result<Option<String>> {
        let jsz = self.monitor_json(i, "/jsz").await?;
        Ok(jsz
            .pointer("/meta_cluster/leader")
            .and_then(|leader| leader.as_str())
            .filter(|leader| !leader.is_empty())
            .map(str::to_owned))
    }

    /// Waits until every running node is healthy (`/healthz`, which includes JetStream) and
    /// all of them name the same meta leader.
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        for node in &mut self.nodes {
            if node.process.is_running() {
                node.process.wait_ready(node.monitor_port, timeout, false).await?;
            }
        }
        loop {
            let Err(error) = self.check_ready().await else { return Ok(()) };
            if tokio::time::Instant::now() >= deadline {
                bail!("not ready after {timeout:?}: {error:#}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn check_ready(&self) -> anyhow::Result<()> {
        let mut leaders = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.process.is_running() {
                continue;
            }
            let (status, body) = monitor::get(loopback(node.monitor_port), "/healthz").await?;
            if status != 200 {
                bail!("{}: /healthz HTTP {status}: {body}", node.server_name);
            }
            let leader = self
                .meta_leader_seen_by(i)
                .await?
                .with_context(|| format!("{} sees no meta leader", node.server_name))?;
            leaders.push(leader);
        }
        leaders.dedup();
        if leaders.len() != 1 {
            bail!("nodes disagree on the meta leader: {leaders:?}");
        }
        // Placement of an R3 stream needs every running peer known to the meta leader as
        // current; right after an election a peer can still be "offline" for placement.
        let running = self.nodes.iter().filter(|n| n.process.is_running()).count();
        let leader = self
            .nodes
            .iter()
            .position(|n| n.process.is_running() && n.server_name == leaders[0])
            .context("the meta leader is not a running node")?;
        let jsz = self.monitor_json(leader, "/jsz").await?;
        let peers =
            jsz.pointer("/meta_cluster/replicas").and_then(|r| r.as_array()).cloned().unwrap_or_default();
        let current = peers.iter().filter(|p| p["current"] == true && p["offline"] != true).count();
        if current + 1 < running {
            bail!("the meta leader sees {current} current peers of {}", running - 1);
        }
        if running == CLUSTER_SIZE {
            probe_placement(&self.url(leader)).await?;
        }
        Ok(())
    }

    fn fail(&mut self, message: &str) -> ! {
        let mut logs = String::new();
        for node in &mut self.nodes {
            node.process.kill();
            let _ = write!(logs, "\n----- log of {} -----\n{}", node.server_name, node.process.log());
        }
        // Each node's Drop would print its tail again; the full logs are printed here.
        for node in &mut self.nodes {
            node.process.mark_log_printed();
        }
        panic!("{message}{logs}");
    }
}

/// Picks ports and writes the three node configs into `dir`.
fn configure(dir: &TempDir) -> Vec<Node> {
    let ports: [u16; 3 * CLUSTER_SIZE] = free_ports();
    let (client_ports, rest) = ports.split_at(CLUSTER_SIZE);
    let (monitor_ports, route_ports) = rest.split_at(CLUSTER_SIZE);
    // A unique cluster name keeps nodes of different test clusters from ever joining up.
    let cluster_name = format!("jetsched-test-{}", route_ports[0]);
    let routes: Vec<String> =
        route_ports.iter().map(|port| format!("\"nats-route://{}\"", loopback(*port))).collect();
    (0..CLUSTER_SIZE)
        .map(|i| {
            let server_name = format!("n{}", i + 1);
            let config = format!(
                "# Generated by jetsched-tests.\n\
                 server_name: \"{server_name}\"\n\
                 listen: \"{client}\"\n\
                 http: \"{monitor}\"\n\
                 jetstream {{\n  store_dir: {store}\n{limits}\n}}\n\
                 cluster {{\n  name: \"{cluster_name}\"\n  listen: \"{route}\"\n  routes: [{routes}]\n}}\n",
                client = loopback(client_ports[i]),
                monitor = loopback(monitor_ports[i]),
                store = quote(&dir.path().join(&server_name)),
                limits = crate::server::TEST_FILE_STORE,
                route = loopback(route_ports[i]),
                routes = routes.join(", "),
            );
            Node {
                process: ServerProcess::new(&server_name, dir.path(), config),
                server_name,
                client_port: client_ports[i],
                monitor_port: monitor_ports[i],
            }
        })
        .collect()
}

/// The proof that R3 streams can be created now on the cluster `url` belongs to: place one (in
/// memory) and remove it. The monitoring endpoints can call a peer current a moment before
/// placement agrees ("no suitable peers for placement, peer offline").
pub(crate) async fn probe_placement(url: &str) -> anyhow::Result<()> {
    let client = async_nats::connect(url).await.context("connect for the placement probe")?;
    let js = async_nats::jetstream::new(client);
    let name = "HARNESS_PLACEMENT_PROBE";
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec!["harness.placement.probe".to_owned()],
        num_replicas: CLUSTER_SIZE,
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .context("place an R3 probe stream")?;
    js.delete_stream(name).await.context("remove the R3 probe stream")?;
    Ok(())
}
