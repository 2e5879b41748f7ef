//! Concurrency limits shared by every worker through `JETSCHED_LIMITS` (docs/limits.md).
//!
//! One entry per key (`concurrency.<namespace>.<key>`) holds the runs holding its slots, each
//! under a lease, the runs waiting in arrival order, and an operator's override. Every change
//! is a compare-and-set of the entry ([`Limits::modify`]), decided by the pure [`rules`].
//!
//! A run that finds no slot is parked ([`park`]): published again as a message the server
//! holds in the dispatch stream, and its delivery acknowledged, so it holds no worker permit,
//! no place in `max_ack_pending` and spends no attempt. A run that frees a slot hands it over
//! in the same write: the slot is reserved for the most urgent, oldest waiter, whose parked
//! message is published back into its lane and deleted ([`handover`]). Each worker follows
//! the bucket and sleeps until the earliest lease end of a key with runs waiting, then drops
//! the expired holders and hands their slots over ([`Limits::deadlines`]): a dead worker's
//! slot is free again within the lease. The parked message is also scheduled to come back by
//! itself after two leases, so a run whose hand-over was cut short is never lost.
//!
//! While no run waits on a key, a worker's write for one of its runs may also take a block of
//! free slots ahead ([`rules::grant_block`], sized by the worker's demand): its next runs of the
//! key take and give back slots of the block with no write ([`block`]). The block is given
//! back, in a write that hands its slots over like a free, when a run waits on the key (the
//! watch shows it), when its slots go unused, and at shutdown; its lease is renewed like a
//! held slot's.

mod ahead;
pub(crate) mod block;
mod deadlines;
mod fresh;
pub(crate) mod handover;
pub(crate) mod park;
pub(crate) mod rules;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, kv};
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::follow;
use jetsched_shared::names::limit_name;
use jetsched_shared::wire::LimitRecord;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::block::LocalBlock;
use self::rules::{Claim, Decision};
use crate::metrics::Metrics;

/// Compare-and-set rounds before giving up on a write (every worker's runs of a hot key
/// write the same entry).
const CAS_ROUNDS: usize = 64;

/// Rounds of giving the blocks back at shutdown (a block being written is waited for).
const SETTLE_ROUNDS: usize = 200;

/// The wait before a key whose hand-over failed is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A record as stored: `revision` 0 when the key holds nothing yet.
#[derive(Debug, Clone, Default)]
pub(crate) struct Versioned {
    pub(crate) record: LimitRecord,
    pub(crate) revision: u64,
}

/// A change waiting for the next write of its key, and where its outcome goes.
struct Pending {
    change: Box<dyn FnMut(&mut LimitRecord) -> bool + Send>,
    done: oneshot::Sender<Result<(), String>>,
}

/// The changes of one key waiting for its next write, and whether a write is in flight.
#[derive(Default)]
struct Writes {
    queue: Vec<Pending>,
    writing: bool,
}

/// The limits bucket, as every delivery and the deadline loop use it.
pub(crate) struct Limits {
    kv: kv::Store,
    /// The dispatch stream, where runs wait parked.
    pub(crate) dispatch: jetstream::stream::Stream,
    pub(crate) js: jetstream::Context,
    pub(crate) worker: String,
    /// How long a slot is held without renewal.
    pub(crate) lease: Duration,
    /// Every key's latest record, from the watch.
    known: Mutex<HashMap<String, Versioned>>,
    /// One write at a time per key from this worker: its runs of a hot key queue their changes
    /// here and join the next write instead of racing each other's compare-and-sets.
    writes: Mutex<HashMap<String, Writes>>,
    changed: Notify,
    metrics: Metrics,
    /// Slots being freed after their runs ended: the run's worker permit is not held for the
    /// write; a graceful shutdown waits for them ([`Limits::settle`]).
    frees: TaskTracker,
    /// This worker's blocks of slots taken ahead, by key.
    blocks: Mutex<HashMap<String, LocalBlock>>,
    /// The most slots a block holds (the worker's concurrency: more could not be used).
    most: u32,
    /// Set at shutdown: every block is closed and given back.
    closing: std::sync::atomic::AtomicBool,
    /// Reads of a key that runs taking slots of a block wait on ([`fresh`]).
    reads: Arc<fresh::Reads>,
}

