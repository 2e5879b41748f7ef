//! Spans of the registry, created only while spans are exported: the changing API requests
//! (`put`, `delete`, `pause`, `resume`, `trigger`, DLQ `replay`) as server spans and intake
//! submissions as consumer spans, each continuing the `traceparent` its message carries. With
//! spans off, a request's own trace context is kept while it is handled, so a dispatch it sends
//! carries the caller's `traceparent` and `tracestate` on as they came.

use async_nats::HeaderMap;
use jetsched_shared::trace::{self, Context};
use tracing::Instrument as _;

/// How requests to an endpoint are traced (a column of the endpoint table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tracing {
    /// A read: no span.
    None,
    /// A change: a server span of this name while spans are exported.
    Span(&'static str),
    /// A change that dispatches a run: its span, or with spans off the caller's trace context
    /// carried on to the dispatch.
    Dispatch(&'static str),
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

/// A span of a message received on `$subject`, of its own trace unless the message's headers
/// carry one (see [`continuing`]).
macro_rules! messaging_span {
    ($span:literal, $name:expr, $kind:literal, $subject:expr) => {
        tracing::info_span!(
            parent: None,
            $span,
            otel.name = $name,
            otel.kind = $kind,
            messaging.system = "nats",
            messaging.destination.name = $subject,
            messaging.operation.type = "process",
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        )
    };
}

/// `span`, continuing the `traceparent` the headers carry.
fn continuing(span: tracing::Span, headers: Option<&HeaderMap>) -> tracing::Span {
    trace::start_child(&span, headers);
    span
}

/// The trace of a request on `subject` to an endpoint traced so: its server span while spans
/// are exported, otherwise the trace context its headers carry for the dispatch of a trigger
/// or a replay.
pub(crate) fn request(tracing: Tracing, subject: &str, headers: Option<&HeaderMap>) -> RequestTrace {
    if !trace::enabled() {
        return match (tracing, trace::caller(headers)) {
            (Tracing::Dispatch(_), Some(cx)) => RequestTrace::Caller(cx),
            _ => RequestTrace::None,
        };
    }
    let name = match tracing {
        Tracing::None => return RequestTrace::None,
        Tracing::Span(name) | Tracing::Dispatch(name) => name,
    };
    RequestTrace::Span(continuing(messaging_span!("request", name, "server", subject), headers))
}

/// The consumer span of an intake submission on `subject`; `None` when spans are off.
pub(crate) fn submission(subject: &str, headers: Option<&HeaderMap>) -> Option<tracing::Span> {
    trace::enabled()
        .then(|| continuing(messaging_span!("submission", "intake submit", "consumer", subject), headers))
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
