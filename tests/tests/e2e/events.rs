//! The shared event pump against a real server: a barrier resolves only after every event
//! queued before it is stored (the scheduler writes fire state behind such a barrier), and a
//! fire's `fire.dispatched` is recorded once even when the scheduler that stored its dispatch
//! never saw the acknowledgement.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use jetsched_scheduler::{Clock, ManualClock, build_with_clock};
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::{Names, dispatch_msg_id, task_key};
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind, scheduled_execution_id};
use jetsched_tests::{App, WithTopology, always, eventually, read_stream, server_with_topology};

async fn stored(js: &jetstream::Context, names: &Names) -> u64 {
    let mut stream = js.get_stream(names.events_stream()).await.expect("events stream");
    stream.info().await.expect("stream info").state.messages
}

#[tokio::test]
async fn an_event_barrier_resolves_after_every_earlier_event_is_stored() {
    let WithTopology { server: _server, js, names, .. } = server_with_topology(TopologyArgs::default()).await;
    let publisher = EventPublisher::with_metrics(js.clone(), names.clone(), &prometheus::Registry::new())
        .expect("event metrics");
    let (sink, pump) = publisher.queue(10_000, 64);
    let pump = tokio::spawn(pump.run());

    // Idle pump: the barrier resolves at once.
    tokio::time::timeout(Duration::from_secs(5), sink.barrier().wait()).await.expect("idle barrier");
    assert_eq!(stored(&js, &names).await, 0);

    for round in 1..=3u64 {
        for i in 0..2_000 {
            let event = Event::new(EventKind::FireSkipped, "barrier", format!("t{i}"));
            assert!(sink.try_emit(event), "queue has room");
        }
        let barrier = sink.barrier();
        // Queued behind the barrier: not waited for, and never counted before it.
        assert!(sink.try_emit(Event::new(EventKind::FireMissed, "barrier", "after")));
        tokio::time::timeout(Duration::from_secs(30), barrier.wait()).await.expect("barrier resolves");
        let count = stored(&js, &names).await;
        assert!(
            count >= round * 2_001 - 1,
            "round {round}: {count} events stored when the barrier resolved, expected every earlier one"
        );
    }
    drop(sink);
    pump.await.expect("pump ends when every sink is dropped");
    assert_eq!(stored(&js, &names).await, 3 * 2_001);
}

/// The events stream is gone for a while (as when a replicated stream elects a new leader after
/// a node died): events queued meanwhile are stored once it is back, and the barrier behind
/// them waits for that. An outage longer than the pump's retry budget is counted, not hidden.
#[tokio::test]
async fn events_survive_an_events_stream_outage_and_a_longer_one_is_counted() {
    let WithTopology { server: _server, js, names, .. } = server_with_topology(TopologyArgs::default()).await;
    let publisher = EventPublisher::with_metrics(js.clone(), names.clone(), &prometheus::Registry::new())
        .expect("event metrics");
    let start_pump = |retry_for: Duration| {
        let (sink, pump) = publisher.queue(1_000, 16);
        (sink, tokio::spawn(pump.retry_for(retry_for).run()))
    };
    let (sink, pump) = start_pump(Duration::from_secs(20));

    js.delete_stream(names.events_stream()).await.expect("delete events stream");
    for i in 0..50 {
        assert!(sink.try_emit(Event::new(EventKind::FireSkipped, "outage", format!("t{i}"))));
    }
    let barrier = tokio::spawn(sink.barrier().wait());
    always(Duration::from_secs(3), "the barrier waits while the events cannot be stored", || async {
        !barrier.is_finished()
    })
    .await;
    topology::ensure(&js, &names, &TopologyArgs::default()).await.expect("events stream back");
    tokio::time::timeout(Duration::from_secs(20), barrier).await.expect("barrier resolves").unwrap();
    assert_eq!(stored(&js, &names).await, 50, "every event queued during the outage is stored once");
    assert_eq!(publisher.failed_total(), 0);
    drop(sink);
    pump.await.unwrap();

    // Longer than the budget: the event fails for good, is counted, and the barrier resolves.
    let (sink, pump) = start_pump(Duration::from_millis(500));
    js.delete_stream(names.events_stream()).await.expect("delete events stream");
    assert!(sink.try_emit(Event::new(EventKind::FireSkipped, "outage", "lost")));
    tokio::time::timeout(Duration::from_secs(10), sink.barrier().wait()).await.expect("barrier resolves");
    assert_eq!(publisher.failed_total(), 1, "the event that could not be stored is counted");
    drop(sink);
    pump.await.unwrap();
}