/// Microseconds since the epoch.
fn micros(at: chrono::DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

impl Limits {
    pub(crate) fn new(
        kv: kv::Store,
        dispatch: jetstream::stream::Stream,
        js: jetstream::Context,
        worker: String,
        lease: Duration,
        most: usize,
        metrics: Metrics,
    ) -> Limits {
        Limits {
            kv,
            dispatch,
            js,
            worker,
            lease,
            known: Mutex::default(),
            writes: Mutex::default(),
            changed: Notify::new(),
            metrics,
            frees: TaskTracker::new(),
            blocks: Mutex::default(),
            most: u32::try_from(most).unwrap_or(u32::MAX).max(1),
            closing: std::sync::atomic::AtomicBool::new(false),
            reads: Arc::default(),
        }
    }

    /// Frees the slot of a run that ended, in the background: the run's permit goes to the next
    /// run at once, and the free joins the key's next write. Failures are logged and counted
    /// (the slot's lease frees it then).
    pub(crate) fn free(self: &Arc<Self>, key: String, execution_id: String, seq: u64) {
        let limits = Arc::clone(self);
        self.frees.spawn(async move {
            if let Err(error) = limits.release(&key, &execution_id, seq).await {
                limits.metrics.errors.with_label_values(&["limit"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    key,
                    "cannot free the concurrency slot; its lease will"
                );
            }
        });
    }

    /// Waits for the slots being freed, then gives every block back (at shutdown, once no run
    /// is left).
    pub(crate) async fn settle(self: &Arc<Self>) {
        self.frees.close();
        self.frees.wait().await;
        self.closing.store(true, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..SETTLE_ROUNDS {
            let keys: Vec<(String, bool)> = {
                let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
                blocks
                    .iter_mut()
                    .filter_map(|(key, b)| {
                        b.judge(false);
                        if b.writing {
                            return Some((key.clone(), false));
                        }
                        let ours = b.surplus() > 0;
                        b.writing = ours;
                        ours.then(|| (key.clone(), true))
                    })
                    .collect()
            };
            if keys.is_empty() {
                return;
            }
            for (key, ours) in keys {
                if ours && let Err(error) = self.give_back(&key).await {
                    self.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(
                        error = format!("{error:#}"),
                        key,
                        "cannot give the block back; its lease will"
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn lease_chrono(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.lease).unwrap_or(chrono::Duration::seconds(30))
    }

    /// Reads every key; returns the watch to [`Limits::follow`].
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        follow::load(&self.kv, |entry| self.seen(entry)).await
    }

    /// Follows the bucket until `stop`.
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        let errors = self.metrics.errors.with_label_values(&["limit_watch"]);
        follow::follow(self.kv.clone(), watch, stop, |entry| self.seen(entry), errors).await;
    }

    fn seen(&self, entry: &kv::Entry) {
        let Some(name) = limit_name(&entry.key) else { return };
        let record = decode(&entry.key, entry);
        let now = Utc::now();
        self.metrics.limit_in_use.with_label_values(&[name]).set(record.in_use(now) as i64);
        self.metrics.limit_waiting.with_label_values(&[name]).set(record.waiters.len() as i64);
        let oldest = record.oldest_wait().map_or(0, |at| at.timestamp());
        self.metrics.limit_oldest_wait.with_label_values(&[name]).set(oldest);
        self.metrics.limit_ahead.with_label_values(&[name]).set(record.reserved_ahead(now) as i64);
        self.learn(&entry.key, Versioned { record, revision: entry.revision });
        self.changed.notify_one();
    }

    /// A record of `key` read, watched or written: kept as the key's latest known record unless
    /// a newer one is known, and this worker's block judged on it.
    fn learn(&self, key: &str, versioned: Versioned) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.get(key).is_some_and(|k| k.revision > versioned.revision) {
            return;
        }
        let record = versioned.record.clone();
        known.insert(key.to_string(), versioned);
        drop(known);
        self.judge_block(key, &record);
    }

    fn known(&self, key: &str) -> Option<Versioned> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    async fn read(&self, key: &str) -> anyhow::Result<Versioned> {
        let entry = self.kv.entry(key).await.with_context(|| format!("read limit {key}"))?;
        Ok(entry.map(|e| Versioned { record: decode(key, &e), revision: e.revision }).unwrap_or_default())
    }

    /// Applies `change` to the latest record of `key` and stores it with compare-and-set,
    /// starting from the watch's copy (one read less when it is current). `change` returns its
    /// result and whether it changed the record (nothing is written otherwise).
    ///
    /// Group commit: the changes of this worker's runs of one key that arrive while a write of
    /// the key is in flight join the next write, applied in arrival order to the same record,
    /// so one compare-and-set takes or frees many slots. The first caller to find no write in
    /// flight starts a task that writes the queued changes until none is queued.
    pub(crate) async fn modify<T: Send + 'static>(
        self: &Arc<Self>,
        key: &str,
        mut change: impl FnMut(&mut LimitRecord) -> (T, bool) + Send + 'static,
    ) -> anyhow::Result<T> {
        let out = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&out);
        let (done, result) = oneshot::channel();
        let pending = Pending {
            change: Box::new(move |record: &mut LimitRecord| {
                let (value, changed) = change(record);
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
                changed
            }),
            done,
        };
        let lead = {
            let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
            let writes = writes.entry(key.to_string()).or_default();
            writes.queue.push(pending);
            !std::mem::replace(&mut writes.writing, true)
        };
        if lead {
            // Its own task: the queued changes get their write even if this caller goes away.
            let (limits, key) = (Arc::clone(self), key.to_string());
            tokio::spawn(async move { limits.flush(&key).await });
        }
        match result.await {
            Ok(Ok(())) => out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .with_context(|| format!("limit {key}: the write gave no result")),
            Ok(Err(error)) => Err(anyhow::anyhow!(error)),
            Err(_) => anyhow::bail!("limit {key}: the write was abandoned"),
        }
    }

    /// Writes the changes of `key` queued, batch after batch, until none is queued.
    async fn flush(&self, key: &str) {
        loop {
            let mut batch = {
                let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
                let Some(writes) = writes.get_mut(key) else { return };
                if writes.queue.is_empty() {
                    writes.writing = false;
                    return;
                }
                std::mem::take(&mut writes.queue)
            };
            let outcome = self.write_batch(key, &mut batch).await.map_err(|error| format!("{error:#}"));
            for pending in batch {
                let _ = pending.done.send(outcome.clone());
            }
        }
    }

    /// Applies every change of `batch` in order to the latest record of `key` and stores the
    /// result with one compare-and-set (again from a fresh read when another worker wrote first).
    async fn write_batch(&self, key: &str, batch: &mut [Pending]) -> anyhow::Result<()> {
        let mut current = match self.known(key) {
            Some(known) => known,
            None => self.read(key).await?,
        };
        for _ in 0..CAS_ROUNDS {
            self.block(key, LocalBlock::round);
            let mut record = current.record.clone();
            let mut changed = false;
            for pending in batch.iter_mut() {
                changed |= (pending.change)(&mut record);
            }
            if !changed {
                return Ok(());
            }
            let body: bytes::Bytes = serde_json::to_vec(&record).context("encode limit record")?.into();
            let written = if current.revision == 0 {
                match self.kv.create(key, body).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_already_exists(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("create limit {key}")),
                }
            } else {
                match self.kv.update(key, body, current.revision).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_revision_mismatch(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("update limit {key}")),
                }
            };
            match written {
                Some(revision) => {
                    self.learn(key, Versioned { record: record.clone(), revision });
                    self.block_stored(key, &record);
                    return Ok(());
                }
                None => current = self.read(key).await?,
            }
        }
        anyhow::bail!("limit {key}: compare-and-set kept failing")
    }

    /// A delivery's claim of a slot of `key`. `eligible`: the run may hold a slot of this
    /// worker's block ([`Limits::take_from_block`]), and the write may take a block ahead.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: &str,
        claim: &Claim<'_>,
        eligible: bool,
    ) -> anyhow::Result<Decision> {
        let lease = self.lease_chrono();
        let claim = claim.owned();
        let (limits, name) = (Arc::clone(self), key.to_string());
        let decision = self
            .modify(key, move |record| {
                let now = Utc::now();
                if eligible && !limits.closing.load(std::sync::atomic::Ordering::SeqCst) {
                    let mut blocks = limits.blocks.lock().unwrap_or_else(|p| p.into_inner());
                    let block = blocks.entry(name.clone()).or_default();
                    if let Some(decision) = block.claim(record, &claim.as_claim(), limits.most, now, lease) {
                        let changed = decision != (Decision::Block { granted: 0 });
                        return (decision, changed);
                    }
                }
                let before = record.clone();
                let decision = rules::acquire(record, &claim.as_claim(), now, lease);
                (decision, *record != before)
            })
            .await?;
        if matches!(decision, Decision::Hold | Decision::Block { .. }) {
            self.metrics.limit_starts.with_label_values(&["written"]).inc();
        }
        Ok(decision)
    }

    /// Frees the slot of `execution_id` held by message `seq`, and hands free slots over.
    pub(crate) async fn release(
        self: &Arc<Self>,
        key: &str,
        execution_id: &str,
        seq: u64,
    ) -> anyhow::Result<()> {
        let lease = self.lease_chrono();
        let execution_id = execution_id.to_string();
        let worker = self.worker.clone();
        let handed = self
            .modify(key, move |record| {
                let released = rules::release(record, &execution_id, seq);
                let handed = rules::hand_over(record, &worker, Utc::now(), lease);
                let changed = released || !handed.is_empty();
                (handed, changed)
            })
            .await?;
        self.deliver_handed(key, handed).await;
        Ok(())
    }

    /// Renews the lease of a running slot; false when the slot is not held any more.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        key: &str,
        execution_id: &str,
        seq: u64,
    ) -> anyhow::Result<bool> {
        let lease = self.lease_chrono();
        let execution_id = execution_id.to_string();
        self.modify(key, move |record| {
            let renewed = rules::renew(record, &execution_id, seq, Utc::now(), lease);
            (renewed, renewed)
        })
        .await
    }

    /// Runs `work` holding a slot of `key`, renewing its lease every third of it. A renewal
    /// that finds the slot gone (its lease ran out: this worker was cut off) is logged and
    /// counted; the run goes on.
    pub(crate) async fn holding<T>(
        self: &Arc<Self>,
        key: &str,
        execution_id: &str,
        seq: u64,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let period = self.lease / 3;
        let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = renewal.tick() => match self.renew(key, execution_id, seq).await {
                    Ok(true) => {}
                    Ok(false) => {
                        self.metrics.errors.with_label_values(&["limit_lost"]).inc();
                        tracing::warn!(key, "the run's concurrency slot lease ran out; it runs on without it");
                    }
                    Err(error) => {
                        self.metrics.errors.with_label_values(&["limit"]).inc();
                        tracing::warn!(error = format!("{error:#}"), key, "cannot renew the concurrency slot");
                    }
                },
            }
        }
    }
}

/// The record an entry holds: empty for a delete or purge marker, or a value that cannot be
/// decoded (logged; the next write replaces it).
fn decode(key: &str, entry: &kv::Entry) -> LimitRecord {
    if entry.operation != kv::Operation::Put {
        return LimitRecord::default();
    }
    serde_json::from_slice(&entry.value).unwrap_or_else(|error| {
        tracing::warn!(%error, key, "undecodable limit record: read as empty");
        LimitRecord::default()
    })
}
