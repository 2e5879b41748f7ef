//! The overlap rules (`allow`, `skip`, `buffer_one`, `cancel_other`, `replace`): whether a
//! task's previous scheduled run is still going, from its run record in `JETSCHED_RUNS`, what
//! happens to the new fire, and what is done to the previous run to make room for it.
//!
//! The decisions are pure (record, absence, age and policy in; decision out); the two reads
//! ([`is_going`] and [`wait_idle`]) run outside the scheduler's loop, which gets their result
//! back as an event. Tasks with `allow` never come here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv::{self, Entry, Operation};
use futures::StreamExt;
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::wire::RunStatus;
use serde::Deserialize;

/// How the scheduler knows the previous fire it asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Previous {
    /// This leader dispatched it: a missing run record means "not started yet".
    Dispatched,
    /// Taken over from the fire state after a leader change: it may have been skipped, so a
    /// missing record means nothing is going.
    Inherited,
}

/// The previous scheduled execution of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prior {
    pub(crate) execution_id: String,
    pub(crate) previous: Previous,
    /// Wall-clock age of its nominal fire.
    pub(crate) age: Duration,
    /// The runs bucket's TTL: an older record may be gone for that reason alone.
    pub(crate) ttl: Duration,
}

/// What happens to a fire that arrives for a gated task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// No previous scheduled run is known: dispatch without reading anything.
    Dispatch,
    /// Read the previous run's record first.
    Check,
    /// A fire of this task is already waiting (being checked or buffered): skip, reason overlap.
    Skip,
}

/// The decision for a fire after the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Dispatch,
    /// `skip` while the previous run is going.
    Skip,
}

/// The part of a run record the scheduler reads (the worker owns the rest).
#[derive(Debug, Deserialize)]
struct RunView {
    status: RunStatus,
}

/// Whether a fire is gated at all.
pub(crate) fn gated(policy: OverlapPolicy) -> bool {
    policy != OverlapPolicy::Allow
}

/// A fire of a gated task arrives: `waiting` = another fire of the task is being checked or
/// buffered, `known` = a previous scheduled execution is known. (Under a policy where the
/// newest fire wins, [`newest_wins`], the waiting fire gives way instead of the new one.)
pub(crate) fn arrive(waiting: bool, known: bool) -> Arrival {
    match (waiting, known) {
        (true, _) => Arrival::Skip,
        (false, false) => Arrival::Dispatch,
        (false, true) => Arrival::Check,
    }
}

/// Whether a new fire takes the place of the fire waiting (`cancel_other`, `replace`), rather
/// than being skipped itself (`skip`, `buffer_one`).
pub(crate) fn newest_wins(policy: OverlapPolicy) -> bool {
    matches!(policy, OverlapPolicy::CancelOther | OverlapPolicy::Replace)
}

/// What a check under `cancel_other` or `replace` does next about the previous run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing of it is going (ended, or never known to be dispatched): the new fire goes.
    Dispatch,
    /// It has not started (queued without a record, or held), or under `cancel_other` waits
    /// for a retry: settle its record `cancelled` by compare-and-set, so it never starts.
    Settle,
    /// It is running and the policy is `cancel_other`: mark it cancelled for its worker to
    /// stop it, then wait for its record to be final.
    Stop,
    /// It is running (or, under `replace`, waits for a retry): wait for its record to be final.
    Wait,
}

/// The next step of a check under `policy` (`cancel_other` or `replace`), from the previous
/// run's record status (`None`: no record) as [`going`] reads a missing one.
pub(crate) fn step(
    policy: OverlapPolicy,
    record: Option<RunStatus>,
    previous: Previous,
    age: Duration,
    ttl: Duration,
) -> Step {
    let cancel_other = policy == OverlapPolicy::CancelOther;
    match record {
        Some(status) if status.is_final() => Step::Dispatch,
        None if !going(None, previous, age, ttl) => Step::Dispatch,
        None | Some(RunStatus::Held) => Step::Settle,
        Some(RunStatus::Retrying) if cancel_other => Step::Settle,
        Some(_) if cancel_other => Step::Stop,
        Some(_) => Step::Wait,
    }
}

