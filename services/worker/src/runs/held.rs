//! Runs an open breaker holds (`on_open: delay`): the record says `held` with the time the
//! server hands the run back to its queue, instead of `dispatched` with no attempt.

use chrono::{DateTime, Utc};
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
}
