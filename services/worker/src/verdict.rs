//! The verdict on a delivery, as pure functions: an attempt's [`Outcome`], the retry policy's
//! decision ([`decide`]) on how the delivery ends ([`Ending`]), and what each ending does
//! ([`plan`]: how the attempt is closed in its run record, what is counted and told, how the
//! message is answered). No I/O and no clock: the caller passes the time elapsed and the jitter.

use std::time::Duration;

use jetsched_shared::spec::RetryPolicy;
use jetsched_shared::wire::{AttemptOutcome, EventKind, RunStatus};

/// When a run whose record could not be written (before its attempt, or at its verdict) is
/// delivered again.
pub(crate) const RECORD_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How an attempt ended. Encodes the ack decision: `Ok` → ack; `Retry` → `Nak` with the
/// backoff delay (or `after`, capped at the policy's `max_interval`) while attempts remain;
/// `Permanent` → dead letter, then `Term`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Succeeded. `result`: what the run returned (a response body, a reply, standard output,
    /// a handler's value), kept with its record when the task keeps results.
    Ok {
        detail: Option<String>,
        result: Option<Vec<u8>>,
    },
    Retry {
        error: String,
        after: Option<Duration>,
    },
    Permanent {
        error: String,
    },
}

impl Outcome {
    pub fn ok() -> Outcome {
        Outcome::Ok { detail: None, result: None }
    }

    /// Succeeded, returning `result`: kept with the run's record (at most 4 KiB of JSON) when
    /// the task says `keep_result`, and handed to the task's children.
    pub fn ok_with_result(result: &serde_json::Value) -> Outcome {
        Outcome::Ok { detail: None, result: serde_json::to_vec(result).ok() }
    }

    pub fn retry(error: impl Into<String>) -> Outcome {
        Outcome::Retry { error: error.into(), after: None }
    }

    pub fn permanent(error: impl Into<String>) -> Outcome {
        Outcome::Permanent { error: error.into() }
    }
}

/// How a delivery ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// The attempt succeeded.
    Succeeded { detail: Option<String>, result: Option<Vec<u8>> },
    /// A retryable failure with attempts left: delivered again after `delay`.
    Retrying { error: String, delay: Duration },
    /// A permanent failure (`permanent`) or retries exhausted: dead-lettered.
    Failed { error: String, permanent: bool, reason: String },
    /// The shutdown grace period ran out mid-attempt: handed back at once to another worker.
    Interrupted,
    /// A redelivery of a run that already succeeded: not run again.
    Duplicate,
    /// A redelivery of a run already in the dead-letter stream.
    AlreadyDead,
    /// A final failure whose dead letter was refused earlier: stored now, not run again.
    DeadLetterPending { reason: String },
    /// The run record could not be written: not run, delivered again shortly.
    Unrecorded,
    /// The run was cancelled while its attempt ran (or as it was about to run): the attempt
    /// stopped, the run ends `cancelled`, never retried nor dead-lettered.
    Cancelled { reason: String },
    /// A redelivery of a run already cancelled: not run.
    AlreadyCancelled,
}

impl Ending {
    /// Whether the attempt failed (retryable or not), as the breaker counts it.
    pub(crate) fn attempt_failed(&self) -> bool {
        matches!(self, Ending::Retrying { .. } | Ending::Failed { .. })
    }

    /// How the run ended for good, as auto-pause counts it: `Some(true)` failed, `Some(false)`
    /// succeeded (resets the count), `None` not ended for good by this delivery.
    pub(crate) fn run_failed(&self) -> Option<bool> {
        match self {
            Ending::Succeeded { .. } => Some(false),
            Ending::Failed { .. } => Some(true),
            _ => None,
        }
    }

    /// The texts the ending carries.
    pub(crate) fn into_texts(self) -> Texts {
        match self {
            Ending::Succeeded { detail, .. } => Texts { detail, ..Texts::default() },
            Ending::Retrying { error, delay } => Texts {
                error: Some(error),
                reason: Some(format!("retry in {} ms", delay.as_millis())),
                ..Texts::default()
            },
            Ending::Failed { error, reason, .. } => {
                Texts { error: Some(error), reason: Some(reason), ..Texts::default() }
            }
            Ending::Interrupted => {
                Texts { error: Some("interrupted: the worker shut down".to_string()), ..Texts::default() }
            }
            Ending::DeadLetterPending { reason } | Ending::Cancelled { reason } => {
                Texts { reason: Some(reason), ..Texts::default() }
            }
            Ending::Duplicate | Ending::AlreadyDead | Ending::Unrecorded | Ending::AlreadyCancelled => {
                Texts::default()
            }
        }
    }

    /// What a succeeded run returned, taken out of the ending.
    pub(crate) fn take_result(&mut self) -> Option<Vec<u8>> {
        match self {
            Ending::Succeeded { result, .. } => result.take(),
            _ => None,
        }
    }

    /// The ending's name (the `jetsched.outcome` of the run span).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Ending::Succeeded { .. } => "succeeded",
            Ending::Retrying { .. } => "retrying",
            Ending::Failed { .. } => "failed",
            Ending::Interrupted => "interrupted",
            Ending::Duplicate => "duplicate",
            Ending::AlreadyDead => "already_dead",
            Ending::DeadLetterPending { .. } => "dead_letter_pending",
            Ending::Unrecorded => "unrecorded",
            Ending::Cancelled { .. } => "cancelled",
            Ending::AlreadyCancelled => "already_cancelled",
        }
    }
}

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
        Outcome::Ok { detail, result } => Ending::Succeeded { detail, result },
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

/// How the dispatch message is answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Answer {
    Ack,
    Nak(Option<Duration>),
    Term,
    /// Store the dead letter, then `Term` (`Nak` after `--dlq-retry-delay` when refused, or
    /// after [`RECORD_RETRY_DELAY`] when the record of the failure could not be written).
    DeadLetter,
}

