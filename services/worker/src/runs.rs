//! Run records in `JETSCHED_RUNS`: one per execution id, created before the first attempt runs,
//! holding the status and every attempt. They make redeliveries recognisable (a run that
//! already succeeded is acked without running again) and feed the dead-letter entries.
//!
//! Every write is a compare-and-set on the entry's revision: the dispatch message is the lock
//! (one holder at a time), the revision catches the rare overlap (an attempt outliving its
//! ack_wait, the advisory mover).

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use jetsched_shared::backoff::Backoff;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch, live, read_leader};
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::wire::Dispatch;
pub use jetsched_shared::wire::{AttemptOutcome, AttemptRecord, RunRecord, RunStatus};

use self::reads::Reads;
use crate::config::RunRecords;

mod held;
mod reads;
pub(crate) mod skip;

/// Compare-and-set rounds before giving up on a write.
const CAS_ROUNDS: usize = 8;

/// Pause before a record refused as conflicting, though none is stored, is written again
/// (times the round).
const VANISHED_PAUSE: Duration = Duration::from_millis(200);

/// How long an ending's record write is retried through transport errors (a replicated
/// bucket refuses writes while it elects a new leader, e.g. after a node died).
const WRITE_RETRY_FOR: Duration = Duration::from_secs(15);

/// What a delivery should do, according to the run record.
#[derive(Debug)]
pub(crate) enum Begin {
    /// Execute the attempt.
    Run { record: Box<RunRecord>, revision: u64, rerun: bool },
    /// Already succeeded: ack without running.
    AlreadySucceeded,
    /// Already in the dead-letter stream: terminate the message.
    AlreadyDead,
    /// A final failure whose dead-letter entry is not stored yet: store it, do not run again.
    DeadLetterPending { record: Box<RunRecord>, revision: u64 },
    /// Cancelled: ack without running.
    AlreadyCancelled,
}

/// A run record as last stored, and its revision (0: not stored yet, see lazy records).
pub(crate) struct Stored {
    pub(crate) record: RunRecord,
    pub(crate) revision: u64,
}

/// The close of an attempt in its run record, applied again on a record re-read after a
/// concurrent write.
pub(crate) struct Closing<'a> {
    pub(crate) attempt: u32,
    pub(crate) outcome: AttemptOutcome,
    pub(crate) status: RunStatus,
    pub(crate) error: Option<&'a str>,
    pub(crate) detail: Option<String>,
    /// Who cancelled the run and why, when it ends `cancelled`.
    pub(crate) reason: Option<String>,
    /// What the run returned, when its task keeps results.
    pub(crate) result: Option<&'a serde_json::Value>,
    pub(crate) now: DateTime<Utc>,
}

impl Closing<'_> {
    pub(crate) fn apply(&self, record: &mut RunRecord) {
        let error = self.error.map(str::to_string);
        record.end_attempt(self.attempt, self.outcome, error, self.detail.clone(), self.status, self.now);
        if record.status == RunStatus::Cancelled && self.reason.is_some() {
            record.reason.clone_from(&self.reason);
        }
        if let Some(result) = self.result {
            record.result = Some(result.clone());
        }
    }
}

/// When a delivery's run record is first written (`--run-records`, `--running-after`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recording {
    pub(crate) mode: RunRecords,
    /// Under deferred records, how long an attempt runs before its record is written.
    pub(crate) running_after: Duration,
}

impl Recording {
    /// Whether delivery `attempt` of `dispatch` is recorded before its attempt runs: always
    /// under eager records; for a task whose overlap policy the scheduler checks against
    /// running records; and under deferred records, a redelivery (its run is known to have
    /// been tried: a crash loop is recorded attempt by attempt from the second on).
    pub(crate) fn before_attempt(&self, dispatch: &Dispatch, attempt: u32) -> bool {
        let by_mode = match self.mode {
            RunRecords::Eager => true,
            RunRecords::Deferred => attempt > 1,
            RunRecords::Lazy => false,
        };
        by_mode || dispatch.spec.overlap != OverlapPolicy::Allow
    }

