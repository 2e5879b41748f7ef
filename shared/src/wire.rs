//! Every payload and header that crosses NATS: API requests and replies, dispatch messages,
//! events, fire state, run records and the leader lease.
//!
//! Times are RFC 3339 UTC with millisecond precision on the wire. The headers and time format
//! live here, each message kind in a module of its own (`wire/`), all re-exported here.

use chrono::{DateTime, SecondsFormat, Utc};

// ---- headers ------------------------------------------------------------------------------

/// Compare-and-set on `put`: the revision the client last saw (0 = must not exist).
pub const HDR_EXPECTED_REVISION: &str = "Jetsched-Expected-Revision";
/// `true` on `put`: fail with `conflict` when the task exists.
pub const HDR_CREATE_ONLY: &str = "Jetsched-Create-Only";
/// `<namespace>.<task_id>` on every dispatch.
pub const HDR_TASK: &str = "Jetsched-Task";
/// Nominal fire time (RFC 3339, ms) on every dispatch.
pub const HDR_NOMINAL_TIME: &str = "Jetsched-Nominal-Time";
pub const HDR_EXECUTION_ID: &str = "Jetsched-Execution-Id";
/// The leader's lease revision (fencing token) that dispatched the fire.
pub const HDR_LEADER_TERM: &str = "Jetsched-Leader-Term";
/// `schedule`, `manual`, `catchup`, `replay`, `backfill` or `after`.
pub const HDR_TRIGGER: &str = "Jetsched-Trigger";
/// On executor requests of a run its parents started (`after`): their runs as a JSON array of
/// `{task, execution_id, status, finished, result}` (a shell program's `JETSCHED_PARENTS`).
pub const HDR_PARENTS: &str = "Jetsched-Parents";
/// `critical`, `high`, `normal` or `low` on every dispatch (absent on older ones: `normal`).
pub const HDR_PRIORITY: &str = "Jetsched-Priority";
/// Attempt number on executor requests (1-based).
pub const HDR_ATTEMPT: &str = "Jetsched-Attempt";

/// Formats an instant the way every jetsched payload and header does.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Reads an RFC 3339 instant (any offset) as UTC; `None` when it is not one.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text).ok().map(|t| t.with_timezone(&Utc))
}

/// Serde helpers for millisecond RFC 3339 timestamps.
pub mod millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }

    /// The same for `Option<DateTime<Utc>>`.
    pub mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&super::super::format_time(*t)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    DateTime::parse_from_rfc3339(&text)
                        .map(|t| t.with_timezone(&Utc))
                        .map_err(serde::de::Error::custom)
                })
                .transpose()
        }
    }
}

/// Reply header of a responder to the worker's `nats` executor: `ok`, `retry` or `fail`
/// (a JSON body `{"status": ...}` works too; see the worker's `executor/nats.rs`).
pub const HDR_STATUS: &str = "Jetsched-Status";

mod after;
mod api;
mod breaker;
mod breaker_api;
mod calendar;
mod cancel;
mod dead_letter;
mod dispatch;
mod dlq_api;
mod event;
mod flow;
mod limit;
mod pause;
mod queue;
mod rate;
mod run;
mod state;

pub use after::{
    GRAPH_NODES, GraphNode, GraphReply, LastRun, MAX_RESULT_BYTES, MAX_RESULTS_PER_CHILD, ParentRun, Wait,
    WaitState, child_execution_id, result_value,
};
pub use api::{
    DeleteReply, ListReply, ListRequest, NextReply, NextRequest, TaskRef, TaskReply, TriggerReply,
};
pub use breaker::{
    BREAKER_SLOTS, BreakerRecord, BreakerSlot, BreakerState, HDR_ATTEMPTS_SPENT, HDR_DELAYS, HDR_SCHEDULE,
    HDR_SCHEDULE_TARGET,
};
pub use breaker_api::{BreakerInfo, BreakerListReply, BreakerRef, BreakerResetReply};
pub use calendar::{CalendarDeleteReply, CalendarListReply, CalendarListRequest, CalendarRef, CalendarReply};
pub use cancel::{
    CancelMarker, CancelOutcome, CancelReply, CancelRequest, CancelTaskReply, CancelTaskRequest,
};
pub use dead_letter::{DeadLetter, DeadLetterSource};
pub use dispatch::{
    Dispatch, DispatchDecoder, Trigger, execution_id_of_fire, fresh_execution_id, scheduled_execution_id,
};
pub use dlq_api::DlqRequest;
pub use event::{BackfillSummary, Event, EventKind};
pub use flow::{
    DEFAULT_DEDUPE_TTL, DedupeClaim, HDR_DEBOUNCE_FIRST, HDR_DEBOUNCE_TRIGGERS, HDR_DEDUPE_KEY,
    HDR_DEDUPE_TTL, MAX_DEDUPE_KEY, MAX_DEDUPE_TTL, MAX_TRIGGER_PAYLOAD, check_dedupe_key, check_payload,
    dedupe_ttl,
};
pub use limit::{Holder, LimitInfo, LimitListReply, LimitRecord, LimitRequest, SlotBlock, Waiter};
pub use pause::PauseRequest;
pub use queue::{LaneInfo, QueueInfo, QueueListReply, QueueReply, QueueRequest, QueueState};
pub use rate::{HDR_RATE_START, RateDeclared, RateInfo, RateRecord, format_rate_start, parse_rate_start};
pub use run::{AttemptOutcome, AttemptRecord, MAX_KEPT_ATTEMPTS, RunRecord, RunStatus};
pub use state::{FireState, LeaderRecord, RECENT_RUNS, TaskState, TaskStatus};
