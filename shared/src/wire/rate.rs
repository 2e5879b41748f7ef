//! A rate limit's state in `JETSCHED_RATES` ([`RateRecord`]), what the limits API shows of it
//! ([`RateInfo`]), and the header a run delayed by its rate limit carries ([`HDR_RATE_START`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

/// On a run re-published because its rate limit delayed it: `<attempt>@<start_us>`, the
/// attempt whose start the limit reserved and that start (microseconds since the epoch). The
/// delivery of that attempt starts without reserving again; a later attempt (a retry) reserves
/// its own start.
pub const HDR_RATE_START: &str = "Jetsched-Rate-Start";

/// The state of one rate-limit key, written by workers with compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RateRecord {
    /// The theoretical arrival time (GCRA), microseconds since the epoch: the next run may
    /// start at `tat_us - (burst - 1) × period / limit`.
    pub tat_us: i64,
    /// When the current throttling episode began (its `limit.throttled` event was told then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_since_us: Option<i64>,
    /// The limit the write decided under (the spec of the last run that came).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<RateDeclared>,
}

/// A rate limit as a spec declares it: `limit` runs per `period_ms`, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateDeclared {
    pub limit: u32,
    pub period_ms: u64,
    pub burst: u32,
}

impl RateDeclared {
    /// The emission interval `period / limit`, in microseconds (rounded up, at least 1).
    pub fn interval_us(&self) -> i64 {
        let period = i64::try_from(self.period_ms.saturating_mul(1_000)).unwrap_or(i64::MAX);
        let limit = i64::from(self.limit.max(1));
        ((period + limit - 1) / limit).max(1)
    }

    /// `<limit>/<period>`, the period in its humantime form: `20/1s`.
    pub fn per_period(&self) -> String {
        let period = humantime::format_duration(std::time::Duration::from_millis(self.period_ms));
        format!("{}/{period}", self.limit)
    }

    /// How far ahead of the theoretical arrival time a run may start: `(burst - 1) × interval`.
    pub fn tolerance_us(&self) -> i64 {
        self.interval_us().saturating_mul(i64::from(self.burst.max(1)) - 1)
    }
}

/// One rate-limit key as the limits API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateInfo {
    /// `<namespace>.<key>`.
    pub key: String,
    /// The limit of the last write (absent in a record written before workers stored it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<RateDeclared>,
    /// Runs that may start at once now (0 while throttled; unknown without `declared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<u32>,
    /// While throttled: the earliest start the limit gives the next run.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub next_start: Option<DateTime<Utc>>,
    /// Since when the key is throttled (its `limit.throttled` event was told then).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub throttled_since: Option<DateTime<Utc>>,
}

impl RateInfo {
    /// What `record` (stored under `key`) shows at `now`. The GCRA lets a run arriving at `now`
    /// start at `max(now, tat - tolerance)`, each start moving the TAT one interval on.
    pub fn of(key: &str, record: &RateRecord, now: DateTime<Utc>) -> RateInfo {
        let now_us = now.timestamp_micros();
        let at = |us: i64| DateTime::from_timestamp_micros(us);
        let (available, next_start) = match record.declared {
            Some(declared) => {
                let (interval, tolerance) = (declared.interval_us(), declared.tolerance_us());
                let earliest = record.tat_us.saturating_sub(tolerance);
                if earliest > now_us {
                    (Some(0), at(earliest))
                } else {
                    let ahead = record.tat_us.saturating_sub(now_us).max(0);
                    let free = (tolerance - ahead) / interval + 1;
                    (Some(u32::try_from(free).unwrap_or(u32::MAX).min(declared.burst.max(1))), None)
                }
            }
            None => (None, None),
        };
        // An episode ends when the key drains: a stored start of one that ended shows nothing.
        let throttled_since = record.throttled_since_us.filter(|_| next_start.is_some()).and_then(at);
        RateInfo { key: key.to_string(), declared: record.declared, available, next_start, throttled_since }
    }
}

/// The reservation [`HDR_RATE_START`] carries: `(attempt, start_us)`.
pub fn parse_rate_start(value: &str) -> Option<(u32, i64)> {
    let (attempt, start) = value.split_once('@')?;
    Some((attempt.parse().ok()?, start.parse().ok()?))
}

/// The value of [`HDR_RATE_START`].
pub fn format_rate_start(attempt: u32, start_us: i64) -> String {
    format!("{attempt}@{start_us}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_round_trip_and_garbage_is_none() {
        assert_eq!(
            parse_rate_start(&format_rate_start(3, 1_700_000_000_123_456)),
            Some((3, 1_700_000_000_123_456))
        );
        assert_eq!(parse_rate_start("x@1"), None);
        assert_eq!(parse_rate_start("1"), None);
        let record = RateRecord { tat_us: 5, throttled_since_us: None, declared: None };
        assert_eq!(serde_json::to_string(&record).unwrap(), r#"{"tat_us":5}"#);
    }

    #[test]
    fn a_key_shows_its_free_starts_and_when_throttled_its_next_start() {
        // 10 per second, burst 3: interval 100 ms, tolerance 200 ms.
        let declared = RateDeclared { limit: 10, period_ms: 1_000, burst: 3 };
        let now = DateTime::from_timestamp_micros(1_000_000_000_000).unwrap();
        let us = now.timestamp_micros();
        let info = |tat_us: i64, since: Option<i64>| {
            RateInfo::of(
                "ns.k",
                &RateRecord { tat_us, throttled_since_us: since, declared: Some(declared) },
                now,
            )
        };
        // Drained long ago: the whole burst.
        assert_eq!(info(0, Some(1)).available, Some(3));
        assert_eq!(info(0, Some(1)).throttled_since, None, "an ended episode is not shown");
        // One start taken just now (TAT one interval ahead): two more at once.
        assert_eq!(info(us + 100_000, None).available, Some(2));
        // The burst used up (TAT three intervals ahead): the next start one interval on.
        let full = info(us + 300_000, Some(us - 5));
        assert_eq!(
            (full.available, full.next_start),
            (Some(0), DateTime::from_timestamp_micros(us + 100_000))
        );
        assert_eq!(full.throttled_since, DateTime::from_timestamp_micros(us - 5));
        assert_eq!(declared.per_period(), "10/1s");
        // Written before the limit was stored: nothing to compute from.
        let old = RateInfo::of("ns.k", &RateRecord { tat_us: us + 300_000, ..RateRecord::default() }, now);
        assert_eq!((old.available, old.next_start), (None, None));
    }
}
