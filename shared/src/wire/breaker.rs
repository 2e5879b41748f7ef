//! Circuit-breaker records in `JETSCHED_BREAKERS`, one per breaker (`task.<namespace>.<id>` for
//! a task's own breaker and its consecutive-failure count, `key.<namespace>.<key>` for a
//! namespace's named breaker, `key.=shared.<key>` for a key shared by every namespace).
//!
//! Workers merge their counts into a record with compare-and-set and watch the bucket, so every
//! worker sees one state. Every field has a serde default so the record can grow.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

/// On a run re-published because its breaker was open (`on_open: delay`): attempts the run
/// had executed before (its next delivery is attempt `spent + delivery count`), so delays never
/// spend `retry.max_attempts`.
pub const HDR_ATTEMPTS_SPENT: &str = "Jetsched-Attempts-Spent";
/// On a delayed run: how many times its breaker delayed it (part of the re-published message's
/// `Nats-Msg-Id`, `<execution_id>:delay:<n>`).
pub const HDR_DELAYS: &str = "Jetsched-Delays";
/// Server-scheduled message (ADR-51): `@at <RFC 3339>` publishes the message's copy then.
pub const HDR_SCHEDULE: &str = "Nats-Schedule";
/// Server-scheduled message: the subject the copy is published on.
pub const HDR_SCHEDULE_TARGET: &str = "Nats-Schedule-Target";

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through; attempts are counted in the window.
    #[default]
    Closed,
    /// Calls are short-circuited (delayed or skipped) until `open_until`.
    Open,
    /// Up to `half_open_runs` probe attempts go through; the rest wait as when open.
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `jetsched_worker_breaker_state` gauge: 0 closed, 1 half open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// Attempts counted in one slot of the sliding window (a slot spans `window / slots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerSlot {
    /// Start of the slot, a multiple of the slot length since the Unix epoch.
    #[serde(with = "millis")]
    pub start: DateTime<Utc>,
    #[serde(default)]
    pub runs: u64,
    #[serde(default)]
    pub failures: u64,
}

/// The value of one key of `JETSCHED_BREAKERS`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BreakerRecord {
    pub state: BreakerState,
    /// Counted attempts of the sliding window, oldest first; slots older than the window are
    /// dropped by the next merge (so a reader should ignore slots older than the window).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<BreakerSlot>,
    /// Window length in milliseconds the slots were counted with (for readers such as the CLI).
    pub window_ms: u64,
    /// When the breaker last opened.
    #[serde(skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub opened_at: Option<DateTime<Utc>>,
    /// When an open breaker lets probes through.
    #[serde(skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub open_until: Option<DateTime<Utc>>,
    /// The current open period in milliseconds (doubles after each failed probe round, up to
    /// `max_open_for`; back to `open_for` when the breaker closes). 0 = not opened yet.
    pub open_for_ms: u64,
    /// Half-open rounds so far: a probe's verdict counts only in the round that granted it.
    pub probe_round: u64,
    /// Probe attempts granted in the current half-open round.
    pub probes_granted: u32,
    /// Probe attempts of the current round that succeeded.
    pub probes_succeeded: u32,
    /// Granted probes that have not reported by then are given up (their worker died), so
    /// the round can grant others.
    #[serde(skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub probe_deadline: Option<DateTime<Utc>>,
    /// Attempts and failures of the window when the breaker last opened (what the event said).
    pub opened_runs: u64,
    pub opened_failures: u64,
    /// Runs of the task that ended `failed` or `dead` in a row (task keys only; a success
    /// resets it). Drives `pause_after_failures`.
    pub consecutive_failures: u32,
    /// Execution id of the run that last changed `consecutive_failures` (so a redelivered
    /// ending is not counted twice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_execution_id: Option<String>,
    /// When and by which worker instance the record was last written.
    #[serde(skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub updated_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub updated_by: String,
}

impl BreakerRecord {
    /// Attempts and failures in the window ending at `now` (slots older than `window_ms`
    /// ignored; all slots when `window_ms` is 0).
    pub fn window_counts(&self, now: DateTime<Utc>) -> (u64, u64) {
        let cutoff = now - chrono::Duration::milliseconds(self.window_ms as i64);
        self.slots
            .iter()
            .filter(|s| self.window_ms == 0 || s.start > cutoff - self.slot_len())
            .fold((0, 0), |(r, f), s| (r + s.runs, f + s.failures))
    }

    /// Failure rate of the window ending at `now` (0 when nothing was counted).
    pub fn failure_rate(&self, now: DateTime<Utc>) -> f64 {
        let (runs, failures) = self.window_counts(now);
        if runs == 0 { 0.0 } else { failures as f64 / runs as f64 }
    }

    fn slot_len(&self) -> chrono::Duration {
        chrono::Duration::milliseconds((self.window_ms / BREAKER_SLOTS as u64) as i64)
    }
}

/// Number of slots a window is cut into.
pub const BREAKER_SLOTS: u32 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_object_is_a_closed_breaker() {
        let record: BreakerRecord = serde_json::from_str("{}").unwrap();
        assert_eq!(record.state, BreakerState::Closed);
        assert_eq!(record.window_counts(Utc::now()), (0, 0));
    }

    #[test]
    fn round_trip_and_window_counts() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:10Z").unwrap().with_timezone(&Utc);
        let record = BreakerRecord {
            state: BreakerState::Open,
            window_ms: 10_000,
            slots: vec![
                BreakerSlot { start: now - chrono::Duration::seconds(20), runs: 5, failures: 5 },
                BreakerSlot { start: now - chrono::Duration::seconds(5), runs: 4, failures: 3 },
            ],
            open_until: Some(now),
            ..BreakerRecord::default()
        };
        let text = serde_json::to_string(&record).unwrap();
        assert!(text.contains("\"state\":\"open\""), "{text}");
        let back: BreakerRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.window_counts(now), (4, 3));
        assert!((back.failure_rate(now) - 0.75).abs() < 1e-9);
    }
}