    /// How long the attempt runs before a record not stored yet is stored (and the start
    /// told), under deferred records; `None`: at the verdict, or stored already.
    pub(crate) fn while_running(&self, stored: &Stored) -> Option<Duration> {
        (self.mode == RunRecords::Deferred && stored.revision == 0).then_some(self.running_after)
    }
}

/// The runs bucket.
#[derive(Clone)]
pub(crate) struct RunStore {
    kv: kv::Store,
    /// Reads gathered into batched direct gets, when started.
    reads: Option<Reads>,
}

impl RunStore {
    /// A store reading records in batches ([`Reads`]) over `client`.
    pub(crate) async fn batched(
        kv: kv::Store,
        client: async_nats::Client,
        bucket: &str,
    ) -> anyhow::Result<RunStore> {
        let reads = Reads::start(client, bucket).await.context("start the batched run-record reader")?;
        Ok(RunStore { kv, reads: Some(reads) })
    }

    /// The record of `execution_id` and its revision, if any: in the next batch of reads, or
    /// alone when batches are off or the batch failed.
    pub(crate) async fn get(&self, execution_id: &str) -> anyhow::Result<Option<(RunRecord, u64)>> {
        let batched = match &self.reads {
            Some(reads) => match reads.read(execution_id).await {
                Ok(found) => Some(found),
                Err(error) => {
                    tracing::debug!(%error, "batched run-record read failed; reading it alone");
                    None
                }
            },
            None => None,
        };
        let found = match batched {
            Some(found) => found,
            None => {
                let entry = self
                    .kv
                    .entry(execution_id)
                    .await
                    .with_context(|| format!("read run record {execution_id}"))?;
                live(entry).map(|entry| (entry.value, entry.revision))
            }
        };
        let Some((value, revision)) = found else { return Ok(None) };
        let record: RunRecord =
            serde_json::from_slice(&value).with_context(|| format!("decode run record {execution_id}"))?;
        Ok(Some((record, revision)))
    }

    /// The record of `execution_id` as its stream's leader holds it: read after a write
    /// conflict. (Direct gets, batched or not, may be answered by a replica that has not
    /// applied the last write yet: right after a conflict, such a read can return the value
    /// the write conflicted with, or no record at all.)
    async fn get_latest(&self, execution_id: &str) -> anyhow::Result<Option<(RunRecord, u64)>> {
        let latest = read_leader(&self.kv.stream, &self.kv.name, execution_id)
            .await
            .with_context(|| format!("read run record {execution_id}"))?;
        let Some(message) = latest.filter(|message| !message.is_kv_marker()) else { return Ok(None) };
        let record: RunRecord = serde_json::from_slice(&message.payload)
            .with_context(|| format!("decode run record {execution_id}"))?;
        Ok(Some((record, message.sequence)))
    }

    /// The record of `execution_id`: from the leader after a write conflict (`conflicted`),
    /// else as [`RunStore::get`] reads it.
    async fn read(&self, execution_id: &str, conflicted: bool) -> anyhow::Result<Option<(RunRecord, u64)>> {
        match conflicted {
            true => self.get_latest(execution_id).await,
            false => self.get(execution_id).await,
        }
    }

