//! Nemesis suite: the chaos workload on a 3-node cluster whose nodes live in network
//! namespaces, with real registry, alerter, scheduler and worker processes inside them (each
//! reaching its node through a proxy of its own), while a driver partitions a leader
//! scheduler from its node, isolates the node holding the leader's connection in the
//! minority, partitions nodes from nodes (both ways and one way) while workers run, slows the
//! leader's link (200 ms ± 100 ms) and drops 5% of its packets, and cuts a worker off mid-run,
//! with two more scheduler replicas running 5 s ahead and 5 s behind (libfaketime).
//! The chaos checker then proves that no fire was lost or doubled and no run executed twice
//! unless a cut worker's abandoned attempt is recorded.
//!
//! Needs root (network namespaces, iptables); elsewhere it prints SKIPPED and passes. By
//! default (and with `JETSCHED_CHAOS=nemesis-short`) one fault of each kind runs;
//! `JETSCHED_CHAOS=nemesis` runs three of each.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, Topology, TopologyArgs};
use jetsched_shared::wire::LeaderRecord;
use jetsched_tests::{CLUSTER_SIZE, Delay, NetLab, NsCluster, NsService, eventually};

use super::chaos::{self, LEASE, NS, Observed, WAIT};

/// The faults, in the order each round applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The leader scheduler cut off from its node (every packet of its link dropped), healed.
    CutLeader,
    /// The node the leader is connected to partitioned from both others, healed.
    IsolateLeaderNode,
    /// Two nodes partitioned from each other, both directions, while workers run.
    SplitNodes,
    /// Packets from one node to another dropped, the reverse kept.
    OneWayNodes,
    /// 200 ms ± 100 ms per chunk and 5% packet loss on the leader's link.
    SlowLossyLeader,
    /// A worker cut off from its node for longer than `ack_wait`, healed.
    CutWorker,
}

const FAULTS: [Fault; 6] = [
    Fault::CutLeader,
    Fault::IsolateLeaderNode,
    Fault::SplitNodes,
    Fault::OneWayNodes,
    Fault::SlowLossyLeader,
    Fault::CutWorker,
];

/// How long node partitions and a slow link last.
const HOLD: Duration = Duration::from_secs(3);

/// A worker's cut lasts longer than its `ack_wait` (2 s), so its runs are redelivered.
const WORKER_CUT: Duration = Duration::from_secs(4);

/// Rounds of every fault: three with `JETSCHED_CHAOS=nemesis`, else one. Reading (never
/// setting) the environment is the switch.
fn rounds() -> usize {
    match std::env::var("JETSCHED_CHAOS").as_deref() {
        Ok("nemesis") => 3,
        _ => 1,
    }
}

/// The processes of the test and where they run: schedulers on nodes 0 and 1, workers on 1
/// and 2, the registry on 2, the alerter on 0.
struct Cast {
    schedulers: Vec<NsService>,
    workers: Vec<NsService>,
    registry: NsService,
    alerter: NsService,
}

/// The library that moves a process's clock (libfaketime, multithreaded variant).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The skewed scheduler replicas: (instance, node, clock offset for `FAKETIME`).
const SKEWED: [(&str, usize, &str); 2] = [("scheduler-ahead", 2, "+5s"), ("scheduler-behind", 0, "-5s")];

/// Starts `binary` as `instance` on node `node` with the test's settings, `extra` arguments
/// and `env`.
async fn spawn_with(
    cluster: &NsCluster,
    node: usize,
    binary: &str,
    instance: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> NsService {
    let mut args = vec!["--replicas", "3", "--lease", "2s"];
    args.extend_from_slice(extra);
    match binary {
        "jetsched-scheduler" => {
            args.extend(["--lease-margin", "500ms", "--fire-events", "true", "--misfire-threshold", "1s"])
        }
        "jetsched-worker" => args.extend(["--ack-wait", "2s", "--concurrency", "32"]),
        // JetStream itself is checked at each check: a full store is alerted within seconds.
        "jetsched-alerter" => args.extend(["--check-interval", "1s"]),
        _ => {}
    }
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "info"));
    cluster
        .service(node, binary, instance, &args, &env)
        .await
        .unwrap_or_else(|e| panic!("start {instance}: {e:#}"))
}

