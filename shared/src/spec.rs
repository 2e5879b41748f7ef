//! The task spec: JSON parsed and validated into typed values, with every default filled in.
//!
//! Parsing reads a `serde_json::Value` field by field so that every error carries a code from
//! [`ErrorCode`] and the dotted path of the offending field (`schedule.cron`, `retry.initial`,
//! `labels.team`), and a spec with several problems is refused with all of them. Unknown fields
//! are rejected at every level. [`TaskSpec::parse`] is structural (no clock); [`TaskSpec::admit`]
//! adds the checks that need the registration time.

mod breaker;
mod executor;
mod fast;
mod retry;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

pub use self::breaker::{BreakerSpec, OnOpen};
pub use self::executor::{Executor, confined_subject};
pub use self::retry::RetryPolicy;
use crate::error::{ApiError, ApiErrors, ErrorCode};
use crate::field::{self, Obj, Problems, err, format_duration, truncate_ms};
pub use crate::priority::Priority;
use crate::schedule::Schedule;

/// A validated task spec. See the README, "The task spec".
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// Spec format version; only 1 exists.
    pub version: u32,
    /// `[A-Za-z0-9_-]{1,128}`.
    pub id: String,
    /// Same rule as `id`; default `default`.
    pub namespace: String,
    pub schedule: Schedule,
    /// `[A-Za-z0-9_-]{1,64}`; default `default`.
    pub queue: String,
    /// The lane of the queue its runs wait in; default `normal`.
    pub priority: Priority,
    pub executor: Executor,
    /// Per-attempt limit, `0 < timeout <= 24h`; default 5m.
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub misfire: MisfirePolicy,
    /// How late a fire may still be delivered (and how old an `at` may be at admission); default 1h.
    pub catchup_window: Duration,
    pub overlap: OverlapPolicy,
    pub jitter: Option<Jitter>,
    pub paused: bool,
    /// Why the task is paused (`consecutive_failures` when auto-paused, or a user's text), at
    /// most 256 characters; only with `paused`. Resuming clears it.
    pub paused_reason: Option<String>,
    /// The circuit breaker runs of this task go through, if any.
    pub breaker: Option<BreakerSpec>,
    /// Pause the task after this many consecutive runs ended `failed` or `dead` (at least 1).
    pub pause_after_failures: Option<u32>,
    /// Keys `[A-Za-z0-9_./-]{1,63}`, values up to 256 characters, at most 64 labels.
    pub labels: BTreeMap<String, String>,
}

/// What to do with fires missed while no scheduler was running (within `catchup_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverlapPolicy {
    /// Run concurrently.
    #[default]
    Allow,
    /// Drop the new fire.
    Skip,
    /// Keep at most one pending fire, run it when the current run ends.
    BufferOne,
}

/// Spreads fires of a task in time: `spread` is a deterministic per-task offset
/// ([`TaskSpec::jitter_offset`]), `max_random` a random extra delay chosen per fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jitter {
    pub spread: Option<Duration>,
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
        }
    }
}

const FIELDS: &[&str] = &[
    "version",
    "id",
    "namespace",
    "schedule",
    "queue",
    "priority",
    "executor",
    "timeout",
    "retry",
    "misfire",
    "catchup_window",
    "overlap",
    "jitter",
    "paused",
    "paused_reason",
    "breaker",
    "pause_after_failures",
    "labels",
];

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(3600);
const MAX_LABELS: usize = 64;
/// The longest `paused_reason`, in characters.
pub const MAX_PAUSED_REASON: usize = 256;

/// Checks a `paused_reason`: 1 to [`MAX_PAUSED_REASON`] characters, and only on a paused task.
fn check_paused_reason(reason: &str, paused: bool) -> Result<(), ApiError> {
    let length = reason.chars().count();
    if length == 0 || length > MAX_PAUSED_REASON {
        return Err(err(
            ErrorCode::InvalidValue,
            "paused_reason",
            format!("must be 1 to {MAX_PAUSED_REASON} characters"),
        ));
    }
    if !paused {
        return Err(err(ErrorCode::InvalidValue, "paused_reason", "only a paused task has a reason"));
    }
    Ok(())
}

/// Checks `pause_after_failures`: at least 1.
fn check_pause_after_failures(n: u32) -> Result<(), ApiError> {
    if n == 0 {
        return Err(err(ErrorCode::InvalidValue, "pause_after_failures", "must be at least 1"));
    }
    Ok(())
}

