//! This worker's blocks of slots taken ahead, as the worker moves them: a run taking a slot
//! of its key's block or giving it back with no write, the block judged open or closed from
//! the key's latest known record, and given back in a write that hands its slots over.

use std::sync::Arc;

use chrono::Utc;
use jetsched_shared::wire::LimitRecord;

use super::block::LocalBlock;
use super::{Limits, micros, rules};

impl Limits {
    /// A run of `key` arriving takes a slot of this worker's block, if the block is open and
    /// has one free (no write). `eligible`: the run may hold a slot of a block at all (a first
    /// delivery the key does not know). The block is judged on a read of the key started after
    /// the run arrived (`arrived`: when its message was taken from the server;
    /// [`fresh`](super::fresh)), so a run stored as waiting before it is never passed.
    pub(crate) async fn take_from_block(
        self: &Arc<Self>,
        key: &str,
        execution_id: &str,
        eligible: bool,
        arrived: std::time::Instant,
    ) -> bool {
        let now = micros(Utc::now());
        let may = {
            let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
            let block = blocks.entry(key.to_string()).or_default();
            block.arrive(now);
            eligible && block.open && block.cap > block.used
        };
        if !may {
            return false;
        }
        let (limits, name) = (Arc::clone(self), key.to_string());
        let read = move || {
            let (limits, name) = (Arc::clone(&limits), name.clone());
            async move { limits.read_and_learn(&name).await }
        };
        if !self.reads.after(key, arrived, read).await {
            return false;
        }
        // A run the key knows (a copy of a holder's message, a waiter) asks with a write.
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).is_some_and(|k| {
            k.record.holders.contains_key(execution_id)
                || k.record.waiters.iter().any(|w| w.execution_id == execution_id)
        });
        if known {
            return false;
        }
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let taken = blocks.get_mut(key).is_some_and(|b| b.take(micros(Utc::now())));
        drop(blocks);
        if taken {
            self.metrics.limit_starts.with_label_values(&["block"]).inc();
        }
        taken
    }

    /// Reads `key` and learns the record (the block judged on it); false when the read failed.
    /// A record at the revision already known is not decoded again.
    async fn read_and_learn(&self, key: &str) -> bool {
        match self.kv.entry(key).await {
            Ok(entry) => {
                let revision = entry.as_ref().map_or(0, |e| e.revision);
                let known = self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).map(|k| k.revision);
                if known != Some(revision) {
                    let record = entry.map(|e| super::decode(key, &e)).unwrap_or_default();
                    self.learn(key, super::Versioned { record, revision });
                }
                true
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["limit"]).inc();
                tracing::warn!(error = format!("{error:#}"), key, "cannot read the concurrency key");
                false
            }
        }
    }

    /// A run of `key` holding a slot of this worker's block ended: the slot goes back to the
    /// block, or, when the block is closed, back to the key by a write that hands it over.
    pub(crate) fn free_block(self: &Arc<Self>, key: &str) {
        let write = {
            let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
            let Some(block) = blocks.get_mut(key) else { return };
            let write = block.give();
            if write {
                block.writing = true;
            }
            write
        };
        if write {
            let (limits, key) = (Arc::clone(self), key.to_string());
            self.frees.spawn(async move {
                if let Err(error) = limits.give_back(&key).await {
                    limits.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(error = format!("{error:#}"), key, "cannot give the block's slot back");
                }
            });
        }
    }

    /// Writes this worker's block of `key` (its `writing` flag set by the caller): gives back
    /// the slots it let go, renews its lease, and hands the freed slots over, again until none
    /// is left to give back. A block the record no longer holds (its lease ran out) is lost:
    /// logged and counted, its runs run on.
    pub(super) async fn give_back(self: &Arc<Self>, key: &str) -> anyhow::Result<()> {
        loop {
            let lease = self.lease_chrono();
            let worker = self.worker.clone();
            let (limits, name) = (Arc::clone(self), key.to_string());
            let written = self
                .modify(key, move |record| {
                    let (surplus, used) = {
                        let blocks = limits.blocks.lock().unwrap_or_else(|p| p.into_inner());
                        blocks.get(&name).map_or((0, 0), |b| (b.surplus(), b.used))
                    };
                    let now = Utc::now();
                    let kept = rules::write_block(record, &worker, surplus, used, now, lease);
                    let handed = rules::hand_over(record, &worker, now, lease);
                    let changed = kept || !handed.is_empty();
                    ((kept, handed), changed)
                })
                .await;
            let (kept, handed) = match written {
                Ok(written) => written,
                Err(error) => {
                    self.block(key, |b| b.writing = false);
                    return Err(error);
                }
            };
            if !kept {
                self.metrics.errors.with_label_values(&["limit_lost"]).inc();
                tracing::warn!(key, "the block's lease ran out; its runs run on without it");
                self.block(key, LocalBlock::lost);
            }
            self.deliver_handed(key, handed).await;
            let again = self.block(key, |b| {
                let again = b.surplus() > 0;
                b.writing = again;
                again
            });
            if again != Some(true) {
                return Ok(());
            }
        }
    }

    /// Applies `f` to this worker's block of `key`, if it has one.
    pub(super) fn block<T>(&self, key: &str, f: impl FnOnce(&mut LocalBlock) -> T) -> Option<T> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).get_mut(key).map(f)
    }

    /// The latest known record of `key` opens or closes this worker's block.
    pub(super) fn judge_block(&self, key: &str, record: &LimitRecord) {
        let open = !self.closing.load(std::sync::atomic::Ordering::SeqCst)
            && rules::block_open(record, &self.worker, Utc::now());
        if self.block(key, |b| b.judge(open)) == Some(true) {
            self.changed.notify_one();
        }
    }

    /// A write of `key` is stored as `record`: this worker's block as the record holds it.
    pub(super) fn block_stored(&self, key: &str, record: &LimitRecord) {
        let now = Utc::now();
        let (recorded, until) = record
            .blocks
            .get(&self.worker)
            .filter(|b| b.lease_until >= now)
            .map_or((0, 0), |b| (b.slots, micros(b.lease_until)));
        self.block(key, |b| b.stored(recorded, until, micros(now)));
    }
}

#[cfg(test)]
#[path = "ahead_tests.rs"]
mod tests;
