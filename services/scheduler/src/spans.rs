//! Spans of fires, created only while spans are exported and the sampler samples the fire's
//! trace: a fire is the root span of its execution's trace (trace id = execution id), a
//! skipped fire a short span with its reason. An unsampled fire's dispatch carries a derived
//! `traceparent` with the same (unsampled) decision.

use jetsched_shared::trace::{self, Context};
use jetsched_shared::wire::{self, Trigger, scheduled_execution_id};

use crate::tasks::from_ms;

/// What a fire span says about its fire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FireFacts<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) nominal_ms: i64,
    pub(crate) trigger: Trigger,
    pub(crate) term: u64,
    pub(crate) now_ms: i64,
}

/// The `fire <namespace>/<id>` span (kind producer) of a fire about to be published, and its
/// context for the dispatch's `traceparent`. `None` when spans are not exported.
pub(crate) fn fire(facts: FireFacts<'_>) -> Option<(tracing::Span, Context)> {
    if !trace::enabled() {
        return None;
    }
    let FireFacts { namespace, task_id, nominal_ms, trigger, term, now_ms } = facts;
    let execution_id = scheduled_execution_id(namespace, task_id, nominal_ms);
    if !trace::records_root(&execution_id) {
        // Not sampled: no span to build; the dispatch's derived traceparent says so.
        return None;
    }
    let span = tracing::info_span!(
        parent: None,
        "fire",
        otel.name = format!("fire {namespace}/{task_id}"),
        otel.kind = "producer",
        jetsched.task = format!("{namespace}/{task_id}"),
        jetsched.execution_id = %execution_id,
        jetsched.nominal_time = %wire::format_time(from_ms(nominal_ms)),
        jetsched.trigger = trigger.as_str(),
        jetsched.leader_term = term as i64,
        jetsched.fire_lag_ms = now_ms - nominal_ms,
        messaging.system = "nats",
        messaging.operation.type = "send",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    let cx = trace::start_root(&span, &execution_id);
    Some((span, cx))
}

/// A short span (in the fire's trace) saying a fire was skipped and why.
pub(crate) fn skipped(namespace: &str, task_id: &str, nominal_ms: i64, reason: &str, term: Option<u64>) {
    if !trace::enabled() {
        return;
    }
    let execution_id = scheduled_execution_id(namespace, task_id, nominal_ms);
    if !trace::records_root(&execution_id) {
        return;
    }
    let span = tracing::info_span!(
        parent: None,
        "fire skipped",
        otel.name = format!("fire {namespace}/{task_id} skipped"),
        jetsched.task = format!("{namespace}/{task_id}"),
        jetsched.execution_id = %execution_id,
        jetsched.nominal_time = %wire::format_time(from_ms(nominal_ms)),
        jetsched.skip_reason = reason,
        jetsched.leader_term = term.unwrap_or(0) as i64,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    trace::start_root(&span, &execution_id);
}
