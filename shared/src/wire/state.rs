//! The scheduler's records: the leader lease and per-task fire state.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

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