impl Cast {
    /// Starts the cast; with `skewed`, two more scheduler replicas whose clocks run 5 s ahead
    /// and 5 s behind (libfaketime), which the clock guard keeps from leading while a correct
    /// replica runs and whose fires are timed on the server's clock when they do lead.
    async fn start(cluster: &NsCluster, skewed: bool, extra: &[&str]) -> Self {
        let spawn = |node, binary, instance| spawn_with(cluster, node, binary, instance, extra, &[]);
        let mut cast = Self {
            registry: spawn(2, "jetsched-registry", "registry-1").await,
            alerter: spawn(0, "jetsched-alerter", "alerter-1").await,
            schedulers: vec![
                spawn(0, "jetsched-scheduler", "scheduler-1").await,
                spawn(1, "jetsched-scheduler", "scheduler-2").await,
            ],
            workers: vec![
                spawn(1, "jetsched-worker", "worker-1").await,
                spawn(2, "jetsched-worker", "worker-2").await,
            ],
        };
        if skewed {
            for (instance, node, offset) in SKEWED {
                let env = [("LD_PRELOAD", FAKETIME_LIB), ("FAKETIME", offset), ("DONT_FAKE_MONOTONIC", "1")];
                cast.schedulers
                    .push(spawn_with(cluster, node, "jetsched-scheduler", instance, extra, &env).await);
            }
        }
        cast
    }

    /// Every service process.
    fn all(&mut self) -> impl Iterator<Item = &mut NsService> {
        [&mut self.registry, &mut self.alerter]
            .into_iter()
            .chain(&mut self.schedulers)
            .chain(&mut self.workers)
    }

    /// Every service process, to read.
    fn each(&self) -> impl Iterator<Item = &NsService> {
        [&self.registry, &self.alerter].into_iter().chain(&self.schedulers).chain(&self.workers)
    }

    /// The scheduler holding the lease (waits for one).
    async fn leader(&self, topology: &Topology) -> &NsService {
        let i = eventually(WAIT, "a scheduler holds the lease", || async {
            let record = chaos::leader(topology).await?;
            self.schedulers.iter().position(|s| s.instance == record.instance)
        })
        .await;
        &self.schedulers[i]
    }
}

/// The lease bucket as each node serves it.
struct Leases(Vec<kv::Store>);

impl Leases {
    async fn open(cluster: &NsCluster) -> Self {
        let mut stores = Vec::new();
        for i in 0..CLUSTER_SIZE {
            let js = jetstream::new(cluster.client_to(i).await);
            stores.push(js.get_key_value(Names::default().leader_bucket()).await.expect("lease bucket"));
        }
        Self(stores)
    }

    /// Waits until a scheduler other than `instance` holds the lease, as node `node` (one of
    /// the majority) sees it.
    async fn moved(&self, node: usize, instance: &str) {
        eventually(WAIT, "another scheduler takes the lease", || async {
            let get = self.0[node].entry(Names::default().leader_key());
            let entry = tokio::time::timeout(Duration::from_secs(1), get).await.ok()?.ok()??;
            let record: LeaderRecord = serde_json::from_slice(&entry.value).ok()?;
            (entry.operation == kv::Operation::Put && record.instance != instance).then_some(())
        })
        .await;
    }
}

fn heal(lab: &NetLab) {
    lab.heal().unwrap_or_else(|e| panic!("heal: {e:#}"));
}