/// Every `fire.dispatched` event of namespace `ns`, as (task, nominal ms).
async fn dispatched_events(js: &jetstream::Context, names: &Names, ns: &str) -> Vec<(String, i64)> {
    let messages = read_stream(js, &names.events_stream(), Duration::from_secs(10)).await.expect("events");
    messages
        .iter()
        .filter_map(|m| serde_json::from_slice::<Event>(&m.payload).ok())
        .filter(|e| e.kind == EventKind::FireDispatched && e.namespace == ns)
        .map(|e| (e.task_id, e.nominal_time.expect("nominal time").timestamp_millis()))
        .collect()
}

/// Found by the nemesis partition runs: a leader whose dispatch was stored but whose
/// acknowledgement never came (lost with its link, or dropped as it stepped down) records no
/// `fire.dispatched`, and the scheduler publishing the same fire again got a duplicate and
/// recorded nothing either, so the fire ran with no event and no failure counted. Here the
/// predecessor is played by the test: it stored two fires' dispatches, and the event of only one
/// of them. The scheduler's publishes of both come back duplicates; each fire then has exactly
/// one `fire.dispatched` event.
#[tokio::test]
async fn a_fire_stored_by_a_leader_that_never_saw_its_ack_still_gets_one_dispatched_event() {
    const NS: &str = "handover";
    let WithTopology { server, js, names, .. } = server_with_topology(TopologyArgs::default()).await;
    let tasks = js.get_key_value(names.tasks_bucket()).await.expect("tasks bucket");
    let clock = ManualClock::starting_now();
    let next = clock.now_ms() + 1000;
    for id in ["unrecorded", "recorded", "witness"] {
        let spec = serde_json::json!({
            "id": id, "namespace": NS, "schedule": {"every": "1s"},
            "executor": {"kind": "nats", "subject": "jobs.run"}, "misfire": "fire_all",
        });
        tasks.put(task_key(NS, id), serde_json::to_vec(&spec).expect("json").into()).await.expect("put task");
    }

    // The predecessor's dispatches of the next fire of two tasks (same subject and id as the
    // scheduler's), and the event of only one of them, through the shared pump.
    for id in ["unrecorded", "recorded"] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, dispatch_msg_id(NS, id, next).as_str());
        let subject = names.dispatch_subject("default", NS, id);
        js.publish_with_headers(subject, headers, "stored by the previous leader".into())
            .await
            .expect("publish")
            .await
            .expect("dispatch stored");
    }
    let publisher = EventPublisher::with_metrics(js.clone(), names.clone(), &prometheus::Registry::new())
        .expect("event metrics");
    let (sink, pump) = publisher.queue(16, 4);
    let pump = tokio::spawn(pump.run());
    let nominal = chrono::DateTime::from_timestamp_millis(next).expect("nominal");
    assert!(sink.try_emit(Event {
        execution_id: Some(scheduled_execution_id(NS, "recorded", next)),
        nominal_time: Some(nominal),
        ..Event::new(EventKind::FireDispatched, NS, "recorded")
    }));
    drop(sink);
    pump.await.expect("pump ends");
    assert_eq!(publisher.failed_total(), 0);

    let config = jetsched_scheduler::Config::for_tests(&server.url());
    let scheduler =
        Box::pin(build_with_clock(config, Arc::new(clock.clone()))).await.expect("scheduler builds");
    let scheduler = App::spawn("scheduler", scheduler.admin_addr(), |shutdown| scheduler.run(shutdown));
    eventually(Duration::from_secs(10), "the scheduler leads", || async {
        scheduler.metric("jetsched_scheduler_is_leader").await == Some(1.0)
    })
    .await;
    clock.advance(Duration::from_secs(1));
    eventually(Duration::from_secs(10), "the three fires acknowledged, two as duplicates", || async {
        scheduler.metric("jetsched_fires_duplicate_total").await == Some(2.0)
            && dispatched_events(&js, &names, NS).await.contains(&("witness".to_owned(), next))
    })
    .await;
    // A graceful stop publishes every queued event first.
    scheduler.stop().await;

    let events = dispatched_events(&js, &names, NS).await;
    for id in ["unrecorded", "recorded", "witness"] {
        let at_next = events.iter().filter(|(task, nominal)| task == id && *nominal == next).count();
        assert_eq!(at_next, 1, "{id}: {at_next} fire.dispatched events for its fire at {next}: {events:?}");
    }
}
