//! A run's place among the worker's `--concurrency` permits ([`Slot`]): held while the run
//! works, given back while it only waits (a rate-limited run held for its start time), taken
//! again before it starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// Counts freed permits of every queue, so a loop waiting on its reserve wakes when any run ends.
pub(crate) type Frees = Arc<watch::Sender<u64>>;

/// A permit held by a run of one lane: while it is held, the lane's run count includes the
/// run; once given back (or dropped), every queue's loop hears of it.
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    permits: Arc<Semaphore>,
    running: Arc<AtomicUsize>,
    frees: Frees,
}

impl Slot {
    /// The slot of a run that holds `permit` (counted in `running` from now on).
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        permits: Arc<Semaphore>,
        running: Arc<AtomicUsize>,
        frees: Frees,
    ) -> Slot {
        running.fetch_add(1, Ordering::AcqRel);
        Slot { permit: Some(permit), permits, running, frees }
    }

    /// Gives the permit back while the run waits (nothing to do when it holds none).
    pub(crate) fn release(&mut self) {
        if let Some(permit) = self.permit.take() {
            drop(permit);
            self.running.fetch_sub(1, Ordering::AcqRel);
            self.frees.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Takes a permit again (waiting for one to be free) before the run starts.
    pub(crate) async fn reacquire(&mut self) {
        if self.permit.is_none()
            && let Ok(permit) = self.permits.clone().acquire_owned().await
        {
            self.running.fetch_add(1, Ordering::AcqRel);
            self.permit = Some(permit);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}
