//! Spans of runs, built for export only while spans are exported and the run's trace is
//! sampled: a `run` span (kind consumer) per delivery, child of the dispatch's trace context,
//! and one span per executor call below it (HTTP client, NATS request, shell process, embedded
//! handler) whose context the executor passes on. Otherwise the `run` span is one only the logs
//! see, and the dispatch's own `traceparent` is passed on unchanged.

use jetsched_shared::spec::Executor;
use jetsched_shared::trace;
use jetsched_shared::wire::Dispatch;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::message::TraceContext;

/// Trace context handed to the downstream of an attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Propagated {
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<String>,
}

impl Propagated {
    /// The dispatch's own trace context, passed on as it came.
    pub(crate) fn of_dispatch(context: &TraceContext) -> Propagated {
        Propagated { traceparent: context.traceparent.clone(), tracestate: context.tracestate.clone() }
    }

    /// The context of `span` (an executor span).
    fn of_span(span: &tracing::Span) -> Option<Propagated> {
        let (traceparent, tracestate) = trace::context_of(span)?;
        Some(Propagated {
            traceparent: Some(traceparent),
            tracestate: Some(tracestate).filter(|s| !s.is_empty()),
        })
    }

    /// `(header, value)` pairs for HTTP and NATS requests.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [(trace::TRACEPARENT, &self.traceparent), (trace::TRACESTATE, &self.tracestate)]
            .into_iter()
            .filter_map(|(name, value)| value.as_deref().map(|value| (name, value)))
    }
}

/// The `run` span of a delivery under `target`, with the fields both kinds carry and `extra`.
macro_rules! run_span {
    ($target:expr, $dispatch:expr, $attempt:expr, $($extra:tt)*) => {
        tracing::info_span!(
            target: $target,
            "run",
            namespace = %$dispatch.namespace,
            task = %$dispatch.task_id,
            execution = %$dispatch.execution_id,
            attempt = $attempt,
            $($extra)*
        )
    };
}

/// The `run` span of a delivery. Built for export (attributes, the dispatch's trace context as
/// its parent) only when spans are exported and its trace is sampled; otherwise a span under an
/// untraced target that only the logs see, carrying the dispatch's trace id for them.
pub(crate) fn run(dispatch: &Dispatch, attempt: u32, subject: &str, context: &TraceContext) -> tracing::Span {
    if !context.records_child() {
        let trace_id = dispatch.trace_id.as_deref();
        return run_span!("jetsched_worker::delivery::untraced", dispatch, attempt, trace_id);
    }
    let span = run_span!(
        "jetsched_worker::delivery",
        dispatch,
        attempt,
        otel.kind = "consumer",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    start_run(&span, dispatch, attempt, subject, context);
    span
}

/// The `run` span's attributes, then its parent, the dispatch's trace context.
fn start_run(span: &tracing::Span, dispatch: &Dispatch, attempt: u32, subject: &str, context: &TraceContext) {
    trace::set_attribute(span, trace::ATTR_TASK, format!("{}/{}", dispatch.namespace, dispatch.task_id));
    trace::set_attribute(span, trace::ATTR_EXECUTION_ID, dispatch.execution_id.clone());
    trace::set_attribute(span, trace::ATTR_ATTEMPT, i64::from(attempt));
    trace::set_attribute(span, trace::ATTR_DELIVERY_COUNT, i64::from(attempt));
    trace::set_attribute(span, trace::ATTR_TRIGGER, dispatch.trigger.as_str());
    trace::set_attribute(span, "messaging.system", "nats");
    trace::set_attribute(span, "messaging.operation.type", "process");
    trace::set_attribute(span, "messaging.destination.name", subject.to_string());
    if context.trace_id.is_some() {
        let _ = span.set_parent(context.parent.clone());
    }
    trace::record_ids(span, &span.context());
}

/// Records how the attempt ended on the current (`run`) span.
pub(crate) fn outcome(outcome: &'static str) {
    if trace::enabled() && !trace::current_is_untraced() {
        trace::set_attribute(&tracing::Span::current(), trace::ATTR_OUTCOME, outcome);
    }
}

/// The executor's span (child of the current `run` span) and the context to pass downstream;
/// `None` with spans off or when the run is not traced (the dispatch's context goes on then).
pub(crate) fn executor(executor: &Executor) -> Option<(tracing::Span, Propagated)> {
    if !trace::enabled() || trace::current_is_untraced() {
        return None;
    }
    let span = match executor {
        Executor::Http { method, url, .. } => tracing::info_span!(
            "http",
            otel.name = method.to_ascii_uppercase(),
            otel.kind = "client",
            http.request.method = method.to_ascii_uppercase(),
            url.full = url.as_str(),
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        ),
        Executor::Nats { subject, .. } => tracing::info_span!(
            "nats",
            otel.name = format!("send {subject}"),
            otel.kind = "client",
            messaging.system = "nats",
            messaging.destination.name = subject.as_str(),
            messaging.operation.type = "send",
            otel.status_code = tracing::field::Empty,
        ),
        Executor::Shell { command, .. } => tracing::info_span!(
            "shell",
            otel.name = "shell",
            process.executable.name = command.first().map(String::as_str).unwrap_or_default(),
            otel.status_code = tracing::field::Empty,
        ),
        Executor::Handler { name, .. } => tracing::info_span!(
            "handler",
            otel.name = format!("handler {name}"),
            jetsched.handler = name.as_str(),
            otel.status_code = tracing::field::Empty,
        ),
    };
    let propagated = Propagated::of_span(&span)?;
    Some((span, propagated))
}
