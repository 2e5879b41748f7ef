//! The fast path of [`TaskSpec::parse`]: the spec, its schedule and its executor (except
//! `shell`) are deserialized into typed fields (strings borrowed from the input where they have
//! no escapes) instead of a `serde_json::Value` tree, then checked with the same validators as
//! the reference reader in `spec.rs`; `retry`, `jitter`, `breaker`, `rate_limit`, `debounce` and `calendars` go through the reference parsers.
//!
//! It only ever answers "valid, and here is the spec" or "not mine": every input it does not
//! accept (a type error, a duplicate key, a value that fails validation) goes to the reference
//! reader, which produces the structured errors (so `parse` and the reference reader refuse a
//! spec with the same list, by construction). It must never accept an input the reference
//! rejects, nor build a different spec; `tests.rs` checks both on the spec corpus and on
//! generated documents.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::DateTime;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::bounds::read_bounds;
use super::executor::{check_header, parse_method, validate_handler_name, validate_subject, validate_url};
use super::{
    BreakerSpec, ConcurrencySpec, DEFAULT_CATCHUP_WINDOW, DEFAULT_TIMEOUT, DebounceSpec, Executor,
    MAX_LABELS, MAX_TIMEOUT, MISFIRE, OVERLAP, PRIORITY, RateLimitSpec, RetryPolicy, TaskSpec, check_label,
    check_pause_after_failures, check_paused_reason, lookup, read_jitter, validate_id, validate_name,
};
use crate::calendar::CalendarRef;
use crate::field::{Problems, parse_duration, parse_instant};
use crate::schedule::{CronSchedule, Schedule, check_interval};

/// A spec document as typed fields. Absent and `null` both give `None`, as in the reference
/// reader.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc<'a> {
    version: Option<u32>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    schedule: Option<Object<ScheduleDoc<'a>>>,
    #[serde(borrow)]
    queue: Option<Cow<'a, str>>,
    #[serde(borrow)]
    priority: Option<Cow<'a, str>>,
    #[serde(borrow)]
    executor: Option<Object<ExecutorDoc<'a>>>,
    #[serde(borrow)]
    timeout: Option<Cow<'a, str>>,
    retry: Option<Value>,
    #[serde(borrow)]
    misfire: Option<Cow<'a, str>>,
    #[serde(borrow)]
    catchup_window: Option<Cow<'a, str>>,
    #[serde(borrow)]
    overlap: Option<Cow<'a, str>>,
    jitter: Option<Value>,
    paused: Option<bool>,
    #[serde(borrow)]
    paused_reason: Option<Cow<'a, str>>,
    breaker: Option<Value>,
    pause_after_failures: Option<u32>,
    concurrency: Option<Value>,
    rate_limit: Option<Value>,
    debounce: Option<Value>,
    #[serde(borrow)]
    start_at: Option<Cow<'a, str>>,
    #[serde(borrow)]
    end_at: Option<Cow<'a, str>>,
    max_runs: Option<u32>,
    calendars: Option<Value>,
    labels: Option<BTreeMap<String, String>>,
}

/// The `schedule` object. As in the reference reader, `null` counts as absent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleDoc<'a> {
    #[serde(borrow)]
    cron: Option<Cow<'a, str>>,
    #[serde(borrow)]
    timezone: Option<Cow<'a, str>>,
    #[serde(borrow)]
    every: Option<Cow<'a, str>>,
    #[serde(borrow)]
    anchor: Option<Cow<'a, str>>,
    #[serde(borrow)]
    at: Option<Cow<'a, str>>,
    #[serde(borrow)]
    after: Option<Cow<'a, str>>,
}

/// The `executor` object: every field of every kind, each `Some` when the key is present (even
/// with `null`), because the reference reader refuses a key of another kind even when null.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecutorDoc<'a> {
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<Option<Cow<'a, str>>>,
    #[serde(default, borrow, deserialize_with = "present")]
    url: Option<Option<Cow<'a, str>>>,
    #[serde(default, deserialize_with = "present")]
    headers: Option<Option<BTreeMap<String, String>>>,
    #[serde(default, deserialize_with = "present")]
    body: Option<Option<Value>>,
    #[serde(default, borrow, deserialize_with = "present")]
    subject: Option<Option<Cow<'a, str>>>,
    #[serde(default, deserialize_with = "present")]
    payload: Option<Option<Value>>,
    #[serde(default, borrow, deserialize_with = "present")]
    name: Option<Option<Cow<'a, str>>>,
    // The shell fields: only their presence matters here (shell goes to the reference reader).
    #[serde(default, deserialize_with = "present")]
    command: Option<Option<IgnoredAny>>,
    #[serde(default, deserialize_with = "present")]
    env: Option<Option<IgnoredAny>>,
    #[serde(default, deserialize_with = "present")]
    cwd: Option<Option<IgnoredAny>>,
}

