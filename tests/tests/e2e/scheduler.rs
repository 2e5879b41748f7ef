//! End-to-end tests of jetsched-scheduler against a real nats-server: firing once per nominal
//! time, task updates / deletes / pause / resume, misfire policies after a leader change,
//! failover by kill -9 of real scheduler processes, a graceful handover to a warm follower,
//! fencing of a frozen (SIGSTOP) leader, and a server restart during steady firing.
//!
//! Every check reads the dispatch stream back and looks at each task's nominal fire times:
//! each at most once, and (with `fire_all`) none missing between the first and the last.
//! Tests that only need time to pass run the scheduler on a [`ManualClock`] and move it; the
//! others run on the real clock and wait for conditions, not for fixed periods.

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::pull};
use futures::StreamExt;
use jetsched_scheduler::{Clock, Config, ManualClock, build_with_clock};
use jetsched_shared::names::{Names, dispatch_msg_id, task_key};
use jetsched_shared::partition::partition_of;
use jetsched_shared::topology::Topology;
use jetsched_shared::wire::{self, HDR_LEADER_TERM, HDR_NOMINAL_TIME, HDR_TASK, LeaderRecord};
use jetsched_tests::fixtures::write_task;
use jetsched_tests::{
    App, ChildProcess, SpecBuilder, WithTopology, eventually, read_stream, server_with_topology, spec,
    with_lease,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);
const NS: &str = "e2e";

/// One message of the dispatch stream.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) msg_id: String,
    pub(crate) task: String,
    pub(crate) nominal_ms: i64,
    pub(crate) term: u64,
    pub(crate) published: SystemTime,
    pub(crate) body: wire::Dispatch,
}

fn scheduler_config(url: &str, instance: &str, lease: Duration) -> Config {
    let mut config = Config::for_tests(url);
    config.shared.common.instance_id = Some(instance.to_string());
    config.shared.topology.lease = lease;
    config.lease_margin = lease / 4;
    config
}

/// A scheduler in-process on the real clock.
async fn start(url: &str, instance: &str, lease: Duration) -> App {
    App::scheduler(scheduler_config(url, instance, lease)).await
}

/// A scheduler in-process on `clock`, which only the test moves.
async fn start_on(config: Config, clock: &ManualClock) -> App {
    let scheduler =
        Box::pin(build_with_clock(config, Arc::new(clock.clone()))).await.expect("scheduler builds");
    App::spawn("scheduler", scheduler.admin_addr(), |shutdown| scheduler.run(shutdown))
}

/// Moves `clock` one second on and waits until `witness` (a task firing every second) has
/// fired at the new time: the scheduler has then handled everything due until then.
async fn tick(clock: &ManualClock, js: &jetstream::Context, witness: &str) -> i64 {
    clock.advance(Duration::from_secs(1));
    let now = clock.now_ms();
    let key = task_key(NS, witness);
    eventually(WAIT, &format!("{witness} fired at {now}"), || async {
        read_dispatches(js).await.iter().any(|s| s.task == key && s.nominal_ms == now)
    })
    .await;
    now
}

/// A task of these tests: a `nats` executor on `jobs.run`.
fn task(id: &str) -> SpecBuilder {
    spec(NS, id).nats("jobs.run")
}

/// Writes `count` tasks `<prefix>-000`, `<prefix>-001`... firing every second; their ids.
async fn every_second(topology: &Topology, prefix: &str, count: usize) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:03}")).collect();
    put_every_second(topology, ids.clone()).await;
    ids
}

async fn put_every_second(topology: &Topology, ids: impl IntoIterator<Item = String>) {
    for id in ids {
        write_task(&topology.tasks, &task(&id).every("1s").misfire("fire_all")).await;
    }
}

/// Reads the whole dispatch stream (nothing consumes it in these tests) without removing anything.
pub(crate) async fn read_dispatches(js: &jetstream::Context) -> Vec<Seen> {
    let names = Names::default();
    let messages = read_stream(js, &names.dispatch_stream(), Duration::from_secs(60))
        .await
        .expect("read the dispatch stream");
    let mut seen = Vec::with_capacity(messages.len());
    for message in messages {
        let headers = message.headers.clone().expect("dispatch headers");
        let header = |name: &str| headers.get(name).map(|v| v.to_string()).unwrap_or_default();
        let body: wire::Dispatch = serde_json::from_slice(&message.payload).expect("dispatch body");
        let nominal =
            chrono::DateTime::parse_from_rfc3339(&header(HDR_NOMINAL_TIME)).expect("nominal header");
        let published = message.info().expect("info").published;
        let published = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(published.unix_timestamp_nanos()).expect("after epoch"));
        seen.push(Seen {
            msg_id: header("Nats-Msg-Id"),
            task: header(HDR_TASK),
            nominal_ms: nominal.timestamp_millis(),
            term: header(HDR_LEADER_TERM).parse().expect("term header"),
            published,
            body,
        });
    }
    seen
}

