//! The pull loop of one queue and the life of one delivery: run record, execution with
//! progress acks, verdict (ack, delayed Nak, dead letter then Term), events and metrics.
//!
//! Back-pressure: a concurrency permit is taken before each pull, and a pull asks for exactly
//! as many messages as permits are held, so no message waits in a client buffer while its
//! ack_wait runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, context::PublishAckFuture};
use chrono::Utc;
use futures::StreamExt;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::wire::{Dispatch, Event, EventKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::{RunEvents, RunRecords};
use crate::dlq::{DeadLetter, DeadLetterSource, DeadLetters, undecodable};
use crate::executor::{Attempt, Executors, Outcome};
use crate::metrics::Metrics;
use crate::retry::{Verdict, decide};
use crate::runs::{AttemptOutcome, Begin, RunRecord, RunStatus, RunStore};

/// Everything a delivery needs, shared by the pull loops and run tasks.
pub(crate) struct Shared {
    pub(crate) names: Names,
    pub(crate) worker: String,
    pub(crate) runs: RunStore,
    pub(crate) dlq: DeadLetters,
    pub(crate) events: EventPublisher,
    pub(crate) executors: Executors,
    pub(crate) metrics: Metrics,
    pub(crate) progress_interval: Duration,
    pub(crate) dlq_retry_delay: Duration,
    pub(crate) run_events: RunEvents,
    pub(crate) run_records: RunRecords,
    /// Cancelled when the shutdown grace period is over: in-flight attempts stop and are
    /// handed back.
    pub(crate) hard_stop: CancellationToken,
}

/// Pull settings of a queue loop.
pub(crate) struct Pull {
    pub(crate) queue: String,
    pub(crate) consumer: PullConsumer,
    pub(crate) max_batch: usize,
    pub(crate) expires: Duration,
}

/// Pull requests one queue loop keeps outstanding at once. Two, so freed permits are put back
/// to work while the previous batch is still being filled; not more, so that under load
/// permits accumulate into larger batches: with 8, no-op runs averaged 4.5 messages per pull
/// and the server spent a sixth of its CPU on pull requests (2: 13 per pull, 17% more runs/s).
const MAX_OUTSTANDING_PULLS: usize = 2;

/// How long a run event that JetStream did not store is published again (a replicated events
/// stream refuses writes while it elects a new leader, e.g. after a node died) before it is
/// counted in `jetsched_worker_errors_total{what="event"}` and logged.
const EVENT_RETRY_FOR: Duration = Duration::from_secs(15);

/// Pulls and starts runs until `shutdown`; runs are spawned on `tracker`.
pub(crate) async fn run_queue(
    shared: Arc<Shared>,
    pull: Pull,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let queue: Arc<str> = Arc::from(pull.queue.as_str());
    let pulls = Arc::new(Semaphore::new(MAX_OUTSTANDING_PULLS));
    let batches = TaskTracker::new();
    let mut failures = 0u32;
    loop {
        let slot = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            slot = pulls.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let mut held: Vec<OwnedSemaphorePermit> = vec![first];
        while held.len() < pull.max_batch {
            match permits.clone().try_acquire_owned() {
                Ok(permit) => held.push(permit),
                Err(_) => break,
            }
        }
        let batch = pull.consumer.batch().max_messages(held.len()).expires(pull.expires).messages().await;
        let batch = match batch {
            Ok(batch) => {
                failures = 0;
                batch
            }
            Err(error) => {
                failures += 1;
                shared.metrics.errors.with_label_values(&["pull"]).inc();
                tracing::warn!(%error, queue = %queue, "pull request failed");
                drop(held);
                let delay = Duration::from_millis(100 * 2u64.pow(failures.min(6)));
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let reader = BatchReader {
            shared: shared.clone(),
            queue: queue.clone(),
            tracker: tracker.clone(),
            shutdown: shutdown.clone(),
        };
        batches.spawn(async move {
            let _slot = slot;
            reader.read(batch, held).await;
        });
    }
    batches.close();
    batches.wait().await;
}

/// Starts a run for each message of one pull batch, with the permits taken for it.
struct BatchReader {
    shared: Arc<Shared>,
    queue: Arc<str>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl BatchReader {
    async fn read(self, mut batch: jetstream::consumer::pull::Batch, mut held: Vec<OwnedSemaphorePermit>) {
        // Read the batch to its end even after shutdown: what arrives then is handed back at
        // once (Nak), not left to wait for ack_wait.
        while let Some(message) = batch.next().await {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    self.shared.metrics.errors.with_label_values(&["pull"]).inc();
                    tracing::warn!(%error, queue = %self.queue, "pull stream error");
                    continue;
                }
            };
            if self.shutdown.is_cancelled() {
                if let Err(error) = message.ack_with(AckKind::Nak(None)).await {
                    tracing::warn!(%error, "hand back a run at shutdown");
                }
                continue;
            }
            let Some(permit) = held.pop() else {
                // The server never sends more than asked; be safe anyway.
                let _ = message.ack_with(AckKind::Nak(None)).await;
                continue;
            };
            let shared = self.shared.clone();
            let queue = self.queue.clone();
            self.tracker.spawn(async move {
                let _permit = permit;
                // Boxed: a delivery's state machine is kilobytes, and an unboxed one was
                // copied several times per spawn (half of the 11% of a worker's CPU spent in memmove).
                Box::pin(process(&shared, &queue, message)).await;
            });
        }
    }
}

/// Event acks awaited together at the end of a delivery (publishing is pipelined); an event
/// that was not stored is published again for up to [`EVENT_RETRY_FOR`].
struct Emitter<'a> {
    events: &'a EventPublisher,
    wanted: RunEvents,
    metrics: &'a Metrics,
    pending: Vec<(Event, PublishAckFuture)>,
    unsent: Vec<Event>,
    /// The worker's hard stop: retrying ends with it.
    stop: &'a CancellationToken,
}

impl Emitter<'_> {
    async fn emit(&mut self, event: Event) {
        if !self.wanted.wants(event.kind) {
            return;
        }
        match self.events.send(&event).await {
            Ok(ack) => self.pending.push((event, ack)),
            Err(error) => {
                tracing::debug!(
                    error = format!("{error:#}"),
                    kind = event.kind.as_str(),
                    "event not sent yet"
                );
                self.unsent.push(event);
            }
        }
    }

    async fn flush(self) {
        let mut unsent = self.unsent;
        for (event, ack) in self.pending {
            if let Err(error) = ack.await {
                tracing::debug!(%error, kind = event.kind.as_str(), "event not stored yet");
                unsent.push(event);
            }
        }
        if unsent.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + EVENT_RETRY_FOR;
        for event in unsent {
            let stored = tokio::select! {
                stored = self.events.store_until(&event, None, deadline) => stored,
                _ = self.stop.cancelled() => Err(anyhow::anyhow!("the worker is stopping")),
            };
            if let Err(error) = stored {
                self.metrics.errors.with_label_values(&["event"]).inc();
                tracing::warn!(error = format!("{error:#}"), kind = event.kind.as_str(), "event not stored");
            }
        }
    }
}

