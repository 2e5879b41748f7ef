//! The life of one delivery up to its [`Ending`]: JetStream metadata and body (one that does
//! not decode, or names another run than its subject, is dead-lettered and never run), what the
//! run record says (run it, or a redelivery already decided), the attempt with progress acks,
//! and the retry policy's decision. [`crate::ending`] takes it from there.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use chrono::Utc;
use jetsched_shared::events::EventBatch;
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::trace;
use jetsched_shared::wire::{Dispatch, Event, EventKind};
use tracing::Instrument;

use crate::breaker::shortcut::{ATTEMPTS_SPENT, header_count};
use crate::breaker::{Admission, Gate};
use crate::config::RunRecords;
use crate::consumer::Shared;
use crate::dlq::{DeadLetter, disagreement, mismatched, undecodable};
use crate::ending::{Ending, Stored};
use crate::executor::Attempt;
use crate::retry::decide;
use crate::runs::Begin;
use crate::spans::{self, Propagated};

/// How long a run event that JetStream did not store is published again (a replicated events
/// stream refuses writes while it elects a new leader, e.g. after a node died) before it is
/// counted in `jetsched_events_failed_total` and logged.
const EVENT_RETRY_FOR: Duration = Duration::from_secs(15);

/// Handles one delivery from its metadata to its ending.
pub(crate) async fn process(shared: &Shared, queue: &str, message: jetstream::Message) {
    let (attempt, sequence) = match message.info() {
        Ok(info) => {
            // A run delayed by its breaker is a new message: it carries the attempts before.
            let spent = header_count(message.headers.as_ref(), ATTEMPTS_SPENT);
            let delivered = u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1);
            (delivered.saturating_add(spent), info.stream_sequence)
        }
        Err(error) => {
            shared.metrics.errors.with_label_values(&["message_info"]).inc();
            tracing::warn!(%error, "dispatch without JetStream metadata; ignored");
            return;
        }
    };
    let mut dispatch = match shared.dispatches.decode(&message.payload) {
        Ok(dispatch) => dispatch,
        Err(error) => {
            tracing::error!(%error, subject = %message.subject, "undecodable dispatch: dead-lettering it");
            let entry = undecodable(
                &shared.names,
                &message.subject,
                &message.payload,
                &error,
                &shared.worker,
                sequence,
            );
            refuse(shared, &message, &entry).await;
            return;
        }
    };
    // The subject is what the publisher's permissions were checked against: a body naming
    // another run (another namespace's task, say) is not run under it.
    if let Some(reason) = disagreement(&shared.names, &message.subject, &dispatch) {
        tracing::error!(subject = %message.subject, reason, "dispatch subject and body disagree: dead-lettering it");
        let entry = mismatched(
            &shared.names,
            &message.subject,
            &message.payload,
            &dispatch,
            reason,
            &shared.worker,
            sequence,
        );
        refuse(shared, &message, &entry).await;
        return;
    }
    dispatch.trace_id = trace::trace_id_in(message.headers.as_ref());
    let span = spans::run(&dispatch, attempt, &message.subject, message.headers.as_ref());
    let delivery = Delivery {
        shared,
        queue,
        message: &message,
        dispatch: &dispatch,
        attempt,
        sequence,
        stored: None,
        elapsed: None,
        gate: None,
        events: shared.events.batch(),
    };
    delivery.deliver().instrument(span).await;
}

/// Ends a delivery that is not run: its dead letter stored (awaiting the stream's ack, counted
/// by source), then the message terminated; handed back for later when the entry is not stored.
async fn refuse(shared: &Shared, message: &jetstream::Message, entry: &DeadLetter) {
    let answer = match Box::pin(shared.store_dead_letter(entry)).await {
        Ok(()) => AckKind::Term,
        Err(_) => AckKind::Nak(Some(shared.dlq_retry_delay)),
    };
    acknowledge(shared, message, answer).await;
}