    /// Creates or advances the record for delivery `attempt` of `dispatch`.
    ///
    /// `eager`: the record is stored (status `running`) before the attempt runs. Otherwise a
    /// missing record is only read here and first written at the verdict (revision 0 =
    /// create): one stored write less per run, but no `running` record for the scheduler's
    /// overlap checks and no attempt history of a worker that died mid-run (the rerun is
    /// still recognised and counted by the delivery count).
    pub(crate) async fn begin(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
        eager: bool,
    ) -> anyhow::Result<Begin> {
        let key = dispatch.execution_id.as_str();
        for round in 0..CAS_ROUNDS {
            let now = Utc::now();
            let conflicted = round > 0;
            // The common case (first delivery) costs one write.
            if eager && attempt <= 1 && !conflicted {
                let record = RunRecord::new(dispatch, attempt, worker, now);
                match self.kv.create(key, encode(&record)?).await {
                    Ok(revision) => {
                        return Ok(Begin::Run { record: Box::new(record), revision, rerun: false });
                    }
                    Err(error) if is_already_exists(&error) => {}
                    Err(error) => return Err(error).with_context(|| format!("create run record {key}")),
                }
            }
            let Some((mut record, revision)) = self.read(key, conflicted).await? else {
                let mut record = RunRecord::new(dispatch, attempt, worker, now);
                // A later delivery without a record: the deliveries before reached no verdict.
                let rerun = attempt > 1;
                if rerun {
                    record.reruns = 1;
                }
                if !eager {
                    return Ok(Begin::Run { record: Box::new(record), revision: 0, rerun });
                }
                match self.kv.create(key, encode(&record)?).await {
                    Ok(revision) => {
                        return Ok(Begin::Run { record: Box::new(record), revision, rerun });
                    }
                    Err(error) if is_already_exists(&error) => continue,
                    Err(error) => return Err(error).with_context(|| format!("create run record {key}")),
                }
            };
            match record.status {
                RunStatus::Succeeded | RunStatus::Skipped => return Ok(Begin::AlreadySucceeded),
                RunStatus::Dead => return Ok(Begin::AlreadyDead),
                RunStatus::Cancelled => return Ok(Begin::AlreadyCancelled),
                RunStatus::Failed => {
                    return Ok(Begin::DeadLetterPending { record: Box::new(record), revision });
                }
                RunStatus::Running | RunStatus::Retrying | RunStatus::Held => {}
            }
            let rerun = record.start_attempt(attempt, worker, now);
            match self.kv.update(key, encode(&record)?, revision).await {
                Ok(revision) => return Ok(Begin::Run { record: Box::new(record), revision, rerun }),
                Err(error) if is_revision_mismatch(&error) => continue,
                Err(error) => return Err(error).with_context(|| format!("update run record {key}")),
            }
        }
        anyhow::bail!("run record {key}: compare-and-set kept failing")
    }

    /// Stores `record` (not stored yet: a deferred record of a run still running); returns its
    /// revision, or `None` when a record exists already (the verdict's compare-and-set then
    /// reads it and applies the verdict to it).
    pub(crate) async fn create(&self, record: &RunRecord) -> anyhow::Result<Option<u64>> {
        let key = record.execution_id.as_str();
        match self.kv.create(key, encode(record)?).await {
            Ok(revision) => Ok(Some(revision)),
            Err(error) if is_already_exists(&error) => Ok(None),
            Err(error) => Err(error).with_context(|| format!("create run record {key}")),
        }
    }

    /// Writes `record` (read at `revision`; 0 = not stored yet, create it), re-reading and re-applying `change` when someone
    /// else wrote in between. Returns the stored record and its new revision.
    pub(crate) async fn save(
        &self,
        mut record: RunRecord,
        mut revision: u64,
        change: impl Fn(&mut RunRecord),
    ) -> anyhow::Result<(RunRecord, u64)> {
        let key = record.execution_id.clone();
        for round in 0..CAS_ROUNDS {
            match self.update_retrying(&key, encode(&record)?, revision).await {
                Ok(new_revision) => return Ok((record, new_revision)),
                Err(error) if is_revision_mismatch(&error) => match self.get_latest_retrying(&key).await? {
                    Some((fresh, fresh_revision)) => {
                        record = fresh;
                        revision = fresh_revision;
                        change(&mut record);
                    }
                    None => {
                        // Refused as if a write had come first, yet none is stored: a write
                        // the leader had accepted but not committed when it lost its quorum
                        // (a partition). Create the record as it is, after a pause.
                        tracing::debug!(key, "run record refused but not stored; writing it again");
                        revision = 0;
                        tokio::time::sleep(VANISHED_PAUSE * (round as u32 + 1)).await;
                    }
                },
                Err(error) => return Err(error).with_context(|| format!("update run record {key}")),
            }
        }
        anyhow::bail!("run record {key}: compare-and-set kept failing")
    }
}