/// Checks an id or namespace against `[A-Za-z0-9_-]{1,128}` (`invalid_id` at `field`).
pub fn validate_id(field: &str, value: &str) -> Result<(), ApiError> {
    validate_name(field, value, 128)
}

fn validate_name(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    let ok = (1..=max).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::at(
            ErrorCode::InvalidId,
            field,
            format!("{value:?} must match [A-Za-z0-9_-]{{1,{max}}}"),
        ))
    }
}

fn check_label(path: &str, key: &str, value: &str) -> Result<(), ApiError> {
    let key_ok = (1..=63).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-'));
    if !key_ok {
        return Err(err(
            ErrorCode::InvalidId,
            path,
            format!("label key {key:?} must match [A-Za-z0-9_./-]{{1,63}}"),
        ));
    }
    if value.chars().count() > 256 {
        return Err(err(ErrorCode::InvalidValue, path, "label values are at most 256 characters"));
    }
    Ok(())
}

/// The spellings of [`MisfirePolicy`] and [`OverlapPolicy`] in a spec.
const MISFIRE: &[(&str, MisfirePolicy)] = &[
    ("skip", MisfirePolicy::Skip),
    ("fire_once", MisfirePolicy::FireOnce),
    ("fire_all", MisfirePolicy::FireAll),
];
/// The spellings of [`Priority`] in a spec.
const PRIORITY: &[(&str, Priority)] = &[
    ("critical", Priority::Critical),
    ("high", Priority::High),
    ("normal", Priority::Normal),
    ("low", Priority::Low),
];
const OVERLAP: &[(&str, OverlapPolicy)] = &[
    ("allow", OverlapPolicy::Allow),
    ("skip", OverlapPolicy::Skip),
    ("buffer_one", OverlapPolicy::BufferOne),
];

/// The value `text` names among `choices`.
fn lookup<T: Copy>(text: &str, choices: &[(&str, T)]) -> Option<T> {
    choices.iter().find(|(name, _)| *name == text).map(|(_, value)| *value)
}

/// Reads an enum-like string field: `None` when absent, `invalid_value` when not one of `choices`.
fn choice<T: Copy>(obj: &Obj<'_>, key: &str, choices: &[(&str, T)]) -> Result<Option<T>, ApiError> {
    let Some(text) = obj.string(key)? else { return Ok(None) };
    match lookup(text, choices) {
        Some(value) => Ok(Some(value)),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            Err(err(
                ErrorCode::InvalidValue,
                &obj.path(key),
                format!("{text:?} is not one of {}", names.join(", ")),
            ))
        }
    }
}

/// The `jitter` object: `spread`, `max_random` or both.
fn read_jitter(value: &Value, problems: &mut Problems) -> Option<Jitter> {
    let j = problems.take(Obj::new(value, "jitter"))?;
    j.deny_unknown(&["spread", "max_random"], problems);
    let spread = problems.take(j.duration("spread"));
    let max_random = problems.take(j.duration("max_random"));
    let jitter = Jitter { spread: spread?, max_random: max_random? };
    if jitter.spread.is_none() && jitter.max_random.is_none() {
        problems.push(err(ErrorCode::InvalidValue, "jitter", "give spread, max_random or both"));
        return None;
    }
    Some(jitter)
}

/// The `labels` object: at most [`MAX_LABELS`], each checked by [`check_label`].
fn read_labels(obj: &Obj<'_>, problems: &mut Problems) -> Option<BTreeMap<String, String>> {
    let labels = obj.string_map("labels", check_label, problems)?;
    if labels.len() > MAX_LABELS {
        problems.push(err(ErrorCode::InvalidValue, "labels", format!("at most {MAX_LABELS} labels")));
        return None;
    }
    Some(labels)
}

impl TaskSpec {
    /// Parses and validates a JSON spec (structure only: no clock is consulted). A spec with
    /// several problems is refused with each of them, in the order the reader meets them: the
    /// unknown fields of an object first, then its fields in the order of the spec's
    /// documentation (`version`, `id`, `namespace`, `schedule`, `queue`, `executor`, ...).
    ///
    /// A typed fast path handles well-formed specs without building a `Value` tree; anything it
    /// does not accept goes through the field-by-field reader, which names every problem.
    pub fn parse(bytes: &[u8]) -> Result<TaskSpec, ApiErrors> {
        if let Some(spec) = fast::parse(bytes) {
            return Ok(spec);
        }
        TaskSpec::parse_reference(bytes)
    }

