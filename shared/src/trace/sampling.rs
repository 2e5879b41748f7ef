//! Sampling decided at the root of a trace: the configured sampler (`OTEL_TRACES_SAMPLER` and
//! `_ARG`, read whether or not spans are exported) decides once per trace id, and the decision
//! travels in the `traceparent` flags to every service below.
//!
//! The ratio decision reads the trace id's last 62 bits. The SDK's `TraceIdRatioBased` reads
//! the last 63, whose top bits in a UUID are the fixed variant bits `10`: with trace ids that
//! are execution ids it samples nothing below a ratio of one half. This one is deterministic
//! (every leader and tool decides the same for the same execution) and uniform on UUIDs and
//! random ids alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use opentelemetry::trace::{Link, SpanContext, SpanKind, TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SamplingDecision, SamplingResult, ShouldSample};

/// The sampler of a process, as the standard variables describe it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// A span with a parent follows its parent's decision (the `parentbased_*` samplers).
    pub parent_based: bool,
    /// Share of root traces sampled: 1 for `always_on`, 0 for `always_off`.
    pub ratio: f64,
}

impl Default for Sampling {
    /// `parentbased_always_on`, the standard default.
    fn default() -> Sampling {
        Sampling { parent_based: true, ratio: 1.0 }
    }
}

const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";

impl Sampling {
    /// The sampler named by `OTEL_TRACES_SAMPLER` (`sampler`) and `OTEL_TRACES_SAMPLER_ARG`
    /// (`arg`, the ratio of the `*traceidratio` samplers, default 1); every problem named.
    pub fn parse(sampler: Option<&str>, arg: Option<&str>) -> Result<Sampling, Vec<String>> {
        let mut problems = Vec::new();
        let ratio = || match arg.map(str::trim) {
            None | Some("") => Ok(1.0),
            Some(text) => match text.parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
                _ => Err(format!("{SAMPLER_ARG} = {text:?}: must be a ratio from 0 to 1")),
            },
        };
        let name = sampler.map(str::trim).filter(|name| !name.is_empty());
        let (parent_based, ratio) = match name.unwrap_or("parentbased_always_on") {
            "always_on" => (false, Ok(1.0)),
            "always_off" => (false, Ok(0.0)),
            "traceidratio" => (false, ratio()),
            "parentbased_always_on" => (true, Ok(1.0)),
            "parentbased_always_off" => (true, Ok(0.0)),
            "parentbased_traceidratio" => (true, ratio()),
            other => {
                problems.push(format!(
                    "{SAMPLER} = {other:?}: must be always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ));
                (true, ratio())
            }
        };
        let ratio = ratio.unwrap_or_else(|problem| {
            problems.push(problem);
            1.0
        });
        if problems.is_empty() { Ok(Sampling { parent_based, ratio }) } else { Err(problems) }
    }

    /// Whether a trace that starts here with `trace_id` is sampled.
    pub fn samples_root(&self, trace_id: TraceId) -> bool {
        samples_ratio(self.ratio, trace_id)
    }

    /// Whether a span of `trace_id` under `parent` (a valid remote or local parent, if any) is
    /// sampled.
    pub fn samples(&self, parent: Option<&SpanContext>, trace_id: TraceId) -> bool {
        match parent.filter(|parent| parent.is_valid()) {
            Some(parent) if self.parent_based => parent.is_sampled(),
            _ => self.samples_root(trace_id),
        }
    }

    /// The SDK sampler making the same decisions.
    pub(crate) fn sdk(&self) -> Decide {
        Decide(*self)
    }
}

/// Whether `trace_id` falls in the sampled `ratio` of trace ids (its last 62 bits below
/// `ratio` × 2⁶²).
fn samples_ratio(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 || trace_id == TraceId::INVALID {
        return false;
    }
    const BITS: u32 = 62;
    let low = u128::from_be_bytes(trace_id.to_bytes()) as u64 & ((1u64 << BITS) - 1);
    low < (ratio * (1u64 << BITS) as f64) as u64
}

/// [`Sampling`] as the SDK's sampler.
#[derive(Debug, Clone)]
pub(crate) struct Decide(Sampling);

impl ShouldSample for Decide {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let parent =
            parent_context.filter(|cx| cx.has_active_span()).map(|cx| cx.span().span_context().clone());
        decide(self.0.samples(parent.as_ref(), trace_id), parent_context)
    }
}

fn decide(sampled: bool, parent: Option<&Context>) -> SamplingResult {
    let trace_state = parent
        .filter(|cx| cx.has_active_span())
        .map(|cx| cx.span().span_context().trace_state().clone())
        .unwrap_or_default();
    SamplingResult {
        decision: if sampled { SamplingDecision::RecordAndSample } else { SamplingDecision::Drop },
        attributes: Vec::new(),
        trace_state,
    }
}

