//! Runs an open breaker holds (`on_open: delay`): the record says `held` with the time the
//! server hands the run back to its queue, instead of `dispatched` with no attempt; and runs
//! waiting for a concurrency slot (`held`, reason `concurrency_limit`, no release time).

use chrono::{DateTime, Utc};
use jetsched_shared::names::CONCURRENCY_LIMIT;
use jetsched_shared::wire::Dispatch;

use super::skip::Skip;
use super::{RunRecord, RunStatus, RunStore};

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
        let hold = |record: &mut RunRecord| {
            record.status = RunStatus::Held;
            record.release_at = Some(until);
            record.worker = worker.to_string();
        };
        Ok(self.write_unexecuted(dispatch, attempt, worker, false, hold).await? == Skip::Skipped)
    }

    /// Records a run waiting for a concurrency slot: status `held`, reason `concurrency_limit`,
    /// no release time (it starts when a slot frees). False when the run is final already.
    pub(crate) async fn wait_for_slot(
        &self,
        dispatch: &Dispatch,
        attempt: u32,
        worker: &str,
    ) -> anyhow::Result<bool> {
        let wait = |record: &mut RunRecord| {
            record.status = RunStatus::Held;
            record.release_at = None;
            record.reason = Some(CONCURRENCY_LIMIT.to_string());
            record.worker = worker.to_string();
        };
        Ok(self.write_unexecuted(dispatch, attempt, worker, false, wait).await? == Skip::Skipped)
    }
}