/// Applies `fault` (the `step`-th), waits for what it must cause, and heals.
async fn apply(
    fault: Fault,
    step: usize,
    cluster: &NsCluster,
    cast: &Cast,
    topology: &Topology,
    leases: &Leases,
    cut: &mut HashSet<String>,
) {
    let lab = cluster.lab();
    match fault {
        Fault::CutLeader => {
            let leader = cast.leader(topology).await;
            lab.drop_port(leader.node, leader.proxy.addr().port(), None).expect("cut the leader");
            leases.moved((leader.node + 1) % lab.len(), &leader.instance).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            heal(lab);
        }
        Fault::IsolateLeaderNode => {
            let leader = cast.leader(topology).await;
            let others: Vec<usize> = (0..lab.len()).filter(|&i| i != leader.node).collect();
            lab.partition(&[leader.node], &others, true).expect("isolate the leader's node");
            leases.moved(others[0], &leader.instance).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            heal(lab);
            cluster.wait_ready().await.expect("cluster whole again");
        }
        Fault::SplitNodes | Fault::OneWayNodes => {
            let (a, b) = (step % lab.len(), (step + 1) % lab.len());
            lab.partition(&[a], &[b], fault == Fault::SplitNodes).expect("partition nodes");
            tokio::time::sleep(HOLD).await;
            heal(lab);
            cluster.wait_ready().await.expect("cluster whole again");
        }
        Fault::SlowLossyLeader => {
            let leader = cast.leader(topology).await;
            leader.proxy.set_delay(Some(Delay {
                base: Duration::from_millis(200),
                jitter: Duration::from_millis(100),
            }));
            lab.drop_port(leader.node, leader.proxy.addr().port(), Some(0.05)).expect("lossy link");
            tokio::time::sleep(HOLD + Duration::from_secs(2)).await;
            leader.proxy.set_delay(None);
            heal(lab);
        }
        Fault::CutWorker => {
            let worker = &cast.workers[step % cast.workers.len()];
            lab.drop_port(worker.node, worker.proxy.addr().port(), None).expect("cut a worker");
            cut.insert(worker.instance.clone());
            tokio::time::sleep(WORKER_CUT).await;
            heal(lab);
        }
    }
}

/// Disk size of each node in the full-disk test, and the JetStream limit inside it.
const DISK_MB: u64 = 128;
const STORE_LIMITS: &str = "max_file_store: 100MB";

/// Reservations of the events and DLQ streams lowered to fit the small disks.
const SMALL_STREAM_BYTES: i64 = 8 << 20;

/// A running workload on a cluster in namespaces.
struct Setup {
    started: Instant,
    cluster: NsCluster,
    client: async_nats::Client,
    js: jetstream::Context,
    topology: Topology,
    calls: Arc<Mutex<HashMap<String, u32>>>,
    cast: Cast,
    skewed: bool,
    periodic: Vec<(String, i64)>,
    registered: i64,
}

impl Setup {
    /// A cluster (on small disks when `small`), the topology, the responder, the cast and the
    /// workload's periodic tasks.
    async fn start(small: bool) -> Self {
        let started = Instant::now();
        let (disk, limits) = if small { (Some(DISK_MB), STORE_LIMITS) } else { (None, "") };
        let cluster = NsCluster::start(disk, limits).await.unwrap_or_else(|e| panic!("{e:#}"));
        let client = cluster.client().await;
        let js = jetstream::new(client.clone());
        let names = Names::default();
        let mut args = TopologyArgs { replicas: 3, lease: LEASE, ..TopologyArgs::default() };
        if small {
            args.events_max_bytes = SMALL_STREAM_BYTES;
            args.dlq_max_bytes = SMALL_STREAM_BYTES;
        }
        let topology =
            eventually(WAIT, "the topology", || async { topology::ensure(&js, &names, &args).await.ok() })
                .await;
        let sub = client.subscribe("chaos.*").await.expect("responder subscription");
        let calls = chaos::responder(client.clone(), sub);
        let skewed = std::path::Path::new(FAKETIME_LIB).is_file();
        if !skewed {
            eprintln!(
                "nemesis: no skewed scheduler replicas: {FAKETIME_LIB} is missing (Debian package libfaketime)"
            );
        }
        let small_args = ["--events-max-bytes", "8388608", "--dlq-max-bytes", "8388608"];
        let extra: &[&str] = if small { &small_args } else { &[] };
        let cast = Cast::start(&cluster, skewed && !small, extra).await;
        let (periodic, registered) = chaos::register_workload(&client).await;
        Self { started, cluster, client, js, topology, calls, cast, skewed, periodic, registered }
    }

