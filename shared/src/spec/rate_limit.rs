//! The `rate_limit` of a task spec: at most `limit` runs start per `period` per key, with a
//! `burst`, shared by every worker (docs/limits.md); excess runs are delayed, or skipped with
//! `on_limit: skip`.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::{choice, limit_key, lookup, schema};
use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err, format_duration};

/// A task's rate limit. Tasks of one namespace whose `key` expands to the same text share one
/// limit; without `key` the limit is the task's own (`{id}`).
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// A literal or a template over `{namespace}`, `{id}` and `{labels.<name>}`; expanded, it
    /// matches `[A-Za-z0-9_-]{1,128}`. Default `{id}` (the task's own limit).
    #[schemars(length(min = 1, max = 256))]
    pub key: Option<String>,
    /// Runs that may start per `period`: 1 to 1,000,000.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub limit: u32,
    /// At least 1ms, at most 1 day; `period / limit` at least 1µs.
    #[schemars(with = "schema::HumanDuration")]
    pub period: Duration,
    /// Runs that may start at once after a quiet spell, 1 to 1,000,000 (default 1: evenly spaced).
    #[schemars(range(min = 1, max = 1_000_000), default = "schema::one")]
    pub burst: u32,
    #[schemars(default)]
    pub on_limit: OnLimit,
}

/// What happens to a run that would start too early for its rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum OnLimit {
    /// Start it at the time its limit allows (without holding a worker or an attempt meanwhile).
    #[default]
    Delay,
    /// End it as `skipped` (reason `rate_limited`).
    Skip,
}

impl OnLimit {
    pub fn as_str(self) -> &'static str {
        match self {
            OnLimit::Delay => "delay",
            OnLimit::Skip => "skip",
        }
    }
}

const ON_LIMIT: &[(&str, OnLimit)] = &[("delay", OnLimit::Delay), ("skip", OnLimit::Skip)];
const FIELDS: &[&str] = &["key", "limit", "period", "burst", "on_limit"];
const MAX_LIMIT: u32 = 1_000_000;
const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);

impl RateLimitSpec {
    /// The key's template, default `{id}`.
    pub fn template(&self) -> &str {
        self.key.as_deref().unwrap_or("{id}")
    }

    /// The key expanded for a task (checked at `put`, so a stored spec's expands).
    pub fn expand_key(
        &self,
        namespace: &str,
        id: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, String> {
        limit_key::expand(self.template(), namespace, id, labels)
    }

    /// The emission interval `period / limit` in microseconds, rounded up (never faster than
    /// the limit).
    pub fn interval_us(&self) -> i64 {
        let period = i64::try_from(self.period.as_micros()).unwrap_or(i64::MAX);
        let limit = i64::from(self.limit.max(1));
        (period + limit - 1) / limit
    }

    /// Reads the `rate_limit` object, recording each of its problems; `None` when it has one.
    /// The key is checked against the task (`labels`) by [`check_key`](Self::check_key).
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<RateLimitSpec> {
        let obj = problems.take(Obj::new(value, "rate_limit"))?;
        obj.deny_unknown(FIELDS, problems);
        let rule = |key: &str, ok: bool, rule: &str| {
            if ok { Ok(()) } else { Err(err(ErrorCode::InvalidValue, &obj.path(key), rule)) }
        };
        let key = problems.take(obj.string("key").and_then(|key| {
            match key {
                Some(key) => rule("key", !key.is_empty() && key.len() <= 256, "must be 1 to 256 characters")
                    .map(|()| Some(key.to_owned())),
                None => Ok(None),
            }
        }));
        let limit = problems.take(obj.u32("limit").and_then(|n| match n {
            Some(n) => rule("limit", (1..=MAX_LIMIT).contains(&n), "must be 1 to 1000000").map(|()| n),
            None => Err(err(ErrorCode::MissingField, &obj.path("limit"), "\"limit\" is required")),
        }));
        let period = problems.take(obj.duration("period").and_then(|d| {
            match d {
                Some(d) => rule(
                    "period",
                    d >= Duration::from_millis(1) && d <= MAX_PERIOD,
                    "must be at least 1ms and at most 1d",
                )
                .map(|()| d),
                None => Err(err(ErrorCode::MissingField, &obj.path("period"), "\"period\" is required")),
            }
        }));
        let burst = problems.take(obj.u32("burst").and_then(|n| {
            let n = n.unwrap_or(1);
            rule("burst", (1..=MAX_LIMIT).contains(&n), "must be 1 to 1000000").map(|()| n)
        }));
        let on_limit = problems.take_opt(choice(&obj, "on_limit", ON_LIMIT)).unwrap_or_default();
        let (limit, period) = (limit?, period?);
        if period.as_micros() < u128::from(limit) {
            let text = "more than 1000000 runs per second (period / limit under 1µs)";
            problems.push(err(ErrorCode::InvalidValue, &obj.path("limit"), text));
            return None;
        }
        Some(RateLimitSpec { key: key?, limit, period, burst: burst?, on_limit })
    }

    /// Checks that the key expands for the task `namespace`/`id` with its `labels` (a label the
    /// spec does not have, a bad character, ...), recording the problem at `rate_limit.key`.
    pub(crate) fn check_key(
        &self,
        namespace: &str,
        id: &str,
        labels: &BTreeMap<String, String>,
        problems: &mut Problems,
    ) {
        if let Err(error) = self.expand_key(namespace, id, labels) {
            problems.push(err(ErrorCode::InvalidValue, "rate_limit.key", error.to_string()));
        }
    }

    /// Parses an `on_limit` spelling.
    pub fn parse_on_limit(text: &str) -> Option<OnLimit> {
        lookup(text, ON_LIMIT)
    }

    /// The canonical form: every default filled in.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = json!({
            "limit": self.limit,
            "period": format_duration(self.period),
            "burst": self.burst,
            "on_limit": self.on_limit.as_str(),
        });
        if let Some(key) = &self.key {
            v["key"] = Value::String(key.clone());
        }
        v
    }
}
