//! The circuit breaker's rules as pure functions on a [`BreakerRecord`]: counting into window
//! slots, the merge of a worker's counts, opening, half-open probe grants and their verdicts,
//! doubling of the open period. No I/O and no clock: every function takes `now`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::spec::BreakerSpec;
use jetsched_shared::wire::{BREAKER_SLOTS, BreakerRecord, BreakerSlot, BreakerState};

/// A state change made by one write (told as a `breaker.*` event by the worker whose write it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    HalfOpened,
    Closed,
}

/// Attempts counted by one worker since its last merge, by window slot (slot start in ms).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Delta {
    slots: BTreeMap<i64, (u64, u64)>,
}

impl Delta {
    /// Counts one attempt that ended at `at` (`failed`: a retryable or permanent failure).
    pub(crate) fn count(&mut self, window: Duration, at: DateTime<Utc>, failed: bool) {
        let slot = slot_start(window, at);
        let entry = self.slots.entry(slot).or_default();
        entry.0 += 1;
        entry.1 += u64::from(failed);
    }

    /// Adds `other`'s counts (counts whose merge failed, kept for the next one).
    pub(crate) fn absorb(&mut self, other: &Delta) {
        for (&slot, &(runs, failures)) in &other.slots {
            let entry = self.slots.entry(slot).or_default();
            entry.0 += runs;
            entry.1 += failures;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Length of one window slot in milliseconds (at least 1).
fn slot_ms(window: Duration) -> i64 {
    (i64::try_from(window.as_millis()).unwrap_or(i64::MAX) / i64::from(BREAKER_SLOTS)).max(1)
}

/// Start (ms since the epoch) of the slot `at` falls in.
fn slot_start(window: Duration, at: DateTime<Utc>) -> i64 {
    let len = slot_ms(window);
    at.timestamp_millis().div_euclid(len) * len
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn after(now: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    now + chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 2))
}

/// Drops slots that ended before the window ending at `now`.
fn prune(record: &mut BreakerRecord, window: Duration, now: DateTime<Utc>) {
    let len = slot_ms(window);
    let oldest = now.timestamp_millis() - i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2);
    record.slots.retain(|s| s.start.timestamp_millis() + len > oldest);
}

/// Merges a worker's counts into the record. Counts only matter while the breaker is closed
/// (attempts that started before it opened and ended after are dropped); the merge that makes
/// the window reach `min_runs` with a failure rate of at least `failure_rate` opens it.
pub(crate) fn merge(
    record: &mut BreakerRecord,
    delta: &Delta,
    spec: &BreakerSpec,
    now: DateTime<Utc>,
) -> Option<Transition> {
    if record.state != BreakerState::Closed {
        return None;
    }
    record.window_ms = millis(spec.window);
    for (&start, &(runs, failures)) in &delta.slots {
        match record.slots.iter_mut().find(|s| s.start.timestamp_millis() == start) {
            Some(slot) => {
                slot.runs += runs;
                slot.failures += failures;
            }
            None => {
                let Some(start) = DateTime::from_timestamp_millis(start) else { continue };
                record.slots.push(BreakerSlot { start, runs, failures });
            }
        }
    }
    record.slots.sort_by_key(|s| s.start);
    prune(record, spec.window, now);
    let (runs, failures) = record.window_counts(now);
    let tripped = runs >= u64::from(spec.min_runs) && failures as f64 >= spec.failure_rate * runs as f64;
    if !tripped {
        return None;
    }
    record.opened_runs = runs;
    record.opened_failures = failures;
    let open_for = if record.open_for_ms == 0 { millis(spec.open_for) } else { record.open_for_ms };
    open(record, open_for, now);
    Some(Transition::Opened)
}

fn open(record: &mut BreakerRecord, open_for_ms: u64, now: DateTime<Utc>) {
    record.state = BreakerState::Open;
    record.opened_at = Some(now);
    record.open_for_ms = open_for_ms;
    record.open_until = Some(after(now, open_for_ms));
    record.probes_granted = 0;
    record.probes_succeeded = 0;
    record.probe_deadline = None;
}

/// What a delivery may do, as far as the breaker is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Closed: run (and count the attempt).
    Run,
    /// Run as a probe of half-open round `round`; report its verdict with [`probe_verdict`].
    Probe { round: u64 },
    /// Do not run (delay or skip).
    ShortCircuit,
}