/// Nominal fire times per task, checking each message's id, headers and body agree.
pub(crate) fn per_task(seen: &[Seen]) -> BTreeMap<String, Vec<i64>> {
    let mut ids = HashSet::new();
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for s in seen {
        let (ns, id) = s.task.split_once('.').expect("task header is ns.id");
        assert_eq!(s.msg_id, dispatch_msg_id(ns, id, s.nominal_ms));
        assert!(ids.insert(s.msg_id.clone()), "message id {} stored twice", s.msg_id);
        assert_eq!(s.body.execution_id, wire::scheduled_execution_id(ns, id, s.nominal_ms));
        assert_eq!((s.body.namespace.as_str(), s.body.task_id.as_str()), (ns, id));
        assert_eq!(s.body.term, s.term);
        out.entry(s.task.clone()).or_default().push(s.nominal_ms);
    }
    for nominals in out.values_mut() {
        nominals.sort_unstable();
    }
    out
}

/// Each nominal second at most once and none missing between the first and the last.
pub(crate) fn assert_contiguous(task: &str, nominals: &[i64], step_ms: i64) {
    for pair in nominals.windows(2) {
        assert!(pair[1] != pair[0], "{task}: nominal {} dispatched twice", pair[0]);
        assert_eq!(pair[1] - pair[0], step_ms, "{task}: fires missing between {} and {}", pair[0], pair[1]);
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Events of `kind` about tasks of the test namespace (or the system namespace).
async fn read_events(js: &jetstream::Context, kind: &str, namespace: &str) -> Vec<wire::Event> {
    let names = Names::default();
    let stream = js.get_stream(names.events_stream()).await.expect("events stream");
    let consumer = stream
        .create_consumer(pull::Config {
            ack_policy: AckPolicy::None,
            filter_subject: names.event_subject(kind, namespace, "*"),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .expect("events consumer");
    let mut events = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .expect("fetch events");
        let mut got = 0;
        while let Some(message) = batch.next().await {
            got += 1;
            events.push(serde_json::from_slice(&message.expect("event").payload).expect("event body"));
        }
        if got == 0 {
            break;
        }
    }
    events
}

async fn leader(topology: &Topology) -> Option<LeaderRecord> {
    let entry = topology.leader.entry(Names::default().leader_key()).await.ok()??;
    if entry.operation != jetstream::kv::Operation::Put {
        return None;
    }
    serde_json::from_slice(&entry.value).ok()
}

#[tokio::test]
async fn scheduler_dispatches_each_nominal_second_exactly_once() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let ids = every_second(&topology, "tick", 5).await;
    let scheduler = start(&server.url(), "solo", lease).await;
    let started = now_ms();
    // The record holds the term from the first renewal on (sent right after the create).
    let held = eventually(WAIT, "a leader with its term", || async {
        leader(&topology).await.filter(|l| l.term > 0)
    })
    .await;
    eventually(WAIT, "every task fired three times", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        tasks.len() == ids.len() && tasks.values().all(|n| n.len() >= 3)
    })
    .await;
    // Read between two seconds' fires, so that no fire is counted in one figure and not yet in
    // another.
    let into_second = now_ms().rem_euclid(1000) as u64;
    tokio::time::sleep(Duration::from_millis((1400 - into_second) % 1000)).await;
    let metrics = scheduler.metrics().await;
    for line in [
        "jetsched_scheduler_is_leader 1",
        "jetsched_scheduler_resumed 1",
        "jetsched_tasks_registered 5",
        "jetsched_scheduler_timers 5",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("jetsched_fires_dispatched_total{trigger=\"schedule\"}"), "{metrics}");
    assert!(metrics.contains("jetsched_fire_lag_seconds_bucket"), "{metrics}");
    // Each task counts in its partition, every partition is exported, and the fires per
    // partition add up to the fires dispatched.
    let by_partition = |name: &str| -> BTreeMap<u16, f64> {
        let values =
            metrics.lines().filter_map(|line| line.strip_prefix(name)?.strip_prefix("{partition=\""));
        values
            .filter_map(|rest| {
                let (partition, value) = rest.split_once("\"} ")?;
                Some((partition.parse().ok()?, value.parse().ok()?))
            })
            .collect()
    };
    let tasks_by_partition = by_partition("jetsched_partition_tasks");
    assert_eq!(tasks_by_partition.len(), 64, "{metrics}");
    let mut expected = BTreeMap::new();
    for id in &ids {
        *expected.entry(partition_of(NS, id, 64)).or_insert(0.0) += 1.0;
    }
    let nonzero: BTreeMap<u16, f64> = tasks_by_partition.into_iter().filter(|&(_, n)| n > 0.0).collect();
    assert_eq!(nonzero, expected);
    let fired: f64 = by_partition("jetsched_partition_fires_total").values().sum();
    let dispatched = metrics
        .lines()
        .find_map(|l| l.strip_prefix("jetsched_fires_dispatched_total{trigger=\"schedule\"} "));
    assert_eq!(Some(fired), dispatched.and_then(|n| n.parse().ok()), "{metrics}");
    // Renewed every lease/3 meanwhile: the record keeps its term and acquisition time.
    let renewed = leader(&topology).await.expect("still leading");
    assert_eq!((renewed.term, renewed.acquired_at), (held.term, held.acquired_at));
    assert_eq!(renewed.instance, "solo");
    scheduler.stop().await;
    let stopped = now_ms();

    // A graceful stop hands over at once: the lease key is deleted.
    assert!(leader(&topology).await.is_none(), "lease released on shutdown");
    let seen = read_dispatches(&js).await;
    let tasks = per_task(&seen);
    assert_eq!(tasks.len(), ids.len(), "every task fired: {tasks:?}");
    for (task, nominals) in &tasks {
        assert_contiguous(task, nominals, 1000);
        assert!(nominals.len() >= 3, "{task}: {nominals:?}");
        assert!(nominals.iter().all(|&n| n % 1000 == 0 && n > started - 1000 && n <= stopped));
    }
    for s in &seen {
        assert_eq!(s.body.trigger, wire::Trigger::Schedule);
        // One leader throughout: every dispatch carries the term its lease record holds.
        assert_eq!(s.term, held.term, "{s:?}");
        // Dispatched after (never before) its nominal time.
        let published_ms =
            s.published.duration_since(SystemTime::UNIX_EPOCH).expect("after epoch").as_millis() as i64;
        assert!(published_ms >= s.nominal_ms, "dispatched early: {s:?}");
    }
    // The fire state records the last dispatched nominal time of each task.
    for (task, nominals) in &tasks {
        let state = topology.state.get(task.as_str()).await.expect("state read").expect("state stored");
        let state: wire::FireState = serde_json::from_slice(&state).expect("fire state");
        assert_eq!(state.last_nominal_fire.timestamp_millis(), *nominals.last().expect("fires"), "{task}");
        assert_eq!(state.fires, nominals.len() as u64, "{task}");
    }
    let system = jetsched_shared::names::SYSTEM_NAMESPACE;
    let acquired = read_events(&js, "leader.acquired", system).await;
    let lost = read_events(&js, "leader.lost", system).await;
    assert_eq!(acquired.len(), 1, "{acquired:?}");
    assert_eq!(acquired[0].instance.as_deref(), Some("solo"));
    assert_eq!(lost.len(), 1, "leader.lost on shutdown: {lost:?}");
    assert_eq!(lost[0].term, acquired[0].term);
    assert_eq!(acquired[0].term, Some(held.term));
    let dispatched = read_events(&js, "fire.dispatched", NS).await;
    assert_eq!(dispatched.len(), seen.len(), "one fire.dispatched event per dispatch");
}

#[tokio::test]
async fn a_new_leader_applies_each_misfire_policy_to_fires_missed_while_down() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    for (id, misfire) in [("skip", "skip"), ("once", "fire_once"), ("all", "fire_all")] {
        let body = task(id).every("1s").misfire(misfire).bytes();
        topology.tasks.put(task_key(NS, id), body.into()).await.expect("put task");
    }
    // A fire more than 1 s late is a misfire for these schedulers.
    let config = |instance: &str| {
        let mut config = scheduler_config(&server.url(), instance, lease);
        config.misfire_threshold = Duration::from_secs(1);
        config
    };
    let clock = ManualClock::starting_now();
    let first = start_on(config("first"), &clock).await;
    eventually(WAIT, "first leads", || async { leader(&topology).await.filter(|l| l.instance == "first") })
        .await;
    for _ in 0..2 {
        tick(&clock, &js, "all").await;
    }
    first.stop().await;
    // Its successor starts five seconds later: three fires are misfires, two are ordinary.
    let later = ManualClock::at(clock.now_us() + 5_000_000);
    let second = start_on(config("second"), &later).await;
    let resumed = later.now_ms();
    eventually(WAIT, "the new leader caught up", || async {
        per_task(&read_dispatches(&js).await).get(&task_key(NS, "all")).and_then(|n| n.last().copied())
            == Some(resumed)
    })
    .await;
    for _ in 0..2 {
        tick(&later, &js, "all").await;
    }
    second.stop().await;

    let seen = read_dispatches(&js).await;
    let tasks = per_task(&seen);
    let catchups = |id: &str| -> Vec<i64> {
        seen.iter()
            .filter(|s| s.task == task_key(NS, id) && s.body.trigger == wire::Trigger::Catchup)
            .map(|s| s.nominal_ms)
            .collect()
    };
    let skipped = read_events(&js, "fire.skipped", NS).await;
    let skipped_of = |id: &str, reason: &str| -> Vec<i64> {
        skipped
            .iter()
            .filter(|e| e.task_id == id && e.reason.as_deref() == Some(reason))
            .map(|e| e.nominal_time.expect("nominal time").timestamp_millis())
            .collect()
    };
    // fire_all: every missed fire dispatched, late ones as catch-up.
    assert_contiguous("all", &tasks[&task_key(NS, "all")], 1000);
    assert!(catchups("all").len() >= 2, "{:?}", catchups("all"));
    // fire_once: one catch-up run; the other missed fires are recorded as coalesced.
    assert_eq!(catchups("once").len(), 1, "{:?}", catchups("once"));
    let coalesced = skipped_of("once", "coalesced");
    assert!(!coalesced.is_empty());
    let mut once: Vec<i64> = tasks[&task_key(NS, "once")].iter().copied().chain(coalesced).collect();
    once.sort_unstable();
    assert_contiguous("once (dispatched or coalesced)", &once, 1000);
    // skip: nothing caught up; every skipped fire is an event.
    assert!(catchups("skip").is_empty());
    let misfired = skipped_of("skip", "misfire");
    assert!(misfired.len() >= 2, "{misfired:?}");
    let mut skip: Vec<i64> = tasks[&task_key(NS, "skip")].iter().copied().chain(misfired).collect();
    skip.sort_unstable();
    assert_contiguous("skip (dispatched or skipped)", &skip, 1000);
}

