//! The scheduler's records (the leader lease and per-task fire state) and what they tell of a
//! task: its state (active, paused, completed) by one rule, and the status `list` and `get`
//! report.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{RunStatus, millis};

/// Value of the leader lease key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub instance: String,
    /// The leader's term: the revision of the `create` that won the lease. It stays the same
    /// while one leader holds the lease (renewals rewrite it unchanged) and grows with every
    /// new leadership. 0 in the record the `create` itself writes (its revision is not known
    /// yet; the first renewal, sent at once, stores it), whose own revision is then the term,
    /// and in records of versions that did not store it.
    #[serde(default)]
    pub term: u64,
    /// When this leader acquired the lease (renewals keep it).
    #[serde(with = "millis")]
    pub acquired_at: DateTime<Utc>,
    /// Lease length in milliseconds, so followers and tools know when it lapses.
    pub lease_ms: u64,
}

/// Per-task fire state in `JETSCHED_STATE`, written by the leader so a new leader resumes
/// exactly where the old one stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FireState {
    /// The last nominal fire that was dispatched or recorded as skipped.
    #[serde(with = "millis")]
    pub last_nominal_fire: DateTime<Utc>,
    #[serde(default, with = "millis::option")]
    pub next_fire: Option<DateTime<Utc>>,
    /// Fires dispatched so far by any leader.
    pub fires: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_id: Option<String>,
    /// Spec revision the state was computed with.
    pub revision: u64,
}

/// Where a task stands, derived from stored facts by [`TaskState::derive`], the one rule the
/// registry, the CLI and the console share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Fires on its schedule.
    Active,
    /// Fires nothing until resumed.
    Paused,
    /// A task whose last fire (its one-shot, the last before `end_at`, the `max_runs`-th) was
    /// dispatched (or recorded as skipped), or whose window closed: it never fires again.
    Completed,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Active => "active",
            TaskState::Paused => "paused",
            TaskState::Completed => "completed",
        }
    }

    /// The state of a task from its spec (`one_shot_at`: its last fire, the instant of an `at`
    /// schedule or the last of its bounded window, `None` for a task nothing ends; `paused`)
    /// and its fire state in the state bucket: a task whose last recorded fire is at or after
    /// its last fire is `completed` (paused or not: nothing is left to fire); otherwise a
    /// paused task is `paused`, any other `active`.
    pub fn derive(one_shot_at: Option<DateTime<Utc>>, paused: bool, fire: Option<&FireState>) -> TaskState {
        match (one_shot_at, fire) {
            (Some(at), Some(fire)) if fire.last_nominal_fire >= at => TaskState::Completed,
            _ if paused => TaskState::Paused,
            _ => TaskState::Active,
        }
    }

    /// The instant of a one-shot's `at` schedule in a spec's JSON `schedule` object, for
    /// readers that hold the spec as JSON.
    pub fn one_shot_at(schedule: &serde_json::Value) -> Option<DateTime<Utc>> {
        super::parse_time(schedule.get("at")?.as_str()?)
    }
}

/// How many of a task's latest scheduled runs [`TaskStatus`] counts outcomes over.
pub const RECENT_RUNS: usize = 10;

/// What `list` and `get` report of a task besides its spec: its state, its next and last fire,
/// its last run's status and the outcomes of its last [`RECENT_RUNS`] scheduled runs whose
/// records are still kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub next_fire: Option<DateTime<Utc>>,
    /// The last nominal fire dispatched (or skipped by policy).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub last_fire: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_id: Option<String>,
    /// Status of the last fire's run record, while the runs bucket keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<RunStatus>,
    /// Runs among the last [`RECENT_RUNS`] scheduled ones that ended (succeeded, failed or
    /// dead-lettered) and whose records are kept...
    pub recent_runs: u32,
    /// ... and how many of them succeeded.
    pub recent_succeeded: u32,
    /// Fires dispatched so far.
    pub fires: u64,
    /// Of a task with `max_runs`: the scheduled fires it has left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_runs: Option<u32>,
    /// What ends the task's fires (`end_at`, `max_runs`, `one_shot`), when something does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_by: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("an instant")
    }

    fn fired(last: i64) -> FireState {
        FireState {
            last_nominal_fire: at(last),
            next_fire: None,
            fires: 1,
            last_execution_id: None,
            revision: 1,
        }
    }

    #[test]
    fn a_one_shot_is_completed_once_its_fire_is_recorded() {
        assert_eq!(TaskState::derive(Some(at(10)), false, None), TaskState::Active, "not fired yet");
        assert_eq!(TaskState::derive(Some(at(10)), false, Some(&fired(10))), TaskState::Completed);
        assert_eq!(TaskState::derive(Some(at(10)), true, Some(&fired(10))), TaskState::Completed);
        // Moved to a later instant after it fired: it will fire again.
        assert_eq!(TaskState::derive(Some(at(20)), false, Some(&fired(10))), TaskState::Active);
        assert_eq!(TaskState::derive(None, false, Some(&fired(10))), TaskState::Active, "periodic");
        assert_eq!(TaskState::derive(None, true, Some(&fired(10))), TaskState::Paused);
        let schedule = serde_json::json!({"at": "2027-01-15T08:00:00.000Z"});
        assert_eq!(TaskState::one_shot_at(&schedule), "2027-01-15T08:00:00Z".parse().ok());
        assert_eq!(TaskState::one_shot_at(&serde_json::json!({"every": "5s"})), None);
    }
}