    /// Calm (a leader, then the schedulers stopped and the workers drained) and the checker.
    async fn finish(
        mut self,
        label: &str,
        one_shots: Vec<(String, i64)>,
        cut: HashSet<String>,
        faults: BTreeMap<String, usize>,
        server_restarts: Vec<(i64, i64)>,
    ) -> chaos::Report {
        self.cast.leader(&self.topology).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let end = chaos::now_ms() - 2500;
        for service in self.cast.all() {
            assert!(
                service.process.is_running(),
                "{} exited during the faults:\n{}",
                service.instance,
                service.process.output()
            );
        }
        let events_given_up = chaos::given_up(self.cast.schedulers.iter().map(|s| s.process.output()));
        for scheduler in &mut self.cast.schedulers {
            scheduler.process.kill9();
        }
        let observed = Observed {
            events_given_up,
            label: format!("{label}, skewed replicas: {}", self.skewed && self.cluster.disk(0).is_none()),
            periodic: self.periodic,
            registered: self.registered,
            one_shots,
            server_restarts,
            killed_workers: cut,
            faults,
            started: self.started,
            end,
            leader_kills: 0,
        };
        let report = chaos::check(&self.js, &self.topology, self.calls, observed).await;
        // The results row of docs/nemesis.md: faults, fires expected / dispatched / skipped, re-runs, lost.
        eprintln!(
            "nemesis results ({label}, namespace {NS}): expected {} / dispatched {} / skipped by policy {}, \
             runs retried {}, re-run {}, dead-lettered {}, lost 0",
            report.expected,
            report.dispatched,
            report.skipped_by_policy,
            report.retried,
            report.reruns,
            report.dead_lettered
        );
        report
    }
}

#[tokio::test]
async fn nemesis_partitions_slow_lossy_links_and_cut_workers_lose_and_double_nothing() {
    if NetLab::skip("nemesis") {
        return;
    }
    let rounds = rounds();
    if rounds == 1 {
        eprintln!("nemesis: short variant (JETSCHED_CHAOS=nemesis runs three of each fault)");
    }
    let setup = Setup::start(false).await;
    let leases = Leases::open(&setup.cluster).await;
    let mut one_shots = Vec::new();
    let mut cut = HashSet::new();
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..rounds {
        for (k, fault) in FAULTS.into_iter().enumerate() {
            let step = round * FAULTS.len() + k;
            one_shots.push(chaos::submit_one_shot(&setup.js, step).await);
            tokio::time::sleep(Duration::from_millis(700 + (step as u64 * 389) % 900)).await;
            apply(fault, step + round, &setup.cluster, &setup.cast, &setup.topology, &leases, &mut cut).await;
            *faults.entry(format!("{fault:?}")).or_default() += 1;
        }
    }
    let report =
        setup.finish(&format!("partitions, {rounds} round(s)"), one_shots, cut, faults, Vec::new()).await;
    // A worker cut off for longer than `ack_wait` leaves its runs to be re-run, recorded.
    assert!(report.reruns > 0, "a worker was cut off mid-run, yet no run records a re-run");
}

/// Puts a paused task (it never fires) through the registry; the error code when refused.
async fn put_probe(client: &async_nats::Client, id: &str) -> Result<(), String> {
    let body = jetsched_tests::spec(NS, id)
        .schedule(serde_json::json!({"every": "1h"}))
        .nats("chaos.ok")
        .field("paused", true)
        .bytes();
    let api = jetsched_tests::Api::new(client);
    let put = api.reply(api.names().task_api_subject("put"), async_nats::HeaderMap::new(), body);
    let reply = tokio::time::timeout(Duration::from_secs(5), put)
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| format!("{e:#}"))?;
    match reply.pointer("/error/code").and_then(|c| c.as_str()) {
        None => Ok(()),
        Some(code) => Err(code.to_owned()),
    }
}

/// The `jetstream` readiness check of `service` and whether `/readyz` says ready.
async fn jetstream_readiness(service: &NsService) -> Option<(bool, bool)> {
    let (status, body) = service.admin_get("/readyz").await.ok()?;
    let body: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some((body.pointer("/checks/jetstream")?.as_bool()?, status == 200))
}

/// Waits until every service's `/readyz` has its `jetstream` check at `ready` (and answers 503
/// while it is not).
async fn every_service_says_jetstream(cast: &Cast, ready: bool) {
    for service in cast.each() {
        let what = format!("{} reports jetstream ready: {ready}", service.instance);
        eventually(WAIT, &what, || async {
            let (jetstream, all) = jetstream_readiness(service).await?;
            (jetstream == ready && (ready || !all)).then_some(())
        })
        .await;
    }
}

/// How soon after the registry stores again every scheduler must hold every task of the
/// bucket: each opens its tasks watch anew once JetStream answers again (before that fix, the
/// client's own recovery of the watch left every scheduler blind to task changes for tens of
/// seconds after a restart, and a one-shot stored between the two outages was never fired).
const TASKS_SEEN_WITHIN: Duration = Duration::from_secs(15);

