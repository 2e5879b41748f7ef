//! Runs an open breaker holds (`on_open: delay`): the record says `held` with the time the
//! server hands the run back to its queue, instead of `dispatched` with no attempt.

use anyhow::Context;
use chrono::{DateTime, Utc};
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::wire::Dispatch;

use super::{CAS_ROUNDS, RunRecord, RunStatus, RunStore, encode};

impl RunStore {
    /// Records a run held until `until`: status `held`, `release_at`. Returns false when the
    /// record says the run is final already (nothing written).
    pub(crate) async fn hold(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
        until: DateTime<Utc>,
    ) -> anyhow::Result<bool> {
        let key = dispatch.execution_id.as_str();
        let hold = |record: &mut RunRecord| {
            record.status = RunStatus::Held;
            record.release_at = Some(until);
            record.worker = worker.to_string();
        };
        for round in 0..CAS_ROUNDS {
            match self.read(key, round > 0).await? {
                Some((record, _)) if record.status.is_final() => return Ok(false),
                Some((mut record, revision)) => {
                    hold(&mut record);
                    match self.kv.update(key, encode(&record)?, revision).await {
                        Ok(_) => return Ok(true),
                        Err(error) if is_revision_mismatch(&error) => continue,
                        Err(error) => return Err(error).with_context(|| format!("update run record {key}")),
                    }
                }
                None => {
                    let mut record = RunRecord::new(dispatch, attempt, worker, Utc::now());
                    // Nothing was executed yet.
                    record.attempts.clear();
                    hold(&mut record);
                    match self.kv.create(key, encode(&record)?).await {
                        Ok(_) => return Ok(true),
                        Err(error) if is_already_exists(&error) => continue,
                        Err(error) => return Err(error).with_context(|| format!("create run record {key}")),
                    }
                }
            }
        }
        anyhow::bail!("run record {key}: compare-and-set kept failing")
    }
}
