//! Rate limits shared by every worker through `JETSCHED_RATES` (docs/limits.md).
//!
//! Each key's state is one KV entry (its GCRA theoretical arrival time, [`gcra`]), written with
//! compare-and-set: a reservation fixes the run's start time, so no worker keeps a limit in
//! memory alone and pacing does not depend on polling. Deliveries of one key arriving together
//! in a worker share one write (a group commit: while a write is in flight the next ones queue,
//! and the next write decides for all of them), so a busy key costs each worker about one write
//! per round trip, whatever its rate. The worker remembers the state and revision it wrote
//! last; a lost race (another worker wrote) reads the key from the stream's leader and decides
//! again. The TAT never goes down, so a decision from a stale state that writes nothing (a skip)
//! is never wrong.

pub(crate) mod gcra;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use async_nats::jetstream::kv;
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch, read_leader};
use jetsched_shared::events::EventPublisher;
use jetsched_shared::metrics::counter_vec;
use jetsched_shared::spec::OnLimit;
use jetsched_shared::wire::{Event, EventKind, RateRecord};
use prometheus::{IntCounterVec, Registry};
use tokio::sync::oneshot;

use self::gcra::{Batch, Decision, Gcra, KeyState};

/// Compare-and-set rounds before a reservation gives up (the run is handed back).
const CAS_ROUNDS: usize = 16;

/// Rate limits as one worker uses them.
pub(crate) struct Rates {
    kv: kv::Store,
    events: EventPublisher,
    worker: String,
    keys: Mutex<HashMap<String, Cell>>,
    /// `jetsched_limit_throttled_total{key, action}`: runs a rate limit delayed or skipped.
    pub(crate) throttled: IntCounterVec,
}

/// One key in this worker: the state it last wrote or read, and the runs waiting for a write.
#[derive(Default)]
struct Cell {
    known: Option<(KeyState, u64)>,
    pending: Vec<Request>,
    flushing: bool,
}

/// A run waiting for its key's decision.
struct Request {
    gcra: Gcra,
    on_limit: OnLimit,
    /// The run, for the event that a throttling episode began.
    about: Event,
    reply: oneshot::Sender<Result<Decision, String>>,
}

impl Rates {
    pub(crate) fn new(
        kv: kv::Store,
        events: EventPublisher,
        worker: String,
        registry: &Registry,
    ) -> anyhow::Result<Rates> {
        let throttled = counter_vec(
            registry,
            "jetsched_limit_throttled_total",
            "Runs a rate limit delayed (action delay) or skipped (action skip), per key",
            &["key", "action"],
        )?;
        Ok(Rates { kv, events, worker, keys: Mutex::new(HashMap::new()), throttled })
    }

