//! The retry policy of a task spec and its exponential backoff with jitter.

use std::time::Duration;

use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err, format_duration};

/// How failed attempts are retried: exponential backoff from `initial`, capped at `max_interval`,
/// with a multiplicative `jitter`, giving up after `max_attempts` attempts or `max_elapsed`.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Total attempts including the first, 1..=1000 (default 3).
    #[schemars(range(min = 1, max = 1000))]
    pub max_attempts: u32,
    /// Delay after the first failure (default 1s).
    #[schemars(with = "super::schema::HumanDuration", default = "super::schema::retry_initial")]
    pub initial: Duration,
    /// Growth factor per failure, 1.0..=100 (default 2.0).
    #[schemars(range(min = 1.0, max = 100.0))]
    pub multiplier: f64,
    /// Cap on the nominal delay, >= `initial` (default 60s, or `initial` when that is larger).
    #[schemars(with = "super::schema::HumanDuration", default = "super::schema::retry_max_interval")]
    pub max_interval: Duration,
    /// Relative spread around the nominal delay, 0..=1 (default 0.2).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub jitter: f64,
    /// Stop retrying once this much time has passed since the first attempt.
    #[schemars(with = "Option<super::schema::HumanDuration>", skip_serializing_if = "Option::is_none")]
    pub max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_interval: Duration::from_secs(60),
            jitter: 0.2,
            max_elapsed: None,
        }
    }
}

impl RetryPolicy {
    /// Bounds `(min, max)` of the delay before the next attempt after attempt `failed_attempt`
    /// (1-based; 0 is treated as 1) failed. The nominal delay is
    /// `initial * multiplier^(failed_attempt - 1)` capped at `max_interval`; the bounds are
    /// `nominal * (1 - jitter)` and `nominal * (1 + jitter)`.
    pub fn backoff(&self, failed_attempt: u32) -> (Duration, Duration) {
        let exponent = i32::try_from(failed_attempt.max(1) - 1).unwrap_or(i32::MAX);
        let cap = self.max_interval.as_secs_f64();
        // `powi` overflows to infinity for large exponents, which the cap absorbs.
        let nominal = (self.initial.as_secs_f64() * self.multiplier.powi(exponent)).min(cap);
        let jitter = self.jitter.clamp(0.0, 1.0);
        (Duration::from_secs_f64(nominal * (1.0 - jitter)), Duration::from_secs_f64(nominal * (1.0 + jitter)))
    }

    /// The delay within [`backoff`](Self::backoff)'s bounds picked by `unit`, a random number in
    /// `[0, 1)` (0 gives the lower bound; out-of-range values are clamped).
    pub fn delay_with(&self, failed_attempt: u32, unit: f64) -> Duration {
        let (min, max) = self.backoff(failed_attempt);
        let unit = if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) };
        let (min, max) = (min.as_secs_f64(), max.as_secs_f64());
        Duration::from_secs_f64(min + (max - min) * unit)
    }

    /// Whether another attempt follows attempt `failed_attempt` (1-based) failing, `elapsed`
    /// after the first attempt started.
    pub fn should_retry(&self, failed_attempt: u32, elapsed: Duration) -> bool {
        failed_attempt < self.max_attempts && self.max_elapsed.is_none_or(|limit| elapsed < limit)
    }

    /// Reads the `retry` object, recording each of its problems; `None` when it has one.
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<RetryPolicy> {
        let obj = problems.take(Obj::new(value, "retry"))?;
        obj.deny_unknown(
            &["max_attempts", "initial", "multiplier", "max_interval", "jitter", "max_elapsed"],
            problems,
        );
        let defaults = RetryPolicy::default();
        let in_range = |key: &str, ok: bool, rule: &str| {
            if ok { Ok(()) } else { Err(err(ErrorCode::InvalidValue, &obj.path(key), rule)) }
        };
        let max_attempts = problems.take(obj.u32("max_attempts").and_then(|n| {
            let n = n.unwrap_or(defaults.max_attempts);
            in_range("max_attempts", (1..=1000).contains(&n), "must be between 1 and 1000").map(|()| n)
        }));
        let initial = problems.take(obj.duration("initial")).map(|d| d.unwrap_or(defaults.initial));
        let multiplier = problems.take(obj.f64("multiplier").and_then(|m| {
            let m = m.unwrap_or(defaults.multiplier);
            in_range("multiplier", (1.0..=100.0).contains(&m), "must be between 1.0 and 100").map(|()| m)
        }));
        let max_interval = problems.take(obj.duration("max_interval")).and_then(|given| {
            // Compared with `initial` only when that was valid.
            let Some(initial) = initial else { return given };
            let max_interval = given.unwrap_or(defaults.max_interval.max(initial));
            let rule = format!("must be at least retry.initial ({})", format_duration(initial));
            problems.take(in_range("max_interval", max_interval >= initial, &rule).map(|()| max_interval))
        });
        let jitter = problems.take(obj.f64("jitter").and_then(|j| {
            let j = j.unwrap_or(defaults.jitter);
            in_range("jitter", (0.0..=1.0).contains(&j), "must be between 0 and 1").map(|()| j)
        }));
        let max_elapsed = problems.take(obj.duration("max_elapsed"));
        Some(RetryPolicy {
            max_attempts: max_attempts?,
            initial: initial?,
            multiplier: multiplier?,
            max_interval: max_interval?,
            jitter: jitter?,
            max_elapsed: max_elapsed?,
        })
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut v = json!({
            "max_attempts": self.max_attempts,
            "initial": format_duration(self.initial),
            "multiplier": self.multiplier,
            "max_interval": format_duration(self.max_interval),
            "jitter": self.jitter,
        });
        if let Some(max_elapsed) = self.max_elapsed {
            v["max_elapsed"] = Value::String(format_duration(max_elapsed));
        }
        v
    }
}