fn run_event(kind: EventKind, dispatch: &Dispatch, attempt: u32, worker: &str) -> Event {
    Event {
        execution_id: Some(dispatch.execution_id.clone()),
        nominal_time: Some(dispatch.nominal_time),
        trigger: Some(dispatch.trigger),
        attempt: Some(attempt),
        worker: Some(worker.to_string()),
        revision: Some(dispatch.revision),
        ..Event::new(kind, &dispatch.namespace, &dispatch.task_id)
    }
}

async fn settle(shared: &Shared, message: &jetstream::Message, kind: AckKind) {
    if let Err(error) = message.ack_with(kind).await {
        shared.metrics.errors.with_label_values(&["ack"]).inc();
        tracing::warn!(%error, "acknowledge dispatch");
    }
}

/// Handles one delivery from start to verdict.
pub(crate) async fn process(shared: &Shared, queue: &str, message: jetstream::Message) {
    let (attempt, sequence) = match message.info() {
        Ok(info) => {
            shared
                .metrics
                .queue_pending
                .with_label_values(&[queue])
                .set(i64::try_from(info.pending).unwrap_or(i64::MAX));
            (u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1), info.stream_sequence)
        }
        Err(error) => {
            shared.metrics.errors.with_label_values(&["message_info"]).inc();
            tracing::warn!(%error, "dispatch without JetStream metadata; ignored");
            return;
        }
    };
    let dispatch: Dispatch = match serde_json::from_slice(&message.payload) {
        Ok(dispatch) => dispatch,
        Err(error) => {
            let entry = undecodable(
                &shared.names,
                &message.subject,
                &message.payload,
                &error,
                &shared.worker,
                sequence,
            );
            tracing::error!(%error, subject = %message.subject, "undecodable dispatch: dead-lettering it");
            match Box::pin(shared.dlq.publish(&entry)).await {
                Ok(()) => {
                    shared
                        .metrics
                        .dead_letters
                        .with_label_values(&[DeadLetterSource::Undecodable.as_str()])
                        .inc();
                    settle(shared, &message, AckKind::Term).await;
                }
                Err(error) => {
                    shared.metrics.dlq_rejected.inc();
                    tracing::error!(error = format!("{error:#}"), "dead letter refused; retrying later");
                    settle(shared, &message, AckKind::Nak(Some(shared.dlq_retry_delay))).await;
                }
            }
            return;
        }
    };
    let span = tracing::info_span!(
        "run",
        namespace = %dispatch.namespace,
        task = %dispatch.task_id,
        execution = %dispatch.execution_id,
        attempt
    );
    deliver(shared, queue, &message, &dispatch, attempt, sequence).instrument(span).await;
}

