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
//! is never wrong. A busy key with burst to spare also gets starts reserved ahead by the same
//! write ([`ahead`]): the next runs of the key take them without a write.

pub(crate) mod ahead;
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
use jetsched_shared::wire::{Event, EventKind, RateDeclared, RateRecord};
use prometheus::{IntCounterVec, Registry};
use tokio::sync::oneshot;

use self::ahead::Ahead;
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
    /// `jetsched_limit_rate_writes_total{outcome}`: compare-and-sets of rate-limit keys,
    /// `written` or lost to another worker (`conflict`).
    writes: IntCounterVec,
    /// `jetsched_limit_rate_starts_total{how}`: starts given by a write (`written`) or taken
    /// from a block reserved ahead (`ahead`).
    starts: IntCounterVec,
}

/// One key in this worker: the state it last wrote or read, and the runs waiting for a write.
#[derive(Default)]
struct Cell {
    known: Option<(KeyState, u64)>,
    pending: Vec<Request>,
    flushing: bool,
    ahead: Ahead,
}

/// A write's outcome: the batch decided, the revision stored, the starts reserved ahead and the
/// time they were reserved at.
struct Committed {
    batch: Batch,
    revision: u64,
    ahead: u32,
    at: i64,
}

/// A run waiting for its key's decision.
struct Request {
    gcra: Gcra,
    /// The limit as the run's spec declares it, stored with the state for the limits API.
    declared: RateDeclared,
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
        let writes = counter_vec(
            registry,
            "jetsched_limit_rate_writes_total",
            "Compare-and-sets of rate-limit keys: written, or lost to another worker (conflict)",
            &["outcome"],
        )?;
        let starts = counter_vec(
            registry,
            "jetsched_limit_rate_starts_total",
            "Rate-limited starts given by a write (written) or from starts reserved ahead (ahead)",
            &["how"],
        )?;
        Ok(Rates { kv, events, worker, keys: Mutex::new(HashMap::new()), throttled, writes, starts })
    }

    /// The decision on one run of `key` (a bucket key), arriving now: its start time
    /// (microseconds since the epoch), or a skip. `about` is the run's event template.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        key: &str,
        gcra: Gcra,
        declared: RateDeclared,
        on_limit: OnLimit,
        about: Event,
    ) -> anyhow::Result<Decision> {
        let (reply, answer) = oneshot::channel();
        let now = Utc::now().timestamp_micros();
        let lead = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            let cell = keys.entry(key.to_string()).or_default();
            cell.ahead.arrive(now);
            // No write queued before it: a start reserved ahead serves it at once.
            if cell.pending.is_empty()
                && let Some(start) = cell.ahead.take(gcra, now)
            {
                self.starts.with_label_values(&["ahead"]).inc();
                return Ok(Decision::Start(start));
            }
            cell.pending.push(Request { gcra, declared, on_limit, about, reply });
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
            let (batch, known, want) = {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                let Some(cell) = keys.get_mut(key) else { return };
                // The runs that queued during the last write take the starts it reserved ahead.
                let now = Utc::now().timestamp_micros();
                let served =
                    cell.pending.iter().take_while(|r| cell.ahead.take(r.gcra, now).is_some()).count();
                for request in cell.pending.drain(..served) {
                    self.starts.with_label_values(&["ahead"]).inc();
                    let _ = request.reply.send(Ok(Decision::Start(now)));
                }
                if cell.pending.is_empty() {
                    cell.flushing = false;
                    return;
                }
                // One write decides for the runs that share the first one's settings.
                let gcra = cell.pending[0].gcra;
                let same = cell.pending.iter().take_while(|r| r.gcra == gcra).count();
                let want = cell.ahead.wanted(same);
                (cell.pending.drain(..same).collect::<Vec<_>>(), cell.known, want)
            };
            let on_limits: Vec<OnLimit> = batch.iter().map(|r| r.on_limit).collect();
            let (gcra, declared) = (batch[0].gcra, batch[0].declared);
            let decided = self.commit(key, gcra, declared, &on_limits, known, want).await;
            match decided {
                Ok(Committed { batch: decided, revision, ahead, at }) => {
                    self.remember(key, decided.state, revision, gcra, ahead, at);
                    self.starts.with_label_values(&["written"]).inc_by(batch.len() as u64);
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

    /// Decides on `on_limits` against the key's state, reserves up to `want` starts ahead that
    /// begin at once, and stores the new state with compare-and-set (re-read from the leader
    /// after a lost race).
    async fn commit(
        &self,
        key: &str,
        gcra: Gcra,
        declared: RateDeclared,
        on_limits: &[OnLimit],
        known: Option<(KeyState, u64)>,
        want: u32,
    ) -> anyhow::Result<Committed> {
        let mut known = known;
        for _ in 0..CAS_ROUNDS {
            let (state, revision) = match known.take() {
                Some(known) => known,
                None => self.read(key).await?,
            };
            let now = Utc::now().timestamp_micros();
            let mut batch = gcra.decide(state, now, on_limits);
            let (ahead, after) = gcra.ahead(batch.state, now, want);
            if ahead > 0 {
                (batch.state, batch.changed) = (after, true);
            }
            if !batch.changed {
                return Ok(Committed { batch, revision, ahead, at: now });
            }
            let record = RateRecord {
                tat_us: batch.state.tat,
                throttled_since_us: batch.state.throttled_since,
                declared: Some(declared),
            };
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
                Ok(revision) => {
                    self.writes.with_label_values(&["written"]).inc();
                    return Ok(Committed { batch, revision, ahead, at: now });
                }
                // Another worker wrote first: read and decide again.
                Err(None) => {
                    self.writes.with_label_values(&["conflict"]).inc();
                    continue;
                }
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

    fn remember(&self, key: &str, state: KeyState, revision: u64, gcra: Gcra, ahead: u32, at: i64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cell) = keys.get_mut(key) {
            cell.known = Some((state, revision));
            cell.ahead.fill(gcra, ahead, at);
        }
    }

    fn forget(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cell) = keys.get_mut(key) {
            cell.known = None;
            cell.ahead.drop_block();
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
