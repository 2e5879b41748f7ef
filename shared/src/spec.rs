//! The task spec: JSON parsed and validated into typed values, with every default filled in.
//!
//! Parsing reads a `serde_json::Value` field by field so that every error carries a code from
//! [`ErrorCode`] and the dotted path of the offending field (`schedule.cron`, `retry.initial`,
//! `labels.team`), and a spec with several problems is refused with all of them. Unknown fields
//! are rejected at every level. [`TaskSpec::parse`] is structural (no clock); [`TaskSpec::admit`]
//! adds the checks that need the registration time.

mod after;
mod bounds;
mod breaker;
mod concurrency;
mod debounce;
mod executor;
mod fast;
pub mod limit_key;
mod rate_limit;
mod read;
mod retry;
mod schema;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

pub use self::after::{AfterMode, AfterSpec, AfterWhen, DEFAULT_WITHIN, MAX_PARENTS, MAX_WITHIN, ParentRef};
pub use self::bounds::MAX_RUNS;
pub use self::breaker::{BreakerSpec, OnOpen};
pub use self::concurrency::ConcurrencySpec;
pub use self::debounce::DebounceSpec;
pub use self::executor::{Executor, confined_subject};
pub use self::rate_limit::{OnLimit, RateLimitSpec};
pub use self::read::validate_id;
use self::read::{
    MISFIRE, OVERLAP, PRIORITY, check_label, check_pause_after_failures, check_paused_reason, choice, lookup,
    read_jitter, validate_name,
};
pub use self::retry::RetryPolicy;
pub use self::schema::{SCHEMA_PATH, json_schema, json_schema_text};
use crate::error::{ApiError, ErrorCode};
use crate::field::{self, format_duration, truncate_ms};
pub use crate::priority::Priority;
use crate::schedule::{Schedule, Window};

/// A queue name as a spec's `queue` field takes it: `[A-Za-z0-9_-]{1,64}` (`invalid_id` naming
/// the field `queue` otherwise).
pub fn validate_queue(queue: &str) -> Result<(), ApiError> {
    validate_name("queue", queue, 64)
}