#[tokio::test]
async fn scheduler_applies_updates_deletes_pause_and_resume() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    put_every_second(&topology, ["changed".to_string(), "deleted".to_string(), "paused".to_string()]).await;
    let scheduler = start(&server.url(), "solo", lease).await;
    // Registered while running: picked up through the watch. A value that is not a spec is
    // ignored (and counted), never fatal.
    put_every_second(&topology, ["late".to_string()]).await;
    topology.tasks.put(task_key(NS, "broken"), "{\"id\": 42}".into()).await.expect("put garbage");
    eventually(WAIT, "every task fired twice", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        tasks.len() == 4 && tasks.values().all(|n| n.len() >= 2)
    })
    .await;
    assert_eq!(scheduler.metric("jetsched_scheduler_invalid_specs_total").await, Some(1.0));
    // Fires of `id` more than 300 ms after `t` (a fire may race a change by that much).
    let after = |tasks: &BTreeMap<String, Vec<i64>>, id: &str, t: i64| -> Vec<i64> {
        tasks.get(&task_key(NS, id)).into_iter().flatten().copied().filter(|&n| n > t + 300).collect()
    };

    let changed_at = now_ms();
    write_task(&topology.tasks, &task("changed").every("2s").misfire("fire_all")).await;
    topology.tasks.delete(task_key(NS, "deleted")).await.expect("delete");
    write_task(&topology.tasks, &task("paused").every("1s").misfire("fire_all").paused(true)).await;
    // In order: once the pause is applied (two timers left), so are the others.
    eventually(WAIT, "the changes applied", || async {
        scheduler.metric("jetsched_scheduler_timers").await == Some(2.0)
    })
    .await;
    eventually(WAIT, "three more fires while paused", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        after(&tasks, "late", changed_at).len() >= 3 && !after(&tasks, "changed", changed_at).is_empty()
    })
    .await;
    let resumed_at = now_ms();
    write_task(&topology.tasks, &task("paused").every("1s").misfire("fire_all")).await;
    eventually(WAIT, "fires again after resume", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        after(&tasks, "paused", resumed_at).len() >= 3 && after(&tasks, "changed", changed_at).len() >= 2
    })
    .await;
    scheduler.stop().await;

    let tasks = per_task(&read_dispatches(&js).await);
    let key = |id: &str| task_key(NS, id);
    assert!(!tasks.contains_key(&key("broken")));
    // A change lands within milliseconds: allow 300 ms for a fire racing the change.
    let after = |id: &str, t: i64| after(&tasks, id, t);
    let changed = after("changed", changed_at);
    assert!(changed.len() >= 2, "changed task keeps firing: {changed:?}");
    assert!(changed.iter().all(|n| n % 2000 == 0), "only the new 2 s schedule after the change: {changed:?}");
    assert_contiguous(&key("changed"), &changed, 2000);
    assert!(
        after("deleted", changed_at).is_empty(),
        "a deleted task never fires again: {:?}",
        tasks[&key("deleted")]
    );
    let paused_fires: Vec<i64> = after("paused", changed_at);
    assert!(
        paused_fires.iter().all(|&n| n > resumed_at),
        "no fire while paused, none caught up: {paused_fires:?}"
    );
    assert!(paused_fires.len() >= 2, "fires again after resume: {paused_fires:?}");
    assert_contiguous(&key("paused"), &paused_fires, 1000);
    assert_contiguous(&key("late"), &tasks[&key("late")], 1000);
}

