//! Trace context of one execution: W3C `traceparent`/`tracestate` in NATS headers, the trace
//! id every service derives from an execution id, the `jetsched.*` span attribute names, and
//! the cheap flag that says whether spans are exported at all.
//!
//! A scheduled execution's trace id is its execution id's 128 bits (the UUID as 32 hex
//! digits), so every leader, worker and tool derives the same trace id for the same fire.
//! With no exporter, no span is created on the hot paths ([`enabled`] is false), yet every
//! dispatch still carries a `traceparent` ([`fallback_traceparent`]) so a traced downstream
//! joins the execution's trace; its sampled flag is the process's sampler's decision for the
//! trace ([`sampling`]), so the share configured at the root holds end to end.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::{HeaderMap, HeaderName};
pub use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

mod sampling;

pub use sampling::Sampling;
pub(crate) use sampling::set_process as set_sampling;

/// W3C Trace Context header carrying trace id, parent span id and flags.
pub const TRACEPARENT: &str = "traceparent";
/// W3C Trace Context header carrying vendor state.
pub const TRACESTATE: &str = "tracestate";
/// nats-server's message-tracing header. A dispatch whose `traceparent` is sampled carries it
/// with [`NATS_TRACE_DISABLED`] unless [`server_msg_trace`] is on: nats-server reads every header
/// of a message with a sampled `traceparent` into a map to ask whether the account traces it,
/// and this value (the one nats-server writes into the messages it stores) tells it not to.
pub const NATS_TRACE_DEST: &str = "Nats-Trace-Dest";
/// The [`NATS_TRACE_DEST`] value that turns nats-server's message tracing off for a message.
pub const NATS_TRACE_DISABLED: &str = "trace disabled";
/// Environment variable a shell executor's command finds its trace context in.
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";
/// Environment variable with the vendor state, when there is one.
pub const TRACESTATE_ENV: &str = "TRACESTATE";

/// The `jetsched.*` span attribute names (spelled in `names`, with every other name).
pub use crate::names::span_attr::{
    ATTEMPT as ATTR_ATTEMPT, DELIVERY_COUNT as ATTR_DELIVERY_COUNT, EXECUTION_ID as ATTR_EXECUTION_ID,
    FIRE_LAG_MS as ATTR_FIRE_LAG_MS, LEADER_TERM as ATTR_LEADER_TERM, NOMINAL_TIME as ATTR_NOMINAL_TIME,
    OUTCOME as ATTR_OUTCOME, SKIP_REASON as ATTR_SKIP_REASON, TASK as ATTR_TASK, TRIGGER as ATTR_TRIGGER,
};

static ENABLED: AtomicBool = AtomicBool::new(false);
static SERVER_MSG_TRACE: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an OTLP endpoint is configured). Hot paths test this before
/// creating any span object.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether nats-server may trace this process's sampled dispatches with its own message tracing
/// (an account's `msg_trace`): `JETSCHED_NATS_MSG_TRACE`, off by default, in which case they
/// carry [`NATS_TRACE_DEST`]` = `[`NATS_TRACE_DISABLED`].
pub fn server_msg_trace() -> bool {
    SERVER_MSG_TRACE.load(Ordering::Relaxed)
}

pub(crate) fn set_server_msg_trace(on: bool) {
    SERVER_MSG_TRACE.store(on, Ordering::Relaxed);
}

/// [`TRACEPARENT`] and [`TRACESTATE`] as header names: a lookup by `&str` validates, builds and
/// allocates the name every time, and every delivery looks them up.
pub const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static(TRACEPARENT);
pub const TRACESTATE_HEADER: HeaderName = HeaderName::from_static(TRACESTATE);

/// Adds [`NATS_TRACE_DEST`]` = `[`NATS_TRACE_DISABLED`] to `headers` when their `traceparent`
/// is sampled and [`server_msg_trace`] is off.
pub fn keep_from_server_tracing(headers: &mut HeaderMap) {
    let sampled =
        headers.get(TRACEPARENT_HEADER).and_then(|v| parse_traceparent(v.as_str())).is_some_and(|(_, s)| s);
    if sampled && !server_msg_trace() {
        headers.insert(NATS_TRACE_DEST, NATS_TRACE_DISABLED);
    }
}

