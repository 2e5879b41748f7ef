//! The reference reader of a task spec: a `Value` read field by field, every problem recorded
//! with its code and dotted path, the rules of each field, and the spellings of its choices.

use std::collections::BTreeMap;

use serde_json::Value;

use super::bounds::read_bounds;
use super::{
    AfterSpec, BreakerSpec, ConcurrencySpec, DEFAULT_CATCHUP_WINDOW, DEFAULT_TIMEOUT, DebounceSpec, Executor,
    Jitter, MAX_LABELS, MAX_PAUSED_REASON, MAX_TIMEOUT, MisfirePolicy, OverlapPolicy, Priority,
    RateLimitSpec, RetryPolicy, TaskSpec, fast,
};
use crate::calendar::CalendarRef;
use crate::error::{ApiError, ApiErrors, ErrorCode};
use crate::field::{Obj, Problems, err};
use crate::schedule::Schedule;

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
    "concurrency",
    "rate_limit",
    "debounce",
    "start_at",
    "end_at",
    "max_runs",
    "calendars",
    "after",
    "keep_result",
    "labels",
];

/// Checks a `paused_reason`: 1 to [`MAX_PAUSED_REASON`] characters, and only on a paused task.
pub(super) fn check_paused_reason(reason: &str, paused: bool) -> Result<(), ApiError> {
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
pub(super) fn check_pause_after_failures(n: u32) -> Result<(), ApiError> {
    if n == 0 {
        return Err(err(ErrorCode::InvalidValue, "pause_after_failures", "must be at least 1"));
    }
    Ok(())
}

/// Checks an id or namespace against `[A-Za-z0-9_-]{1,128}` (`invalid_id` at `field`).
pub fn validate_id(field: &str, value: &str) -> Result<(), ApiError> {
    validate_name(field, value, 128)
}

pub(super) fn validate_name(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
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

pub(super) fn check_label(path: &str, key: &str, value: &str) -> Result<(), ApiError> {
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
pub(super) const MISFIRE: &[(&str, MisfirePolicy)] = &[
    ("skip", MisfirePolicy::Skip),
    ("fire_once", MisfirePolicy::FireOnce),
    ("fire_all", MisfirePolicy::FireAll),
];
/// The spellings of [`Priority`] in a spec.
pub(super) const PRIORITY: &[(&str, Priority)] = &[
    ("critical", Priority::Critical),
    ("high", Priority::High),
    ("normal", Priority::Normal),
    ("low", Priority::Low),
];
pub(super) const OVERLAP: &[(&str, OverlapPolicy)] = &[
    ("allow", OverlapPolicy::Allow),
    ("skip", OverlapPolicy::Skip),
    ("buffer_one", OverlapPolicy::BufferOne),
    ("cancel_other", OverlapPolicy::CancelOther),
    ("replace", OverlapPolicy::Replace),
];

/// The value `text` names among `choices`.
pub(super) fn lookup<T: Copy>(text: &str, choices: &[(&str, T)]) -> Option<T> {
    choices.iter().find(|(name, _)| *name == text).map(|(_, value)| *value)
}

/// Reads an enum-like string field: `None` when absent, `invalid_value` when not one of `choices`.
pub(super) fn choice<T: Copy>(
    obj: &Obj<'_>,
    key: &str,
    choices: &[(&str, T)],
) -> Result<Option<T>, ApiError> {
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
pub(super) fn read_jitter(value: &Value, problems: &mut Problems) -> Option<Jitter> {
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
        // A task with `after` and no schedule runs from its parents' runs alone; with a
        // schedule too, its fires wait for its parents' runs of the same nominal time.
        let after_given = obj.get("after").is_some_and(|v| !v.is_null());
        let schedule = match obj.get("schedule").filter(|v| !v.is_null()) {
            Some(value) => Schedule::read(value, problems),
            None if after_given => Some(Schedule::Parents),
            None => problems.take(obj.required("schedule")).and_then(|v| Schedule::read(v, problems)),
        };
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
        // Outer `Some`: given; inner `None`: refused.
        let concurrency = obj.get("concurrency").map(|c| ConcurrencySpec::read(c, problems));
        let rate_limit = obj.get("rate_limit").map(|rate| RateLimitSpec::read(rate, problems));
        let debounce = obj.get("debounce").map(|debounce| DebounceSpec::read(debounce, problems));
        let start_at = problems.take(obj.string("start_at"));
        let end_at = problems.take(obj.string("end_at"));
        let max_runs = problems.take(obj.u32("max_runs"));
        let bounds = read_bounds(
            schedule.as_ref(),
            start_at.flatten(),
            end_at.flatten(),
            max_runs.flatten(),
            problems,
        );
        let calendars = match obj.get("calendars") {
            None | Some(Value::Null) => Some(Vec::new()),
            Some(calendars) => CalendarRef::read(calendars, "calendars", problems),
        };
        let after = match obj.get("after") {
            None | Some(Value::Null) => Some(None),
            Some(after) => AfterSpec::read(after, namespace, id, problems).map(|after| Some(Box::new(after))),
        };
        let keep_result = problems.take_opt(obj.bool("keep_result")).unwrap_or(false);
        let labels = read_labels(&obj, problems);
        // The keys are checked against the task once its namespace, id and labels are known.
        if let (Some(Some(concurrency)), Some(id), Some(labels)) = (&concurrency, id, &labels) {
            problems.take(concurrency.check_labels(namespace, id, labels));
        }
        if let (Some(Some(rate)), Some(id), Some(labels)) = (&rate_limit, id, &labels) {
            rate.check_key(namespace, id, labels, problems);
        }
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
            concurrency: match concurrency {
                Some(concurrency) => Some(concurrency?),
                None => None,
            },
            rate_limit: match rate_limit {
                Some(rate_limit) => Some(rate_limit?),
                None => None,
            },
            debounce: match debounce {
                Some(debounce) => Some(debounce?),
                None => None,
            },
            start_at: bounds?.start_at,
            end_at: bounds?.end_at,
            max_runs: bounds?.max_runs,
            calendars: calendars?,
            after: after?,
            keep_result,
            labels: labels?,
        })
    }
}