    /// The decision on one run of `key` (a bucket key), arriving now: its start time
    /// (microseconds since the epoch), or a skip. `about` is the run's event template.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        key: &str,
        gcra: Gcra,
        on_limit: OnLimit,
        about: Event,
    ) -> anyhow::Result<Decision> {
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            let cell = keys.entry(key.to_string()).or_default();
            cell.pending.push(Request { gcra, on_limit, about, reply });
            !std::mem::replace(&mut cell.flushing, true)
        };
        if lead {
            // Its own task: the queued runs get their answer even if this delivery goes away.
            let (rates, key) = (self.clone(), key.to_string());
            tokio::spawn(async move { rates.flush(&key).await });
        }
        match answer.await {
            Ok(Ok(decision)) => Ok(decision),
            Ok(Err(error)) => Err(anyhow::anyhow!(error)),
            Err(_) => anyhow::bail!("the reservation of {key} was dropped"),
        }
    }

    /// Writes decisions for the runs of `key` waiting, batch after batch, until none waits.
    async fn flush(&self, key: &str) {
        loop {
            let (batch, known) = {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                let Some(cell) = keys.get_mut(key) else { return };
                if cell.pending.is_empty() {
                    cell.flushing = false;
                    return;
                }
                // One write decides for the runs that share the first one's settings.
                let gcra = cell.pending[0].gcra;
                let same = cell.pending.iter().take_while(|r| r.gcra == gcra).count();
                (cell.pending.drain(..same).collect::<Vec<_>>(), cell.known)
            };
            let on_limits: Vec<OnLimit> = batch.iter().map(|r| r.on_limit).collect();
            let decided = self.commit(key, batch[0].gcra, &on_limits, known).await;
            match decided {
                Ok((decided, revision)) => {
                    self.remember(key, decided.state, revision);
                    if decided.episode {
                        self.tell_throttled(key, &batch[0].about, revision);
                    }
                    for (request, decision) in batch.into_iter().zip(decided.decisions) {
                        let _ = request.reply.send(Ok(decision));
                    }
                }
                Err(error) => {
                    self.forget(key);
                    let text = format!("{error:#}");
                    for request in batch {
                        let _ = request.reply.send(Err(text.clone()));
                    }
                }
            }
        }
    }

    /// Decides on `on_limits` against the key's state, and stores the new state with
    /// compare-and-set (re-read from the leader after a lost race). The batch and the revision
    /// now stored.
    async fn commit(
        &self,
        key: &str,
        gcra: Gcra,
        on_limits: &[OnLimit],
        known: Option<(KeyState, u64)>,
    ) -> anyhow::Result<(Batch, u64)> {
        let mut known = known;
        for _ in 0..CAS_ROUNDS {
            let (state, revision) = match known.take() {
                Some(known) => known,
                None => self.read(key).await?,
            };
            let now = Utc::now().timestamp_micros();
            let batch = gcra.decide(state, now, on_limits);
            if !batch.changed {
                return Ok((batch, revision));
            }
            let record =
                RateRecord { tat_us: batch.state.tat, throttled_since_us: batch.state.throttled_since };
            let value = serde_json::to_vec(&record).context("encode rate record")?;
            let written = if revision == 0 {
                self.kv.create(key, value.into()).await.map_err(|error| {
                    if is_already_exists(&error) { None } else { Some(anyhow::Error::new(error)) }
                })
            } else {
                self.kv.update(key, value.into(), revision).await.map_err(|error| {
                    if is_revision_mismatch(&error) { None } else { Some(anyhow::Error::new(error)) }
                })
            };
            match written {
                Ok(revision) => return Ok((batch, revision)),
                // Another worker wrote first: read and decide again.
                Err(None) => continue,
                Err(Some(error)) => return Err(error).with_context(|| format!("write rate limit {key}")),
            }
        }
        anyhow::bail!("rate limit {key}: compare-and-set kept failing")
    }

    /// The key's state and revision as the stream's leader has it (0: no entry).
    async fn read(&self, key: &str) -> anyhow::Result<(KeyState, u64)> {
        let latest = read_leader(&self.kv.stream, &self.kv.name, key)
            .await
            .with_context(|| format!("read rate limit {key}"))?;
        let Some(message) = latest else { return Ok((KeyState::default(), 0)) };
        if message.is_kv_marker() {
            return Ok((KeyState::default(), message.sequence));
        }
        let record: RateRecord =
            serde_json::from_slice(&message.payload).with_context(|| format!("decode rate limit {key}"))?;
        let state = KeyState { tat: record.tat_us, throttled_since: record.throttled_since_us };
        Ok((state, message.sequence))
    }

    fn remember(&self, key: &str, state: KeyState, revision: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cell) = keys.get_mut(key) {
            cell.known = Some((state, revision));
        }
    }

    fn forget(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cell) = keys.get_mut(key) {
            cell.known = None;
        }
    }

    /// `limit.throttled`, told by the worker whose write began the episode (once: its id is
    /// the key and the revision).
    fn tell_throttled(&self, key: &str, about: &Event, revision: u64) {
        let (namespace, name) = key.split_once('.').unwrap_or(("", key));
        let event = Event {
            execution_id: about.execution_id.clone(),
            worker: Some(self.worker.clone()),
            key: Some(key.to_string()),
            ..Event::new(EventKind::LimitThrottled, namespace, name)
        };
        tracing::info!(key, "rate limit throttling");
        let id = format!("limit:{key}:{revision}");
        let events = self.events.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
            if let Err(error) = events.store_until(&event, Some(&id), deadline).await {
                events.give_up(&event, &error);
            }
        });
    }
}