/// Spawns a scheduler process with a short lease.
pub(crate) fn spawn_scheduler(url: &str, instance: &str, lease: Duration) -> ChildProcess {
    ChildProcess::spawn_command(instance, scheduler_command(url, instance, lease))
}

/// The command of a scheduler process with a short lease, no fire events, logs on.
pub(crate) fn scheduler_command(url: &str, instance: &str, lease: Duration) -> Command {
    let mut command: Command = ChildProcess::command("jetsched-scheduler");
    command
        .env("NATS_URL", url)
        .env("RUST_LOG", "info")
        .args(["--instance-id", instance, "--admin-addr", "127.0.0.1:0", "--fire-events", "false"])
        .args(["--lease", &format!("{}ms", lease.as_millis())])
        .args(["--lease-margin", &format!("{}ms", lease.as_millis() / 4)]);
    command
}

/// Waits until a scheduler process has loaded the tasks (it logs so).
pub(crate) async fn tasks_loaded(process: &ChildProcess) {
    eventually(WAIT, &format!("{} loaded the tasks", process.pid()), || async {
        process.output().contains("tasks loaded")
    })
    .await;
}

/// Waits until a dispatch was stored after `time` (some leader is dispatching past it).
pub(crate) async fn dispatched_past(js: &jetstream::Context, time: SystemTime) {
    eventually(WAIT, "a dispatch past the time", || async {
        read_dispatches(js).await.iter().any(|s| s.published > time)
    })
    .await;
}

