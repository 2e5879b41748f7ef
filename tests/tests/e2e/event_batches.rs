//! Run events in fast-ingest batches against a real server: the events of many deliveries in
//! flight share batches and each is stored once, with far fewer answers from the server than
//! events; a stream that refuses batches gets every event the ordinary way; the topology turns
//! batches on for an events stream made without them.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures::future::join_all;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::events::ingest::Ingest;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Event, EventKind};
use jetsched_tests::{NatsServer, WithTopology, read_stream, server_with_topology};
use tokio_util::sync::CancellationToken;

/// Units of work (deliveries), each telling one event and flushing it, all at once.
const UNITS: usize = 1_000;

/// The events stored, by task id.
async fn stored_by_task(js: &jetstream::Context, names: &Names) -> BTreeMap<String, usize> {
    let messages =
        read_stream(js, &names.events_stream(), Duration::from_secs(30)).await.expect("read events");
    let mut counts = BTreeMap::new();
    for message in messages {
        let event: Event = serde_json::from_slice(&message.payload).expect("an event");
        *counts.entry(event.task_id).or_insert(0) += 1;
    }
    counts
}

/// What the server has sent to its clients so far (its `/varz`).
async fn server_out_msgs(server: &NatsServer) -> u64 {
    let varz = server.monitor_json("/varz").await.expect("varz");
    varz["out_msgs"].as_u64().expect("out_msgs")
}

/// The workers' publisher: its units' events in fast-ingest batches.
async fn batched_publisher(
    js: &jetstream::Context,
    names: &Names,
    client: &async_nats::Client,
) -> EventPublisher {
    EventPublisher::with_metrics(js.clone(), names.clone(), &prometheus::Registry::new())
        .expect("event metrics")
        .with_batches(client.clone())
        .await
        .expect("batches")
}

/// Every unit tells its event and flushes it, concurrently; returns the publisher's failures.
async fn tell_all(publisher: &EventPublisher, namespace: &str) -> u64 {
    let stop = CancellationToken::new();
    let units = (0..UNITS).map(|i| {
        let publisher = publisher.clone();
        let stop = stop.clone();
        let namespace = namespace.to_string();
        async move {
            let mut batch = publisher.batch();
            batch.emit(Event::new(EventKind::RunSucceeded, &namespace, format!("t{i}"))).await;
            batch.flush(Duration::from_secs(20), &stop).await;
        }
    });
    let units: Vec<_> = units.map(tokio::spawn).collect();
    for unit in join_all(units).await {
        unit.expect("unit");
    }
    publisher.failed_total()
}

#[tokio::test]
async fn the_events_of_many_deliveries_share_batches_and_each_is_stored_once() {
    let WithTopology { server, client, js, names, .. } = server_with_topology(TopologyArgs::default()).await;
    let publisher = batched_publisher(&js, &names, &client).await;

    let before = server_out_msgs(&server).await;
    assert_eq!(tell_all(&publisher, "batched").await, 0, "no event given up");
    let answers = server_out_msgs(&server).await - before;

    let counts = stored_by_task(&js, &names).await;
    assert_eq!(counts.len(), UNITS, "every event stored");
    assert!(counts.values().all(|&n| n == 1), "none stored twice: {counts:?}");
    // One acknowledgement per event would be 1,000 answers (plus the two monitor requests'
    // none): batches answer once each, and a flow acknowledgement now and then.
    assert!(answers < (UNITS / 4) as u64, "the server answered {answers} times for {UNITS} events");
}

#[tokio::test]
async fn a_stream_that_refuses_batches_gets_every_event_the_ordinary_way() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    // An events stream made without batches (as by hand, or by a server's operator).
    js.create_stream(stream::Config {
        name: names.events_stream(),
        subjects: vec![names.events_wildcard()],
        ..Default::default()
    })
    .await
    .expect("events stream without batches");

    // The batch publisher alone: the refusal is the answer, and batches go off for a while.
    let ingest = Ingest::start(client.clone()).await.expect("ingest");
    let subject = names.event_subject("run.succeeded", "refused", "alone");
    let pending = ingest.send(subject.into(), "{}".into()).await.expect("task running");
    let answer = tokio::time::timeout(Duration::from_secs(10), pending.stored()).await.expect("answered");
    let error = answer.expect_err("a stream without allow_batched refuses the batch");
    assert!(error.contains("disabled"), "{error}");
    assert!(!ingest.accepting(), "batches are off after the refusal");

    // Through the publisher: every event is stored once all the same.
    let publisher = batched_publisher(&js, &names, &client).await;
    assert_eq!(tell_all(&publisher, "refused").await, 0, "no event given up");
    let counts = stored_by_task(&js, &names).await;
    // The lone message the refused batch carried was not stored.
    assert_eq!(counts.len(), UNITS, "every event stored: {} of {UNITS}", counts.len());
    assert!(counts.values().all(|&n| n == 1), "none stored twice");
}

#[tokio::test]
async fn the_topology_turns_batches_on_for_an_events_stream_made_without_them() {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    let args = TopologyArgs::default();
    // A deployment whose events stream predates batches.
    let mut old = topology::stream_configs(&names, &args)
        .into_iter()
        .find(|config| config.name == names.events_stream())
        .expect("events stream config");
    old.allow_batch_publish = false;
    js.create_stream(old).await.expect("old events stream");

    topology::ensure(&js, &names, &args).await.expect("topology converges");
    let mut events = js.get_stream(names.events_stream()).await.expect("events stream");
    assert!(events.info().await.expect("info").config.allow_batch_publish, "batches on");
}