/// The process's sampler for roots decided without a span (a dispatch sent while spans are not
/// exported) and for the cheap "will this span be recorded" test of hot paths.
static RATIO_BITS: AtomicU64 = AtomicU64::new(0x3FF0_0000_0000_0000); // 1.0
static PARENT_BASED: AtomicBool = AtomicBool::new(true);

/// Makes `sampling` the process's sampler.
pub(crate) fn set_process(sampling: Sampling) {
    RATIO_BITS.store(sampling.ratio.to_bits(), Ordering::Relaxed);
    PARENT_BASED.store(sampling.parent_based, Ordering::Relaxed);
}

/// The process's sampler (the default until telemetry is started).
pub(crate) fn process() -> Sampling {
    Sampling {
        parent_based: PARENT_BASED.load(Ordering::Relaxed),
        ratio: f64::from_bits(RATIO_BITS.load(Ordering::Relaxed)),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceState};

    use super::*;

    #[test]
    fn the_standard_names_parse_and_every_problem_is_named() {
        let parse = Sampling::parse;
        assert_eq!(parse(None, None), Ok(Sampling::default()));
        assert_eq!(parse(Some("always_off"), None), Ok(Sampling { parent_based: false, ratio: 0.0 }));
        assert_eq!(
            parse(Some("parentbased_traceidratio"), Some("0.01")),
            Ok(Sampling { parent_based: true, ratio: 0.01 })
        );
        assert_eq!(parse(Some("traceidratio"), None), Ok(Sampling { parent_based: false, ratio: 1.0 }));
        let problems = parse(Some("jaeger_remote"), Some("2")).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("OTEL_TRACES_SAMPLER = \"jaeger_remote\""), "{problems:?}");
        assert!(problems[1].contains("OTEL_TRACES_SAMPLER_ARG = \"2\""), "{problems:?}");
    }

    #[test]
    fn a_ratio_samples_its_share_of_execution_ids_and_the_same_ones_every_time() {
        let ids: Vec<TraceId> = (0..20_000u64)
            .map(|n| {
                let id = crate::wire::scheduled_execution_id("ns", "task", n as i64 * 1000);
                crate::trace::trace_id_of(&id).expect("a UUID")
            })
            .collect();
        for ratio in [0.01, 0.1, 0.5] {
            let sampling = Sampling { parent_based: true, ratio };
            let sampled = ids.iter().filter(|id| sampling.samples_root(**id)).count();
            let expected = ratio * ids.len() as f64;
            assert!(
                (sampled as f64 - expected).abs() < expected * 0.2 + 10.0,
                "ratio {ratio}: {sampled} of {} sampled",
                ids.len()
            );
            let again = ids.iter().filter(|id| sampling.samples_root(**id)).count();
            assert_eq!(sampled, again, "deterministic");
        }
        let none = Sampling { parent_based: true, ratio: 0.0 };
        assert!(!ids.iter().any(|id| none.samples_root(*id)));
        assert!(ids.iter().all(|id| Sampling::default().samples_root(*id)));
    }

    #[test]
    fn parent_based_follows_the_parent_and_the_sdk_sampler_agrees() {
        let trace_id = TraceId::from(0x0b2f9c8e61a45d2b9b5e3f1c2d4e5f60u128);
        let unsampled =
            SpanContext::new(trace_id, SpanId::from(7u64), TraceFlags::default(), true, TraceState::NONE);
        let sampled =
            SpanContext::new(trace_id, SpanId::from(7u64), TraceFlags::SAMPLED, true, TraceState::NONE);
        let follow = Sampling::default();
        assert!(!follow.samples(Some(&unsampled), trace_id));
        assert!(follow.samples(Some(&sampled), trace_id));
        assert!(follow.samples(None, trace_id));
        let independent = Sampling { parent_based: false, ratio: 1.0 };
        assert!(independent.samples(Some(&unsampled), trace_id));

        for sampling in [follow, independent, Sampling { parent_based: true, ratio: 0.0 }] {
            for parent in [None, Some(&unsampled), Some(&sampled)] {
                let cx = parent.map(|p| Context::new().with_remote_span_context(p.clone()));
                let result =
                    sampling.sdk().should_sample(cx.as_ref(), trace_id, "run", &SpanKind::Consumer, &[], &[]);
                let sdk = result.decision == SamplingDecision::RecordAndSample;
                assert_eq!(sdk, sampling.samples(parent, trace_id), "{sampling:?} under {parent:?}");
            }
        }
    }
}