#[tokio::test]
async fn scheduler_failover_by_kill_9_loses_and_doubles_no_fire() {
    const KILLS: usize = 10;
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let ids = every_second(&topology, "task", 200).await;
    let registered = now_ms();

    let mut spawned = 0;
    let mut next_instance = || {
        spawned += 1;
        format!("sched-{spawned}")
    };
    let mut procs: BTreeMap<String, ChildProcess> = BTreeMap::new();
    for _ in 0..2 {
        let instance = next_instance();
        procs.insert(instance.clone(), spawn_scheduler(&server.url(), &instance, lease));
    }
    let mut kills: Vec<(SystemTime, String)> = Vec::new();
    for round in 0..KILLS {
        let holder = eventually(WAIT, "a live leader", || async {
            leader(&topology).await.filter(|l| procs.contains_key(&l.instance))
        })
        .await;
        // Let it dispatch a little, then kill it at a random point of its lease period.
        let pause = 700
            + (round as u64 * 379
                + u64::from(
                    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("epoch").subsec_millis(),
                ))
                % 1300;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let mut victim = procs.remove(&holder.instance).expect("leader is one of ours");
        let killed_at = SystemTime::now();
        victim.kill9();
        kills.push((killed_at, holder.instance.clone()));
        let instance = next_instance();
        procs.insert(instance.clone(), spawn_scheduler(&server.url(), &instance, lease));
        eventually(WAIT, "a new leader", || async {
            leader(&topology)
                .await
                .filter(|l| l.instance != holder.instance && procs.contains_key(&l.instance))
        })
        .await;
    }
    let last_handover = now_ms();
    eventually(WAIT, "every task fired 2 s past the last handover", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        tasks.values().all(|n| n.last().is_some_and(|&l| l >= last_handover + 2000))
    })
    .await;
    let end = now_ms();
    for proc in procs.values_mut() {
        proc.kill9();
    }

    let seen = read_dispatches(&js).await;
    let tasks = per_task(&seen);
    assert_eq!(tasks.len(), ids.len());
    for (task, nominals) in &tasks {
        assert_contiguous(task, nominals, 1000);
        assert!(nominals[0] <= registered + 3000, "{task} started late: {}", nominals[0] - registered);
        assert!(*nominals.last().expect("fires") >= end - 3000, "{task} stopped early");
    }
    // Handover: after each kill, the next dispatch comes within lease + 1 s.
    let mut by_time: Vec<&Seen> = seen.iter().collect();
    by_time.sort_by_key(|s| s.published);
    let mut gaps = Vec::new();
    for (killed_at, instance) in &kills {
        let next = by_time.iter().find(|s| s.published > *killed_at).expect("dispatches after a kill");
        let gap = next.published.duration_since(*killed_at).expect("later");
        assert!(gap <= lease + Duration::from_secs(1), "handover after killing {instance} took {gap:?}");
        gaps.push(gap.as_millis());
    }
    eprintln!("handover gaps after kill -9 (ms, lease {} ms): {gaps:?}", lease.as_millis());
}

#[tokio::test]
async fn a_graceful_shutdown_hands_over_at_once() {
    // A long lease: only the released key (not its expiry) can explain a fast handover.
    let lease = Duration::from_secs(10);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    put_every_second(&topology, (0..10).map(|i| format!("handover-{i}"))).await;
    let mut a = spawn_scheduler(&server.url(), "handover-a", lease);
    eventually(WAIT, "a leads", || async { leader(&topology).await.filter(|l| l.instance == "handover-a") })
        .await;
    let mut b = spawn_scheduler(&server.url(), "handover-b", lease);
    tasks_loaded(&b).await;
    let stopped_at = SystemTime::now();
    a.sigterm();
    assert!(a.wait_exit(WAIT).await.is_some_and(|status| status.success()), "clean exit:\n{}", a.output());
    eventually(Duration::from_secs(3), "b takes over well before the lease could expire", || async {
        leader(&topology).await.filter(|l| l.instance == "handover-b")
    })
    .await;
    dispatched_past(&js, stopped_at + Duration::from_secs(2)).await;
    b.sigterm();
    assert!(b.wait_exit(WAIT).await.is_some(), "b stops");

    let seen = read_dispatches(&js).await;
    for (task, nominals) in &per_task(&seen) {
        assert_contiguous(task, nominals, 1000);
    }
    let next =
        seen.iter().filter(|s| s.published > stopped_at).map(|s| s.published).min().expect("b dispatched");
    let gap = next.duration_since(stopped_at).expect("later");
    assert!(gap < Duration::from_millis(1500), "handover took {gap:?}");
}

