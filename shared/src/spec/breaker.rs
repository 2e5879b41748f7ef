//! The `breaker` of a task spec: when a downstream fails too often, runs behind the breaker are
//! delayed or skipped instead of executed, with the state shared by every worker.

use std::time::Duration;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::{choice, lookup, schema, validate_name};
use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err, format_duration};
use crate::names;

/// A task's circuit breaker (docs/breakers.md). Without `key` the breaker is the
/// task's own; tasks of one namespace giving the same `key` share one breaker (tasks of every
/// namespace do when the workers declare the key shared).
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields, default)]
pub struct BreakerSpec {
    /// `[A-Za-z0-9_-]{1,64}`: the named breaker's key.
    #[schemars(pattern(r"^[A-Za-z0-9_-]{1,64}$"), skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The breaker opens when at least `min_runs` attempts fell in `window` and this share of
    /// them failed: `0 < failure_rate <= 1` (default 0.5).
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub failure_rate: f64,
    /// At least 1 (default 10).
    #[schemars(range(min = 1))]
    pub min_runs: u32,
    /// The sliding window attempts are counted in, at least 1s (default 1m).
    #[schemars(with = "schema::HumanDuration", default = "schema::breaker_window")]
    pub window: Duration,
    /// How long the breaker stays open before probing (default 30s); doubled after each failed
    /// probe round up to `max_open_for`.
    #[schemars(with = "schema::HumanDuration", default = "schema::breaker_open_for")]
    pub open_for: Duration,
    /// At least `open_for` (default 10m).
    #[schemars(with = "schema::HumanDuration", default = "schema::breaker_max_open_for")]
    pub max_open_for: Duration,
    /// Probe attempts let through when half open, at least 1 (default 1).
    #[schemars(range(min = 1))]
    pub half_open_runs: u32,
    #[schemars(default = "schema::on_open")]
    pub on_open: OnOpen,
}

/// What happens to a run delivered while its breaker is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum OnOpen {
    /// Run it later, once the breaker lets calls through again.
    #[default]
    Delay,
    /// End it as `skipped` (reason `breaker_open`).
    Skip,
}

impl OnOpen {
    pub fn as_str(self) -> &'static str {
        match self {
            OnOpen::Delay => "delay",
            OnOpen::Skip => "skip",
        }
    }
}

const ON_OPEN: &[(&str, OnOpen)] = &[("delay", OnOpen::Delay), ("skip", OnOpen::Skip)];

const FIELDS: &[&str] =
    &["key", "failure_rate", "min_runs", "window", "open_for", "max_open_for", "half_open_runs", "on_open"];

impl Default for BreakerSpec {
    fn default() -> Self {
        BreakerSpec {
            key: None,
            failure_rate: 0.5,
            min_runs: 10,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(600),
            half_open_runs: 1,
            on_open: OnOpen::Delay,
        }
    }
}

impl BreakerSpec {
    /// The breaker's key in the breakers bucket: `task.<namespace>.<id>` for the task's own,
    /// `key.<namespace>.<key>` for a named breaker (it belongs to the task's namespace), or
    /// `key.=shared.<key>` when `shared` says the key is shared by every namespace.
    pub fn bucket_key(&self, namespace: &str, task_id: &str, shared: impl Fn(&str) -> bool) -> String {
        match &self.key {
            Some(key) if shared(key) => names::breaker_shared_key(key),
            Some(key) => names::breaker_named_key(namespace, key),
            None => names::breaker_task_key(namespace, task_id),
        }
    }

    /// Parses an `on_open` spelling.
    pub fn parse_on_open(text: &str) -> Option<OnOpen> {
        lookup(text, ON_OPEN)
    }

    /// Reads the `breaker` object, recording each of its problems; `None` when it has one.
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<BreakerSpec> {
        let obj = problems.take(Obj::new(value, "breaker"))?;
        obj.deny_unknown(FIELDS, problems);
        let defaults = BreakerSpec::default();
        let rule = |key: &str, ok: bool, rule: &str| {
            if ok { Ok(()) } else { Err(err(ErrorCode::InvalidValue, &obj.path(key), rule)) }
        };
        let key = problems.take(obj.string("key").and_then(|key| match key {
            Some(key) => validate_name(&obj.path("key"), key, 64).map(|()| Some(key.to_owned())),
            None => Ok(None),
        }));
        let failure_rate = problems.take(obj.f64("failure_rate").and_then(|r| {
            let r = r.unwrap_or(defaults.failure_rate);
            rule("failure_rate", r > 0.0 && r <= 1.0, "must be greater than 0 and at most 1").map(|()| r)
        }));
        let min_runs = problems.take(obj.u32("min_runs").and_then(|n| {
            let n = n.unwrap_or(defaults.min_runs);
            rule("min_runs", n >= 1, "must be at least 1").map(|()| n)
        }));
        let window = problems.take(obj.duration("window").and_then(|d| {
            let d = d.unwrap_or(defaults.window);
            rule("window", d >= Duration::from_secs(1), "must be at least 1s").map(|()| d)
        }));
        let open_for = problems.take(obj.duration("open_for").and_then(|d| {
            let d = d.unwrap_or(defaults.open_for);
            rule("open_for", !d.is_zero(), "must be more than 0").map(|()| d)
        }));
        let max_open_for = problems.take(obj.duration("max_open_for")).and_then(|given| {
            // Compared with `open_for` only when that was valid.
            let Some(open_for) = open_for else { return given };
            let max_open_for = given.unwrap_or(defaults.max_open_for.max(open_for));
            let text = format!("must be at least breaker.open_for ({})", format_duration(open_for));
            problems.take(rule("max_open_for", max_open_for >= open_for, &text).map(|()| max_open_for))
        });
        let half_open_runs = problems.take(obj.u32("half_open_runs").and_then(|n| {
            let n = n.unwrap_or(defaults.half_open_runs);
            rule("half_open_runs", n >= 1, "must be at least 1").map(|()| n)
        }));
        let on_open = problems.take_opt(choice(&obj, "on_open", ON_OPEN)).unwrap_or_default();
        Some(BreakerSpec {
            key: key?,
            failure_rate: failure_rate?,
            min_runs: min_runs?,
            window: window?,
            open_for: open_for?,
            max_open_for: max_open_for?,
            half_open_runs: half_open_runs?,
            on_open,
        })
    }

    /// The canonical form: every default filled in.
    pub(crate) fn to_json(&self) -> Value {
        let mut v = json!({
            "failure_rate": self.failure_rate,
            "min_runs": self.min_runs,
            "window": format_duration(self.window),
            "open_for": format_duration(self.open_for),
            "max_open_for": format_duration(self.max_open_for),
            "half_open_runs": self.half_open_runs,
            "on_open": self.on_open.as_str(),
        });
        if let Some(key) = &self.key {
            v["key"] = Value::String(key.clone());
        }
        v
    }
}
