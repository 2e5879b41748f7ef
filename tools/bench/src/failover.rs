//! Failover: two real scheduler processes and tasks firing every second; the leader is killed
//! with SIGKILL repeatedly and the time from the kill to the next dispatch by a new leader
//! (a higher term, seen by a core subscription on the dispatch subjects) is measured.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::HDR_LEADER_TERM;
use jetsched_tests::NatsServer;
use serde_json::json;

use crate::system::{Lag, service_bin, spec, write_tasks};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    pub(crate) kills: usize,
    /// Lease length in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub(crate) lease_ms: u64,
    /// Tasks firing every second.
    #[arg(long, default_value_t = 100)]
    pub(crate) tasks: usize,
}

struct Scheduler {
    instance: String,
    child: Child,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(url: &str, instance: &str, lease_ms: u64) -> anyhow::Result<Scheduler> {
    let child = Command::new(service_bin("jetsched-scheduler")?)
        .env("NATS_URL", url)
        .env("RUST_LOG", "warn")
        .args(["--instance-id", instance, "--admin-addr", "127.0.0.1:0", "--fire-events", "false"])
        .args(["--lease", &format!("{lease_ms}ms"), "--lease-margin", &format!("{}ms", lease_ms / 4)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn jetsched-scheduler")?;
    Ok(Scheduler { instance: instance.to_string(), child })
}

#[derive(serde::Deserialize)]
struct Lease {
    instance: String,
    /// The leader's term; 0 only in the record its `create` wrote, whose revision is the term.
    #[serde(default)]
    term: u64,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let lease = Duration::from_millis(args.lease_ms);
    let topology_args = TopologyArgs { lease, ..TopologyArgs::default() };
    let topology = topology::ensure(&js, &names, &topology_args).await?;
    let specs = (0..args.tasks)
        .map(|i| (format!("f{i}"), spec(&format!("f{i}"), serde_json::json!({"every": "1s"}))))
        .collect();
    write_tasks(&topology, specs).await?;

    // Every dispatch publish, with its term, as it happens.
    let mut dispatches = client.subscribe(names.dispatch_wildcard()).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, u64)>();
    tokio::spawn(async move {
        while let Some(message) = dispatches.next().await {
            let term = message
                .headers
                .as_ref()
                .and_then(|h| h.get(HDR_LEADER_TERM))
                .and_then(|v| v.as_str().parse().ok());
            if let Some(term) = term
                && tx.send((Instant::now(), term)).is_err()
            {
                break;
            }
        }
    });

    let mut spawned = 0;
    let mut procs: Vec<Scheduler> = Vec::new();
    for _ in 0..2 {
        spawned += 1;
        procs.push(spawn(&server.url(), &format!("sched-{spawned}"), args.lease_ms)?);
    }
    let mut gaps = Vec::new();
    for _ in 0..args.kills {
        // The current leader and its term, once it dispatches.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (holder, term) = loop {
            if Instant::now() > deadline {
                bail!("no dispatching leader within 30 s");
            }
            let entry = topology.leader.entry(names.leader_key()).await?;
            if let Some(entry) = entry
                && entry.operation == jetstream::kv::Operation::Put
                && let Ok(lease) = serde_json::from_slice::<Lease>(&entry.value)
                && procs.iter().any(|p| p.instance == lease.instance)
            {
                // Wait for a dispatch under this term (drain what came before), never past the
                // deadline: dispatches of other terms keep arriving.
                let term = if lease.term == 0 { entry.revision } else { lease.term };
                let mut seen = false;
                while Instant::now() < deadline
                    && let Ok(Some((_, t))) =
                        tokio::time::timeout(Duration::from_millis(1500), rx.recv()).await
                {
                    if t == term {
                        seen = true;
                        break;
                    }
                }
                if seen {
                    break (lease.instance, term);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(Duration::from_millis(300 + (gaps.len() as u64 * 397) % 700)).await;
        let index = procs.iter().position(|p| p.instance == holder).context("leader is ours")?;
        let mut victim = procs.remove(index);
        let killed = Instant::now();
        victim.child.kill()?;
        let _ = victim.child.wait();
        spawned += 1;
        procs.push(spawn(&server.url(), &format!("sched-{spawned}"), args.lease_ms)?);
        let gap = loop {
            let Some((at, t)) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.ok().flatten()
            else {
                bail!("no dispatch within 30 s of killing {holder}");
            };
            if t > term && at > killed {
                break at - killed;
            }
        };
        gaps.push(gap);
    }
    drop(procs);
    let lag = Lag::from_micros(gaps.iter().map(|g| g.as_micros() as i64).collect());
    eprintln!(
        "failover: {} leader kills, kill -9 to next dispatch p50 {:.0} / p99 {:.0} / max {:.0} ms (lease {} ms)",
        args.kills, lag.p50_ms, lag.p99_ms, lag.max_ms, args.lease_ms
    );
    Ok(json!({
        "scenario": "failover",
        "kills": args.kills,
        "lease_ms": args.lease_ms,
        "gap": lag,
        "gaps_ms": gaps.iter().map(|g| g.as_millis() as u64).collect::<Vec<_>>(),
        "within_lease_plus_1s": gaps.iter().all(|g| *g <= lease + Duration::from_secs(1)),
    }))
}