/// What an ending does, its texts aside.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    /// How the attempt is closed in the run record (endings of an attempt that ran).
    pub(crate) close: Option<(AttemptOutcome, RunStatus)>,
    /// The `outcome` label counted in `jetsched_worker_runs_total`.
    pub(crate) counted: Option<&'static str>,
    /// The run event told.
    pub(crate) event: Option<EventKind>,
    pub(crate) answer: Answer,
}

/// What `ending` does, its texts aside.
pub(crate) fn plan(ending: &Ending) -> Plan {
    use AttemptOutcome as Attempt;
    let (close, counted, event, answer) = match ending {
        Ending::Succeeded { .. } => (
            Some((Attempt::Succeeded, RunStatus::Succeeded)),
            Some("succeeded"),
            Some(EventKind::RunSucceeded),
            Answer::Ack,
        ),
        Ending::Retrying { delay, .. } => (
            Some((Attempt::Failed, RunStatus::Retrying)),
            Some("retried"),
            Some(EventKind::RunRetrying),
            Answer::Nak(Some(*delay)),
        ),
        Ending::Failed { permanent, .. } => (
            Some((if *permanent { Attempt::Permanent } else { Attempt::Failed }, RunStatus::Failed)),
            Some("failed"),
            Some(EventKind::RunFailed),
            Answer::DeadLetter,
        ),
        Ending::Interrupted => {
            (Some((Attempt::Interrupted, RunStatus::Retrying)), Some("interrupted"), None, Answer::Nak(None))
        }
        Ending::Duplicate => (None, Some("duplicate"), None, Answer::Ack),
        Ending::AlreadyDead => (None, None, None, Answer::Term),
        Ending::DeadLetterPending { .. } => (None, None, None, Answer::DeadLetter),
        Ending::Unrecorded => (None, None, None, Answer::Nak(Some(RECORD_RETRY_DELAY))),
        Ending::Cancelled { .. } => (
            Some((Attempt::Cancelled, RunStatus::Cancelled)),
            Some("cancelled"),
            Some(EventKind::RunCancelled),
            Answer::Ack,
        ),
        Ending::AlreadyCancelled => (None, None, None, Answer::Ack),
    };
    Plan { close, counted, event, answer }
}

/// The texts an ending carries: the attempt's error and detail, and the reason told in the
/// event and the dead letter.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Texts {
    pub(crate) error: Option<String>,
    pub(crate) detail: Option<String>,
    pub(crate) reason: Option<String>,
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
            Ending::Succeeded { detail: None, result: None }
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

    #[test]
    fn each_ending_has_one_plan() {
        use AttemptOutcome as A;
        let second = Duration::from_secs(1);
        let failed = |permanent| Ending::Failed { error: "e".into(), permanent, reason: "r".into() };
        let table = [
            (
                Ending::Succeeded { detail: None, result: None },
                Some((A::Succeeded, RunStatus::Succeeded)),
                Some("succeeded"),
                Some(EventKind::RunSucceeded),
                Answer::Ack,
            ),
            (
                Ending::Retrying { error: "e".into(), delay: second },
                Some((A::Failed, RunStatus::Retrying)),
                Some("retried"),
                Some(EventKind::RunRetrying),
                Answer::Nak(Some(second)),
            ),
            (
                failed(true),
                Some((A::Permanent, RunStatus::Failed)),
                Some("failed"),
                Some(EventKind::RunFailed),
                Answer::DeadLetter,
            ),
            (
                failed(false),
                Some((A::Failed, RunStatus::Failed)),
                Some("failed"),
                Some(EventKind::RunFailed),
                Answer::DeadLetter,
            ),
            (
                Ending::Interrupted,
                Some((A::Interrupted, RunStatus::Retrying)),
                Some("interrupted"),
                None,
                Answer::Nak(None),
            ),
            (Ending::Duplicate, None, Some("duplicate"), None, Answer::Ack),
            (Ending::AlreadyDead, None, None, None, Answer::Term),
            (Ending::DeadLetterPending { reason: "r".into() }, None, None, None, Answer::DeadLetter),
            (Ending::Unrecorded, None, None, None, Answer::Nak(Some(RECORD_RETRY_DELAY))),
            (
                Ending::Cancelled { reason: "r".into() },
                Some((A::Cancelled, RunStatus::Cancelled)),
                Some("cancelled"),
                Some(EventKind::RunCancelled),
                Answer::Ack,
            ),
            (Ending::AlreadyCancelled, None, None, None, Answer::Ack),
        ];
        for (ending, close, counted, event, answer) in table {
            assert_eq!(plan(&ending), Plan { close, counted, event, answer }, "{ending:?}");
        }
    }

    #[test]
    fn texts_go_where_the_ending_says() {
        let retrying = Ending::Retrying { error: "boom".into(), delay: Duration::from_millis(250) };
        assert_eq!(
            retrying.into_texts(),
            Texts { error: Some("boom".into()), detail: None, reason: Some("retry in 250 ms".into()) }
        );
        let failed =
            Ending::Failed { error: "bad".into(), permanent: true, reason: "permanent failure: bad".into() };
        assert_eq!(failed.into_texts().reason.as_deref(), Some("permanent failure: bad"));
        assert_eq!(
            Ending::Succeeded { detail: Some("HTTP 200".into()), result: None }
                .into_texts()
                .detail
                .as_deref(),
            Some("HTTP 200")
        );
        assert!(Ending::Interrupted.into_texts().error.is_some_and(|e| e.contains("shut down")));
        assert_eq!(Ending::Duplicate.into_texts(), Texts::default());
    }
}
