//! The retry decision: from an attempt's outcome, the task's retry policy and the delivery
//! count, what happens to the dispatch message.

use std::time::Duration;

use jetsched_shared::spec::RetryPolicy;

use crate::executor::Outcome;

/// What to do with the dispatch message after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Success: ack.
    Ack,
    /// Retryable failure with attempts left: `Nak(delay)`.
    Retry { delay: Duration },
    /// Permanent failure or retries exhausted: dead-letter, then `Term`.
    Dead { reason: String },
}

/// Decides after attempt `attempt` (1-based delivery count) ended with `outcome`, `elapsed`
/// after the first attempt started. `unit` is a random number in `[0, 1)` picking the jitter.
///
/// A retry delay asked for by the executor (`Outcome::Retry { after: Some(_) }`, e.g. an HTTP
/// `Retry-After`) replaces the backoff but is capped at `max_interval`.
pub(crate) fn decide(
    policy: &RetryPolicy,
    outcome: &Outcome,
    attempt: u32,
    elapsed: Duration,
    unit: f64,
) -> Verdict {
    match outcome {
        Outcome::Ok { .. } => Verdict::Ack,
        Outcome::Permanent { error } => Verdict::Dead { reason: format!("permanent failure: {error}") },
        Outcome::Retry { error, after } => {
            if attempt >= policy.max_attempts {
                return Verdict::Dead {
                    reason: format!(
                        "gave up after {attempt} attempts (max_attempts {}): {error}",
                        policy.max_attempts
                    ),
                };
            }
            if !policy.should_retry(attempt, elapsed) {
                return Verdict::Dead {
                    reason: format!(
                        "gave up after {attempt} attempts ({elapsed:?} elapsed, over max_elapsed): {error}"
                    ),
                };
            }
            let delay = match after {
                Some(after) => (*after).min(policy.max_interval),
                None => policy.delay_with(attempt, unit),
            };
            Verdict::Retry { delay }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            max_interval: Duration::from_millis(300),
            jitter: 0.5,
            max_elapsed: Some(Duration::from_secs(10)),
        }
    }

    fn retry() -> Outcome {
        Outcome::retry("boom")
    }

    #[test]
    fn success_acks_and_permanent_dies_at_once() {
        assert_eq!(decide(&policy(), &Outcome::ok(), 1, Duration::ZERO, 0.5), Verdict::Ack);
        assert!(matches!(
            decide(&policy(), &Outcome::permanent("bad"), 1, Duration::ZERO, 0.5),
            Verdict::Dead { .. }
        ));
    }

    #[test]
    fn delays_grow_within_the_jitter_bounds_and_stop_at_max_attempts() {
        let table = [(1, 0.0, 50), (1, 1.0, 150), (2, 0.0, 100), (2, 1.0, 300), (3, 0.5, 300)];
        for (attempt, unit, millis) in table {
            assert_eq!(
                decide(&policy(), &retry(), attempt, Duration::ZERO, unit),
                Verdict::Retry { delay: Duration::from_millis(millis) },
                "attempt {attempt} unit {unit}"
            );
        }
        assert!(matches!(decide(&policy(), &retry(), 4, Duration::ZERO, 0.5), Verdict::Dead { .. }));
    }

    #[test]
    fn max_elapsed_stops_retries() {
        let verdict = decide(&policy(), &retry(), 1, Duration::from_secs(11), 0.5);
        assert!(
            matches!(verdict, Verdict::Dead { ref reason } if reason.contains("max_elapsed")),
            "{verdict:?}"
        );
    }

    #[test]
    fn an_executor_delay_is_capped_at_max_interval() {
        let outcome = Outcome::Retry { error: "429".into(), after: Some(Duration::from_secs(60)) };
        assert_eq!(
            decide(&policy(), &outcome, 1, Duration::ZERO, 0.5),
            Verdict::Retry { delay: Duration::from_millis(300) }
        );
    }
}