/// Whether the previous run is still going, from its record (`None`: absent or deleted).
pub(crate) fn going(record: Option<RunStatus>, previous: Previous, age: Duration, ttl: Duration) -> bool {
    match record {
        Some(status) => !status.is_final(),
        // Dispatched but not started yet, unless the record may simply have expired.
        None => previous == Previous::Dispatched && age <= ttl,
    }
}

/// The decision of a check under `policy` (`buffer_one` waits with [`wait_idle`] instead, so
/// its check always ends in a dispatch).
pub(crate) fn decision(policy: OverlapPolicy, going: bool) -> Decision {
    match (policy, going) {
        (OverlapPolicy::Skip, true) => Decision::Skip,
        _ => Decision::Dispatch,
    }
}

/// The status in a run record entry; `None` for a delete or purge marker.
pub(crate) fn status_of(entry: &Entry) -> anyhow::Result<Option<RunStatus>> {
    match entry.operation {
        Operation::Put => {
            let view: RunView = serde_json::from_slice(&entry.value).context("decode run record")?;
            Ok(Some(view.status))
        }
        Operation::Delete | Operation::Purge => Ok(None),
    }
}

pub(crate) async fn read_status(runs: &kv::Store, execution_id: &str) -> anyhow::Result<Option<RunStatus>> {
    match runs.entry(execution_id).await.context("read run record")? {
        Some(entry) => status_of(&entry),
        None => Ok(None),
    }
}

/// One read: is the previous run still going?
pub(crate) async fn is_going(runs: Arc<kv::Store>, prior: Prior) -> anyhow::Result<bool> {
    let record = read_status(&runs, &prior.execution_id).await?;
    Ok(going(record, prior.previous, prior.age, prior.ttl))
}