async fn deliver(
    shared: &Shared,
    queue: &str,
    message: &jetstream::Message,
    dispatch: &Dispatch,
    attempt: u32,
    sequence: u64,
) {
    let mut emitter = Emitter {
        events: &shared.events,
        wanted: shared.run_events,
        metrics: &shared.metrics,
        pending: Vec::new(),
        unsent: Vec::new(),
        stop: &shared.hard_stop,
    };
    let eager = shared.run_records == RunRecords::Eager || dispatch.spec.overlap != OverlapPolicy::Allow;
    let begin = match shared.runs.begin(dispatch, attempt, &shared.worker, eager).await {
        Ok(begin) => begin,
        Err(error) => {
            // Without a record the run cannot be recognised later: do not run, retry soon.
            shared.metrics.errors.with_label_values(&["run_record"]).inc();
            tracing::warn!(error = format!("{error:#}"), "cannot write the run record; handing the run back");
            settle(shared, message, AckKind::Nak(Some(Duration::from_secs(1)))).await;
            return;
        }
    };
    let (record, revision, rerun) = match begin {
        Begin::AlreadySucceeded => {
            shared.metrics.runs.with_label_values(&[queue, "duplicate"]).inc();
            tracing::info!("redelivery of a run that already succeeded: acked without running");
            settle(shared, message, AckKind::Ack).await;
            return;
        }
        Begin::AlreadyDead => {
            settle(shared, message, AckKind::Term).await;
            return;
        }
        Begin::DeadLetterPending { record, revision } => {
            let error = record.error.clone().unwrap_or_default();
            let reason = format!("failed for good after {} attempts: {error}", record.attempt);
            Box::pin(dead_letter(
                shared,
                message,
                dispatch,
                *record,
                revision,
                reason,
                sequence,
                &mut emitter,
            ))
            .await;
            emitter.flush().await;
            return;
        }
        Begin::Run { record, revision, rerun } => (*record, revision, rerun),
    };
    if rerun {
        shared.metrics.reruns.with_label_values(&[queue]).inc();
        tracing::warn!("the previous attempt never reached a verdict (worker lost): running again");
        let mut event = run_event(EventKind::RunRetrying, dispatch, attempt, &shared.worker);
        event.reason = Some("worker_lost".to_string());
        emitter.emit(event).await;
    }
    emitter.emit(run_event(EventKind::RunStarted, dispatch, attempt, &shared.worker)).await;

    shared.metrics.in_flight.inc();
    let started = Instant::now();
    let outcome = {
        let run = Attempt { dispatch, attempt, cancel: shared.hard_stop.child_token() };
        let execution = shared.executors.execute(&run);
        let stopped = shared.hard_stop.cancelled();
        keeping_alive(shared, message, async {
            tokio::select! {
                biased;
                outcome = execution => Some(outcome),
                _ = stopped => None,
            }
        })
        .await
    };
    let elapsed = started.elapsed();
    shared.metrics.in_flight.dec();
    shared
        .metrics
        .duration
        .with_label_values(&[queue, dispatch.spec.executor.kind()])
        .observe(elapsed.as_secs_f64());
    let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);

    let Some(outcome) = outcome else {
        // Shutdown grace over: hand the run back for immediate redelivery elsewhere.
        let error = "interrupted: the worker shut down".to_string();
        finish(
            shared,
            message,
            record,
            revision,
            attempt,
            AttemptOutcome::Interrupted,
            Some(error),
            None,
            RunStatus::Retrying,
        )
        .await;
        shared.metrics.runs.with_label_values(&[queue, "interrupted"]).inc();
        settle(shared, message, AckKind::Nak(None)).await;
        emitter.flush().await;
        return;
    };

    let since_first = (Utc::now() - record.first_started).to_std().unwrap_or_default();
    let verdict = decide(&dispatch.spec.retry, &outcome, attempt, since_first, rand::random::<f64>());
    let error = outcome.error().map(str::to_string);
    let detail = match &outcome {
        Outcome::Ok { detail } => detail.clone(),
        _ => None,
    };
    match verdict {
        Verdict::Ack => {
            finish(
                shared,
                message,
                record,
                revision,
                attempt,
                AttemptOutcome::Succeeded,
                None,
                detail,
                RunStatus::Succeeded,
            )
            .await;
            settle(shared, message, AckKind::Ack).await;
            shared.metrics.runs.with_label_values(&[queue, "succeeded"]).inc();
            let mut event = run_event(EventKind::RunSucceeded, dispatch, attempt, &shared.worker);
            event.duration_ms = Some(duration_ms);
            emitter.emit(event).await;
        }
        Verdict::Retry { delay } => {
            finish(
                shared,
                message,
                record,
                revision,
                attempt,
                AttemptOutcome::Failed,
                error.clone(),
                None,
                RunStatus::Retrying,
            )
            .await;
            settle(shared, message, AckKind::Nak(Some(delay))).await;
            shared.metrics.runs.with_label_values(&[queue, "retried"]).inc();
            shared.metrics.retries.with_label_values(&[queue]).inc();
            tracing::info!(error = error.as_deref().unwrap_or_default(), ?delay, "attempt failed; retrying");
            let mut event = run_event(EventKind::RunRetrying, dispatch, attempt, &shared.worker);
            event.error = error;
            event.duration_ms = Some(duration_ms);
            event.reason = Some(format!("retry in {} ms", delay.as_millis()));
            emitter.emit(event).await;
        }
        Verdict::Dead { reason } => {
            let kind = match outcome {
                Outcome::Permanent { .. } => AttemptOutcome::Permanent,
                _ => AttemptOutcome::Failed,
            };
            let saved = finish(
                shared,
                message,
                record,
                revision,
                attempt,
                kind,
                error.clone(),
                None,
                RunStatus::Failed,
            )
            .await;
            shared.metrics.runs.with_label_values(&[queue, "failed"]).inc();
            tracing::warn!(%reason, "run failed for good: dead-lettering it");
            let mut event = run_event(EventKind::RunFailed, dispatch, attempt, &shared.worker);
            event.error = error;
            event.duration_ms = Some(duration_ms);
            event.reason = Some(reason.clone());
            emitter.emit(event).await;
            match saved {
                Some((record, revision)) => {
                    // Boxed like every rare path, so the common one's future stays small.
                    Box::pin(dead_letter(
                        shared,
                        message,
                        dispatch,
                        record,
                        revision,
                        reason,
                        sequence,
                        &mut emitter,
                    ))
                    .await
                }
                None => settle(shared, message, AckKind::Nak(Some(Duration::from_secs(1)))).await,
            }
        }
    }
    emitter.flush().await;
}

