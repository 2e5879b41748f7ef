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

use self::rules::{Claim, Decision};
use crate::metrics::Metrics;

/// Compare-and-set rounds before giving up on a write (every worker's runs of a hot key
/// write the same entry).
const CAS_ROUNDS: usize = 64;

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
}

impl Limits {
    pub(crate) fn new(
        kv: kv::Store,
        dispatch: jetstream::stream::Stream,
        js: jetstream::Context,
        worker: String,
        lease: Duration,
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

    /// Waits for the slots being freed (at shutdown, once no run is left).
    pub(crate) async fn settle(&self) {
        self.frees.close();
        self.frees.wait().await;
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
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let stale = known.get(&entry.key).is_some_and(|k| k.revision > entry.revision);
        if !stale {
            known.insert(entry.key.clone(), Versioned { record, revision: entry.revision });
        }
        drop(known);
        self.changed.notify_one();
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
                    let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
                    if known.get(key).is_none_or(|k| k.revision < revision) {
                        known.insert(key.to_string(), Versioned { record, revision });
                    }
                    return Ok(());
                }
                None => current = self.read(key).await?,
            }
        }
        anyhow::bail!("limit {key}: compare-and-set kept failing")
    }

    /// A delivery's claim of a slot of `key`.
    pub(crate) async fn acquire(self: &Arc<Self>, key: &str, claim: &Claim<'_>) -> anyhow::Result<Decision> {
        let lease = self.lease_chrono();
        let claim = claim.owned();
        self.modify(key, move |record| {
            let before = record.clone();
            let decision = rules::acquire(record, &claim.as_claim(), Utc::now(), lease);
            (decision, *record != before)
        })
        .await
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

    /// Sleeps until the earliest time a key with waiting runs needs a hand-over (a lease end,
    /// or now after an override raised its limit), then drops expired holders and hands their
    /// slots over; re-plans on every change of the bucket. Until `stop`.
    pub(crate) async fn deadlines(self: Arc<Self>, stop: CancellationToken) {
        let mut retry_at: HashMap<String, chrono::DateTime<Utc>> = HashMap::new();
        loop {
            let now = Utc::now();
            let due: Vec<(String, chrono::DateTime<Utc>)> = {
                let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
                known
                    .iter()
                    .filter_map(|(key, v)| rules::next_due(&v.record, now).map(|at| (key.clone(), at)))
                    .map(|(key, at)| {
                        let at = retry_at.get(&key).map_or(at, |retry| at.max(*retry));
                        (key, at)
                    })
                    .collect()
            };
            let next = due.iter().map(|(_, at)| *at).min();
            let wait = next.map(|at| (at - now).to_std().unwrap_or_default());
            let changed = self.changed.notified();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                () = changed => continue,
                () = sleep_for(wait) => {}
            }
            let now = Utc::now();
            retry_at.retain(|_, at| *at > now);
            for (key, at) in due.into_iter().filter(|(_, at)| *at <= now) {
                let _ = at;
                if let Err(error) = self.reclaim(&key).await {
                    self.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(error = format!("{error:#}"), key, "cannot hand a concurrency slot over");
                    retry_at.insert(key, now + chrono::Duration::from_std(RETRY_AFTER).unwrap_or_default());
                }
            }
        }
    }

    /// Drops the expired holders of `key` and hands free slots over.
    async fn reclaim(self: &Arc<Self>, key: &str) -> anyhow::Result<()> {
        let lease = self.lease_chrono();
        let worker = self.worker.clone();
        let name = key.to_string();
        let handed = self
            .modify(key, move |record| {
                let expired = rules::expire(record, Utc::now());
                let handed = rules::hand_over(record, &worker, Utc::now(), lease);
                if expired > 0 {
                    tracing::info!(
                        key = name.as_str(),
                        expired,
                        "concurrency slots whose lease ran out reclaimed"
                    );
                }
                let changed = expired > 0 || !handed.is_empty();
                (handed, changed)
            })
            .await?;
        self.deliver_handed(key, handed).await;
        Ok(())
    }
}

/// Sleeps `wait`, or forever without one.
async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
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