/// Returns once the previous run is no longer going: the record's key is watched first (so a
/// change between the read and the watch is not lost), then read; updates decide from there.
/// No polling. A missing record of a dispatched fire waits for the worker to write one.
pub(crate) async fn wait_idle(runs: Arc<kv::Store>, prior: Prior) -> anyhow::Result<()> {
    let mut watch = runs.watch(&prior.execution_id).await.context("watch run record")?;
    let record = read_status(&runs, &prior.execution_id).await?;
    if !going(record, prior.previous, prior.age, prior.ttl) {
        return Ok(());
    }
    while let Some(entry) = watch.next().await {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::debug!(%error, execution = %prior.execution_id, "run record watch error");
                continue;
            }
        };
        match status_of(&entry) {
            // A deleted record: nothing is going any more.
            Ok(None) => return Ok(()),
            Ok(Some(status)) if status.is_final() => return Ok(()),
            Ok(Some(_)) => {}
            Err(error) => {
                tracing::debug!(error = format!("{error:#}"), execution = %prior.execution_id, "unreadable run record")
            }
        }
    }
    anyhow::bail!("run record watch ended")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(7 * 24 * 3600);
    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_run_is_going_until_its_status_is_final() {
        use RunStatus::*;
        let cases = [(Running, true), (Retrying, true), (Succeeded, false), (Failed, false), (Dead, false)];
        for (status, expected) in cases {
            for previous in [Previous::Dispatched, Previous::Inherited] {
                assert_eq!(going(Some(status), previous, SECOND, TTL), expected, "{status:?} {previous:?}");
                // Age does not matter once a record exists.
                assert_eq!(going(Some(status), previous, TTL * 2, TTL), expected, "{status:?} old");
            }
        }
    }

    #[test]
    fn a_missing_record_is_a_dispatched_run_not_started_yet_unless_it_may_have_expired() {
        let cases = [
            (Previous::Dispatched, Duration::ZERO, true),
            (Previous::Dispatched, SECOND, true),
            (Previous::Dispatched, TTL, true),
            (Previous::Dispatched, TTL + SECOND, false),
            (Previous::Inherited, Duration::ZERO, false),
            (Previous::Inherited, SECOND, false),
            (Previous::Inherited, TTL + SECOND, false),
        ];
        for (previous, age, expected) in cases {
            assert_eq!(going(None, previous, age, TTL), expected, "{previous:?} age {age:?}");
        }
    }

    #[test]
    fn skip_drops_fires_while_going_and_buffer_one_always_ends_in_a_dispatch() {
        let cases = [
            (OverlapPolicy::Skip, true, Decision::Skip),
            (OverlapPolicy::Skip, false, Decision::Dispatch),
            (OverlapPolicy::BufferOne, true, Decision::Dispatch),
            (OverlapPolicy::BufferOne, false, Decision::Dispatch),
        ];
        for (policy, is_going, expected) in cases {
            assert_eq!(decision(policy, is_going), expected, "{policy:?} going={is_going}");
        }
    }

    #[test]
    fn at_most_one_fire_waits_per_task() {
        assert_eq!(arrive(true, true), Arrival::Skip);
        assert_eq!(arrive(true, false), Arrival::Skip);
        assert_eq!(arrive(false, false), Arrival::Dispatch);
        assert_eq!(arrive(false, true), Arrival::Check);
    }

    #[test]
    fn cancel_other_stops_what_is_going_and_replace_only_what_has_not_started() {
        use OverlapPolicy::{CancelOther, Replace};
        use Previous::{Dispatched, Inherited};
        use RunStatus::*;
        let cases = [
            // Ended: the new fire goes at once, whatever the policy.
            (CancelOther, Some(Succeeded), Dispatched, Step::Dispatch),
            (Replace, Some(Cancelled), Dispatched, Step::Dispatch),
            (Replace, Some(Dead), Inherited, Step::Dispatch),
            (CancelOther, Some(Skipped), Inherited, Step::Dispatch),
            // Not started: both settle it cancelled.
            (CancelOther, None, Dispatched, Step::Settle),
            (Replace, None, Dispatched, Step::Settle),
            (CancelOther, Some(Held), Inherited, Step::Settle),
            (Replace, Some(Held), Dispatched, Step::Settle),
            // Never known to be dispatched (it may have been skipped): nothing to cancel.
            (CancelOther, None, Inherited, Step::Dispatch),
            (Replace, None, Inherited, Step::Dispatch),
            // Started: cancel_other stops it (a retry waiting is settled), replace waits.
            (CancelOther, Some(Running), Dispatched, Step::Stop),
            (CancelOther, Some(Retrying), Dispatched, Step::Settle),
            (Replace, Some(Running), Dispatched, Step::Wait),
            (Replace, Some(Retrying), Inherited, Step::Wait),
        ];
        for (policy, record, previous, expected) in cases {
            assert_eq!(
                step(policy, record, previous, SECOND, TTL),
                expected,
                "{policy:?} {record:?} {previous:?}"
            );
        }
        // A record that may have expired is not a run waiting.
        assert_eq!(step(Replace, None, Dispatched, TTL + SECOND, TTL), Step::Dispatch);
    }

    #[test]
    fn only_cancel_other_and_replace_let_the_newest_fire_wait() {
        let wins = [
            (OverlapPolicy::Allow, false),
            (OverlapPolicy::Skip, false),
            (OverlapPolicy::BufferOne, false),
            (OverlapPolicy::CancelOther, true),
            (OverlapPolicy::Replace, true),
        ];
        for (policy, expected) in wins {
            assert_eq!(newest_wins(policy), expected, "{policy:?}");
        }
    }

    #[test]
    fn only_allow_is_ungated() {
        assert!(!gated(OverlapPolicy::Allow));
        assert!(gated(OverlapPolicy::Skip));
        assert!(gated(OverlapPolicy::BufferOne));
        assert!(gated(OverlapPolicy::CancelOther));
        assert!(gated(OverlapPolicy::Replace));
    }

    #[test]
    fn the_record_view_reads_the_status_and_ignores_the_rest() {
        let record = br#"{"execution_id":"x","status":"retrying","attempt":2,"attempts":[],"future":1}"#;
        let view: RunView = serde_json::from_slice(record).expect("decodes");
        assert_eq!(view.status, RunStatus::Retrying);
        assert!(serde_json::from_slice::<RunView>(br#"{"status":"sleeping"}"#).is_err());
    }
}
