//! Registry `put` throughput: N concurrent clients each sending puts one after another, beside
//! raw concurrent KV puts of the same bytes to the same bucket in the same run.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use jetsched_registry::{Config, build};
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{Clients, Defaults};
use crate::stats::Figures;

/// The registry under test.
enum Registry {
    InProcess(CancellationToken, tokio::task::JoinHandle<anyhow::Result<()>>),
    Process(tokio::process::Child),
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Puts per phase.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) puts: usize,
    #[command(flatten)]
    pub(crate) clients: Clients<Args>,
    /// NATS connections the clients are spread over.
    #[arg(long, default_value_t = 8)]
    pub(crate) connections: usize,
    /// Run the registry inside the bench process instead of as its own `jetsched-registry`
    /// process (as it is deployed).
    #[arg(long)]
    pub(crate) in_process: bool,
}

impl Defaults for Args {}

fn spec(id: &str, generation: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "namespace": "bench",
        "schedule": {"cron": "0 */5 * * * *", "timezone": "Europe/Berlin"},
        "executor": {"kind": "http", "method": "POST", "url": "http://reports.internal/run", "body": {"day": "yesterday"}},
        "retry": {"max_attempts": 4, "initial": "1s"},
        "labels": {"team": "bench", "generation": generation.to_string()}
    }))
    .expect("spec serializes")
}

/// Runs `total` operations over `clients` concurrent loops; returns per-operation latencies.
pub(crate) async fn drive<F, Fut>(
    clients: usize,
    total: usize,
    op: F,
) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let mut handles = Vec::new();
    for client in 0..clients {
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut i = client;
            while i < total {
                let t = Instant::now();
                op(i).await?;
                samples.push(t.elapsed());
                i += clients;
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::with_capacity(total);
    for handle in handles {
        samples.extend(handle.await??);
    }
    Ok((samples, started.elapsed()))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let names = Names::default();
    let mut connections = Vec::new();
    for _ in 0..args.connections.max(1) {
        connections.push(server.client().await);
    }
    let js = jetstream::new(connections[0].clone());
    let topology = topology::ensure(&js, &names, &TopologyArgs::default()).await?;

    // Raw: concurrent KV puts of a spec-sized value.
    let kv = topology.tasks.clone();
    let body = bytes::Bytes::from(spec("raw", 0));
    let (samples, elapsed) = drive(args.clients.clients, args.puts, move |i| {
        let kv = kv.clone();
        let body = body.clone();
        async move {
            kv.put(format!("raw.k{i}"), body).await?;
            Ok(())
        }
    })
    .await?;
    let raw = Figures::from_samples("raw KV put (concurrent)", samples, elapsed);

    // The registry: its own process (as deployed), or in-process.
    let registry = if args.in_process {
        let mut config = Config::for_tests(&server.url());
        config.concurrency = 1024;
        let registry = build(config).await?;
        let shutdown = CancellationToken::new();
        Registry::InProcess(shutdown.clone(), tokio::spawn(registry.run(shutdown)))
    } else {
        let child = tokio::process::Command::new(crate::system::service_bin("jetsched-registry")?)
            .args(["--nats-url", &server.url(), "--admin-addr", "127.0.0.1:0", "--concurrency", "1024"])
            .env("RUST_LOG", "warn")
            .envs(crate::system::service_env())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while jetsched_shared::presence::ping(
            &connections[0],
            &names.service_name(),
            Duration::from_millis(200),
        )
        .await?
        .is_empty()
        {
            anyhow::ensure!(Instant::now() < deadline, "jetsched-registry did not start");
        }
        Registry::Process(child)
    };

    let subject = names.task_api_subject("put");
    let mut rows = vec![raw];
    for (phase, generation) in [("registry put, new tasks", 0), ("registry put, updates", 1)] {
        let clients = connections.clone();
        let subject = subject.clone();
        // Bodies are built before the clock starts: the phase measures the registry.
        let bodies: std::sync::Arc<Vec<bytes::Bytes>> =
            std::sync::Arc::new((0..args.puts).map(|i| spec(&format!("t{i}"), generation).into()).collect());
        let (samples, elapsed) = drive(args.clients.clients, args.puts, move |i| {
            let client = clients[i % clients.len()].clone();
            let subject = subject.clone();
            let body = bodies[i].clone();
            async move {
                let reply = client.request_with_headers(subject, HeaderMap::new(), body).await?;
                if reply
                    .headers
                    .as_ref()
                    .is_some_and(|h| h.get(async_nats::service::NATS_SERVICE_ERROR).is_some())
                {
                    anyhow::bail!("put failed: {}", String::from_utf8_lossy(&reply.payload));
                }
                Ok(())
            }
        })
        .await?;
        rows.push(Figures::from_samples(phase, samples, elapsed));
    }
    match registry {
        Registry::InProcess(shutdown, running) => {
            shutdown.cancel();
            running.await??;
        }
        Registry::Process(mut child) => {
            child.kill().await?;
        }
    }

    Figures::print_table(&rows);
    let ratio = rows[1].per_second / rows[0].per_second;
    eprintln!("registry new-task puts / raw KV puts = {ratio:.2}");
    Ok(json!({
        "scenario": "registry",
        "clients": args.clients.clients,
        "connections": args.connections,
        "phases": rows,
        "ratio_to_raw": ratio,
    }))
}