/// The trace id of an execution: its UUID's 128 bits. `None` for an id that is not a UUID.
pub fn trace_id_of(execution_id: &str) -> Option<TraceId> {
    uuid::Uuid::parse_str(execution_id)
        .ok()
        .map(|id| TraceId::from(id.as_u128()))
        .filter(|id| *id != TraceId::INVALID)
}

/// A parent span id derived from the execution id (its last 64 bits), for the `traceparent`
/// of a dispatch sent while no span exists: every leader sends the same one.
fn fallback_span_id(execution_id: &str) -> SpanId {
    let bits = uuid::Uuid::parse_str(execution_id).map(|id| id.as_u128() as u64).unwrap_or(0);
    SpanId::from(bits.max(1))
}

/// `00-<trace id>-<span id>-<flags>` of an execution for which no span was created (tracing
/// off): the same trace id a traced fire would have, and sampled (`01`) when the process's
/// sampler samples that trace id as a root, so a parent-based downstream records its part
/// exactly when a traced root would have been sampled.
pub fn fallback_traceparent(execution_id: &str) -> Option<String> {
    let trace_id = trace_id_of(execution_id)?;
    let flags = if sampling::process().samples_root(trace_id) { "01" } else { "00" };
    Some(format!("00-{trace_id}-{}-{flags}", fallback_span_id(execution_id)))
}

/// The process's sampler (the standard default until telemetry is started).
pub fn sampling() -> Sampling {
    sampling::process()
}

/// Whether a span started now as the root of `execution_id`'s trace would be recorded: spans
/// are exported and the sampler samples the trace. Hot paths build no span otherwise.
pub fn records_root(execution_id: &str) -> bool {
    enabled() && trace_id_of(execution_id).is_some_and(|id| sampling::process().samples_root(id))
}

/// Whether a span continuing the trace context in `headers` would be recorded: spans are
/// exported and the sampler samples it (a parent-based one follows the `traceparent` flag).
pub fn records_child(headers: Option<&HeaderMap>) -> bool {
    if !enabled() {
        return false;
    }
    let parent = headers.and_then(|h| h.get(TRACEPARENT_HEADER)).and_then(|v| parse_traceparent(v.as_str()));
    match parent {
        Some((trace_id, sampled)) => {
            let sampling = sampling::process();
            if sampling.parent_based { sampled } else { sampling.samples_root(trace_id) }
        }
        // A new trace with a random id: decided by the SDK when the span starts.
        None => true,
    }
}

/// The trace id and sampled flag of a `traceparent`, read without allocating (a later version
/// is read as version 00, as the W3C recommendation says).
fn parse_traceparent(value: &str) -> Option<(TraceId, bool)> {
    let mut parts = value.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let version = u8::from_str_radix(version, 16).ok().filter(|v| *v != 0xff)?;
    if (version == 0 && parts.next().is_some())
        || trace_id.len() != 32
        || span_id.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok().filter(|id| *id != TraceId::INVALID)?;
    SpanId::from_hex(span_id).ok().filter(|id| *id != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace_id, flags & TraceFlags::SAMPLED.to_u8() != 0))
}

/// The end of the target of a span that stays out of trace export (a run whose trace is not
/// sampled): the export layer never builds it, only the logs see it.
pub const UNTRACED_SUFFIX: &str = "::untraced";

/// Whether the current span is one that trace export never sees ([`UNTRACED_SUFFIX`]) or
/// there is none.
pub fn current_is_untraced() -> bool {
    tracing::Span::current().metadata().is_none_or(|meta| meta.target().ends_with(UNTRACED_SUFFIX))
}

/// The trace context a request's `headers` carry, when it is valid (a caller's context to
/// pass on as it came while no span of ours continues it).
pub fn caller(headers: Option<&HeaderMap>) -> Option<Context> {
    let headers = headers.filter(|headers| headers.get(TRACEPARENT_HEADER).is_some())?;
    let cx = extract(Some(headers));
    cx.span().span_context().is_valid().then_some(cx)
}

