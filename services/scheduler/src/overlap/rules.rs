//! The overlap rules (`allow`, `skip`, `buffer_one`): whether a task's previous scheduled run
//! is still going, from its run record in `JETSCHED_RUNS`, and what happens to the new fire.
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
/// buffered, `known` = a previous scheduled execution is known.
pub(crate) fn arrive(waiting: bool, known: bool) -> Arrival {
    match (waiting, known) {
        (true, _) => Arrival::Skip,
        (false, false) => Arrival::Dispatch,
        (false, true) => Arrival::Check,
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

async fn read_status(runs: &kv::Store, execution_id: &str) -> anyhow::Result<Option<RunStatus>> {
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
    fn only_allow_is_ungated() {
        assert!(!gated(OverlapPolicy::Allow));
        assert!(gated(OverlapPolicy::Skip));
        assert!(gated(OverlapPolicy::BufferOne));
    }

    #[test]
    fn the_record_view_reads_the_status_and_ignores_the_rest() {
        let record = br#"{"execution_id":"x","status":"retrying","attempt":2,"attempts":[],"future":1}"#;
        let view: RunView = serde_json::from_slice(record).expect("decodes");
        assert_eq!(view.status, RunStatus::Retrying);
        assert!(serde_json::from_slice::<RunView>(br#"{"status":"sleeping"}"#).is_err());
    }
}