/// Waits until every scheduler's table holds as many tasks as the tasks bucket (the probe
/// just stored included), failing after [`TASKS_SEEN_WITHIN`].
async fn every_scheduler_holds_every_task(setup: &Setup) {
    let started = Instant::now();
    let tasks = setup.js.get_key_value(Names::default().tasks_bucket()).await.expect("tasks bucket");
    let stored = eventually(WAIT, "count the tasks bucket's keys", || async {
        jetsched_shared::cas::keys_once(&tasks).await.ok().map(|keys| keys.len() as u64)
    })
    .await;
    for scheduler in &setup.cast.schedulers {
        let what = format!("{} holds the {stored} tasks of the bucket", scheduler.instance);
        eventually(TASKS_SEEN_WITHIN.saturating_sub(started.elapsed()), &what, || async {
            (counter(scheduler, "jetsched_tasks_registered ").await? == stored).then_some(())
        })
        .await;
        eprintln!("{what} {} ms after the registry stored again", started.elapsed().as_millis());
    }
}

/// How soon after the registry stores again after a restart some scheduler dispatches again
/// (a task of the workload fires every second). A new leader whose reads of the fire state
/// were sent while the restarted cluster's streams had no leader used to wait out the client's
/// request timeout (10 s) and more before it dispatched: two runs lost their last 16-20 s of
/// fires that way.
const FIRES_RESUME_WITHIN: Duration = Duration::from_secs(10);

/// Fires dispatched so far by every scheduler together.
async fn dispatched_total(setup: &Setup) -> u64 {
    eventually(WAIT, "read the schedulers' dispatch counters", || async {
        let mut total = 0;
        for scheduler in &setup.cast.schedulers {
            total += sum(scheduler, "jetsched_fires_dispatched_total{").await?;
        }
        Some(total)
    })
    .await
}

/// Waits until the schedulers have dispatched more than `before` fires, failing
/// [`FIRES_RESUME_WITHIN`] after `since` (when the registry stored again).
async fn fires_resume_soon_after_the_restart(setup: &Setup, since: Instant, before: u64) {
    let limit = FIRES_RESUME_WITHIN.saturating_sub(since.elapsed());
    eventually(limit, "a scheduler dispatches again after the restart", || async {
        (dispatched_total(setup).await > before).then_some(())
    })
    .await;
    eprintln!("fires dispatched again {} ms after the registry stored again", since.elapsed().as_millis());
}

/// The sum of the values of `service`'s metric lines starting with `prefix`.
async fn sum(service: &NsService, prefix: &str) -> Option<u64> {
    let (_, body) = service.admin_get("/metrics").await.ok()?;
    let values = body.lines().filter(|line| line.starts_with(prefix));
    Some(values.filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok()).sum::<f64>() as u64)
}

/// The value of a counter line of `service`'s metrics starting with `prefix`.
async fn counter(service: &NsService, prefix: &str) -> Option<u64> {
    let (_, body) = service.admin_get("/metrics").await.ok()?;
    let line = body.lines().find(|line| line.starts_with(prefix))?;
    line.split_whitespace().last()?.parse::<f64>().ok().map(|v| v as u64)
}

/// How often the alerter's `rule` fired (before de-duplication).
async fn alerts_raised(alerter: &NsService, rule: &str) -> Option<u64> {
    counter(alerter, &format!("jetsched_alerts_raised_total{{rule=\"{rule}\"}}")).await
}

/// The value of `jetsched_events_failed_total` a service exports.
async fn events_failed(service: &NsService) -> Option<u64> {
    counter(service, "jetsched_events_failed_total").await
}

