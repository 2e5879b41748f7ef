//! Spans of the registry, created only while spans are exported: the changing API requests
//! (`put`, `delete`, `pause`, `resume`, `trigger`, DLQ `replay`) as server spans and intake
//! submissions as consumer spans, each continuing the `traceparent` its message carries. With
//! spans off, a request's own trace context is kept while it is handled, so a dispatch it sends
//! carries the caller's `traceparent` and `tracestate` on as they came.

use async_nats::HeaderMap;
use jetsched_shared::trace::{self, Context};
use tracing::Instrument as _;

use crate::api::Endpoint;
use crate::dlq::DlqEndpoint;

/// Whether requests to `endpoint` get a span (the ones that change something).
fn traced(endpoint: Endpoint) -> bool {
    matches!(
        endpoint,
        Endpoint::Put
            | Endpoint::Delete
            | Endpoint::Pause
            | Endpoint::Resume
            | Endpoint::Trigger
            | Endpoint::Dlq(DlqEndpoint::Replay)
    )
}

/// How a request is traced while it is handled.
pub(crate) enum RequestTrace {
    /// Its server span (spans exported, an endpoint that changes something).
    Span(tracing::Span),
    /// The caller's trace context only (spans off), for the dispatch it may send.
    Caller(Context),
    /// Nothing to carry.
    None,
}

impl RequestTrace {
    /// Handles the request (`handling`) inside its span or its caller's context.
    pub(crate) async fn around<F: Future>(self, handling: F) -> F::Output {
        match self {
            RequestTrace::Span(span) => handling.instrument(span).await,
            RequestTrace::Caller(cx) => trace::with_context(cx, handling).await,
            RequestTrace::None => handling.await,
        }
    }
}

/// The trace of a request to `endpoint` on `subject`: its server span while spans are
/// exported, otherwise the trace context its headers carry for the dispatch of a trigger or a
/// replay.
pub(crate) fn request(endpoint: Endpoint, subject: &str, headers: Option<&HeaderMap>) -> RequestTrace {
    if !trace::enabled() {
        let dispatches = matches!(endpoint, Endpoint::Trigger | Endpoint::Dlq(DlqEndpoint::Replay));
        return match trace::caller(headers).filter(|_| dispatches) {
            Some(cx) => RequestTrace::Caller(cx),
            None => RequestTrace::None,
        };
    }
    if !traced(endpoint) {
        return RequestTrace::None;
    }
    let name = match endpoint {
        Endpoint::Dlq(_) => "dlq replay",
        other => other.name(),
    };
    let span = tracing::info_span!(
        parent: None,
        "request",
        otel.name = name,
        otel.kind = "server",
        messaging.system = "nats",
        messaging.destination.name = subject,
        messaging.operation.type = "process",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    trace::start_child(&span, headers);
    RequestTrace::Span(span)
}

/// The consumer span of an intake submission on `subject`; `None` when spans are off.
pub(crate) fn submission(subject: &str, headers: Option<&HeaderMap>) -> Option<tracing::Span> {
    if !trace::enabled() {
        return None;
    }
    let span = tracing::info_span!(
        parent: None,
        "submission",
        otel.name = "intake submit",
        otel.kind = "consumer",
        messaging.system = "nats",
        messaging.destination.name = subject,
        messaging.operation.type = "process",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    trace::start_child(&span, headers);
    Some(span)
}

/// Names the task on the current request span.
pub(crate) fn task(namespace: &str, id: &str) {
    if trace::enabled() {
        trace::set_attribute(&tracing::Span::current(), trace::ATTR_TASK, format!("{namespace}/{id}"));
    }
}

/// The context a dispatch sent while handling the current request carries on: the request's
/// span, or with spans off the caller's context (`None` when the request carried none: the
/// dispatch then derives its own from the execution id).
pub(crate) fn dispatch_parent() -> Option<Context> {
    if trace::enabled() {
        return Some(trace::current());
    }
    trace::kept_context()
}
