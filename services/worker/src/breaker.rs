//! Circuit breakers shared by every worker through `JETSCHED_BREAKERS`.
//!
//! A breaker belongs to a namespace: a task's own (`task.<namespace>.<id>`) or a key named by
//! tasks of one namespace (`key.<namespace>.<key>`); a key the workers declare shared
//! (`--shared-breakers`) has one breaker for every namespace (`key.=shared.<key>`).
//!
//! Each worker keeps the latest record of every breaker from one watch of the bucket, so a
//! delivery behind a closed (or plainly open) breaker costs no KV operation. Attempts are
//! counted in memory and merged into the records every [`sync::MERGE_EVERY`] with compare-and-set
//! ([`sync`]); the merge that trips the window opens the breaker. Half-open probes are granted
//! and judged by compare-and-set one by one. Whoever's write made a transition tells its
//! `breaker.*` event, so each is told once ([`state`]). The rules themselves are pure
//! ([`machine`]).

mod machine;
mod pause;
mod state;
mod store;
mod sync;

use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::spec::BreakerSpec;
use jetsched_shared::wire::{BreakerRecord, Dispatch};

pub(crate) use self::machine::Admission;
use self::machine::Delta;
pub(crate) use self::state::Breakers;
use self::state::Pending;

/// A probe may run for its task's timeout plus this much before its grant is given back.
const PROBE_MARGIN: Duration = Duration::from_secs(5);

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
                self.failed(&key, &error, "cannot ask the breaker for a probe");
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
                        self.failed(&gate.key, &error, "cannot record a probe's verdict; its grant lapses");
                    }
                }
            }
        }
    }
}
