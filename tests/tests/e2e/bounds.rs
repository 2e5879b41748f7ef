//! End-to-end tests of schedule bounds with real scheduler processes: `max_runs` holds across a
//! leader killed with SIGKILL between the last two fires (exactly `max_runs` dispatches, one
//! `task.completed`), and no fire is made at `end_at` while the one just before it is.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv::Operation};
use chrono::{DateTime, TimeDelta, Utc};
use jetsched_shared::names::Names;
use jetsched_shared::topology::{Topology, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind, LeaderRecord};
use jetsched_tests::fixtures::write_task;
use jetsched_tests::{ChildProcess, NatsServer, ensure_topology, eventually, read_stream, spec};

use crate::scheduler::{per_task, read_dispatches, spawn_scheduler, tasks_loaded};

const NS: &str = "bounds";
const WAIT: Duration = Duration::from_secs(20);

/// A whole second a little ahead of now.
fn second_ahead(seconds: i64) -> DateTime<Utc> {
    let now = Utc::now() + TimeDelta::seconds(seconds);
    DateTime::from_timestamp(now.timestamp(), 0).expect("an instant")
}

fn text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn holder(topology: &Topology) -> Option<String> {
    let entry = topology.leader.entry(Names::default().leader_key()).await.ok()??;
    if entry.operation != Operation::Put {
        return None;
    }
    serde_json::from_slice::<LeaderRecord>(&entry.value).ok().map(|r| r.instance)
}

/// The nominal fires (ms) of task `id` in the dispatch stream, ascending, each once.
async fn fires_of(js: &jetstream::Context, id: &str) -> Vec<i64> {
    per_task(&read_dispatches(js).await).remove(&format!("{NS}.{id}")).unwrap_or_default()
}

async fn completed_events(js: &jetstream::Context, id: &str) -> Vec<Event> {
    let messages = read_stream(js, &Names::default().events_stream(), Duration::from_secs(10))
        .await
        .expect("read the events stream");
    messages
        .iter()
        .filter_map(|m| serde_json::from_slice::<Event>(&m.payload).ok())
        .filter(|e| e.kind == EventKind::TaskCompleted && e.task_id == id)
        .collect()
}

#[tokio::test]
async fn max_runs_holds_across_a_killed_leader_with_one_completed_event() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let lease = Duration::from_secs(3);
    let (_, topology) = ensure_topology(&client, &TopologyArgs { lease, ..TopologyArgs::default() }).await;
    let js = jetstream::new(client.clone());
    let mut procs: HashMap<String, ChildProcess> = ["bound-1", "bound-2"]
        .iter()
        .map(|i| (i.to_string(), spawn_scheduler(&server.url(), i, lease)))
        .collect();
    for proc in procs.values() {
        tasks_loaded(proc).await;
    }
    // Fires every second from start_at (in the future: the first fire is at start_at), six of them.
    let start = second_ahead(3);
    let task = spec(NS, "six")
        .schedule(serde_json::json!({"every": "1s"}))
        .nats("jobs.run")
        .misfire("fire_all")
        .field("start_at", text(start))
        .field("max_runs", 6);
    write_task(&topology.tasks, &task).await;
    // Kill the leader once four fires are out, between the fifth and the sixth at the latest.
    eventually(WAIT, "four fires", || async { (fires_of(&js, "six").await.len() >= 4).then_some(()) }).await;
    let leader = eventually(WAIT, "a leader", || async { holder(&topology).await }).await;
    procs.get_mut(&leader).expect("the leader is ours").kill9();
    // The follower takes over; well after the sixth fire and a lease, look at what was made.
    let last = start + TimeDelta::seconds(5);
    eventually(WAIT, "a new leader", || async { holder(&topology).await.filter(|h| *h != leader) }).await;
    let until = last + TimeDelta::from_std(lease).expect("lease") + TimeDelta::seconds(3);
    tokio::time::sleep((until - Utc::now()).to_std().unwrap_or_default()).await;
    let fires = fires_of(&js, "six").await;
    let want: Vec<i64> = (0..6).map(|k| (start + TimeDelta::seconds(k)).timestamp_millis()).collect();
    assert_eq!(fires, want, "exactly max_runs fires, the first at start_at, none lost, none past the last");
    let completed = eventually(WAIT, "task.completed", || async {
        let events = completed_events(&js, "six").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    // A second one would come from the new leader handling the last fire again: give it time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let completed_now = completed_events(&js, "six").await;
    assert_eq!(completed_now.len(), 1, "one task.completed: {completed:?}");
    assert_eq!(completed_now[0].reason.as_deref(), Some("max_runs"));
    assert_eq!(completed_now[0].nominal_time, Some(last));
}

#[tokio::test]
async fn no_fire_is_made_at_end_at_and_the_one_before_is() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let lease = Duration::from_secs(3);
    let (_, topology) = ensure_topology(&client, &TopologyArgs { lease, ..TopologyArgs::default() }).await;
    let js = jetstream::new(client.clone());
    let proc = spawn_scheduler(&server.url(), "end-1", lease);
    tasks_loaded(&proc).await;
    let start = second_ahead(2);
    let end = start + TimeDelta::seconds(3);
    let task = spec(NS, "ends")
        .schedule(serde_json::json!({"every": "1s"}))
        .nats("jobs.run")
        .field("end_at", text(end));
    write_task(&topology.tasks, &task).await;
    tokio::time::sleep(((end + TimeDelta::seconds(3)) - Utc::now()).to_std().unwrap_or_default()).await;
    let fires = fires_of(&js, "ends").await;
    let before = (end - TimeDelta::seconds(1)).timestamp_millis();
    assert_eq!(fires.last(), Some(&before), "the fire just before end_at is made: {fires:?}");
    assert!(fires.iter().all(|&f| f < end.timestamp_millis()), "nothing at or after end_at: {fires:?}");
    let completed = eventually(WAIT, "task.completed", || async {
        let events = completed_events(&js, "ends").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].reason.as_deref(), Some("end_at"));
    drop(proc);
}