#[tokio::test]
async fn nemesis_full_disks_refuse_writes_and_resume_after_a_restart_losing_nothing() {
    if NetLab::skip("nemesis full disks") {
        return;
    }
    if rounds() == 1 {
        eprintln!("SKIPPED nemesis full disks: a long fault, run with JETSCHED_CHAOS=nemesis");
        return;
    }
    let mut setup = Setup::start(true).await;
    every_service_says_jetstream(&setup.cast, true).await;
    let mut one_shots = Vec::new();
    let mut restarts = Vec::new();
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for episode in 0..2 {
        one_shots.push(chaos::submit_one_shot(&setup.js, episode).await);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let from = chaos::now_ms();
        for i in 0..CLUSTER_SIZE {
            setup.cluster.disk(i).expect("small disk").fill().expect("fill the disk");
        }
        // JetStream stops on a write it cannot make; the registry then refuses with `unavailable`.
        let probe = format!("probe-{episode}");
        eventually(WAIT, "the registry refuses a put with `unavailable`", || async {
            matches!(put_probe(&setup.client, &probe).await, Err(code) if code == "unavailable")
        })
        .await;
        // Every service says what is wrong: its `jetstream` readiness check fails, and the
        // alerter raises `jetstream_unavailable` once per episode (sent through its log channel
        // the first time; the second falls in the first's de-duplication window).
        every_service_says_jetstream(&setup.cast, false).await;
        eventually(WAIT, "the alerter raises jetstream_unavailable", || async {
            let raised = alerts_raised(&setup.cast.alerter, "jetstream_unavailable").await?;
            (raised > episode as u64).then_some(())
        })
        .await;
        if episode == 0 {
            // Counted when raised; its log channel writes it once the alerter's loop gets to it
            // (its checks may be waiting out request timeouts while JetStream does not answer).
            eventually(WAIT, "the alerter logs the jetstream_unavailable alert", || async {
                setup.cast.alerter.process.output().contains("jetstream_unavailable")
            })
            .await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for i in 0..CLUSTER_SIZE {
            setup.cluster.disk(i).expect("small disk").free().expect("free the disk");
        }
        setup.cluster.restart_all().await.unwrap_or_else(|e| panic!("{e:#}"));
        restarts.push((from, chaos::now_ms()));
        // Every service resumes on its own: ready again, and the registry stores again.
        every_service_says_jetstream(&setup.cast, true).await;
        eventually(WAIT, "the registry stores again after the restart", || put_probe(&setup.client, &probe))
            .await;
        let stored_again = Instant::now();
        let dispatched = dispatched_total(&setup).await;
        tokio::join!(
            every_scheduler_holds_every_task(&setup),
            fires_resume_soon_after_the_restart(&setup, stored_again, dispatched)
        );
        *faults.entry("FullDisks".to_owned()).or_default() += 1;
    }
    // Nothing acknowledged before the disks filled is lost: each one-shot submitted just before
    // is stored as a task (the checker then proves it fired once).
    let tasks = setup.js.get_key_value(Names::default().tasks_bucket()).await.expect("tasks bucket");
    for (id, _) in &one_shots {
        let key = format!("{NS}.{id}");
        let deadline = Instant::now() + WAIT;
        loop {
            let entry = tasks.entry(key.clone()).await.ok().flatten();
            if entry.is_some_and(|e| e.operation == kv::Operation::Put) {
                break;
            }
            if Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let mut logs = String::new();
            for service in setup.cast.each() {
                for line in service.process.output().lines().filter(|l| l.contains(id.as_str())) {
                    logs.push_str(&format!("{}: {line}\n", service.instance));
                }
            }
            panic!(
                "one-shot {id} acknowledged before the disks filled was never stored; logs naming it:\n{logs}"
            );
        }
    }
    // Events that could not be stored are counted, by every service that stores events.
    for service in setup.cast.each().filter(|s| !s.instance.starts_with("alerter")) {
        let failed = events_failed(service).await;
        eprintln!("{}: jetsched_events_failed_total {failed:?}", service.instance);
        assert!(failed.is_some(), "{} exports no jetsched_events_failed_total", service.instance);
    }
    // What every service logged about the one-shots, shown if the checker finds one not fired.
    let mut logs = String::new();
    for (id, _) in &one_shots {
        for service in setup.cast.each() {
            for line in service.process.output().lines().filter(|l| {
                l.contains(&format!("{id}\"")) || l.contains(&format!("{id} ")) || l.ends_with(id.as_str())
            }) {
                logs.push_str(&format!("{}: {line}\n", service.instance));
            }
        }
    }
    let finished =
        std::panic::AssertUnwindSafe(setup.finish("full disks", one_shots, HashSet::new(), faults, restarts));
    if let Err(panic) = futures::FutureExt::catch_unwind(finished).await {
        eprintln!("log lines naming the one-shots:\n{logs}");
        std::panic::resume_unwind(panic);
    }
}
