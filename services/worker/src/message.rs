//! A dispatch message as a delivery handles it: its JetStream metadata and the headers the
//! worker reads, each read once ([`Received`]: the attempt number, the stream sequence, the
//! trace context parsed once), and its answers ([`Answers`]: ack, nak, term and progress, a
//! failed answer logged and counted).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use async_nats::{HeaderMap, HeaderName};
use jetsched_shared::trace;
use jetsched_shared::wire::{HDR_ATTEMPTS_SPENT, HDR_DELAYS, HDR_RATE_START, parse_rate_start};
use opentelemetry::trace::TraceContextExt;
use prometheus::IntCounter;

/// [`HDR_ATTEMPTS_SPENT`] and [`HDR_DELAYS`] as header names (a lookup by `&str` allocates the
/// name each time).
const ATTEMPTS_SPENT: HeaderName = HeaderName::from_static(HDR_ATTEMPTS_SPENT);
const DELAYS: HeaderName = HeaderName::from_static(HDR_DELAYS);
const RATE_START: HeaderName = HeaderName::from_static(HDR_RATE_START);

/// A dispatch message and what its metadata and headers say.
pub(crate) struct Received {
    pub(crate) message: jetstream::Message,
    /// The attempt number (1-based): the delivery count, plus the attempts made before a
    /// delay by the breaker (a delayed run is a new message carrying them).
    pub(crate) attempt: u32,
    /// The message's stream sequence.
    pub(crate) sequence: u64,
    /// The trace context the message carries.
    pub(crate) trace: TraceContext,
    /// When the worker took the message from the server (the run's arrival, which a read of
    /// its concurrency key must come after).
    pub(crate) arrived: Instant,
}

impl Received {
    /// Reads the metadata and headers of `message`, which arrived at `arrived`; an error when
    /// it has no JetStream metadata.
    pub(crate) fn read(message: jetstream::Message, arrived: Instant) -> Result<Received, async_nats::Error> {
        let info = message.info()?;
        let spent = count(message.headers.as_ref(), ATTEMPTS_SPENT);
        let delivered = u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1);
        let (attempt, sequence) = (delivered.saturating_add(spent), info.stream_sequence);
        let trace = TraceContext::read(message.headers.as_ref());
        Ok(Received { message, attempt, sequence, trace, arrived })
    }

    /// The delays by the breaker or the rate limit this run has had so far.
    pub(crate) fn delays(&self) -> u32 {
        count(self.message.headers.as_ref(), DELAYS)
    }

    /// The start its rate limit reserved, as `(attempt, start_us)`, on a run it delayed.
    pub(crate) fn rate_start(&self) -> Option<(u32, i64)> {
        let value = self.message.headers.as_ref()?.get(RATE_START)?;
        parse_rate_start(value.as_str())
    }
}

/// The number in a header (0 when absent or not a number).
fn count(headers: Option<&HeaderMap>, name: HeaderName) -> u32 {
    headers.and_then(|h| h.get(name)).and_then(|v| v.as_str().parse().ok()).unwrap_or(0)
}

/// The W3C trace context of a dispatch: `traceparent` parsed once, and both headers as they
/// came (passed on unchanged while no span of ours continues the trace).
pub(crate) struct TraceContext {
    /// The remote parent (an empty context when there is none or it is invalid).
    pub(crate) parent: trace::Context,
    /// The parent's trace id, as 32 hex digits.
    pub(crate) trace_id: Option<String>,
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<String>,
}

impl TraceContext {
    fn read(headers: Option<&HeaderMap>) -> TraceContext {
        let get = |name: HeaderName| headers.and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
        let traceparent = get(trace::TRACEPARENT_HEADER);
        let tracestate = get(trace::TRACESTATE_HEADER).filter(|s| !s.is_empty());
        let parent = match traceparent {
            Some(_) => trace::extract(headers),
            None => trace::Context::new(),
        };
        let trace_id = {
            let span = parent.span();
            let context = span.span_context();
            context.is_valid().then(|| context.trace_id().to_string())
        };
        TraceContext { parent, trace_id, traceparent, tracestate }
    }

    /// Whether a span continuing this context is recorded: spans are exported and the sampler
    /// samples it (a parent-based one follows the parent's sampled flag; without a valid
    /// parent, a new trace is decided when its span starts).
    pub(crate) fn records_child(&self) -> bool {
        if !trace::enabled() {
            return false;
        }
        let span = self.parent.span();
        let context = span.span_context();
        !context.is_valid() || trace::sampling().samples(Some(context), context.trace_id())
    }
}

/// How a delivery answers its message, and keeps it while it works.
#[derive(Clone)]
pub(crate) struct Answers {
    /// How often a message being handled gets a progress ack.
    progress_interval: Duration,
    /// Counts answers that failed.
    failed: IntCounter,
}

impl Answers {
    pub(crate) fn new(progress_interval: Duration, failed: IntCounter) -> Answers {
        Answers { progress_interval, failed }
    }

    pub(crate) fn progress_interval(&self) -> Duration {
        self.progress_interval
    }

    /// Answers the dispatch message (`Ack`, `Nak`, `Term` or `Progress`); a failure is logged
    /// and counted (the server redelivers after ack_wait).
    pub(crate) async fn send(&self, message: &jetstream::Message, kind: AckKind) {
        if let Err(error) = message.ack_with(kind).await {
            self.failed.inc();
            tracing::warn!(%error, "acknowledge dispatch");
        }
    }

    /// Runs `work` while telling the server the delivery is still being handled (progress
    /// acks every `progress_interval`), so neither a long execution nor a record write retried
    /// through a node failure outlives `ack_wait` and hands the run to another worker.
    ///
    /// `work` is pinned by the caller and lent: a future taken by value lives twice in the
    /// state of the function taking it (as the argument and as the local it is pinned in), and
    /// a delivery's state machine, copied whole at each level, grew to 25 KB.
    pub(crate) async fn keeping_alive<T>(
        &self,
        message: &jetstream::Message,
        mut work: Pin<&mut impl Future<Output = T>>,
    ) -> T {
        let period = self.progress_interval;
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = progress.tick() => self.send(message, AckKind::Progress).await,
            }
        }
    }
}
