//! Keeping the breakers in step with the bucket: the merge loop (this worker's counts into the
//! records, every [`MERGE_EVERY`] while there are any) and the watch (every worker's writes
//! into this worker's copy, through the shared follower).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use chrono::Utc;
use jetsched_shared::follow;
use tokio_util::sync::CancellationToken;

use super::machine;
use super::state::{Breakers, Pending};
use super::store::{Versioned, decode};

/// How often a worker merges its counts into the records (at most this long of counts is lost
/// with a killed worker; a state change reaches every worker within this plus the watch's
/// latency).
const MERGE_EVERY: Duration = Duration::from_millis(250);

impl Breakers {
    /// Opens the watch of the bucket and loads every record ([`follow::load`]).
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        follow::load(self.store.kv(), |entry| self.seen(entry)).await
    }

    /// Follows the bucket until `stop`, re-opening the watch after an error.
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        let errors = self.metrics.errors.with_label_values(&["breaker_watch"]);
        follow::follow(self.store.kv().clone(), watch, stop, |entry| self.seen(entry), errors).await;
    }

    fn seen(&self, entry: &kv::Entry) {
        if entry.operation == kv::Operation::Put {
            let record = decode(&entry.key, entry);
            self.remember(&entry.key, Versioned { record, revision: entry.revision });
        } else {
            self.forget(&entry.key, entry.revision);
        }
    }

    /// Merges this worker's counts every [`MERGE_EVERY`] while there are any, until `stop`;
    /// then merges what is left once more.
    pub(crate) async fn merge_loop(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = self.counted.notified() => {}
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(MERGE_EVERY) => {}
            }
            self.merge_pending().await;
        }
        self.merge_pending().await;
    }

    /// Merges every key's counts into its record with compare-and-set; counts that could not
    /// be merged wait for the next round.
    pub(crate) async fn merge_pending(&self) {
        let pending: HashMap<String, Pending> =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for (key, counts) in pending {
            if counts.delta.is_empty() {
                continue;
            }
            let merged = self
                .store
                .modify(&key, self.known(&key), |record| {
                    let before = record.clone();
                    let transition = machine::merge(record, &counts.delta, &counts.spec, Utc::now());
                    (transition, *record != before)
                })
                .await;
            match merged {
                Ok((transition, stored)) => {
                    if let Some(transition) = transition {
                        self.tell(&key, transition, &stored);
                    }
                    self.remember(&key, stored);
                }
                Err(error) => {
                    self.failed(&key, &error, "cannot merge breaker counts; keeping them");
                    let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                    let entry = pending
                        .entry(key)
                        .or_insert(Pending { spec: counts.spec.clone(), delta: Default::default() });
                    entry.delta.absorb(&counts.delta);
                    drop(pending);
                    self.counted.notify_one();
                }
            }
        }
    }
}