#[tokio::test]
async fn a_warm_follower_resumes_from_the_latest_fire_state() {
    let lease = Duration::from_secs(10);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let ids = every_second(&topology, "warm", 5).await;
    let mut a = spawn_scheduler(&server.url(), "warm-a", lease);
    eventually(WAIT, "a leads", || async { leader(&topology).await.filter(|l| l.instance == "warm-a") })
        .await;
    // b follows the fire state a writes for seconds before it leads: it must take over from
    // what a wrote last (fire counts continue, no fire repeated or lost), not from its start.
    let mut b = spawn_scheduler(&server.url(), "warm-b", lease);
    tasks_loaded(&b).await;
    dispatched_past(&js, SystemTime::now() + Duration::from_secs(2)).await;
    a.sigterm();
    assert!(a.wait_exit(WAIT).await.is_some_and(|status| status.success()), "clean exit:\n{}", a.output());
    eventually(Duration::from_secs(3), "b leads", || async {
        leader(&topology).await.filter(|l| l.instance == "warm-b")
    })
    .await;
    dispatched_past(&js, SystemTime::now() + Duration::from_secs(2)).await;
    b.sigterm();
    assert!(b.wait_exit(WAIT).await.is_some_and(|status| status.success()), "clean exit:\n{}", b.output());

    let seen = read_dispatches(&js).await;
    let per = per_task(&seen);
    for id in &ids {
        let key = task_key(NS, id);
        let nominals = per.get(&key).unwrap_or_else(|| panic!("{key} dispatched"));
        assert_contiguous(&key, nominals, 1000);
        let stored = topology.state.get(&key).await.expect("read fire state").expect("fire state stored");
        let state: wire::FireState = serde_json::from_slice(&stored).expect("fire state JSON");
        assert_eq!(state.fires, nominals.len() as u64, "{key}: fire count carried over the handover");
        assert_eq!(state.last_nominal_fire.timestamp_millis(), nominals[nominals.len() - 1], "{key}");
    }
}

#[tokio::test]
async fn a_frozen_leader_never_dispatches_after_it_wakes() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let _ids = every_second(&topology, "frozen", 20).await;
    let mut a = spawn_scheduler(&server.url(), "freeze-a", lease);
    let first = eventually(WAIT, "a leader", || leader(&topology)).await;
    assert_eq!(first.instance, "freeze-a");
    let mut b = spawn_scheduler(&server.url(), "freeze-b", lease);
    tasks_loaded(&b).await;
    dispatched_past(&js, SystemTime::now()).await;

    let frozen_at = SystemTime::now();
    a.sigstop();
    eventually(WAIT, "the other replica takes over", || async {
        leader(&topology).await.filter(|l| l.instance == "freeze-b")
    })
    .await;
    // Frozen for well over the lease, while the new leader dispatches.
    dispatched_past(&js, SystemTime::now() + Duration::from_millis(1500)).await;
    let woke_at = SystemTime::now();
    a.sigcont();
    // The woken leader has time to (wrongly) dispatch while the new one goes on.
    dispatched_past(&js, woke_at + Duration::from_secs(2)).await;
    b.sigterm();
    assert!(b.wait_exit(WAIT).await.is_some(), "b stops");
    a.kill9();

    let seen = read_dispatches(&js).await;
    let tasks = per_task(&seen);
    for (task, nominals) in &tasks {
        assert_contiguous(task, nominals, 1000);
    }
    // Until the freeze only `a` led: its term is the highest one seen before it. After `b`
    // stops (gracefully), `a` may legitimately win a new, higher term; only `a`'s frozen term
    // must never dispatch again once it woke.
    let frozen_term =
        seen.iter().filter(|s| s.published < frozen_at).map(|s| s.term).max().expect("a dispatched before");
    let stale: Vec<&Seen> = seen.iter().filter(|s| s.published >= woke_at && s.term == frozen_term).collect();
    assert!(stale.is_empty(), "the woken leader dispatched again: {stale:?}");
    assert!(seen.iter().any(|s| s.published >= woke_at), "the new leader kept dispatching");
    assert!(a.output().contains("leadership lost"), "the frozen leader stepped down:\n{}", a.output());
}

#[tokio::test]
async fn a_server_outage_and_restart_during_steady_firing_loses_and_doubles_nothing() {
    let lease = Duration::from_secs(2);
    let WithTopology { mut server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let ids = every_second(&topology, "steady", 20).await;
    let scheduler = start(&server.url(), "survivor", lease).await;
    eventually(WAIT, "every task fired twice", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        tasks.len() == ids.len() && tasks.values().all(|n| n.len() >= 2)
    })
    .await;
    // Down for longer than the lease (real time: the server's), the passing of time is the
    // point: the leader steps down, then resumes from the fire state.
    server.kill();
    tokio::time::sleep(lease + Duration::from_millis(1000)).await;
    server.restart().await;
    let restarted = now_ms();
    eventually(Duration::from_secs(20), "dispatching again after the restart", || async {
        let tasks = per_task(&read_dispatches(&js).await);
        tasks.len() == ids.len() && tasks.values().all(|n| n.last().is_some_and(|&l| l > restarted + 2500))
    })
    .await;
    scheduler.stop().await;

    let tasks = per_task(&read_dispatches(&js).await);
    assert_eq!(tasks.len(), ids.len());
    for (task, nominals) in &tasks {
        assert_contiguous(task, nominals, 1000);
    }
}

// ---- overlap policy (scheduler + worker in-process) ---------------------------------------