/// Runs `work` while telling the server the delivery is still being handled (progress acks
/// every `progress_interval`), so neither a long execution nor a record write retried through
/// a node failure outlives `ack_wait` and hands the run to another worker.
async fn keeping_alive<T>(
    shared: &Shared,
    message: &jetstream::Message,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    let period = shared.progress_interval;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            _ = progress.tick() => settle(shared, message, AckKind::Progress).await,
        }
    }
}

/// Closes the attempt in the record. Logs (and counts) a failed write: the verdict stands.
#[allow(clippy::too_many_arguments)] // one call per verdict; a struct would only rename them
async fn finish(
    shared: &Shared,
    message: &jetstream::Message,
    mut record: RunRecord,
    revision: u64,
    attempt: u32,
    outcome: AttemptOutcome,
    error: Option<String>,
    detail: Option<String>,
    status: RunStatus,
) -> Option<(RunRecord, u64)> {
    let now = Utc::now();
    record.end_attempt(attempt, outcome, error.clone(), detail.clone(), status, now);
    let change =
        |r: &mut RunRecord| r.end_attempt(attempt, outcome, error.clone(), detail.clone(), status, now);
    match keeping_alive(shared, message, shared.runs.save(record, revision, change)).await {
        Ok(saved) => Some(saved),
        Err(error) => {
            shared.metrics.errors.with_label_values(&["run_record"]).inc();
            tracing::warn!(
                error = format!("{error:#}"),
                status = status.as_str(),
                "cannot update the run record"
            );
            None
        }
    }
}