/// A validated task spec. See the README, "The task spec".
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields, title = "jetsched task spec", transform = schema::task_spec_rules)]
pub struct TaskSpec {
    /// Spec format version; only 1 exists.
    #[schemars(default = "schema::one", range(min = 1, max = 1))]
    pub version: u32,
    /// `[A-Za-z0-9_-]{1,128}`.
    #[schemars(pattern(r"^[A-Za-z0-9_-]{1,128}$"))]
    pub id: String,
    /// Same rule as `id`; default `default`.
    #[schemars(default = "schema::default_name", pattern(r"^[A-Za-z0-9_-]{1,128}$"))]
    pub namespace: String,
    /// When the task fires. Absent on a task with `after` (it runs from its parents' runs);
    /// exactly one of the two is given.
    pub schedule: Schedule,
    /// `[A-Za-z0-9_-]{1,64}`; default `default`.
    #[schemars(default = "schema::default_name", pattern(r"^[A-Za-z0-9_-]{1,64}$"))]
    pub queue: String,
    /// The lane of the queue its runs wait in; default `normal`.
    #[schemars(default)]
    pub priority: Priority,
    pub executor: Executor,
    /// Per-attempt limit, `0 < timeout <= 24h`; default 5m.
    #[schemars(with = "schema::HumanDuration", default = "schema::timeout")]
    pub timeout: Duration,
    #[schemars(default = "schema::retry")]
    pub retry: RetryPolicy,
    #[schemars(default = "schema::misfire")]
    pub misfire: MisfirePolicy,
    /// How late a fire may still be delivered (and how old an `at` may be at admission); default 1h.
    #[schemars(with = "schema::HumanDuration", default = "schema::catchup_window")]
    pub catchup_window: Duration,
    #[schemars(default = "schema::overlap")]
    pub overlap: OverlapPolicy,
    pub jitter: Option<Jitter>,
    #[schemars(default)]
    pub paused: bool,
    /// Why the task is paused (`consecutive_failures` when auto-paused, or a user's text), at
    /// most 256 characters; only with `paused`. Resuming clears it.
    #[schemars(length(min = 1, max = 256))]
    pub paused_reason: Option<String>,
    /// The circuit breaker runs of this task go through, if any.
    pub breaker: Option<BreakerSpec>,
    /// Pause the task after this many consecutive runs ended `failed` or `dead` (at least 1).
    #[schemars(range(min = 1))]
    pub pause_after_failures: Option<u32>,
    /// At most `limit` runs under the expanded `key` at once, across every worker.
    pub concurrency: Option<ConcurrencySpec>,
    /// How many runs may start per period, per key, across every worker (docs/limits.md).
    pub rate_limit: Option<RateLimitSpec>,
    /// Triggers within `period` of each other collapse into one run with the last payload.
    pub debounce: Option<DebounceSpec>,
    /// No scheduled fire before this instant (inclusive): RFC 3339, or a wall time without an
    /// offset on the schedule's zone. Repeating schedules only.
    #[schemars(with = "Option<schema::Bound>")]
    pub start_at: Option<DateTime<Utc>>,
    /// No scheduled fire at or after this instant (exclusive); same forms as `start_at`.
    #[schemars(with = "Option<schema::Bound>")]
    pub end_at: Option<DateTime<Utc>>,
    /// The number of scheduled fires the task makes, counted from `start_at` (admission sets
    /// `start_at` to the registration time when it is absent); manual triggers and backfills
    /// do not count.
    #[schemars(range(min = 1, max = 10000))]
    pub max_runs: Option<u32>,
    /// Business calendars of the task's namespace and what a fire outside their business time
    /// does: `exclude` skips it, `shift_next_business_day` / `shift_previous_business_day` move
    /// it (docs/spec.md, "Calendars"). Each calendar named once; shifts in one direction only.
    #[schemars(default)]
    pub calendars: Vec<crate::calendar::CalendarRef>,
    /// The tasks whose runs this one follows, and the rule their verdicts must meet
    /// (docs/dependencies.md). A task with `after` has no `schedule`.
    pub after: Option<Box<AfterSpec>>,
    /// Keep what each run returns (at most 4 KiB: an HTTP response body, a NATS reply, a
    /// shell command's standard output, a handler's result) with its run record, where its
    /// children's dispatches find it; default false.
    #[schemars(default)]
    pub keep_result: bool,
    /// Keys `[A-Za-z0-9_./-]{1,63}`, values up to 256 characters, at most 64 labels.
    #[schemars(
        default = "schema::empty_map",
        inner(length(max = 256)),
        extend("propertyNames" = {"pattern": "^[A-Za-z0-9_./-]{1,63}$"}, "maxProperties" = 64)
    )]
    pub labels: BTreeMap<String, String>,
}

/// What to do with fires missed while no scheduler was running (within `catchup_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Drop missed fires.
    Skip,
    /// Fire once for all the missed fires.
    #[default]
    FireOnce,
    /// Fire each missed fire.
    FireAll,
}

/// What to do when a fire comes while the previous run of the task is still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Run concurrently.
    #[default]
    Allow,
    /// Drop the new fire.
    Skip,
    /// Keep at most one pending fire, run it when the current run ends.
    BufferOne,
    /// Cancel the previous run (running, queued or held); the new fire runs once it has ended.
    CancelOther,
    /// Cancel the previous run if it has not started; a running one finishes first. At most
    /// one fire waits, the newest.
    Replace,
}

/// Spreads fires of a task in time: `spread` is a deterministic per-task offset
/// ([`TaskSpec::jitter_offset`]), `max_random` a random extra delay chosen per fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields, transform = schema::jitter_rules)]
pub struct Jitter {
    #[schemars(with = "Option<schema::HumanDuration>")]
    pub spread: Option<Duration>,
    #[schemars(with = "Option<schema::HumanDuration>")]
    pub max_random: Option<Duration>,
}

impl MisfirePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            MisfirePolicy::Skip => "skip",
            MisfirePolicy::FireOnce => "fire_once",
            MisfirePolicy::FireAll => "fire_all",
        }
    }
}

impl OverlapPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::BufferOne => "buffer_one",
            OverlapPolicy::CancelOther => "cancel_other",
            OverlapPolicy::Replace => "replace",
        }
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(3600);
const MAX_LABELS: usize = 64;
/// The longest `paused_reason`, in characters.
pub const MAX_PAUSED_REASON: usize = 256;