/// One delivery being handled: the message, what it carries, the run record as last stored,
/// and the events told about it.
pub(crate) struct Delivery<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) queue: &'a str,
    pub(crate) message: &'a jetstream::Message,
    pub(crate) dispatch: &'a Dispatch,
    /// The attempt number (1-based): the delivery count, plus the attempts made before a
    /// delay by the breaker.
    pub(crate) attempt: u32,
    /// The dispatch message's stream sequence.
    pub(crate) sequence: u64,
    /// The run record as last stored, once the record store has answered.
    pub(crate) stored: Option<Stored>,
    /// How long the attempt ran, if it ran.
    pub(crate) elapsed: Option<Duration>,
    /// The breaker's admission of this delivery, if the task has a breaker.
    gate: Option<Gate>,
    /// The run events told so far, their acknowledgements awaited at the end.
    events: EventBatch<'a>,
}

impl Delivery<'_> {
    async fn deliver(mut self) {
        if let Some(gate) = self.shared.breakers.admit(self.dispatch).await {
            if gate.admission == Admission::ShortCircuit {
                self.short_circuit(&gate).await;
                self.events.flush(EVENT_RETRY_FOR, &self.shared.hard_stop).await;
                return;
            }
            self.gate = Some(gate);
        }
        let ending = self.run().await;
        self.conclude(ending).await;
        self.events.flush(EVENT_RETRY_FOR, &self.shared.hard_stop).await;
    }

    /// Everything before the ending: the run record's say, then the attempt.
    async fn run(&mut self) -> Ending {
        let (shared, dispatch, attempt) = (self.shared, self.dispatch, self.attempt);
        // Recorded before the attempt: always under eager records; for a task whose overlap
        // policy the scheduler checks against running records; and under deferred records, a
        // redelivery (its run is known to have been tried: a crash loop is recorded attempt
        // by attempt from the second on).
        let eager = match shared.run_records {
            RunRecords::Eager => true,
            RunRecords::Deferred => attempt > 1,
            RunRecords::Lazy => false,
        } || dispatch.spec.overlap != OverlapPolicy::Allow;
        let (stored, rerun) = match shared.runs.begin(dispatch, attempt, &shared.worker, eager).await {
            Ok(Begin::Run { record, revision, rerun }) => (Stored { record: *record, revision }, rerun),
            Ok(Begin::AlreadySucceeded) => return Ending::Duplicate,
            Ok(Begin::AlreadyDead) => return Ending::AlreadyDead,
            Ok(Begin::DeadLetterPending { record, revision }) => {
                let error = record.error.as_deref().unwrap_or_default();
                let reason = format!("failed for good after {} attempts: {error}", record.attempt);
                self.stored = Some(Stored { record: *record, revision });
                return Ending::DeadLetterPending { reason };
            }
            Err(error) => {
                // Without a record the run cannot be recognised later: do not run, retry soon.
                shared.metrics.errors.with_label_values(&["run_record"]).inc();
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
        let defer = shared.run_records == RunRecords::Deferred && stored.revision == 0;
        self.stored = Some(stored);
        if rerun {
            shared.metrics.reruns.with_label_values(&[self.queue]).inc();
            tracing::warn!("the previous attempt never reached a verdict (worker lost): running again");
            let mut event = self.event(EventKind::RunRetrying, attempt);
            event.reason = Some("worker_lost".to_string());
            self.tell(event).await;
        }
        let started_at = Utc::now();
        if !defer {
            self.tell(self.event(EventKind::RunStarted, attempt)).await;
        }

        shared.metrics.in_flight.inc();
        let started = Instant::now();
        let outcome = {
            let message = self.message;
            let trace = Propagated::from_headers(message.headers.as_ref());
            let run = Attempt { dispatch, attempt, cancel: shared.hard_stop.child_token(), trace };
            let mut execution = pin!(shared.executors.execute(&run));
            let stopped = shared.hard_stop.cancelled();
            let execution = pin!(async {
                tokio::select! {
                    biased;
                    outcome = &mut execution => Some(outcome),
                    _ = stopped => None,
                }
            });
            let after = defer.then_some(shared.running_after);
            let recorded = pin!(alongside(execution, after, || self.record_running(started_at)));
            keeping_alive(shared, message, recorded).await
        };
        let elapsed = started.elapsed();
        self.elapsed = Some(elapsed);
        shared.metrics.in_flight.dec();
        shared
            .metrics
            .duration
            .with_label_values(&[self.queue, dispatch.spec.executor.kind()])
            .observe(elapsed.as_secs_f64());
        let Some(outcome) = outcome else {
            return Ending::Interrupted;
        };
        let since_first = (Utc::now() - first_started).to_std().unwrap_or_default();
        let ending = decide(&dispatch.spec.retry, outcome, tries, since_first, rand::random::<f64>());
        if let Some(gate) = &self.gate {
            let failed = matches!(ending, Ending::Retrying { .. } | Ending::Failed { .. });
            shared.breakers.report(gate, failed).await;
        }
        ending
    }

    /// A deferred record of a run still running is stored (status running), and the run's
    /// start told, as of `started_at`. A write that fails is left to the verdict (counted).
    async fn record_running(&mut self, started_at: chrono::DateTime<Utc>) {
        let Some(stored) = self.stored.as_mut() else { return };
        match self.shared.runs.create(&stored.record).await {
            Ok(Some(revision)) => stored.revision = revision,
            Ok(None) => tracing::debug!("a record of the run exists already; the verdict resolves it"),
            Err(error) => {
                self.shared.metrics.errors.with_label_values(&["run_record"]).inc();
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

    /// Publishes a run event, if the worker tells events of its kind (`--run-events`).
    pub(crate) async fn tell(&mut self, event: Event) {
        if self.shared.run_events.wants(event.kind) {
            self.events.emit(event).await;
        }
    }

    /// A run event of `kind` about this delivery (attempt `attempt`).
    pub(crate) fn event(&self, kind: EventKind, attempt: u32) -> Event {
        let dispatch = self.dispatch;
        Event {
            execution_id: Some(dispatch.execution_id.clone()),
            nominal_time: Some(dispatch.nominal_time),
            trigger: Some(dispatch.trigger),
            attempt: Some(attempt),
            worker: Some(self.shared.worker.clone()),
            revision: Some(dispatch.revision),
            trace_id: dispatch.trace_id.clone(),
            ..Event::new(kind, &dispatch.namespace, &dispatch.task_id)
        }
    }
}

impl Shared {
    /// Stores a dead letter (awaiting the stream's ack) and counts it by source. A refusal is
    /// counted and logged here, and returned: then the caller must not `Term`.
    pub(crate) async fn store_dead_letter(&self, entry: &DeadLetter) -> anyhow::Result<()> {
        match self.dlq.publish(entry).await {
            Ok(()) => {
                self.metrics.dead_letters.with_label_values(&[entry.source.as_str()]).inc();
                Ok(())
            }
            Err(error) => {
                self.metrics.dlq_rejected.inc();
                tracing::error!(
                    error = format!("{error:#}"),
                    "the dead-letter stream refused the entry; retrying later"
                );
                Err(error)
            }
        }
    }
}

/// Acknowledges the dispatch message (`Ack`, `Nak`, `Term` or `Progress`); a failure is logged
/// and counted (the server redelivers after ack_wait).
pub(crate) async fn acknowledge(shared: &Shared, message: &jetstream::Message, kind: AckKind) {
    if let Err(error) = message.ack_with(kind).await {
        shared.metrics.errors.with_label_values(&["ack"]).inc();
        tracing::warn!(%error, "acknowledge dispatch");
    }
}

/// Runs `work` while telling the server the delivery is still being handled (progress acks
/// every `progress_interval`), so neither a long execution nor a record write retried through
/// a node failure outlives `ack_wait` and hands the run to another worker.
///
/// `work` is pinned by the caller and lent, here and in [`alongside`]: a future taken by value
/// lives twice in the state of the function taking it (as the argument and as the local it is
/// pinned in), and a delivery's state machine, copied whole at each level, grew to 25 KB.
pub(crate) async fn keeping_alive<T>(
    shared: &Shared,
    message: &jetstream::Message,
    mut work: Pin<&mut impl Future<Output = T>>,
) -> T {
    let period = shared.progress_interval;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            _ = progress.tick() => acknowledge(shared, message, AckKind::Progress).await,
        }
    }
}

/// Runs `work`; if it is still running `after` (when given), runs `action` alongside it, and
/// finishes an `action` under way when `work` ends, so nothing it began is left half done.
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
