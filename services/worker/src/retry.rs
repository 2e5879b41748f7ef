//! The retry decision: from an attempt's outcome, the task's retry policy and the attempts
//! that failed before, how the delivery ends (succeeded, retrying after a delay, or failed for
//! good).

use std::time::Duration;

use jetsched_shared::spec::RetryPolicy;

use crate::ending::Ending;
use crate::executor::Outcome;

/// Decides after an attempt ended with `outcome`, `elapsed` after the first attempt started;
/// `attempt` is what `max_attempts` counts: the attempts that failed before, plus this one
/// (deliveries that never reached a verdict do not count). `unit` is a random number in `[0, 1)` picking the jitter.
///
/// A retry delay asked for by the executor (`Outcome::Retry { after: Some(_) }`, e.g. an HTTP
/// `Retry-After`) replaces the backoff but is capped at `max_interval`.
pub(crate) fn decide(
    policy: &RetryPolicy,
    outcome: Outcome,
    attempt: u32,
    elapsed: Duration,
    unit: f64,
) -> Ending {
    match outcome {
        Outcome::Ok { detail } => Ending::Succeeded { detail },
        Outcome::Permanent { error } => {
            Ending::Failed { reason: format!("permanent failure: {error}"), error, permanent: true }
        }
        Outcome::Retry { error, after } => {
            let gave_up = if attempt >= policy.max_attempts {
                Some(format!(
                    "gave up after {attempt} attempts (max_attempts {}): {error}",
                    policy.max_attempts
                ))
            } else if !policy.should_retry(attempt, elapsed) {
                Some(format!(
                    "gave up after {attempt} attempts ({elapsed:?} elapsed, over max_elapsed): {error}"
                ))
            } else {
                None
            };
            if let Some(reason) = gave_up {
                return Ending::Failed { error, permanent: false, reason };
            }
            let delay = match after {
                Some(after) => after.min(policy.max_interval),
                None => policy.delay_with(attempt, unit),
            };
            Ending::Retrying { error, delay }
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
        assert_eq!(
            decide(&policy(), Outcome::ok(), 1, Duration::ZERO, 0.5),
            Ending::Succeeded { detail: None }
        );
        assert_eq!(
            decide(&policy(), Outcome::permanent("bad"), 1, Duration::ZERO, 0.5),
            Ending::Failed { error: "bad".into(), permanent: true, reason: "permanent failure: bad".into() }
        );
    }

    #[test]
    fn delays_grow_within_the_jitter_bounds_and_stop_at_max_attempts() {
        let table = [(1, 0.0, 50), (1, 1.0, 150), (2, 0.0, 100), (2, 1.0, 300), (3, 0.5, 300)];
        for (attempt, unit, millis) in table {
            assert_eq!(
                decide(&policy(), retry(), attempt, Duration::ZERO, unit),
                Ending::Retrying { error: "boom".into(), delay: Duration::from_millis(millis) },
                "attempt {attempt} unit {unit}"
            );
        }
        assert!(matches!(
            decide(&policy(), retry(), 4, Duration::ZERO, 0.5),
            Ending::Failed { permanent: false, ref reason, .. } if reason.contains("max_attempts 4")
        ));
    }

    #[test]
    fn max_elapsed_stops_retries() {
        let ending = decide(&policy(), retry(), 1, Duration::from_secs(11), 0.5);
        assert!(
            matches!(ending, Ending::Failed { ref reason, .. } if reason.contains("max_elapsed")),
            "{ending:?}"
        );
    }

    #[test]
    fn an_executor_delay_is_capped_at_max_interval() {
        let outcome = Outcome::Retry { error: "429".into(), after: Some(Duration::from_secs(60)) };
        assert_eq!(
            decide(&policy(), outcome, 1, Duration::ZERO, 0.5),
            Ending::Retrying { error: "429".into(), delay: Duration::from_millis(300) }
        );
    }
}