/// The `traceparent` of a span context (`None` when it is not valid).
pub fn traceparent(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8())
    })
}

/// Writes the trace context of `cx` (`traceparent`, `tracestate`) into `headers`.
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut Headers(headers));
}

/// Writes the trace context of a tracing span into `headers` (nothing when the span has none).
pub fn inject_span(span: &tracing::Span, headers: &mut HeaderMap) {
    inject(&span.context(), headers);
}

/// The remote parent carried by `headers` (an empty context when there is none or it is invalid).
pub fn extract(headers: Option<&HeaderMap>) -> Context {
    match headers {
        Some(headers) => TraceContextPropagator::new().extract(&HeadersRef(headers)),
        None => Context::new(),
    }
}

/// The trace id carried by `headers`' `traceparent`, as 32 hex digits.
pub fn trace_id_in(headers: Option<&HeaderMap>) -> Option<String> {
    let value = headers?.get(TRACEPARENT_HEADER)?.as_str();
    let context = extract_span_context(value)?;
    Some(context.trace_id().to_string())
}

/// Parses a `traceparent` value.
pub fn extract_span_context(traceparent: &str) -> Option<SpanContext> {
    let cx = TraceContextPropagator::new().extract(&Traceparent(traceparent));
    let span_context = cx.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// The trace context of a tracing span as (`traceparent`, `tracestate`), for a downstream
/// protocol of its own (HTTP headers, environment variables, a handler's context).
pub fn context_of(span: &tracing::Span) -> Option<(String, String)> {
    let cx = span.context();
    let span_ref = cx.span();
    let context = span_ref.span_context();
    Some((traceparent(context)?, context.trace_state().header()))
}

/// A context whose remote parent is `traceparent` (for a run whose span is not created because
/// tracing is off: the downstream still joins the dispatch's trace).
pub fn remote_context(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let context = extract_span_context(traceparent)?;
    let state = tracestate.and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
    Some(SpanContext::new(context.trace_id(), context.span_id(), context.trace_flags(), true, state))
}

/// The sampled flag of a `traceparent` (for tests and tools).
pub fn is_sampled(traceparent: &str) -> bool {
    extract_span_context(traceparent).is_some_and(|c| c.trace_flags() == TraceFlags::SAMPLED)
}

/// Builds `span` as the root of `execution_id`'s trace (its trace id is the execution id's) and
/// returns its context; the span's `trace_id` and `span_id` fields, when it declares them, are
/// recorded for the logs written inside it.
pub fn start_root(span: &tracing::Span, execution_id: &str) -> Context {
    let cx = with_trace_id(trace_id_of(execution_id), || span.context());
    record_ids(span, &cx);
    cx
}

/// Makes `span` the child of the trace context carried by `headers` (a new trace when they
/// carry none) and returns its context, its `trace_id`/`span_id` fields recorded.
pub fn start_child(span: &tracing::Span, headers: Option<&HeaderMap>) -> Context {
    let parent = extract(headers);
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    let cx = span.context();
    record_ids(span, &cx);
    cx
}

/// Records the `trace_id` and `span_id` fields of `span` from its context `cx`.
pub fn record_ids(span: &tracing::Span, cx: &Context) {
    let span_ref = cx.span();
    let context = span_ref.span_context();
    if context.is_valid() {
        span.record("trace_id", tracing::field::display(context.trace_id()));
        span.record("span_id", tracing::field::display(context.span_id()));
    }
}

/// Runs `future` with `cx` as the current trace context (no span of ours: a caller's context,
/// kept for what the future sends).
pub fn with_context<F: Future>(cx: Context, future: F) -> impl Future<Output = F::Output> {
    opentelemetry::context::FutureExt::with_context(future, cx)
}

/// The current trace context set by [`with_context`], when it holds a valid span context.
pub fn kept_context() -> Option<Context> {
    Some(Context::current()).filter(|cx| cx.span().span_context().is_valid())
}

/// The context of the current tracing span (empty when it has none).
pub fn current() -> Context {
    tracing::Span::current().context()
}

/// Sets an attribute on a span already built (an outcome, a status code).
pub fn set_attribute(span: &tracing::Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    span.set_attribute(key, value);
}

thread_local! {
    static NEXT_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// Runs `f` (which must build a root span, e.g. by asking for its context) so that the root
/// gets `trace_id` instead of a random one.
pub fn with_trace_id<T>(trace_id: Option<TraceId>, f: impl FnOnce() -> T) -> T {
    NEXT_TRACE_ID.with(|next| next.set(trace_id));
    let result = f();
    NEXT_TRACE_ID.with(|next| next.set(None));
    result
}

/// Random ids, except a root span's trace id set through [`with_trace_id`].
#[derive(Debug, Default)]
pub(crate) struct ExecutionIds {
    random: RandomIdGenerator,
}

impl IdGenerator for ExecutionIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE_ID.with(|next| next.take()).unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.random.new_span_id()
    }
}

struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value);
    }
}

struct HeadersRef<'a>(&'a HeaderMap);

impl Extractor for HeadersRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|value| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

/// A lone `traceparent` value as the propagator's carrier (read once per run: no map built).
struct Traceparent<'a>(&'a str);

impl Extractor for Traceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXECUTION: &str = "0b2f9c8e-61a4-5d2b-9b5e-3f1c2d4e5f60";

    #[test]
    fn an_execution_id_is_its_trace_id() {
        let trace_id = trace_id_of(EXECUTION).expect("a UUID");
        assert_eq!(trace_id.to_string(), "0b2f9c8e61a45d2b9b5e3f1c2d4e5f60");
        assert_eq!(trace_id_of("not-a-uuid"), None);
    }

    #[test]
    fn the_fallback_traceparent_is_deterministic_and_parses() {
        let first = fallback_traceparent(EXECUTION).expect("a UUID");
        assert_eq!(first, fallback_traceparent(EXECUTION).unwrap());
        assert_eq!(first, "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-9b5e3f1c2d4e5f60-01");
        assert!(is_sampled(&first));
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, first.as_str());
        assert_eq!(trace_id_in(Some(&headers)).as_deref(), Some("0b2f9c8e61a45d2b9b5e3f1c2d4e5f60"));
    }

    #[test]
    fn inject_then_extract_round_trips() {
        let context = remote_context("00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01", Some("k=v"))
            .expect("valid");
        let cx = Context::new().with_remote_span_context(context.clone());
        let mut headers = HeaderMap::new();
        inject(&cx, &mut headers);
        assert_eq!(
            headers.get(TRACEPARENT).map(|v| v.as_str()),
            Some("00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01")
        );
        assert_eq!(headers.get(TRACESTATE).map(|v| v.as_str()), Some("k=v"));
        let back = extract(Some(&headers));
        assert_eq!(back.span().span_context().trace_id(), context.trace_id());
        assert_eq!(back.span().span_context().span_id(), context.span_id());
        assert!(!extract(None).span().span_context().is_valid());
    }

    #[test]
    fn a_traceparent_is_read_without_the_propagator() {
        let sampled = "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01";
        let (trace_id, flag) = parse_traceparent(sampled).expect("valid");
        assert_eq!(trace_id.to_string(), "0b2f9c8e61a45d2b9b5e3f1c2d4e5f60");
        assert!(flag);
        assert_eq!(
            parse_traceparent("00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-00").map(|p| p.1),
            Some(false)
        );
        assert!(parse_traceparent("01-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01-more").is_some());
        for bad in [
            "",
            "ff-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01",
            "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-01-extra",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-0000000000000000-01",
            "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f6-00f067aa0ba902b7-01",
            "00-0b2f9c8e61a45d2b9b5e3f1c2d4e5f60-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_id_generator_takes_the_given_trace_id_once() {
        let ids = ExecutionIds::default();
        let wanted = trace_id_of(EXECUTION);
        let got = with_trace_id(wanted, || ids.new_trace_id());
        assert_eq!(Some(got), wanted);
        assert_ne!(Some(ids.new_trace_id()), wanted);
    }
}