impl TaskSpec {
    /// Admission at registration time `now`: `after` becomes `at = now + delay`; an `at` older than
    /// `now - catchup_window` is `in_the_past` (field `schedule.at`), and so is a cron whose year
    /// range has no fire after `now` (field `schedule.cron`). A `nats` executor whose subject
    /// lies in the server's or the reply subjects' space is refused (field `executor.subject`;
    /// [`Executor::check_confined`] refuses jetsched's own space as well). These are rules of
    /// admission, not of parsing: a spec stored before them still parses, and the worker
    /// refuses its runs.
    pub fn admit(mut self, now: DateTime<Utc>) -> Result<TaskSpec, ApiError> {
        self.executor.check_admissible()?;
        match &self.schedule {
            Schedule::After(delay) => {
                let at =
                    TimeDelta::from_std(*delay).ok().and_then(|d| truncate_ms(now).checked_add_signed(d));
                let at = at.ok_or_else(|| {
                    ApiError::at(
                        ErrorCode::InvalidValue,
                        "schedule.after",
                        "the delay is too far in the future",
                    )
                })?;
                self.schedule = Schedule::At(at);
            }
            Schedule::At(at) => {
                let oldest =
                    TimeDelta::from_std(self.catchup_window).ok().and_then(|w| now.checked_sub_signed(w));
                if oldest.is_some_and(|oldest| *at < oldest) {
                    return Err(ApiError::at(
                        ErrorCode::InThePast,
                        "schedule.at",
                        format!(
                            "{} is more than the catch-up window ({}) before now",
                            field::format_instant(*at),
                            format_duration(self.catchup_window)
                        ),
                    ));
                }
            }
            Schedule::Cron(cron) => {
                if cron.next_after(now).is_none() {
                    return Err(ApiError::at(
                        ErrorCode::InThePast,
                        "schedule.cron",
                        "the expression has no fire after now",
                    ));
                }
            }
            Schedule::Every { .. } | Schedule::Parents => {}
        }
        self.admit_bounds(now)
    }

    /// `max_runs` without `start_at` counts from `now`; a window with no fire left after
    /// `now - catchup_window` is `in_the_past` (field `end_at`, or `max_runs` when the count
    /// ends it).
    fn admit_bounds(mut self, now: DateTime<Utc>) -> Result<TaskSpec, ApiError> {
        if self.max_runs.is_some() && self.start_at.is_none() {
            self.start_at = Some(truncate_ms(now));
        }
        let window = self.window();
        if window.end.is_none() || matches!(self.schedule, Schedule::At(_)) {
            return Ok(self);
        }
        let oldest = TimeDelta::from_std(self.catchup_window).ok().and_then(|w| now.checked_sub_signed(w));
        if window.next_after(&self.schedule, oldest.unwrap_or(now)).is_none() {
            let field = match window.ends_by {
                Some(crate::schedule::EndReason::MaxRuns) => "max_runs",
                _ => "end_at",
            };
            return Err(ApiError::at(
                ErrorCode::InThePast,
                field,
                "the task's bounds leave no fire after now",
            ));
        }
        Ok(self)
    }

    /// The window of the task's scheduled fires ([`Window`]): a pure function of the spec.
    pub fn window(&self) -> Window {
        Window::new(&self.schedule, self.start_at, self.end_at, self.max_runs)
    }

    /// The window under the task's business calendars (`calendars`: its namespace's): with
    /// `max_runs`, the fires its calendars skip, shift out of the bounds or merge into another
    /// do not count, as the scheduler counts them. Without calendars, [`window`](Self::window).
    pub fn window_with(&self, calendars: &crate::calendar::Calendars) -> Window {
        match self.fires(calendars) {
            Some(fires) if self.max_runs.is_some() => {
                Window::counted_by(&self.schedule, self.start_at, self.end_at, self.max_runs, |_, n| {
                    fires.nth_run(n)
                })
            }
            _ => self.window(),
        }
    }

    /// How many of the task's `max_runs` fires are left after `cursor` (the last fire made),
    /// under its business calendars; `window` is [`window_with`](Self::window_with) of the
    /// same calendars. `None` without `max_runs`.
    pub fn remaining_runs_with(
        &self,
        window: &Window,
        calendars: &crate::calendar::Calendars,
        cursor: Option<DateTime<Utc>>,
    ) -> Option<u32> {
        match self.fires(calendars) {
            Some(fires) => window.remaining_runs_of(fires.own_runs(), cursor),
            None => window.remaining_runs(&self.schedule, cursor),
        }
    }

