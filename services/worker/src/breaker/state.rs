//! The breakers as this worker knows them ([`Breakers`]): the latest record of every breaker,
//! the counts not merged yet, and the `breaker.*` event of each transition this worker's
//! write made.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::{BreakerKey, Names, SHARED_BREAKER_SCOPE};
use jetsched_shared::spec::BreakerSpec;
use jetsched_shared::wire::{BreakerRecord, Event, EventKind};
use tokio::sync::Notify;

use super::machine::{Delta, Transition};
use super::store::{Store, Versioned};
use crate::metrics::Metrics;

/// How long a transition's event is published again before it is given up (and counted).
const EVENT_RETRY_FOR: Duration = Duration::from_secs(10);

/// The breakers as this worker knows them, and the counts it has not merged yet.
pub(crate) struct Breakers {
    pub(super) store: Store,
    pub(super) js: jetstream::Context,
    pub(super) names: Names,
    events: EventPublisher,
    pub(super) metrics: Metrics,
    /// Breaker keys shared by every namespace (`--shared-breakers`); any other key belongs to
    /// the namespace of the task naming it.
    pub(super) shared: HashSet<String>,
    /// Latest record per key, from the watch and from this worker's own writes.
    pub(super) known: Mutex<HashMap<String, Versioned>>,
    /// Attempts counted since the last merge, per key.
    pub(super) pending: Mutex<HashMap<String, Pending>>,
    /// Wakes the merge loop when the first count of a period arrives.
    pub(super) counted: Notify,
}

pub(super) struct Pending {
    pub(super) spec: BreakerSpec,
    pub(super) delta: Delta,
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

    pub(super) fn known(&self, key: &str) -> Option<Versioned> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Keeps `stored` as the latest record of `key` unless a newer one is known already.
    pub(super) fn remember(&self, key: &str, stored: Versioned) {
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
    pub(super) fn forget(&self, key: &str, revision: u64) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.get(key).is_some_and(|k| k.revision < revision) {
            known.remove(key);
        }
        drop(known);
        self.metrics.breaker_state.with_label_values(&[key]).set(0);
    }

    /// Counts and logs a bucket operation on `key` that failed (`what` says which).
    pub(super) fn failed(&self, key: &str, error: &anyhow::Error, what: &str) {
        self.metrics.errors.with_label_values(&["breaker"]).inc();
        tracing::warn!(error = format!("{error:#}"), key, "{what}");
    }

    /// Tells the `breaker.*` event of a transition this worker's write made (in the
    /// background, with a message id so a retried publish is stored once).
    pub(super) fn tell(&self, key: &str, transition: Transition, stored: &Versioned) {
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