    /// The reference reader behind [`parse`](Self::parse): a `Value` first, then field by field
    /// with a code and path per problem. Public for differential tests and fuzzing: it accepts
    /// exactly what `parse` accepts, only slower.
    #[doc(hidden)]
    pub fn parse_reference(bytes: &[u8]) -> Result<TaskSpec, ApiErrors> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("the spec is not valid JSON: {e}")))?;
        TaskSpec::from_value(&value)
    }

    /// Validates an already-decoded JSON spec.
    pub fn parse_value(value: Value) -> Result<TaskSpec, ApiErrors> {
        TaskSpec::from_value(&value)
    }

    fn from_value(value: &Value) -> Result<TaskSpec, ApiErrors> {
        Problems::collect(|problems| TaskSpec::read(value, problems))
    }

    /// Reads the spec field by field, recording each problem and going on with the next field.
    fn read(value: &Value, problems: &mut Problems) -> Option<TaskSpec> {
        let obj = problems.take(Obj::new(value, ""))?;
        obj.deny_unknown(FIELDS, problems);

        let version = problems.take_opt(obj.u32("version")).unwrap_or(1);
        if version != 1 {
            problems.push(err(
                ErrorCode::InvalidValue,
                "version",
                format!("unsupported version {version}; only 1"),
            ));
        }
        let id = problems.take(obj.required_string("id").and_then(|id| validate_id("id", id).map(|()| id)));
        let namespace = problems
            .take(obj.string("namespace").and_then(|namespace| {
                let namespace = namespace.unwrap_or("default");
                validate_id("namespace", namespace).map(|()| namespace)
            }))
            .unwrap_or("default");
        let schedule = problems.take(obj.required("schedule")).and_then(|v| Schedule::read(v, problems));
        let queue = problems
            .take(obj.string("queue").and_then(|queue| {
                let queue = queue.unwrap_or("default");
                validate_name("queue", queue, 64).map(|()| queue)
            }))
            .unwrap_or("default");
        let priority = problems.take_opt(choice(&obj, "priority", PRIORITY)).unwrap_or_default();
        let executor =
            problems.take(obj.required("executor")).and_then(|v| Executor::read(v, "executor", problems));

        let timeout = problems.take_opt(obj.duration("timeout")).unwrap_or(DEFAULT_TIMEOUT);
        if timeout > MAX_TIMEOUT {
            problems.push(err(ErrorCode::InvalidValue, "timeout", "must be at most 24h"));
        }
        let retry = match obj.get("retry") {
            Some(retry) => RetryPolicy::read(retry, problems),
            None => Some(RetryPolicy::default()),
        };
        let misfire = problems.take_opt(choice(&obj, "misfire", MISFIRE)).unwrap_or_default();
        let catchup_window =
            problems.take_opt(obj.duration("catchup_window")).unwrap_or(DEFAULT_CATCHUP_WINDOW);
        let overlap = problems.take_opt(choice(&obj, "overlap", OVERLAP)).unwrap_or_default();
        // Outer `Some`: given; inner `None`: refused.
        let jitter = obj.get("jitter").map(|jitter| read_jitter(jitter, problems));
        let paused = problems.take_opt(obj.bool("paused")).unwrap_or(false);
        let paused_reason = problems.take(obj.string("paused_reason").and_then(|reason| match reason {
            Some(reason) => check_paused_reason(reason, paused).map(|()| Some(reason.to_owned())),
            None => Ok(None),
        }));
        // Outer `Some`: given; inner `None`: refused.
        let breaker = obj.get("breaker").map(|breaker| BreakerSpec::read(breaker, problems));
        let pause_after_failures = problems.take(obj.u32("pause_after_failures").and_then(|n| match n {
            Some(n) => check_pause_after_failures(n).map(|()| Some(n)),
            None => Ok(None),
        }));
        let labels = read_labels(&obj, problems);
        if !problems.is_empty() {
            return None;
        }

        Some(TaskSpec {
            version,
            id: id?.to_owned(),
            namespace: namespace.to_owned(),
            schedule: schedule?,
            queue: queue.to_owned(),
            priority,
            executor: executor?,
            timeout,
            retry: retry?,
            misfire,
            catchup_window,
            overlap,
            jitter: match jitter {
                Some(jitter) => Some(jitter?),
                None => None,
            },
            paused,
            paused_reason: paused_reason?,
            breaker: match breaker {
                Some(breaker) => Some(breaker?),
                None => None,
            },
            pause_after_failures: pause_after_failures?,
            labels: labels?,
        })
    }

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
            Schedule::Every { .. } => {}
        }
        Ok(self)
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
            "schedule": self.schedule.to_json(),
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
