//! Circuit breakers shared by every worker through `JETSCHED_BREAKERS`.
//!
//! A breaker belongs to a namespace: a task's own (`task.<namespace>.<id>`) or a key named by
//! tasks of one namespace (`key.<namespace>.<key>`); a key the workers declare shared
//! (`--shared-breakers`) has one breaker for every namespace (`key.=shared.<key>`).
//!
//! Each worker keeps the latest record of every breaker from one watch of the bucket, so a
//! delivery behind a closed (or plainly open) breaker costs no KV operation. Attempts are
//! counted in memory and merged into the records every [`MERGE_EVERY`] with compare-and-set
//! ([`sync`]); the merge that trips the window opens the breaker. Half-open probes are granted
//! and judged by compare-and-set one by one. Whoever's write made a transition tells its
//! `breaker.*` event, so each is told once. The rules themselves are pure ([`machine`]).

mod machine;
mod pause;
mod store;
mod sync;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::{BreakerKey, Names, SHARED_BREAKER_SCOPE};
use jetsched_shared::spec::BreakerSpec;
use jetsched_shared::wire::{BreakerRecord, Dispatch, Event, EventKind};
use tokio::sync::Notify;

use crate::metrics::Metrics;
pub(crate) use machine::Admission;
use machine::{Delta, Transition};
use store::{Store, Versioned};

/// How often a worker merges its counts into the records (at most this long of counts is lost
/// with a killed worker; a state change reaches every worker within this plus the watch's
/// latency).
pub(crate) const MERGE_EVERY: Duration = Duration::from_millis(250);

/// A probe may run for its task's timeout plus this much before its grant is given back.
const PROBE_MARGIN: Duration = Duration::from_secs(5);

/// How long a transition's event is published again before it is given up (and counted).
const EVENT_RETRY_FOR: Duration = Duration::from_secs(10);

/// The breakers as this worker knows them, and the counts it has not merged yet.
pub(crate) struct Breakers {
    store: Store,
    js: jetstream::Context,
    names: Names,
    events: EventPublisher,
    metrics: Metrics,
    /// Breaker keys shared by every namespace (`--shared-breakers`); any other key belongs to
    /// the namespace of the task naming it.
    shared: HashSet<String>,
    /// Latest record per key, from the watch and from this worker's own writes.
    known: Mutex<HashMap<String, Versioned>>,
    /// Attempts counted since the last merge, per key.
    pending: Mutex<HashMap<String, Pending>>,
    /// Wakes the merge loop when the first count of a period arrives.
    counted: Notify,
}

struct Pending {
    spec: BreakerSpec,
    delta: Delta,
}

/// The breaker's say on one delivery: its key, rules and admission, and the record it was
/// judged on.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    pub(crate) key: String,
    pub(crate) spec: BreakerSpec,
    pub(crate) admission: Admission,
    pub(crate) record: BreakerRecord,
}

impl Gate {
    /// When a short-circuited run should come back: after the open period, spread over one
    /// more `open_for` (`spread` in [0, 1)) so delayed runs return at a bounded rate.
    pub(crate) fn comeback(&self, now: DateTime<Utc>, spread: f64) -> DateTime<Utc> {
        let at = machine::retry_at(&self.record, &self.spec, now);
        let extra = self.spec.open_for.mul_f64(spread.clamp(0.0, 1.0));
        at + chrono::Duration::from_std(extra).unwrap_or_default()
    }
}

impl Breakers {
    pub(crate) fn new(
        kv: kv::Store,
        js: jetstream::Context,
        names: Names,
        worker: String,
        events: EventPublisher,
        metrics: Metrics,
        shared: HashSet<String>,
    ) -> Breakers {
        Breakers {
            store: Store::new(kv, worker),
            js,
            names,
            events,
            metrics,
            shared,
            known: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            counted: Notify::new(),
        }
    }

