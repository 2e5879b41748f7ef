//! Runs that end without executing: a final `skipped` record with its reason (an open breaker
//! with `on_open: skip`, or a paused task's scheduled run that had not started).

use anyhow::Context;
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::wire::Dispatch;

use super::{CAS_ROUNDS, RunRecord, RunStatus, RunStore, encode};

/// What a skip did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// The record says `skipped` now.
    Skipped,
    /// The run was final already: nothing written.
    Final,
    /// An attempt of the run has executed and the skip was only for runs not started:
    /// nothing written, the run goes on.
    Started,
}

impl RunStore {
    /// Records a run that ends without executing: status `skipped` with `reason`, finished
    /// now. `unstarted_only`: a run with an executed attempt is left alone ([`Skip::Started`]).
    pub(crate) async fn skip(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
        reason: &str,
        unstarted_only: bool,
    ) -> anyhow::Result<Skip> {
        let skip = |record: &mut RunRecord| {
            record.status = RunStatus::Skipped;
            record.reason = Some(reason.to_string());
            record.worker = worker.to_string();
            record.finished = Some(Utc::now());
        };
        self.write_unexecuted(dispatch, attempt, worker, unstarted_only, skip).await
    }

    /// Records a run cancelled before this delivery ran it: status `cancelled` with `reason`,
    /// finished now ([`Skip::Skipped`] once written; [`Skip::Final`] when the run had ended).
    pub(crate) async fn cancel(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
        reason: &str,
    ) -> anyhow::Result<Skip> {
        let cancel = |record: &mut RunRecord| {
            record.status = RunStatus::Cancelled;
            record.reason = Some(reason.to_string());
            record.release_at = None;
            record.finished = Some(Utc::now());
        };
        self.write_unexecuted(dispatch, attempt, worker, false, cancel).await
    }

    /// Writes the record of a run that has not executed (yet), as `change` says, with
    /// compare-and-set: a new record when there is none (no attempt in it), `Skip::Skipped`
    /// once written; `Skip::Final` when the run is final already, `Skip::Started` when
    /// `unstarted_only` and an attempt has executed (nothing written in both cases).
    pub(super) async fn write_unexecuted(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
        unstarted_only: bool,
        change: impl Fn(&mut RunRecord),
    ) -> anyhow::Result<Skip> {
        let key = dispatch.execution_id.as_str();
        for round in 0..CAS_ROUNDS {
            match self.read(key, round > 0).await? {
                Some((record, _)) if record.status.is_final() => return Ok(Skip::Final),
                Some((record, _)) if unstarted_only && !record.attempts.is_empty() => {
                    return Ok(Skip::Started);
                }
                Some((mut record, revision)) => {
                    change(&mut record);
                    match self.kv.update(key, encode(&record)?, revision).await {
                        Ok(_) => return Ok(Skip::Skipped),
                        Err(error) if is_revision_mismatch(&error) => continue,
                        Err(error) => return Err(error).with_context(|| format!("update run record {key}")),
                    }
                }
                None => {
                    let mut record = RunRecord::new(dispatch, attempt, worker, Utc::now());
                    // Nothing was executed.
                    record.attempts.clear();
                    change(&mut record);
                    match self.kv.create(key, encode(&record)?).await {
                        Ok(_) => return Ok(Skip::Skipped),
                        Err(error) if is_already_exists(&error) => continue,
                        Err(error) => return Err(error).with_context(|| format!("create run record {key}")),
                    }
                }
            }
        }
        anyhow::bail!("run record {key}: compare-and-set kept failing")
    }
}