    /// The task's fires under its calendars, when it names some and has a `start_at`.
    fn fires<'a>(&'a self, calendars: &'a crate::calendar::Calendars) -> Option<crate::calendar::Fires<'a>> {
        if self.calendars.is_empty() {
            return None;
        }
        Some(crate::calendar::Fires {
            schedule: &self.schedule,
            zone: crate::calendar::schedule_zone(&self.schedule),
            refs: &self.calendars,
            calendars,
            start: self.start_at?,
            end_at: self.end_at,
        })
    }

    /// The task's key in storage and subjects: `<namespace>.<id>`.
    pub fn key(&self) -> String {
        format!("{}.{}", self.namespace, self.id)
    }

    /// Whether `key` is this task's [`key`](Self::key), without building it (neither part
    /// contains a dot).
    pub fn has_key(&self, key: &str) -> bool {
        key.split_once('.') == Some((self.namespace.as_str(), self.id.as_str()))
    }

    /// The canonical JSON form: every default filled in (but `priority`, written only when it
    /// is not `normal`, so specs stored before priorities keep their bytes), durations as humantime strings,
    /// instants as RFC 3339 UTC. `TaskSpec::parse_value(spec.to_json()) == Ok(spec)`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "version": self.version,
            "id": self.id,
            "namespace": self.namespace,
            "queue": self.queue,
            "executor": self.executor.to_json(),
            "timeout": format_duration(self.timeout),
            "retry": self.retry.to_json(),
            "misfire": self.misfire.as_str(),
            "catchup_window": format_duration(self.catchup_window),
            "overlap": self.overlap.as_str(),
            "paused": self.paused,
            "labels": self.labels,
        });
        if self.schedule != Schedule::Parents {
            v["schedule"] = self.schedule.to_json();
        }
        if let Some(jitter) = &self.jitter {
            let mut j = json!({});
            if let Some(spread) = jitter.spread {
                j["spread"] = Value::String(format_duration(spread));
            }
            if let Some(max_random) = jitter.max_random {
                j["max_random"] = Value::String(format_duration(max_random));
            }
            v["jitter"] = j;
        }
        if self.priority != Priority::Normal {
            v["priority"] = Value::String(self.priority.as_str().to_owned());
        }
        if let Some(reason) = &self.paused_reason {
            v["paused_reason"] = Value::String(reason.clone());
        }
        if let Some(breaker) = &self.breaker {
            v["breaker"] = breaker.to_json();
        }
        if let Some(n) = self.pause_after_failures {
            v["pause_after_failures"] = json!(n);
        }
        if let Some(concurrency) = &self.concurrency {
            v["concurrency"] = concurrency.to_json();
        }
        if let Some(rate_limit) = &self.rate_limit {
            v["rate_limit"] = rate_limit.to_json();
        }
        if let Some(debounce) = self.debounce {
            v["debounce"] = debounce.to_json();
        }
        if let Some(start_at) = self.start_at {
            v["start_at"] = Value::String(field::format_instant(start_at));
        }
        if let Some(end_at) = self.end_at {
            v["end_at"] = Value::String(field::format_instant(end_at));
        }
        if let Some(max_runs) = self.max_runs {
            v["max_runs"] = json!(max_runs);
        }
        if !self.calendars.is_empty() {
            v["calendars"] = Value::Array(self.calendars.iter().map(|c| c.to_json()).collect());
        }
        if let Some(after) = &self.after {
            v["after"] = after.to_json();
        }
        if self.keep_result {
            v["keep_result"] = Value::Bool(true);
        }
        v
    }

    /// The task's deterministic offset within `jitter.spread`: FNV-1a (64-bit) of [`key`](Self::key)
    /// modulo the spread in milliseconds. Stable across processes and releases; zero without a spread.
    pub fn jitter_offset(&self) -> Duration {
        let Some(spread) = self.jitter.and_then(|j| j.spread) else { return Duration::ZERO };
        let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX);
        if spread_ms == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(fnv1a64(self.key().as_bytes()) % spread_ms)
    }
}

/// FNV-1a, 64-bit: a stable hash (std's `DefaultHasher` is seeded per process).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

impl Serialize for TaskSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

/// A spec inside another wire type (a dispatch, a dead letter) is read like a spec on its own:
/// its JSON text goes through [`TaskSpec::parse`] and its typed fast path, not a `Value` tree
/// (which was a tenth of a worker's CPU per run). From a `Value`, the text is rebuilt first.
impl<'de> Deserialize<'de> for TaskSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        TaskSpec::parse(raw.get().as_bytes()).map_err(serde::de::Error::custom)
    }
}
