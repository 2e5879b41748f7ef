//! Failover: two real scheduler processes and tasks firing every second (their phases spread
//! over the second, so a fire is due every few milliseconds); the leader is killed with SIGKILL
//! repeatedly and the time from the kill to the next dispatch by a new leader (a higher term,
//! seen by a core subscription on the dispatch subjects) is measured. Then the leader is frozen
//! with SIGSTOP a few times: the next dispatch is bounded by the lease, and once resumed with
//! SIGCONT the old leader must dispatch nothing under its old term (its local deadline fences it).

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

use crate::args::{Defaults, Tasks};
use crate::system::{Lag, service_bin, spec, write_tasks};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    // Tasks firing every second: the load the leaders dispatch.
    #[command(flatten)]
    pub(crate) tasks: Tasks<Args>,
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    pub(crate) kills: usize,
    /// Lease length in milliseconds (the scheduler's default).
    #[arg(long, default_value_t = 3000)]
    pub(crate) lease_ms: u64,
    /// Leader freezes (SIGSTOP, then SIGCONT once a new leader dispatches).
    #[arg(long, default_value_t = 3)]
    pub(crate) stops: usize,
}

impl Defaults for Args {
    const TASKS: &'static str = "100";
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
        .envs(crate::system::service_env())
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

/// The dispatches seen, with their terms.
struct Seen {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Instant, u64)>,
}

impl Seen {
    /// The first dispatch after `after` under a term above `term`, within 30 s.
    async fn next_above(&mut self, term: u64, after: Instant) -> anyhow::Result<(Instant, u64)> {
        loop {
            let Some((at, t)) =
                tokio::time::timeout(Duration::from_secs(30), self.rx.recv()).await.ok().flatten()
            else {
                bail!("no dispatch by a new leader within 30 s");
            };
            if t > term && at > after {
                return Ok((at, t));
            }
        }
    }

    /// Dispatches under `term` seen from `from` for `window`.
    async fn count_term(&mut self, term: u64, from: Instant, window: Duration) -> usize {
        let end = Instant::now() + window;
        let mut count = 0;
        while let Ok(Some((at, t))) = tokio::time::timeout_at(end.into(), self.rx.recv()).await {
            count += usize::from(t == term && at > from);
        }
        count
    }
}

/// The current leader (one of `procs`) and its term, once it dispatches.
async fn dispatching_leader(
    topology: &topology::Topology,
    names: &Names,
    procs: &[Scheduler],
    seen: &mut Seen,
) -> anyhow::Result<(String, u64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
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
            while Instant::now() < deadline
                && let Ok(Some((_, t))) =
                    tokio::time::timeout(Duration::from_millis(1500), seen.rx.recv()).await
            {
                if t == term {
                    return Ok((lease.instance, term));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(child: &Child, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status()?;
    anyhow::ensure!(status.success(), "kill -{name} failed");
    Ok(())
}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let lease = Duration::from_millis(args.lease_ms);
    let topology_args = TopologyArgs { lease, ..TopologyArgs::default() };
    let topology = topology::ensure(&js, &names, &topology_args).await?;
    // Phases spread over the second: some fire is due every 1000 / tasks ms.
    let specs = (0..args.tasks.tasks)
        .map(|i| {
            let anchor = format!("1970-01-01T00:00:00.{:03}Z", (i * 1000 / args.tasks.tasks.max(1)) % 1000);
            (format!("f{i}"), spec(&format!("f{i}"), json!({"every": "1s", "anchor": anchor})))
        })
        .collect();
    write_tasks(&topology, specs).await?;

    // Every dispatch publish, with its term, as it happens.
    let mut dispatches = client.subscribe(names.dispatch_wildcard()).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, u64)>();
    let mut seen = Seen { rx };
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
        let (holder, term) = dispatching_leader(&topology, &names, &procs, &mut seen).await?;
        tokio::time::sleep(Duration::from_millis(300 + (gaps.len() as u64 * 397) % 700)).await;
        let index = procs.iter().position(|p| p.instance == holder).context("leader is ours")?;
        let mut victim = procs.remove(index);
        let killed = Instant::now();
        victim.child.kill()?;
        let _ = victim.child.wait();
        spawned += 1;
        procs.push(spawn(&server.url(), &format!("sched-{spawned}"), args.lease_ms)?);
        let (at, _) =
            seen.next_above(term, killed).await.with_context(|| format!("after killing {holder}"))?;
        gaps.push(at - killed);
    }
    let (mut stop_gaps, mut stale) = (Vec::new(), 0);
    for _ in 0..args.stops {
        let (holder, term) = dispatching_leader(&topology, &names, &procs, &mut seen).await?;
        tokio::time::sleep(Duration::from_millis(300 + (stop_gaps.len() as u64 * 397) % 700)).await;
        let index = procs.iter().position(|p| p.instance == holder).context("leader is ours")?;
        let stopped = Instant::now();
        signal(&procs[index].child, "STOP")?;
        let (at, _) =
            seen.next_above(term, stopped).await.with_context(|| format!("after stopping {holder}"))?;
        stop_gaps.push(at - stopped);
        let resumed = Instant::now();
        signal(&procs[index].child, "CONT")?;
        // Resumed past its local deadline: nothing more under its term.
        stale += seen.count_term(term, resumed, Duration::from_secs(1)).await;
    }
    drop(procs);
    let lag = Lag::from_micros(gaps.iter().map(|g| g.as_micros() as i64).collect());
    let stop = Lag::from_micros(stop_gaps.iter().map(|g| g.as_micros() as i64).collect());
    eprintln!(
        "failover: {} leader kills, kill -9 to next dispatch p50 {:.0} / p99 {:.0} / max {:.0} ms (lease {} ms); \
         {} freezes, SIGSTOP to next dispatch p50 {:.0} / max {:.0} ms, {stale} dispatches under a resumed leader's term",
        args.kills, lag.p50_ms, lag.p99_ms, lag.max_ms, args.lease_ms, args.stops, stop.p50_ms, stop.max_ms
    );
    Ok(json!({
        "scenario": "failover",
        "kills": args.kills,
        "lease_ms": args.lease_ms,
        "gap": lag,
        "gaps_ms": gaps.iter().map(|g| g.as_millis() as u64).collect::<Vec<_>>(),
        "within_500ms": gaps.iter().all(|g| *g <= Duration::from_millis(500)),
        "stops": args.stops,
        "stop_gap": stop,
        "stop_gaps_ms": stop_gaps.iter().map(|g| g.as_millis() as u64).collect::<Vec<_>>(),
        "stop_within_lease_plus_1s": stop_gaps.iter().all(|g| *g <= lease + Duration::from_secs(1)),
        "stale_dispatches_after_resume": stale,
    }))
}
