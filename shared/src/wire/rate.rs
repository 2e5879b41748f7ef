//! A rate limit's state in `JETSCHED_RATES` ([`RateRecord`]), and the header a run delayed by
//! its rate limit carries ([`HDR_RATE_START`]).

use serde::{Deserialize, Serialize};

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
        let record = RateRecord { tat_us: 5, throttled_since_us: None };
        assert_eq!(serde_json::to_string(&record).unwrap(), r#"{"tat_us":5}"#);
    }
}
