//! The one builder of a dispatch message (subject, `Nats-Msg-Id`, headers, body) for every
//! trigger: a scheduled or caught-up fire, a manual run, a replayed dead letter.
//!
//! The body is [`wire::Dispatch`]. A spec already held as JSON (the stored bytes of the tasks
//! bucket) is spliced into the body as it is rather than re-serialised for every fire.
//!
//! Every dispatch carries a W3C `traceparent`: the context of the span that sent it (a fire,
//! an API request) when there is one, otherwise one derived from the execution id, so a
//! traced worker or downstream joins the execution's trace even when the sender is not traced.
//! A sampled one comes with `Nats-Trace-Dest: trace disabled` unless the process lets
//! nats-server trace dispatches ([`trace::server_msg_trace`]): nats-server reads every header of
//! a message with a sampled `traceparent` into a map to ask whether its account traces it, about
//! 4 µs per dispatch, a sixth of what storing one costs it.

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, NATS_MESSAGE_ID};
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use opentelemetry::trace::TraceContextExt;
use serde::Serialize;

use crate::names::{self, Names};
use crate::priority::Priority;
use crate::spec::TaskSpec;
use crate::trace;
use crate::wire::{self, Trigger};

const TASK: HeaderName = HeaderName::from_static(wire::HDR_TASK);
const NOMINAL_TIME: HeaderName = HeaderName::from_static(wire::HDR_NOMINAL_TIME);
const EXECUTION_ID: HeaderName = HeaderName::from_static(wire::HDR_EXECUTION_ID);
const LEADER_TERM: HeaderName = HeaderName::from_static(wire::HDR_LEADER_TERM);
const TRIGGER: HeaderName = HeaderName::from_static(wire::HDR_TRIGGER);
const PRIORITY: HeaderName = HeaderName::from_static(wire::HDR_PRIORITY);

/// The task a dispatch runs.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub namespace: &'a str,
    pub task_id: &'a str,
    /// The queue of the spec (part of the subject).
    pub queue: &'a str,
    /// Revision of the spec in the tasks bucket.
    pub revision: u64,
    /// The lane the run waits in (the spec's, or a trigger's or replay's override).
    pub priority: Priority,
}

impl<'a> Target<'a> {
    /// The target of a spec stored at `revision`.
    pub fn of(spec: &'a TaskSpec, revision: u64) -> Target<'a> {
        Target {
            namespace: &spec.namespace,
            task_id: &spec.id,
            queue: &spec.queue,
            revision,
            priority: spec.priority,
        }
    }

    /// The same target in lane `priority` instead (a trigger's or replay's override).
    pub fn with_priority(self, priority: Option<Priority>) -> Target<'a> {
        Target { priority: priority.unwrap_or(self.priority), ..self }
    }
}

