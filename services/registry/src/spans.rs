//! Spans of the registry, created only while spans are exported: the changing API requests
//! (`put`, `delete`, `pause`, `resume`, `trigger`, DLQ `replay`) as server spans and intake
//! submissions as consumer spans, each continuing the `traceparent` its message carries.

use async_nats::HeaderMap;
use jetsched_shared::trace::{self, Context};

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

/// The server span of a request to `endpoint` on `subject`; `None` when spans are off or the
/// endpoint only reads.
pub(crate) fn request(
    endpoint: Endpoint,
    subject: &str,
    headers: Option<&HeaderMap>,
) -> Option<tracing::Span> {
    if !trace::enabled() || !traced(endpoint) {
        return None;
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
    Some(span)
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
/// span (`None` when spans are off: the dispatch then derives its own).
pub(crate) fn dispatch_parent() -> Option<Context> {
    trace::enabled().then(trace::current)
}
