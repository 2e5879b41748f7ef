//! End-to-end tests of the scheduler's clock guard with real processes whose clocks are moved
//! by libfaketime (preloaded into the scheduler itself rather than through the `faketime`
//! wrapper, which forks: killing the wrapper would leave the scheduler running; the monotonic
//! clock is left alone so timers stay sane): a replica
//! 5 s ahead never leads while a correct one runs, and with only skewed replicas (5 s ahead,
//! 5 s behind) the fires still happen on the server's clock: the server's timestamp of each
//! dispatch minus its nominal time stays within milliseconds, under either leader.
//!
//! On a machine busy with other work a process can be descheduled for tens of milliseconds,
//! which delays a fire whatever its clock says: the test measures how late its own short
//! sleeps wake meanwhile and allows the fires that much more (on a quiet machine, about 1 ms).
//! The other test processes on the machine stall the scheduler's process apart from this one,
//! so the tight bound is on the median (a replica following its own clock would be 5 s off in
//! every fire) and the tail gets a looser one; no fire may be early, which no stall causes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv::Operation};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::topology::Topology;
use jetsched_shared::wire::{Event, LeaderRecord, Trigger};
use jetsched_tests::fixtures::write_spread_tasks;
use jetsched_tests::{
    ChildProcess, WithTopology, always, eventually, read_stream, server_with_topology, with_lease,
};

use crate::scheduler::{
    Seen, dispatched_past, read_dispatches, scheduler_command, spawn_scheduler, tasks_loaded,
};

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "clock";
const LEASE: Duration = Duration::from_secs(3);

/// Where Debian's `faketime` package puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// libfaketime is there (CI installs it); elsewhere the test says why it did nothing.
fn faketime_available() -> bool {
    let found = std::path::Path::new(LIBFAKETIME).exists();
    if !found {
        eprintln!("SKIPPED: clock guard test because {LIBFAKETIME} is missing (apt-get install faketime)");
    }
    found
}

/// A scheduler process whose wall clock is `offset` off (`+5s`, `-5s`).
fn spawn_skewed(url: &str, instance: &str, offset: &str) -> ChildProcess {
    let mut command = scheduler_command(url, instance, LEASE);
    command.env("LD_PRELOAD", LIBFAKETIME).env("FAKETIME", offset).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    ChildProcess::spawn_command(instance, command)
}

/// A server with the topology (lease [`LEASE`]) and twenty tasks spread over the second.
async fn setup() -> WithTopology {
    let setup = server_with_topology(with_lease(LEASE)).await;
    write_spread_tasks(&setup.topology.tasks, NS, "tick").await;
    setup
}

/// Every instance that ever held the lease, from a watch of the lease key.
fn record_holders(topology: &Topology) -> Arc<Mutex<Vec<String>>> {
    let holders = Arc::new(Mutex::new(Vec::new()));
    let (leader, seen) = (topology.leader.clone(), holders.clone());
    tokio::spawn(async move {
        let mut watch =
            leader.watch_with_history(Names::default().leader_key()).await.expect("watch the lease");
        while let Some(Ok(entry)) = watch.next().await {
            if entry.operation == Operation::Put
                && let Ok(record) = serde_json::from_slice::<LeaderRecord>(&entry.value)
            {
                seen.lock().expect("holders").push(record.instance);
            }
        }
    });
    holders
}

async fn holder(topology: &Topology) -> Option<String> {
    let entry = topology.leader.entry(Names::default().leader_key()).await.ok()??;
    let record: LeaderRecord =
        serde_json::from_slice(&entry.value).ok().filter(|_| entry.operation == Operation::Put)?;
    Some(record.instance)
}

/// The `scheduler.clock_skew` events, by instance.
async fn skew_events(js: &jetstream::Context) -> HashMap<String, Event> {
    let names = Names::default();
    let messages = read_stream(js, &names.events_stream(), WAIT).await.expect("read events");
    let subject = names.event_subject("scheduler.clock_skew", "_system", "scheduler");
    messages
        .iter()
        .filter(|m| m.subject.as_str() == subject)
        .filter_map(|m| serde_json::from_slice::<Event>(&m.payload).ok())
        .filter_map(|e| Some((e.instance.clone()?, e)))
        .collect()
}

