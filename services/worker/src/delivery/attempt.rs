//! A delivery up to its verdict: the run record's say (run it, or a redelivery already
//! decided), the attempt under progress acks (its deferred record written if it runs long),
//! and the retry policy's decision ([`crate::verdict::decide`]).

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::{Duration, Instant};

use chrono::Utc;
use jetsched_shared::wire::EventKind;

use super::state::Delivery;
use crate::executor::Attempt;
use crate::runs::{Begin, Stored};
use crate::spans::Propagated;
use crate::verdict::{Ending, Outcome, decide};

impl Delivery<'_> {
    /// Everything before the ending: the run record's say, then the attempt.
    pub(super) async fn run(&mut self) -> Ending {
        let (parts, dispatch, attempt) = (self.parts, self.dispatch, self.attempt);
        let eager = parts.recording.before_attempt(dispatch, attempt);
        let (stored, rerun) = match parts.runs.begin(dispatch, attempt, &parts.worker, eager).await {
            Ok(Begin::Run { record, revision, rerun }) => (Stored { record: *record, revision }, rerun),
            Ok(Begin::AlreadySucceeded) => return Ending::Duplicate,
            Ok(Begin::AlreadyDead) => return Ending::AlreadyDead,
            Ok(Begin::AlreadyCancelled) => return Ending::AlreadyCancelled,
            Ok(Begin::DeadLetterPending { record, revision }) => {
                let error = record.error.as_deref().unwrap_or_default();
                let reason = format!("failed for good after {} attempts: {error}", record.attempt);
                self.stored = Some(Stored { record: *record, revision });
                return Ending::DeadLetterPending { reason };
            }
            Err(error) => {
                // Without a record the run cannot be recognised later: do not run, retry soon.
                parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot write the run record; handing the run back"
                );
                return Ending::Unrecorded;
            }
        };
        let first_started = stored.record.first_started;
        // Counted against `max_attempts`: the failed attempts before, and this one.
        let tries = stored.record.failures.saturating_add(1);
        // Deferred: a record not stored yet is stored (and the start told) once the attempt
        // has run `--running-after`; a shorter run's verdict writes it.
        let deferred = parts.recording.while_running(&stored);
        self.stored = Some(stored);
        if rerun {
            parts.metrics.reruns.with_label_values(&[self.queue]).inc();
            tracing::warn!("the previous attempt never reached a verdict (worker lost): running again");
            let mut event = self.event(EventKind::RunRetrying, attempt);
            event.reason = Some("worker_lost".to_string());
            self.tell(event).await;
        }
        let started_at = Utc::now();
        if deferred.is_none() {
            self.tell(self.event(EventKind::RunStarted, attempt)).await;
        }

        // Registered before it runs: a cancel of the run, now or while it runs, fires its token.
        let running = parts.cancels.register(&dispatch.execution_id, &parts.hard_stop);
        parts.metrics.in_flight.inc();
        let started = Instant::now();
        let outcome = {
            let received = self.received;
            let trace = Propagated::of_dispatch(&received.trace);
            let run = Attempt { dispatch, attempt, cancel: running.token.clone(), trace };
            let mut execution = pin!(parts.executors.execute(&run));
            let stopped = parts.hard_stop.cancelled();
            let execution = pin!(async {
                tokio::select! {
                    biased;
                    outcome = &mut execution => Some(outcome),
                    _ = stopped => None,
                }
            });
            let recorded = pin!(alongside(execution, deferred, || self.record_running(started_at)));
            parts.answers.keeping_alive(&received.message, recorded).await
        };
        let elapsed = started.elapsed();
        self.elapsed = Some(elapsed);
        parts.metrics.in_flight.dec();
        parts
            .metrics
            .duration
            .with_label_values(&[self.queue, dispatch.spec.executor.kind()])
            .observe(elapsed.as_secs_f64());
        let Some(outcome) = outcome else {
            return Ending::Interrupted;
        };
        // Stopped by its cancel (not by the shutdown): the run ends cancelled, unless the
        // attempt had succeeded before it heard of it.
        let cancelled = running.token.is_cancelled() && !parts.hard_stop.is_cancelled();
        drop(running);
        if cancelled && !matches!(outcome, Outcome::Ok { .. }) {
            let reason =
                parts.cancels.reason(&dispatch.execution_id).unwrap_or_else(|| "cancelled".to_string());
            return Ending::Cancelled { reason };
        }
        let since_first = (Utc::now() - first_started).to_std().unwrap_or_default();
        let ending = decide(&dispatch.spec.retry, outcome, tries, since_first, rand::random::<f64>());
        if let Some(gate) = &self.gate {
            parts.breakers.report(gate, ending.attempt_failed()).await;
        }
        ending
    }

    /// A deferred record of a run still running is stored (status running), and the run's
    /// start told, as of `started_at`. A write that fails is left to the verdict (counted).
    async fn record_running(&mut self, started_at: chrono::DateTime<Utc>) {
        let Some(stored) = self.stored.as_mut() else { return };
        match self.parts.runs.create(&stored.record).await {
            Ok(Some(revision)) => stored.revision = revision,
            Ok(None) => tracing::debug!("a record of the run exists already; the verdict resolves it"),
            Err(error) => {
                self.parts.metrics.errors.with_label_values(&["run_record"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot write the record of a running run; the verdict writes it"
                );
                return;
            }
        }
        let mut event = self.event(EventKind::RunStarted, self.attempt);
        event.time = started_at;
        self.tell(event).await;
    }
}

/// Runs `work`; if it is still running `after` (when given), runs `action` alongside it, and
/// finishes an `action` under way when `work` ends, so nothing it began is left half done.
///
/// `work` is pinned by the caller and lent (see [`crate::message::Answers::keeping_alive`]).
async fn alongside<T, A: Future<Output = ()>>(
    mut work: Pin<&mut impl Future<Output = T>>,
    after: Option<Duration>,
    action: impl FnOnce() -> A,
) -> T {
    let Some(after) = after else { return work.await };
    tokio::select! {
        biased;
        out = &mut work => return out,
        () = tokio::time::sleep(after) => {}
    }
    let action = action();
    tokio::pin!(action);
    let mut done = false;
    let out = loop {
        tokio::select! {
            biased;
            out = &mut work => break out,
            () = &mut action, if !done => done = true,
        }
    };
    if !done {
        action.await;
    }
    out
}
