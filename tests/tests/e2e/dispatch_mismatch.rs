//! A worker refuses a dispatch whose subject and body disagree: published on `demo`'s dispatch
//! subject with a body naming `billing`'s task (or with a spec snapshot of another task), it
//! runs nothing, dead-letters the message under its subject with a reason naming both sides,
//! and counts it; `billing`'s run records and events stay untouched.

use std::sync::{Arc, Mutex};

use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::wire::{DeadLetterSource, Event, RunStatus};
use jetsched_tests::fixtures::{dead_letters, dispatch, run_record, spec, wait_run_status};
use jetsched_tests::{App, WithTopology, eventually, read_stream, server_with_topology};
use jetsched_worker::{Handlers, Outcome, RunContext};

use crate::worker_support::{WAIT, config, dispatch_pending};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_whose_subject_and_body_disagree_runs_nothing_and_is_dead_lettered() {
    let WithTopology { server, js, names, .. } = server_with_topology(Default::default()).await;
    let calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = calls.clone();
    let handlers = Handlers::new().register("record", move |run: RunContext| {
        seen.lock().unwrap().push(format!("{}/{} {}", run.namespace, run.task_id, run.execution_id));
        async move { Outcome::ok() }
    });
    let worker = App::worker(config(&server, "w-mismatch"), handlers).await;
    let billing = spec("billing", "report").handler("record").task();
    let demo = spec("demo", "report").handler("record").task();
    let other = spec("demo", "other").handler("record").task();
    let demo_subject = names.dispatch_subject("default", "demo", "report");

    // Published with the test's plain connection, as anyone allowed on demo's subject could:
    // billing's run on demo's subject, then demo's run carrying the spec of another task.
    let origin = |nominal_ms| Origin::Scheduled { nominal_ms, term: 1, catchup: false };
    let forged =
        dispatch::build(&names, Target::of(&billing, 1), origin(1_000), SpecBody::Spec(&billing)).unwrap();
    assert_ne!(forged.subject, demo_subject);
    let swapped =
        dispatch::build(&names, Target::of(&demo, 1), origin(2_000), SpecBody::Spec(&other)).unwrap();
    assert_eq!(swapped.subject, demo_subject);
    let refused = [forged.execution_id.clone(), swapped.execution_id.clone()];
    for message in [forged.message, swapped.message] {
        js.send_publish(demo_subject.clone(), message).await.expect("publish").await.expect("stored");
    }
    // A run whose subject and body agree goes through (the worker is serving demo's subject).
    let control = dispatch(&js, &names, &demo, 3_000).await;
    wait_run_status(&js, &names, &control, RunStatus::Succeeded, WAIT).await;

    let mut entries = eventually(WAIT, "both refused dispatches are dead-lettered", || async {
        let entries = dead_letters(&js, &names).await;
        (entries.len() == 2).then_some(entries)
    })
    .await;
    entries.sort_by_key(|entry| entry.dispatch_sequence);
    for entry in &entries {
        assert_eq!(entry.source, DeadLetterSource::Mismatched, "{entry:?}");
        assert_eq!(
            (entry.queue.as_str(), entry.namespace.as_str(), entry.task_id.as_str()),
            ("default", "demo", "report"),
            "addressed by the subject it came on: {entry:?}"
        );
        assert!(entry.spec.is_none() && entry.attempts.is_empty(), "{entry:?}");
        assert!(
            entry.reason.contains(&demo_subject) && entry.reason.contains("nothing was run"),
            "{entry:?}"
        );
        assert!(!refused.contains(&entry.execution_id), "the body's execution id is not taken: {entry:?}");
    }
    let (to_billing, to_other) = (&entries[0], &entries[1]);
    for both in [r#"namespace is "demo", the body's namespace "billing""#, r#"spec.namespace "billing""#] {
        assert!(to_billing.reason.contains(both), "{}", to_billing.reason);
    }
    assert!(
        to_billing.raw_dispatch.as_deref().is_some_and(|raw| raw.contains(&refused[0])),
        "{to_billing:?}"
    );
    assert!(
        to_other.reason.contains(r#"the subject's task is "report", the body's spec.id "other""#),
        "{}",
        to_other.reason
    );
    assert!(!to_other.reason.contains("billing"), "{}", to_other.reason);
    let dlq = js.get_stream(names.dlq_stream()).await.expect("DLQ stream");
    let demo_dlq = dlq.get_last_raw_message_by_subject(&names.dlq_subject("default", "demo", "report")).await;
    assert!(demo_dlq.is_ok(), "stored on demo's dead-letter subject");
    let billing_dlq =
        dlq.get_last_raw_message_by_subject(&names.dlq_subject("default", "billing", "report")).await;
    assert!(billing_dlq.is_err(), "nothing on billing's dead-letter subject");

    // Nothing ran but the control run; nothing is left to deliver; the refusals are counted.
    let ran = calls.lock().unwrap().clone();
    assert_eq!(ran, [format!("demo/report {control}")], "no executor ran for a refused dispatch");
    eventually(WAIT, "the refused dispatches are terminated", || async { dispatch_pending(&js).await == 0 })
        .await;
    let counted = worker.metric(r#"jetsched_worker_dead_letters_total{source="mismatched"}"#).await;
    assert_eq!(counted, Some(2.0));

    // Billing is untouched: no run record, no event, whatever its kind.
    for id in &refused {
        assert_eq!(run_record(&js, &names, id).await, None, "no run record of {id}");
    }
    let events: Vec<Event> = read_stream(&js, &names.events_stream(), WAIT)
        .await
        .expect("read events")
        .iter()
        .map(|m| serde_json::from_slice(&m.payload).expect("event decodes"))
        .collect();
    assert!(events.iter().any(|e| e.execution_id.as_ref() == Some(&control)), "the control run is told");
    let about_refused: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.namespace == "billing" || e.execution_id.as_ref().is_some_and(|id| refused.contains(id))
        })
        .collect();
    assert!(about_refused.is_empty(), "{about_refused:?}");
    worker.stop().await;
}