/// Stores the dead letter (awaiting the ack), then marks the record dead and `Term`s the
/// message. A refused dead letter leaves the message (delayed Nak) and says so in an event.
#[allow(clippy::too_many_arguments)] // the delivery's context, passed through once
async fn dead_letter(
    shared: &Shared,
    message: &jetstream::Message,
    dispatch: &Dispatch,
    record: RunRecord,
    revision: u64,
    reason: String,
    sequence: u64,
    emitter: &mut Emitter<'_>,
) {
    let entry = DeadLetter::new(
        dispatch,
        Some(&record),
        reason.clone(),
        DeadLetterSource::Verdict,
        &shared.worker,
        sequence,
    );
    if let Err(error) = shared.dlq.publish(&entry).await {
        shared.metrics.dlq_rejected.inc();
        tracing::error!(
            error = format!("{error:#}"),
            "the dead-letter stream refused the entry; retrying later"
        );
        let mut event = run_event(EventKind::RunFailed, dispatch, record.attempt, &shared.worker);
        event.error = Some(format!("{error:#}"));
        event.reason = Some("dlq_rejected".to_string());
        emitter.emit(event).await;
        settle(shared, message, AckKind::Nak(Some(shared.dlq_retry_delay))).await;
        return;
    }
    shared.metrics.dead_letters.with_label_values(&[DeadLetterSource::Verdict.as_str()]).inc();
    let attempt = record.attempt;
    let mut record = record;
    record.status = RunStatus::Dead;
    let marked = shared.runs.save(record, revision, |r| r.status = RunStatus::Dead);
    if let Err(error) = keeping_alive(shared, message, marked).await {
        shared.metrics.errors.with_label_values(&["run_record"]).inc();
        tracing::warn!(error = format!("{error:#}"), "cannot mark the run record dead");
    }
    settle(shared, message, AckKind::Term).await;
    let mut event = run_event(EventKind::RunDead, dispatch, attempt, &shared.worker);
    event.reason = Some(reason);
    emitter.emit(event).await;
    match shared.dlq.depth().await {
        Ok(depth) => shared.metrics.dlq_depth.set(i64::try_from(depth).unwrap_or(i64::MAX)),
        Err(error) => tracing::debug!(error = format!("{error:#}"), "read DLQ depth"),
    }
}