impl RunStore {
    /// [`RunStore::get_latest`], retried with backoff through errors for up to
    /// [`WRITE_RETRY_FOR`] (a stream electing a new leader answers `temporarily unavailable`).
    async fn get_latest_retrying(&self, key: &str) -> anyhow::Result<Option<(RunRecord, u64)>> {
        let deadline = tokio::time::Instant::now() + WRITE_RETRY_FOR;
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let retryable = |error: &anyhow::Error, _, _| {
            tracing::debug!(error = format!("{error:#}"), key, "run record read failed; retrying");
            true
        };
        let read = |_| self.get_latest(key);
        backoff.retry_until(deadline, read, retryable).await.map_err(|gave_up| gave_up.error)
    }

    /// `kv.update`, retried with backoff through errors other than a revision mismatch for
    /// up to [`WRITE_RETRY_FOR`]. A retry after a write that was stored but not acknowledged
    /// meets a revision mismatch, which the caller resolves like any other.
    async fn update_retrying(
        &self,
        key: &str,
        value: bytes::Bytes,
        revision: u64,
    ) -> Result<u64, kv::UpdateError> {
        let deadline = tokio::time::Instant::now() + WRITE_RETRY_FOR;
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let update = |_| self.kv.update(key, value.clone(), revision);
        let retryable = |error: &kv::UpdateError, _, _| {
            let retry = !is_revision_mismatch(error);
            if retry {
                tracing::debug!(%error, key, "run record write failed; retrying");
            }
            retry
        };
        backoff.retry_until(deadline, update, retryable).await.map_err(|gave_up| gave_up.error)
    }
}

fn encode(record: &RunRecord) -> anyhow::Result<bytes::Bytes> {
    Ok(serde_json::to_vec(record).context("encode run record")?.into())
}

#[cfg(test)]
mod tests {
    use jetsched_shared::wire::MAX_KEPT_ATTEMPTS;

    use super::*;

    fn record() -> RunRecord {
        let dispatch: Dispatch = serde_json::from_str(
            r#"{"execution_id":"e","namespace":"ns","task_id":"t","nominal_time":"2026-01-01T00:00:00.000Z","trigger":"schedule","term":0,"revision":1,"spec":{"id":"t","namespace":"ns","schedule":{"every":"1m"},"executor":{"kind":"handler","name":"x"}}}"#,
        )
        .expect("a dispatch");
        RunRecord::new(&dispatch, 1, "w1", Utc::now())
    }

    /// Closes `attempt` of `r` now, as a verdict does.
    fn close(
        r: &mut RunRecord,
        attempt: u32,
        outcome: AttemptOutcome,
        error: Option<&str>,
        status: RunStatus,
    ) {
        Closing {
            attempt,
            outcome,
            status,
            error,
            detail: None,
            reason: None,
            result: None,
            now: Utc::now(),
        }
        .apply(r);
    }

    #[test]
    fn an_open_attempt_is_abandoned_by_the_next_delivery() {
        let mut r = record();
        assert!(r.start_attempt(2, "w2", Utc::now()));
        assert_eq!(r.attempts[0].outcome, Some(AttemptOutcome::Abandoned));
        assert_eq!(r.reruns, 1);
        close(&mut r, 2, AttemptOutcome::Failed, Some("boom"), RunStatus::Retrying);
        assert!(!r.start_attempt(3, "w2", Utc::now()));
        assert_eq!(r.attempts.len(), 3);
        assert_eq!(r.error.as_deref(), Some("boom"));
        assert!(r.finished.is_none());
    }