#[tokio::test]
async fn a_scheduler_five_seconds_ahead_never_leads_while_a_correct_one_runs() {
    if !faketime_available() {
        return;
    }
    let WithTopology { server, js, topology, .. } = setup().await;
    let holders = record_holders(&topology);
    let url = server.url();
    let mut skewed = spawn_skewed(&url, "ahead", "+5s");
    let mut procs: BTreeMap<String, ChildProcess> = BTreeMap::new();
    for instance in ["right-1", "right-2"] {
        procs.insert(instance.to_string(), spawn_scheduler(&url, instance, LEASE));
    }
    tasks_loaded(&skewed).await;
    // A crash: the other correct replica takes over, fast; the skewed one does not probe.
    let first = eventually(WAIT, "a correct leader", || async {
        holder(&topology).await.filter(|h| procs.contains_key(h))
    })
    .await;
    for proc in procs.values() {
        tasks_loaded(proc).await;
    }
    // It crashes while dispatching.
    dispatched_past(&js, SystemTime::now()).await;
    procs.get_mut(&first).expect("ours").kill9();
    let second = eventually(WAIT, "another correct leader", || async {
        holder(&topology).await.filter(|h| h != &first && procs.contains_key(h))
    })
    .await;
    // A graceful handover: the released lease goes to a correct replica started meanwhile.
    procs.insert("right-3".into(), spawn_scheduler(&url, "right-3", LEASE));
    tasks_loaded(&procs["right-3"]).await;
    let leader = procs.get_mut(&second).expect("ours");
    leader.sigterm();
    assert!(leader.wait_exit(WAIT).await.is_some(), "the leader stops");
    eventually(WAIT, "the third correct replica leads", || async {
        holder(&topology).await.filter(|h| h == "right-3")
    })
    .await;
    // Longer than the skewed replica's extra lease.
    always(LEASE + Duration::from_secs(1), "right-3 keeps the lease", || async {
        let holder = holder(&topology).await;
        if holder.as_deref() == Some("right-3") { Ok(()) } else { Err(holder) }
    })
    .await;
    let all = holders.lock().expect("holders").clone();
    assert!(!all.contains(&"ahead".to_string()), "the skewed replica led: {all:?}");
    assert!(skewed.output().contains("campaigning one lease later"), "{}", skewed.output());
    let events = skew_events(&js).await;
    let offset = events.get("ahead").and_then(|e| e.reason.clone()).expect("a clock_skew event of 'ahead'");
    assert!(offset.contains("+4.9") || offset.contains("+5.0"), "{offset}");
    assert!(!events.contains_key("right-1"), "no event from a correct replica: {events:?}");
    skewed.kill9();
}

/// Server timestamp minus nominal time of each term's ordinary fires, once the term has
/// settled (after its first second: a new leader catches up what it missed, late by design).
fn lags_by_term(seen: &[Seen]) -> BTreeMap<u64, Vec<i64>> {
    let ms =
        |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).expect("after epoch").as_micros() as i64;
    let mut start: BTreeMap<u64, i64> = BTreeMap::new();
    for s in seen {
        let at = ms(s.published);
        start.entry(s.term).and_modify(|v| *v = (*v).min(at)).or_insert(at);
    }
    let mut lags: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.body.trigger == Trigger::Schedule) {
        if s.nominal_ms * 1000 > start[&s.term] + 1_000_000 {
            lags.entry(s.term).or_default().push(ms(s.published) - s.nominal_ms * 1000);
        }
    }
    for v in lags.values_mut() {
        v.sort_unstable();
    }
    lags
}

/// The longest a 5 ms sleep of this process overslept while the returned flag stayed unset:
/// the machine's scheduling stalls during the measurement.
fn measure_stalls() -> (Arc<AtomicBool>, tokio::task::JoinHandle<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = stop.clone();
    let task = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        while !done.load(Ordering::Relaxed) {
            let asked = Duration::from_millis(5);
            let started = std::time::Instant::now();
            tokio::time::sleep(asked).await;
            worst = worst.max(started.elapsed().saturating_sub(asked));
        }
        worst
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_skewed_replicas_fires_follow_the_servers_clock() {
    if !faketime_available() {
        return;
    }
    let (stop, stalls) = measure_stalls();
    let WithTopology { server, js, topology, .. } = setup().await;
    let url = server.url();
    let mut procs: BTreeMap<String, ChildProcess> = BTreeMap::new();
    procs.insert("ahead".into(), spawn_skewed(&url, "ahead", "+5s"));
    procs.insert("behind".into(), spawn_skewed(&url, "behind", "-5s"));
    let first = eventually(WAIT, "a skewed replica leads", || holder(&topology)).await;
    let settled = SystemTime::now() + Duration::from_secs(5);
    eventually(WAIT, "5 s of fires", || async {
        read_dispatches(&js).await.iter().any(|s| s.published > settled)
    })
    .await;
    // The other one takes over only at expiry plus its extra lease; then fires on time again.
    procs.get_mut(&first).expect("ours").kill9();
    let second =
        eventually(WAIT, "the other leads", || async { holder(&topology).await.filter(|h| h != &first) })
            .await;
    let settled = SystemTime::now() + Duration::from_secs(5);
    eventually(WAIT, "5 s of its fires", || async {
        read_dispatches(&js).await.iter().any(|s| s.published > settled)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let stall = i64::try_from(stalls.await.expect("stall meter").as_micros()).unwrap_or(i64::MAX);
    let lags = lags_by_term(&read_dispatches(&js).await);
    assert_eq!(lags.len(), 2, "both leaders fired: {first} then {second}");
    for (term, lags) in &lags {
        let n = lags.len();
        assert!(n >= 60, "term {term}: {n} fires");
        let (min, p50, p99, max) = (lags[0], lags[(n - 1) / 2], lags[(n - 1) * 99 / 100], lags[n - 1]);
        eprintln!(
            "term {term}: {n} fires, server time minus nominal min {min} / p50 {p50} / p99 {p99} / \
             max {max} µs (this process's longest stall {stall} µs)"
        );
        assert!(p50 <= 5_000 + stall, "term {term}: p50 {p50} µs (stall {stall} µs)");
        assert!(max <= 100_000 + stall, "term {term}: max {max} µs (stall {stall} µs)");
        assert!(min >= -2_000, "term {term}: a fire {min} µs early on the server's clock");
    }
    let events = skew_events(&js).await;
    assert!(events.contains_key("ahead") && events.contains_key("behind"), "{events:?}");
    assert!(events["behind"].reason.as_deref().is_some_and(|r| r.contains("-4.9") || r.contains("-5.0")));
}