/// How the run came about: decides the trigger, the execution id and the message id.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A fire of the schedule by leader `term` (`catchup` when dispatched late, after a
    /// failover): execution and message ids derive from the nominal time, so every leader
    /// produces the same ones for the same fire.
    Scheduled { nominal_ms: i64, term: u64, catchup: bool },
    /// A run asked for through the API `at` that instant (term 0, fresh execution id).
    Manual { at: DateTime<Utc> },
    /// A run asked for through the API `at` that instant with an execution id decided before
    /// (a claimed de-duplication key's, a debounce window's) and the trigger's payload: term 0,
    /// trigger `manual`, the message id derived from the execution id, so publishing it again
    /// stores it once.
    Requested { at: DateTime<Utc>, execution_id: &'a str, payload: Option<&'a serde_json::Value> },
    /// A dead letter dispatched again: its nominal time, a fresh execution id, and a message id
    /// derived from the dead run's execution id.
    Replay { nominal_time: DateTime<Utc>, dead_execution_id: &'a str },
    /// A nominal time of a backfill sent by leader `term`: the live fire's ids, or for a rerun
    /// (`rerun_by`: the backfill's id) ids derived from the nominal time and the backfill
    /// ([`crate::backfill::ids`]).
    Backfill { nominal_ms: i64, term: u64, rerun_by: Option<&'a str> },
    /// A run of a task with `after` whose parents' runs of `nominal_ms` met its rule: the
    /// execution id derived from the task and the nominal time
    /// ([`wire::child_execution_id`]), the message id from it, the parents' runs in the body.
    After { nominal_ms: i64, parents: &'a [wire::ParentRun] },
    /// A fire of a task with `after` and a schedule of its own (`trigger`: `schedule` or
    /// `catchup`), held until its parents' runs of `nominal_ms` met its rule: the ids of the
    /// fire ([`Origin::Scheduled`]'s), term 0, the parents' runs in the body.
    Held { nominal_ms: i64, trigger: Trigger, parents: &'a [wire::ParentRun] },
}

impl Origin<'_> {
    pub fn trigger(&self) -> Trigger {
        match self {
            Origin::Scheduled { catchup: false, .. } => Trigger::Schedule,
            Origin::Scheduled { catchup: true, .. } => Trigger::Catchup,
            Origin::Manual { .. } | Origin::Requested { .. } => Trigger::Manual,
            Origin::Replay { .. } => Trigger::Replay,
            Origin::Backfill { .. } => Trigger::Backfill,
            Origin::After { .. } => Trigger::After,
            Origin::Held { trigger, .. } => *trigger,
        }
    }
}

/// The spec snapshot a dispatch carries.
#[derive(Debug, Clone, Copy)]
pub enum SpecBody<'a> {
    /// The spec's canonical JSON (as stored in the tasks bucket), copied in as it is.
    Json(&'a [u8]),
    /// A parsed spec, serialised into the body.
    Spec(&'a TaskSpec),
}

/// A dispatch ready to publish: `js.send_publish(subject, message)`.
#[derive(Debug, Clone)]
pub struct DispatchMessage {
    /// The lane's subject: `jetsched.dispatch.<queue>.<namespace>.<task_id>` for `normal`,
    /// `jetsched.lane.<priority>.<queue>.<namespace>.<task_id>` for the others.
    pub subject: String,
    pub execution_id: String,
    pub nominal_time: DateTime<Utc>,
    /// Trace id the dispatch's `traceparent` carries (32 hex digits).
    pub trace_id: Option<String>,
    pub message: PublishMessage,
}

/// The body's fields before the spec, in [`wire::Dispatch`]'s order.
#[derive(Serialize)]
struct Head<'a> {
    execution_id: &'a str,
    namespace: &'a str,
    task_id: &'a str,
    #[serde(serialize_with = "wire::millis::serialize")]
    nominal_time: DateTime<Utc>,
    trigger: Trigger,
    term: u64,
    revision: u64,
    priority: Priority,
    #[serde(skip_serializing_if = "Option::is_none")]
    replay_of: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    parents: &'a [wire::ParentRun],
}

/// Room for the head of a body and the `"spec"` key: ids, times and numbers.
const HEAD_BYTES: usize = 320;

/// Builds the dispatch of one run of `target` with `spec` as its snapshot, its `traceparent`
/// derived from the execution id.
pub fn build(
    names: &Names,
    target: Target<'_>,
    origin: Origin<'_>,
    spec: SpecBody<'_>,
) -> Result<DispatchMessage, serde_json::Error> {
    build_traced(names, target, origin, spec, None)
}

/// As [`build`], carrying the trace context `parent` (the span that sends it) when it holds a
/// valid span.
pub fn build_traced(
    names: &Names,
    target: Target<'_>,
    origin: Origin<'_>,
    spec: SpecBody<'_>,
    parent: Option<&opentelemetry::Context>,
) -> Result<DispatchMessage, serde_json::Error> {
    let Target { namespace, task_id, queue, revision, priority } = target;
    let (nominal_time, term, execution_id, msg_id) = match origin {
        Origin::Scheduled { nominal_ms, term, .. } => {
            let msg_id = names::dispatch_msg_id(namespace, task_id, nominal_ms);
            let execution_id = wire::execution_id_of_fire(&msg_id);
            (from_ms(nominal_ms), term, execution_id, msg_id)
        }
        Origin::Held { nominal_ms, .. } => {
            let msg_id = names::dispatch_msg_id(namespace, task_id, nominal_ms);
            let execution_id = wire::execution_id_of_fire(&msg_id);
            (from_ms(nominal_ms), 0, execution_id, msg_id)
        }
        Origin::Manual { at } => {
            let execution_id = wire::fresh_execution_id();
            let msg_id = names::manual_msg_id(namespace, task_id, &execution_id);
            (at, 0, execution_id, msg_id)
        }
        Origin::Requested { at, execution_id, .. } => {
            (at, 0, execution_id.to_string(), names::manual_msg_id(namespace, task_id, execution_id))
        }
        Origin::Replay { nominal_time, dead_execution_id } => {
            (nominal_time, 0, wire::fresh_execution_id(), names::replay_msg_id(dead_execution_id))
        }
        Origin::Backfill { nominal_ms, term, rerun_by } => {
            let (msg_id, execution_id) = crate::backfill::ids(namespace, task_id, nominal_ms, rerun_by);
            (from_ms(nominal_ms), term, execution_id, msg_id)
        }
        Origin::After { nominal_ms, .. } => {
            let execution_id = wire::child_execution_id(namespace, task_id, nominal_ms);
            let msg_id = names::manual_msg_id(namespace, task_id, &execution_id);
            (from_ms(nominal_ms), 0, execution_id, msg_id)
        }
    };
    let parents = match origin {
        Origin::After { parents, .. } | Origin::Held { parents, .. } => parents,
        _ => &[],
    };
    let payload = match origin {
        Origin::Requested { payload, .. } => payload,
        _ => None,
    };
    let trigger = origin.trigger();
    let replay_of = match origin {
        Origin::Replay { dead_execution_id, .. } => Some(dead_execution_id),
        _ => None,
    };
    let head = Head {
        execution_id: &execution_id,
        namespace,
        task_id,
        nominal_time,
        trigger,
        term,
        revision,
        priority,
        replay_of,
        payload,
        parents,
    };
    let spec_len = match spec {
        SpecBody::Json(json) => json.len(),
        SpecBody::Spec(_) => 512,
    };
    let mut body = Vec::with_capacity(HEAD_BYTES + spec_len);
    serde_json::to_writer(&mut body, &head)?;
    body.pop(); // the closing brace
    body.extend_from_slice(b",\"spec\":");
    match spec {
        SpecBody::Json(json) => body.extend_from_slice(json),
        SpecBody::Spec(spec) => serde_json::to_writer(&mut body, spec)?,
    }
    body.push(b'}');

    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, msg_id);
    headers.insert(TASK, names::task_key(namespace, task_id));
    headers.insert(NOMINAL_TIME, wire::format_time(nominal_time));
    headers.insert(EXECUTION_ID, execution_id.as_str());
    headers.insert(LEADER_TERM, term.to_string());
    headers.insert(TRIGGER, trigger.as_str());
    headers.insert(PRIORITY, priority.as_str());
    let trace_id = match parent.filter(|cx| cx.span().span_context().is_valid()) {
        Some(cx) => {
            trace::inject(cx, &mut headers);
            Some(cx.span().span_context().trace_id().to_string())
        }
        None => {
            let traceparent = trace::fallback_traceparent(&execution_id);
            if let Some(traceparent) = &traceparent {
                headers.insert(trace::TRACEPARENT, traceparent.as_str());
            }
            traceparent.and_then(|_| trace::trace_id_of(&execution_id)).map(|id| id.to_string())
        }
    };
    trace::keep_from_server_tracing(&mut headers);
    Ok(DispatchMessage {
        subject: names.lane_subject(queue, priority, namespace, task_id),
        execution_id,
        nominal_time,
        trace_id,
        message: PublishMessage::build().headers(headers).payload(Bytes::from(body)),
    })
}

/// An instant from Unix milliseconds (out-of-range values clamp to the representable range).
fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(if ms < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &[u8] = br#"{"id":"report","namespace":"billing","queue":"q1","schedule":{"every":"1m"},"executor":{"kind":"nats","subject":"work.x"}}"#;
    const NOMINAL: i64 = 1_700_000_040_000;

    fn header(message: &DispatchMessage, name: &str) -> Option<String> {
        let outbound = message.message.clone().outbound_message(message.subject.clone());
        outbound.headers.expect("headers").get(name).map(|v| v.to_string())
    }

    fn body(message: &DispatchMessage) -> wire::Dispatch {
        let outbound = message.message.clone().outbound_message(message.subject.clone());
        serde_json::from_slice(&outbound.payload).expect("the body decodes as a dispatch")
    }

    #[test]
    fn every_trigger_builds_a_dispatch_with_its_ids_and_headers() {
        let names = Names::default();
        let spec = TaskSpec::parse(SPEC).expect("valid spec");
        let at = from_ms(NOMINAL + 5);
        let payload = serde_json::json!({"edit": 7});
        let cases: [(Origin<'_>, Trigger, u64, i64); 8] = [
            (
                Origin::Scheduled { nominal_ms: NOMINAL, term: 42, catchup: false },
                Trigger::Schedule,
                42,
                NOMINAL,
            ),
            (
                Origin::Scheduled { nominal_ms: NOMINAL, term: 43, catchup: true },
                Trigger::Catchup,
                43,
                NOMINAL,
            ),
            (Origin::Manual { at }, Trigger::Manual, 0, NOMINAL + 5),
            (
                Origin::Requested { at, execution_id: "exec-1", payload: Some(&payload) },
                Trigger::Manual,
                0,
                NOMINAL + 5,
            ),
            (
                Origin::Replay { nominal_time: from_ms(NOMINAL), dead_execution_id: "dead-1" },
                Trigger::Replay,
                0,
                NOMINAL,
            ),
            (
                Origin::Backfill { nominal_ms: NOMINAL, term: 44, rerun_by: None },
                Trigger::Backfill,
                44,
                NOMINAL,
            ),
            (
                Origin::Backfill { nominal_ms: NOMINAL, term: 44, rerun_by: Some("billing.report.b1") },
                Trigger::Backfill,
                44,
                NOMINAL,
            ),
            (
                Origin::Held { nominal_ms: NOMINAL, trigger: Trigger::Catchup, parents: &[] },
                Trigger::Catchup,
                0,
                NOMINAL,
            ),
        ];
        for (origin, trigger, term, nominal_ms) in cases {
            for spec_body in [SpecBody::Json(SPEC), SpecBody::Spec(&spec)] {
                let message = build(&names, Target::of(&spec, 7), origin, spec_body).expect("builds");
                assert_eq!(message.subject, names.dispatch_subject("q1", "billing", "report"));
                let decoded = body(&message);
                assert_eq!(decoded.execution_id, message.execution_id);
                assert_eq!((decoded.namespace.as_str(), decoded.task_id.as_str()), ("billing", "report"));
                assert_eq!(decoded.nominal_time.timestamp_millis(), nominal_ms);
                assert_eq!((decoded.trigger, decoded.term, decoded.revision), (trigger, term, 7));
                assert_eq!(decoded.spec, spec);
                let replay_of = matches!(origin, Origin::Replay { .. }).then(|| "dead-1".to_string());
                assert_eq!(decoded.replay_of, replay_of, "a replay names its dead run");
                let expected_id = match origin {
                    // A held fire, once its parents allow it, is the fire: the same ids.
                    Origin::Scheduled { .. } | Origin::Held { .. } => {
                        assert_eq!(
                            message.execution_id,
                            wire::scheduled_execution_id("billing", "report", NOMINAL)
                        );
                        names::dispatch_msg_id("billing", "report", NOMINAL)
                    }
                    Origin::Manual { .. } => names::manual_msg_id("billing", "report", &message.execution_id),
                    Origin::After { .. } => unreachable!("not among the cases"),
                    Origin::Requested { .. } => {
                        assert_eq!(message.execution_id, "exec-1", "the execution id decided before");
                        assert_eq!(decoded.payload.as_ref(), Some(&payload), "the trigger's payload");
                        names::manual_msg_id("billing", "report", "exec-1")
                    }
                    Origin::Replay { .. } => names::replay_msg_id("dead-1"),
                    Origin::Backfill { rerun_by: None, .. } => {
                        // The live fire's ids: a backfilled time and its fire are one run.
                        assert_eq!(
                            message.execution_id,
                            wire::scheduled_execution_id("billing", "report", NOMINAL)
                        );
                        names::dispatch_msg_id("billing", "report", NOMINAL)
                    }
                    Origin::Backfill { rerun_by: Some(backfill), .. } => {
                        let msg_id = names::backfill_rerun_msg_id("billing", "report", NOMINAL, backfill);
                        assert_eq!(message.execution_id, wire::execution_id_of_fire(&msg_id));
                        msg_id
                    }
                };
                assert_eq!(header(&message, "Nats-Msg-Id"), Some(expected_id));
                assert_eq!(header(&message, wire::HDR_TASK).as_deref(), Some("billing.report"));
                assert_eq!(header(&message, wire::HDR_EXECUTION_ID), Some(message.execution_id.clone()));
                assert_eq!(header(&message, wire::HDR_LEADER_TERM), Some(term.to_string()));
                assert_eq!(header(&message, wire::HDR_TRIGGER).as_deref(), Some(trigger.as_str()));
                assert_eq!(header(&message, wire::HDR_PRIORITY).as_deref(), Some("normal"));
                assert_eq!(decoded.priority, Priority::Normal);
                assert_eq!(
                    header(&message, wire::HDR_NOMINAL_TIME),
                    Some(wire::format_time(from_ms(nominal_ms)))
                );
                assert_eq!(
                    header(&message, trace::TRACEPARENT),
                    trace::fallback_traceparent(&message.execution_id),
                    "the trace id is the execution id's"
                );
            }
        }
    }

    #[test]
    fn a_sending_span_is_the_parent_of_the_dispatch() {
        let names = Names::default();
        let spec = TaskSpec::parse(SPEC).expect("valid spec");
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let remote = trace::remote_context(traceparent, None).expect("valid");
        let cx = opentelemetry::Context::new().with_remote_span_context(remote);
        let origin = Origin::Manual { at: Utc::now() };
        let message =
            build_traced(&names, Target::of(&spec, 1), origin, SpecBody::Json(SPEC), Some(&cx)).unwrap();
        assert_eq!(header(&message, trace::TRACEPARENT).as_deref(), Some(traceparent));
        assert_eq!(message.trace_id.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(
            header(&message, trace::NATS_TRACE_DEST).as_deref(),
            Some(trace::NATS_TRACE_DISABLED),
            "a sampled dispatch tells nats-server not to trace it"
        );
        let empty = opentelemetry::Context::new();
        let message =
            build_traced(&names, Target::of(&spec, 1), origin, SpecBody::Json(SPEC), Some(&empty)).unwrap();
        assert_eq!(header(&message, trace::TRACEPARENT), trace::fallback_traceparent(&message.execution_id));
        assert_eq!(
            header(&message, trace::NATS_TRACE_DEST).as_deref(),
            Some(trace::NATS_TRACE_DISABLED),
            "the default sampler samples the derived context too"
        );

        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let remote = trace::remote_context(unsampled, None).expect("valid");
        let cx = opentelemetry::Context::new().with_remote_span_context(remote);
        let message =
            build_traced(&names, Target::of(&spec, 1), origin, SpecBody::Json(SPEC), Some(&cx)).unwrap();
        assert_eq!(header(&message, trace::TRACEPARENT).as_deref(), Some(unsampled));
        assert_eq!(header(&message, trace::NATS_TRACE_DEST), None, "nats-server only scans an unsampled one");
    }

    #[test]
    fn manual_runs_and_replays_get_fresh_execution_ids() {
        let names = Names::default();
        let spec = TaskSpec::parse(SPEC).expect("valid spec");
        let build = |origin| build(&names, Target::of(&spec, 1), origin, SpecBody::Json(SPEC)).unwrap();
        let at = Utc::now();
        assert_ne!(build(Origin::Manual { at }).execution_id, build(Origin::Manual { at }).execution_id);
        let replay = Origin::Replay { nominal_time: at, dead_execution_id: "dead" };
        let (first, second) = (build(replay), build(replay));
        assert_ne!(first.execution_id, second.execution_id);
        assert_eq!(header(&first, "Nats-Msg-Id"), header(&second, "Nats-Msg-Id"));
    }

    #[test]
    fn the_priority_picks_the_lane_and_travels_in_header_and_body() {
        let names = Names::default();
        let spec = TaskSpec::parse(SPEC).expect("valid spec");
        let origin = Origin::Manual { at: Utc::now() };
        for priority in Priority::ALL {
            let target = Target::of(&spec, 1).with_priority(Some(priority));
            let message = build(&names, target, origin, SpecBody::Json(SPEC)).unwrap();
            assert_eq!(message.subject, names.lane_subject("q1", priority, "billing", "report"));
            assert_eq!(header(&message, wire::HDR_PRIORITY).as_deref(), Some(priority.as_str()));
            assert_eq!(body(&message).priority, priority);
        }
        assert_eq!(Target::of(&spec, 1).with_priority(None).priority, Priority::Normal);
    }

    #[test]
    fn a_dispatch_from_before_priorities_is_normal() {
        let names = Names::default();
        let spec = TaskSpec::parse(SPEC).expect("valid spec");
        let message =
            build(&names, Target::of(&spec, 1), Origin::Manual { at: Utc::now() }, SpecBody::Json(SPEC))
                .unwrap();
        let outbound = message.message.clone().outbound_message(message.subject.clone());
        let mut old: serde_json::Value = serde_json::from_slice(&outbound.payload).unwrap();
        old.as_object_mut().unwrap().remove("priority");
        let decoded: wire::Dispatch = serde_json::from_value(old).unwrap();
        assert_eq!(decoded.priority, Priority::Normal);
    }
}