    /// The breaker's admission of a delivery of `dispatch` (`None`: the task has no breaker).
    /// Closed, or open before `open_until`: decided from the watched record, no KV operation.
    /// Otherwise a probe is asked for with compare-and-set. A failure to reach the bucket
    /// short-circuits (the run comes back later) rather than hammer a downstream that may be
    /// down.
    pub(crate) async fn admit(&self, dispatch: &Dispatch) -> Option<Gate> {
        let spec = dispatch.spec.breaker.as_ref()?;
        let key = spec.bucket_key(&dispatch.namespace, &dispatch.task_id, |key| self.shared.contains(key));
        let now = Utc::now();
        // The common case, closed, copies nothing out of the known records.
        let known = {
            let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            match known.get(&key) {
                None => None,
                Some(k) if machine::peek(&k.record, now) == Some(Admission::Run) => None,
                Some(k) => Some(k.clone()),
            }
        };
        let record = known.as_ref().map(|k| k.record.clone()).unwrap_or_default();
        if let Some(admission) = machine::peek(&record, now) {
            return Some(Gate { key, spec: spec.clone(), admission, record });
        }
        let probe_for = dispatch.spec.timeout + PROBE_MARGIN;
        let asked = self
            .store
            .modify(&key, known, |record| {
                let before = record.clone();
                let out = machine::grant_probe(record, spec, probe_for, Utc::now());
                (out, *record != before)
            })
            .await;
        let (admission, record) = match asked {
            Ok(((admission, transition), stored)) => {
                if let Some(transition) = transition {
                    self.tell(&key, transition, &stored);
                }
                let record = stored.record.clone();
                self.remember(&key, stored);
                (admission, record)
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["breaker"]).inc();
                tracing::warn!(error = format!("{error:#}"), key, "cannot ask the breaker for a probe");
                (Admission::ShortCircuit, record)
            }
        };
        Some(Gate { key, spec: spec.clone(), admission, record })
    }

    /// Counts the verdict of an attempt the gate let through (`failed`: a retryable or
    /// permanent failure). A closed breaker's attempt waits for the next merge; a probe's
    /// verdict is written at once.
    pub(crate) async fn report(&self, gate: &Gate, failed: bool) {
        match gate.admission {
            Admission::ShortCircuit => {}
            Admission::Run => {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let entry = pending
                    .entry(gate.key.clone())
                    .or_insert_with(|| Pending { spec: gate.spec.clone(), delta: Delta::default() });
                entry.spec.clone_from(&gate.spec);
                entry.delta.count(gate.spec.window, Utc::now(), failed);
                drop(pending);
                self.counted.notify_one();
            }
            Admission::Probe { round } => {
                let judged = self
                    .store
                    .modify(&gate.key, self.known(&gate.key), |record| {
                        let before = record.clone();
                        let transition =
                            machine::probe_verdict(record, &gate.spec, round, !failed, Utc::now());
                        (transition, *record != before)
                    })
                    .await;
                match judged {
                    Ok((transition, stored)) => {
                        if let Some(transition) = transition {
                            self.tell(&gate.key, transition, &stored);
                        }
                        self.remember(&gate.key, stored);
                    }
                    Err(error) => {
                        self.metrics.errors.with_label_values(&["breaker"]).inc();
                        tracing::warn!(
                            error = format!("{error:#}"),
                            key = gate.key,
                            "cannot record a probe's verdict; its grant lapses"
                        );
                    }
                }
            }
        }
    }

    fn known(&self, key: &str) -> Option<Versioned> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Keeps `stored` as the latest record of `key` unless a newer one is known already.
    fn remember(&self, key: &str, stored: Versioned) {
        let state = stored.record.state;
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        match known.get(key) {
            Some(current) if current.revision > stored.revision => return,
            _ => {}
        }
        known.insert(key.to_string(), stored);
        drop(known);
        self.metrics.breaker_state.with_label_values(&[key]).set(state.gauge());
    }

    /// Forgets a deleted key (a reset by delete reads as closed).
    fn forget(&self, key: &str, revision: u64) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.get(key).is_some_and(|k| k.revision < revision) {
            known.remove(key);
        }
        drop(known);
        self.metrics.breaker_state.with_label_values(&[key]).set(0);
    }

    /// Tells the `breaker.*` event of a transition this worker's write made (in the
    /// background, with a message id so a retried publish is stored once).
    fn tell(&self, key: &str, transition: Transition, stored: &Versioned) {
        let record = &stored.record;
        let event = transition_event(key, transition, record, Utc::now(), self.store.worker());
        // The revision that made the transition: a retried publish is stored once.
        let id = format!("breaker:{key}:{}", stored.revision);
        tracing::info!(key, state = record.state.as_str(), "breaker {}", event.kind.as_str());
        let events = self.events.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + EVENT_RETRY_FOR;
            if let Err(error) = events.store_until(&event, Some(&id), deadline).await {
                events.give_up(&event, &error);
            }
        });
    }
}

/// The event of a transition of breaker `key` into `record`'s state.
fn transition_event(
    key: &str,
    transition: Transition,
    record: &BreakerRecord,
    now: DateTime<Utc>,
    worker: &str,
) -> Event {
    let kind = match transition {
        Transition::Opened => EventKind::BreakerOpened,
        Transition::HalfOpened => EventKind::BreakerHalfOpened,
        Transition::Closed => EventKind::BreakerClosed,
    };
    let (namespace, id) =
        BreakerKey::parse(key).map_or((SHARED_BREAKER_SCOPE, key), BreakerKey::event_target);
    let (runs, failures) = match transition {
        Transition::Opened => (record.opened_runs, record.opened_failures),
        _ => record.window_counts(now),
    };
    Event {
        key: Some(key.to_string()),
        state: Some(record.state.as_str().to_string()),
        failure_rate: Some(if runs == 0 { 0.0 } else { failures as f64 / runs as f64 }),
        failures: Some(failures),
        runs: Some(runs),
        open_until: record.open_until,
        worker: Some(worker.to_string()),
        ..Event::new(kind, namespace, id)
    }
}