    #[test]
    fn deliveries_lost_before_a_verdict_do_not_count_as_failed_attempts() {
        // Deliveries 1 and 2 never reached a verdict (their answers lost in a partition, say),
        // delivery 3 failed: one failure counts against `max_attempts`, not three.
        let mut r = record();
        r.start_attempt(2, "w2", Utc::now());
        r.start_attempt(3, "w1", Utc::now());
        assert_eq!(r.failures, 0);
        close(&mut r, 3, AttemptOutcome::Failed, Some("boom"), RunStatus::Retrying);
        assert_eq!(r.failures, 1);
        r.start_attempt(4, "w1", Utc::now());
        close(&mut r, 4, AttemptOutcome::Succeeded, None, RunStatus::Succeeded);
        assert_eq!(r.failures, 1, "a success is no failure");
    }

    #[test]
    fn a_late_verdict_of_an_abandoned_attempt_leaves_the_message_to_the_attempt_in_flight() {
        // Attempt 1's worker was cut off past ack_wait; attempt 2 runs elsewhere. Attempt 1's
        // success comes back: its entry closes, but the run stays attempt 2's, so attempt 1's
        // worker must not answer the message (an ack would take it from under attempt 2, whose
        // retry would then find no message: the run left `retrying` for good).
        let mut r = record();
        r.start_attempt(2, "w2", Utc::now());
        close(&mut r, 1, AttemptOutcome::Succeeded, None, RunStatus::Succeeded);
        assert_eq!(r.status, RunStatus::Running);
        assert!(r.superseded(1), "attempt 1 is superseded by attempt 2");
        assert!(!r.superseded(2));
        // Once attempt 2 ends the run for good, a late verdict is no longer held off.
        close(&mut r, 2, AttemptOutcome::Succeeded, None, RunStatus::Succeeded);
        assert!(!r.superseded(1));
    }

    #[test]
    fn a_cut_off_workers_late_verdict_never_overwrites_the_rerun_that_succeeded() {
        // Attempt 1's worker was cut off past ack_wait; attempt 2 ran elsewhere and succeeded.
        let mut r = record();
        r.start_attempt(2, "w2", Utc::now());
        close(&mut r, 2, AttemptOutcome::Succeeded, None, RunStatus::Succeeded);
        // The cut-off worker comes back and closes attempt 1 as a retryable failure.
        close(&mut r, 1, AttemptOutcome::Failed, Some("no reply"), RunStatus::Retrying);
        assert_eq!(r.status, RunStatus::Succeeded);
        assert_eq!(r.attempt, 2);
        assert!(r.error.is_none());
        // Nor the status of a later attempt still running.
        let mut r = record();
        r.start_attempt(2, "w2", Utc::now());
        close(&mut r, 1, AttemptOutcome::Failed, Some("no reply"), RunStatus::Retrying);
        assert_eq!(r.status, RunStatus::Running);
    }

    #[test]
    fn the_history_is_bounded_and_keeps_the_first_attempt() {
        let mut r = record();
        for n in 2..(MAX_KEPT_ATTEMPTS as u32 + 50) {
            r.start_attempt(n, "w", Utc::now());
        }
        assert_eq!(r.attempts.len(), MAX_KEPT_ATTEMPTS);
        assert_eq!(r.attempts[0].attempt, 1);
    }

    #[test]
    fn records_round_trip_as_json() {
        // Times travel with millisecond precision: compare after one round trip.
        let r: RunRecord = serde_json::from_str(&serde_json::to_string(&record()).unwrap()).unwrap();
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""status":"running""#), "{text}");
        assert_eq!(serde_json::from_str::<RunRecord>(&text).unwrap(), r);
    }
}