/// What the record says without writing: closed runs, open before `open_until` short-circuits,
/// anything else needs [`grant_probe`] (a compare-and-set).
pub(crate) fn peek(record: &BreakerRecord, now: DateTime<Utc>) -> Option<Admission> {
    match record.state {
        BreakerState::Closed => Some(Admission::Run),
        BreakerState::Open if record.open_until.is_none_or(|until| now < until) => {
            Some(Admission::ShortCircuit)
        }
        _ => None,
    }
}

/// Asks for a probe: an open breaker past `open_until` turns half open (a new round); a
/// half-open one grants up to `half_open_runs` probes per round. Probes granted and not
/// reported by `probe_deadline` (their worker died) are given back. `probe_for`: how long the
/// asking run may take. Returns the admission and the transition made, if any; the caller
/// writes the record when it changed (anything but `Run` and a plain `ShortCircuit`).
pub(crate) fn grant_probe(
    record: &mut BreakerRecord,
    spec: &BreakerSpec,
    probe_for: Duration,
    now: DateTime<Utc>,
) -> (Admission, Option<Transition>) {
    if let Some(admission) = peek(record, now) {
        return (admission, None);
    }
    let mut transition = None;
    if record.state == BreakerState::Open {
        record.state = BreakerState::HalfOpen;
        record.probe_round += 1;
        record.probes_granted = 0;
        record.probes_succeeded = 0;
        record.probe_deadline = None;
        transition = Some(Transition::HalfOpened);
    } else if record.probe_deadline.is_some_and(|deadline| now >= deadline) {
        record.probes_granted = record.probes_succeeded;
        record.probe_deadline = None;
    }
    if record.probes_granted >= spec.half_open_runs {
        return (Admission::ShortCircuit, transition);
    }
    record.probes_granted += 1;
    let deadline = now + chrono::Duration::from_std(probe_for).unwrap_or(chrono::Duration::MAX / 2);
    record.probe_deadline = Some(record.probe_deadline.map_or(deadline, |d| d.max(deadline)));
    (Admission::Probe { round: record.probe_round }, transition)
}

/// Records a probe's verdict (of round `round`; a verdict of an older round, or arriving
/// after a reset, changes nothing). A failure opens the breaker again for twice as long (up to
/// `max_open_for`); the last needed success closes it (window cleared, open period reset).
pub(crate) fn probe_verdict(
    record: &mut BreakerRecord,
    spec: &BreakerSpec,
    round: u64,
    succeeded: bool,
    now: DateTime<Utc>,
) -> Option<Transition> {
    if record.state != BreakerState::HalfOpen || record.probe_round != round {
        return None;
    }
    if !succeeded {
        let base = if record.open_for_ms == 0 { millis(spec.open_for) } else { record.open_for_ms };
        let doubled = base.saturating_mul(2).min(millis(spec.max_open_for)).max(millis(spec.open_for));
        // The probe round's own figures are what the opened event tells: its successes so
        // far and this failure.
        record.opened_runs = u64::from(record.probes_succeeded) + 1;
        record.opened_failures = 1;
        open(record, doubled, now);
        return Some(Transition::Opened);
    }
    record.probes_succeeded += 1;
    if record.probes_succeeded < spec.half_open_runs {
        return None;
    }
    close(record);
    Some(Transition::Closed)
}

/// A closed breaker with an empty window (the counters of auto-pause kept).
pub(crate) fn close(record: &mut BreakerRecord) {
    record.state = BreakerState::Closed;
    record.slots.clear();
    record.open_until = None;
    record.open_for_ms = 0;
    record.probes_granted = 0;
    record.probes_succeeded = 0;
    record.probe_deadline = None;
}

/// When a short-circuited run should be looked at again: the end of the open period, or, half
/// open, once the probe round had time to conclude (one `open_for` from now).
pub(crate) fn retry_at(record: &BreakerRecord, spec: &BreakerSpec, now: DateTime<Utc>) -> DateTime<Utc> {
    match (record.state, record.open_until) {
        (BreakerState::Open, Some(until)) if until > now => until,
        _ => after(now, millis(spec.open_for)),
    }
}

#[cfg(test)]
mod tests;