/// A present key (`Some`), whatever its value; `#[serde(default)]` gives `None` when absent.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A struct read from a JSON object only: a derived `Deserialize` also takes an array,
/// filling the fields in order, which the reference reader refuses.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Only<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Only(std::marker::PhantomData))
    }
}

/// The spec in `bytes` when it is valid; `None` for anything the reference reader must judge.
pub(super) fn parse(bytes: &[u8]) -> Option<TaskSpec> {
    let Object(doc) = serde_json::from_slice::<Object<Doc<'_>>>(bytes).ok()?;
    build(doc)
}

fn schedule(doc: ScheduleDoc<'_>) -> Option<Schedule> {
    let kinds = [doc.cron.is_some(), doc.every.is_some(), doc.at.is_some(), doc.after.is_some()];
    if kinds.iter().filter(|&&k| k).count() != 1
        || (doc.timezone.is_some() && doc.cron.is_none())
        || (doc.anchor.is_some() && doc.every.is_none())
    {
        return None;
    }
    if let Some(expr) = doc.cron {
        let cron = CronSchedule::parse(&expr, doc.timezone.as_deref().unwrap_or("UTC")).ok()?;
        return Some(Schedule::Cron(Box::new(cron)));
    }
    if let Some(every) = doc.every {
        let interval = parse_duration("schedule.every", &every).ok()?;
        check_interval(interval).ok()?;
        let anchor = match doc.anchor {
            Some(anchor) => parse_instant("schedule.anchor", &anchor).ok()?,
            None => DateTime::UNIX_EPOCH,
        };
        return Some(Schedule::Every { interval, anchor });
    }
    if let Some(at) = doc.at {
        return parse_instant("schedule.at", &at).ok().map(Schedule::At);
    }
    parse_duration("schedule.after", &doc.after?).ok().map(Schedule::After)
}

fn executor(doc: ExecutorDoc<'_>) -> Option<Executor> {
    let headers = |headers: Option<Option<BTreeMap<String, String>>>| {
        let headers = headers.flatten().unwrap_or_default();
        headers
            .iter()
            .all(|(name, value)| check_header("executor.headers", name, value).is_ok())
            .then_some(headers)
    };
    let shell = doc.command.is_some() || doc.env.is_some() || doc.cwd.is_some();
    match doc.kind.as_deref()? {
        "nats" => {
            if shell || doc.method.is_some() || doc.url.is_some() || doc.body.is_some() || doc.name.is_some()
            {
                return None;
            }
            let subject = doc.subject.flatten()?;
            validate_subject("executor.subject", &subject).ok()?;
            let headers = headers(doc.headers)?;
            Some(Executor::Nats { subject: subject.into_owned(), payload: doc.payload.flatten(), headers })
        }
        "http" => {
            if shell || doc.subject.is_some() || doc.payload.is_some() || doc.name.is_some() {
                return None;
            }
            let method = parse_method("executor.method", doc.method.flatten().as_deref()).ok()?;
            let url = doc.url.flatten()?;
            validate_url("executor.url", &url).ok()?;
            let headers = headers(doc.headers)?;
            Some(Executor::Http { method, url: url.into_owned(), headers, body: doc.body.flatten() })
        }
        "handler" => {
            if shell
                || doc.method.is_some()
                || doc.url.is_some()
                || doc.headers.is_some()
                || doc.body.is_some()
                || doc.subject.is_some()
            {
                return None;
            }
            let name = doc.name.flatten()?;
            validate_handler_name("executor.name", &name).ok()?;
            Some(Executor::Handler { name: name.into_owned(), payload: doc.payload.flatten() })
        }
        // `shell` (rare, and the strictest) and unknown kinds: the reference reader.
        _ => None,
    }
}

