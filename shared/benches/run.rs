//! What a worker does with one dispatch besides talking to NATS: decoding it (its spec read
//! once and then found by its text), the run record created at the verdict and its JSON, and
//! the outcome event with its JSON. A change to this CPU work shows here, where `jetsched-bench
//! e2e` (whose rounds differ by more than such a change) cannot show it.
//!
//! `cargo bench -p jetsched-shared --bench run` (under a minute).

use std::hint::black_box;

use chrono::Utc;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{
    AttemptOutcome, Dispatch, DispatchDecoder, Event, EventKind, RunRecord, RunStatus,
};

/// The body of a dispatch as the scheduler builds it, for the spec `jetsched-bench e2e` runs.
fn dispatch_body() -> Vec<u8> {
    let spec = TaskSpec::parse(
        br#"{"id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"}}"#,
    )
    .expect("a valid spec");
    let origin = Origin::Scheduled { nominal_ms: 1_764_720_000_000, term: 1, catchup: false };
    let built = dispatch::build(&Names::default(), Target::of(&spec, 1), origin, SpecBody::Spec(&spec))
        .expect("the dispatch builds");
    built.message.outbound_message(built.subject).payload.to_vec()
}

/// The record of a successful first attempt, as a worker stores it at the verdict.
fn record_json(dispatch: &Dispatch) -> Vec<u8> {
    let now = Utc::now();
    let mut record = RunRecord::new(dispatch, 1, "worker-1", now);
    record.end_attempt(1, AttemptOutcome::Succeeded, None, None, RunStatus::Succeeded, now);
    serde_json::to_vec(&record).expect("the record serializes")
}

/// The `run.succeeded` event a worker publishes under `--run-events all`.
fn event_json(dispatch: &Dispatch) -> Vec<u8> {
    let event = Event {
        execution_id: Some(dispatch.execution_id.clone()),
        nominal_time: Some(dispatch.nominal_time),
        trigger: Some(dispatch.trigger),
        attempt: Some(1),
        worker: Some("worker-1".to_string()),
        revision: Some(dispatch.revision),
        trace_id: dispatch.trace_id.clone(),
        duration_ms: Some(3),
        ..Event::new(EventKind::RunSucceeded, &dispatch.namespace, &dispatch.task_id)
    };
    serde_json::to_vec(&event).expect("the event serializes")
}

fn run(c: &mut Criterion) {
    let body = dispatch_body();
    let decoder = DispatchDecoder::default();
    let dispatch = decoder.decode(&body).expect("the dispatch decodes");
    let mut group = c.benchmark_group("run");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode_dispatch", |b| b.iter(|| decoder.decode(black_box(&body))));
    group.bench_function("record_json", |b| b.iter(|| record_json(black_box(&dispatch))));
    group.bench_function("event_json", |b| b.iter(|| event_json(black_box(&dispatch))));
    group.bench_function("all", |b| {
        b.iter(|| {
            let dispatch = decoder.decode(black_box(&body)).expect("decodes");
            (record_json(&dispatch), event_json(&dispatch))
        })
    });
    group.finish();
}

criterion_group!(benches, run);
criterion_main!(benches);
