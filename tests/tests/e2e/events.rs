//! The shared event pump against a real server: a barrier resolves only after every event
//! queued before it is stored (the scheduler writes fire state behind such a barrier).

use std::time::Duration;

use async_nats::jetstream;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind};
use jetsched_tests::{NatsServer, init_test_logging};

/// A server with the jetsched topology, a JetStream context on it and the default names.
async fn server_with_topology() -> (NatsServer, jetstream::Context, Names) {
    init_test_logging();
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    topology::ensure(&js, &names, &TopologyArgs::default()).await.expect("topology");
    (server, js, names)
}

async fn stored(js: &jetstream::Context, names: &Names) -> u64 {
    let mut stream = js.get_stream(names.events_stream()).await.expect("events stream");
    stream.info().await.expect("stream info").state.messages
}

#[tokio::test]
async fn an_event_barrier_resolves_after_every_earlier_event_is_stored() {
    let (_server, js, names) = server_with_topology().await;
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
    let (_server, js, names) = server_with_topology().await;
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!barrier.is_finished(), "the barrier waits while the events cannot be stored");
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