fn build(doc: Doc<'_>) -> Option<TaskSpec> {
    let version = doc.version.unwrap_or(1);
    if version != 1 {
        return None;
    }
    let id = doc.id?;
    validate_id("id", &id).ok()?;
    let namespace = doc.namespace.unwrap_or(Cow::Borrowed("default"));
    validate_id("namespace", &namespace).ok()?;
    let schedule = schedule(doc.schedule?.0)?;
    let bounds = Problems::collect(|problems| {
        read_bounds(Some(&schedule), doc.start_at.as_deref(), doc.end_at.as_deref(), doc.max_runs, problems)
    })
    .ok()?;
    let queue = doc.queue.unwrap_or(Cow::Borrowed("default"));
    validate_name("queue", &queue, 64).ok()?;
    let priority = match doc.priority {
        Some(text) => lookup(&text, PRIORITY)?,
        None => Default::default(),
    };
    let executor = executor(doc.executor?.0)?;
    let duration = |field: &str, text: Option<Cow<'_, str>>| match text {
        None => Some(None),
        Some(text) => parse_duration(field, &text).ok().map(Some),
    };
    let timeout = duration("timeout", doc.timeout)?.unwrap_or(DEFAULT_TIMEOUT);
    if timeout > MAX_TIMEOUT {
        return None;
    }
    let retry = match &doc.retry {
        Some(retry) => Problems::collect(|problems| RetryPolicy::read(retry, problems)).ok()?,
        None => RetryPolicy::default(),
    };
    let misfire = match doc.misfire {
        Some(text) => lookup(&text, MISFIRE)?,
        None => Default::default(),
    };
    let catchup_window = duration("catchup_window", doc.catchup_window)?.unwrap_or(DEFAULT_CATCHUP_WINDOW);
    let overlap = match doc.overlap {
        Some(text) => lookup(&text, OVERLAP)?,
        None => Default::default(),
    };
    let jitter = match &doc.jitter {
        Some(jitter) => Some(Problems::collect(|problems| read_jitter(jitter, problems)).ok()?),
        None => None,
    };
    let paused = doc.paused.unwrap_or(false);
    if let Some(reason) = &doc.paused_reason {
        check_paused_reason(reason, paused).ok()?;
    }
    let breaker = match &doc.breaker {
        Some(breaker) => Some(Problems::collect(|problems| BreakerSpec::read(breaker, problems)).ok()?),
        None => None,
    };
    if let Some(n) = doc.pause_after_failures {
        check_pause_after_failures(n).ok()?;
    }
    let debounce = match &doc.debounce {
        Some(debounce) => Some(Problems::collect(|problems| DebounceSpec::read(debounce, problems)).ok()?),
        None => None,
    };
    let calendars = match &doc.calendars {
        Some(calendars) => {
            Problems::collect(|problems| CalendarRef::read(calendars, "calendars", problems)).ok()?
        }
        None => Vec::new(),
    };
    let labels = doc.labels.unwrap_or_default();
    if labels.len() > MAX_LABELS {
        return None;
    }
    // The error (and so its path) is the reference reader's to produce.
    if !labels.iter().all(|(key, value)| check_label("labels", key, value).is_ok()) {
        return None;
    }
    let concurrency = match &doc.concurrency {
        Some(c) => Some(Problems::collect(|problems| ConcurrencySpec::read(c, problems)).ok()?),
        None => None,
    };
    if let Some(concurrency) = &concurrency {
        concurrency.check_labels(&namespace, &id, &labels).ok()?;
    }
    let rate_limit = match &doc.rate_limit {
        Some(rate) => {
            let rate = Problems::collect(|problems| RateLimitSpec::read(rate, problems)).ok()?;
            rate.expand_key(&namespace, &id, &labels).ok()?;
            Some(rate)
        }
        None => None,
    };
    Some(TaskSpec {
        version,
        id: id.into_owned(),
        namespace: namespace.into_owned(),
        schedule,
        queue: queue.into_owned(),
        priority,
        executor,
        timeout,
        retry,
        misfire,
        catchup_window,
        overlap,
        jitter,
        paused,
        paused_reason: doc.paused_reason.map(Cow::into_owned),
        breaker,
        pause_after_failures: doc.pause_after_failures,
        concurrency,
        rate_limit,
        debounce,
        start_at: bounds.start_at,
        end_at: bounds.end_at,
        max_runs: bounds.max_runs,
        calendars,
        after: None,
        keep_result: false,
        labels,
    })
}