/// What the overlap tests read of a run record (the worker owns the full record).
#[derive(Debug, Clone, serde::Deserialize)]
struct RunTimes {
    task_id: String,
    #[serde(with = "wire::millis")]
    nominal_time: chrono::DateTime<chrono::Utc>,
    status: wire::RunStatus,
    #[serde(with = "wire::millis")]
    started: chrono::DateTime<chrono::Utc>,
    #[serde(default, with = "wire::millis::option")]
    finished: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every run record of task `id`, by nominal time.
async fn runs_of(topology: &Topology, id: &str) -> Vec<RunTimes> {
    // Each key once: a run's verdict may be written while the keys are listed.
    let keys = jetsched_shared::cas::keys_once(&topology.runs).await.expect("run keys");
    let mut runs = Vec::new();
    for key in keys {
        let Some(value) = topology.runs.get(&key).await.expect("read run") else { continue };
        let run: RunTimes = serde_json::from_slice(&value).expect("run record decodes");
        if run.task_id == id {
            runs.push(run);
        }
    }
    runs.sort_by_key(|r| r.nominal_time);
    runs
}

/// A worker in-process with a handler `slow` that sleeps `RUN_LENGTH`.
const RUN_LENGTH: Duration = Duration::from_millis(3500);

async fn slow_worker(url: &str) -> App {
    use jetsched_worker::{Handlers, Outcome, RunContext};
    let handlers = Handlers::new().register("slow", |_run: RunContext| async {
        tokio::time::sleep(RUN_LENGTH).await;
        Outcome::ok()
    });
    let mut config = jetsched_worker::Config::for_tests(url, "overlap-worker");
    config.pull_expires = Duration::from_millis(500);
    App::worker(config, handlers).await
}

/// Runs task `id` (every second, the slow handler, overlap `policy`) until it has `runs` run
/// records and `skips` overlap skips, then stops the scheduler, lets the last run finish and
/// returns its runs and overlap-skip nominals.
async fn run_overlapping(
    id: &str,
    policy: &str,
    runs: usize,
    skips: u64,
) -> (Vec<RunTimes>, Vec<i64>, String) {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let worker = slow_worker(&server.url()).await;
    let scheduler = start(&server.url(), "s-overlap", lease).await;
    write_task(&topology.tasks, &spec(NS, id).every("1s").handler("slow").field("overlap", policy)).await;
    let skipped = r#"jetsched_fires_skipped_total{reason="overlap"}"#;
    let seen =
        eventually(Duration::from_secs(30), &format!("{runs} runs and {skips} overlap skips"), || async {
            let recorded = runs_of(&topology, id).await.len();
            let skipped = scheduler.metric(skipped).await.unwrap_or_default() as u64;
            (recorded >= runs && skipped >= skips).then_some(recorded).ok_or((recorded, skipped))
        })
        .await;
    let metrics = scheduler.metrics().await;
    scheduler.stop().await;
    // A listing of the bucket's keys made while records are rewritten can leave one out (the
    // key's old message is gone, its new one not counted yet): list again until every run seen
    // is there and final.
    let runs = eventually(WAIT, "every run finished", || async {
        let runs = runs_of(&topology, id).await;
        match runs.len() >= seen && runs.iter().all(|r| r.status.is_final()) {
            true => Ok(runs),
            false => Err(runs.len()),
        }
    })
    .await;
    worker.stop().await;
    let skipped: Vec<i64> = read_events(&js, "fire.skipped", NS)
        .await
        .into_iter()
        .filter(|e| e.task_id == id)
        .map(|e| {
            assert_eq!(e.reason.as_deref(), Some("overlap"), "{e:?}");
            e.nominal_time.expect("skip names its fire").timestamp_millis()
        })
        .collect();
    (runs, skipped, metrics)
}

/// No two runs of the task overlap; every nominal second between the first and the last run is
/// either a run or an overlap skip (none lost silently, none both).
fn assert_serial_and_accounted(runs: &[RunTimes], skipped: &[i64]) {
    for run in runs {
        assert_eq!(run.status, wire::RunStatus::Succeeded, "{run:?}");
    }
    let mut by_start = runs.to_vec();
    by_start.sort_by_key(|r| r.started);
    for pair in by_start.windows(2) {
        let finished = pair[0].finished.expect("a final run has finished");
        assert!(pair[1].started >= finished, "runs overlap: {:?} and {:?}", pair[0], pair[1]);
    }
    let ran: HashSet<i64> = runs.iter().map(|r| r.nominal_time.timestamp_millis()).collect();
    let skipped_set: HashSet<i64> = skipped.iter().copied().collect();
    assert_eq!(skipped_set.len(), skipped.len(), "a fire skipped twice: {skipped:?}");
    assert!(ran.is_disjoint(&skipped_set), "a fire both ran and was skipped");
    let first = runs.first().expect("runs").nominal_time.timestamp_millis();
    let last = runs.last().expect("runs").nominal_time.timestamp_millis();
    for nominal in (first..=last).step_by(1000) {
        assert!(
            ran.contains(&nominal) || skipped_set.contains(&nominal),
            "fire {nominal} neither ran nor skipped"
        );
    }
}

#[tokio::test]
async fn overlap_skip_drops_fires_while_the_previous_run_is_going() {
    let (runs, skipped, metrics) = run_overlapping("ov-skip", "skip", 2, 4).await;
    assert!(runs.len() >= 2, "several runs: {runs:?}");
    assert!(skipped.len() >= 4, "fires skipped while a 3.5 s run is going: {skipped:?}");
    assert!(metrics.contains("jetsched_fires_skipped_total{reason=\"overlap\"}"), "{metrics}");
    assert_serial_and_accounted(&runs, &skipped);
    // Skipped fires fall inside a run; the next run is the first fire after the previous ended.
    let mut by_start = runs.clone();
    by_start.sort_by_key(|r| r.started);
    for pair in by_start.windows(2) {
        let finished = pair[0].finished.expect("finished").timestamp_millis();
        let next = pair[1].nominal_time.timestamp_millis();
        assert!(next >= finished && next - finished <= 2100, "not the next fire after the run: {pair:?}");
    }
}

#[tokio::test]
async fn overlap_buffer_one_keeps_one_fire_and_dispatches_it_when_the_run_ends() {
    let (runs, skipped, metrics) = run_overlapping("ov-buffer", "buffer_one", 3, 1).await;
    assert!(runs.len() >= 3, "several runs: {runs:?}");
    assert!(!skipped.is_empty(), "fires beyond the one buffered are skipped: {skipped:?}");
    assert!(metrics.contains("jetsched_fires_skipped_total{reason=\"overlap\"}"), "{metrics}");
    assert_serial_and_accounted(&runs, &skipped);
    let mut by_start = runs.clone();
    by_start.sort_by_key(|r| r.started);
    for pair in by_start.windows(2) {
        let finished = pair[0].finished.expect("finished");
        let (next, gap) = (&pair[1], (pair[1].started - finished).num_milliseconds());
        // The buffered fire keeps its nominal time (it was due while the previous run went on)
        // and starts right after the previous run finished.
        assert!(next.nominal_time < finished, "the next run was buffered: {pair:?}");
        assert!(gap < 900, "buffered fire dispatched {gap} ms after the previous run finished");
        // At most one fire waited: every fire due between it and the previous run's end was skipped.
        let skipped_between = skipped
            .iter()
            .filter(|&&s| s > next.nominal_time.timestamp_millis() && s < finished.timestamp_millis())
            .count();
        let due_between = (finished.timestamp_millis() - next.nominal_time.timestamp_millis() - 1) / 1000;
        assert_eq!(skipped_between as i64, due_between, "{pair:?} {skipped:?}");
    }
}

/// A one-shot stored after its time (the registry admits an `at` within the catch-up window,
/// e.g. when the intake is applied late) is a misfire, handled by its policy by a running
/// leader and by a leader that starts later: caught up once, or skipped with an event.
#[tokio::test]
async fn a_one_shot_stored_after_its_time_follows_its_misfire_policy() {
    let lease = Duration::from_secs(2);
    let WithTopology { server, js, topology, .. } = server_with_topology(with_lease(lease)).await;
    let at = |ago_ms: i64| {
        let t = chrono::DateTime::from_timestamp_millis((now_ms() - ago_ms) / 1000 * 1000).expect("time");
        json!({"at": wire::format_time(t)})
    };
    let late = |id: &str, misfire: &str| {
        task(id).schedule(at(30_000)).misfire(misfire).field("catchup_window", "10m")
    };
    // Stored before any scheduler runs: the leader's first catch-up decides.
    for (id, misfire) in [("before-all", "fire_all"), ("before-skip", "skip")] {
        write_task(&topology.tasks, &late(id, misfire)).await;
    }
    // A witness firing every second shows how far the scheduler's clock has been handled.
    put_every_second(&topology, ["witness".to_string()]).await;
    let clock = ManualClock::starting_now();
    let scheduler = start_on(scheduler_config(&server.url(), "solo", lease), &clock).await;
    let fired = |seen: &[Seen], id: &str| seen.iter().filter(|s| s.task == task_key(NS, id)).count();
    eventually(WAIT, "a leader that has caught up", || async {
        fired(&read_dispatches(&js).await, "before-all") == 1
    })
    .await;
    // Stored while a leader runs, 30 s after their time (far beyond the misfire threshold).
    for (id, misfire) in [("while-all", "fire_all"), ("while-once", "fire_once"), ("while-skip", "skip")] {
        write_task(&topology.tasks, &late(id, misfire)).await;
    }
    eventually(WAIT, "the late one-shots are caught up", || async {
        let seen = read_dispatches(&js).await;
        (fired(&seen, "before-all") == 1 && fired(&seen, "while-all") == 1 && fired(&seen, "while-once") == 1)
            .then_some(())
    })
    .await;
    eventually(WAIT, "the skipped ones are recorded", || async {
        let skipped = read_events(&js, "fire.skipped", NS).await;
        let of = |id: &str| skipped.iter().filter(|e| e.task_id == id).count();
        (of("before-skip") == 1 && of("while-skip") == 1).then_some(())
    })
    .await;
    // Time goes on: nothing fires twice.
    for _ in 0..2 {
        tick(&clock, &js, "witness").await;
    }
    scheduler.stop().await;
    let seen = read_dispatches(&js).await;
    for id in ["before-all", "while-all", "while-once"] {
        assert_eq!(fired(&seen, id), 1, "{id} dispatched once: {seen:?}");
        let s = seen.iter().find(|s| s.task == task_key(NS, id)).expect("dispatch");
        assert_eq!(s.body.trigger, wire::Trigger::Catchup, "{id}");
    }
    for id in ["before-skip", "while-skip"] {
        assert_eq!(fired(&seen, id), 0, "{id} never dispatched");
    }
}
