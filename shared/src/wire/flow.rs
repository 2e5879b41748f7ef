//! Flow control on the wire: a trigger's payload, the de-duplication key and its time to live
//! (a trigger's fields, an intake submission's headers), the claim stored for a key, and the
//! headers of a debounced task's pending run.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;
use crate::error::{ApiError, ErrorCode};
use crate::field::parse_duration;
use crate::priority::Priority;

/// On an intake submission: its de-duplication key.
pub const HDR_DEDUPE_KEY: &str = "Jetsched-Dedupe-Key";
/// On an intake submission: how long its key holds (`90s`, `10m`, `7d`; default 10 minutes).
pub const HDR_DEDUPE_TTL: &str = "Jetsched-Dedupe-TTL";
/// On a debounced task's pending run: when the window's first trigger came (RFC 3339).
pub const HDR_DEBOUNCE_FIRST: &str = "Jetsched-Debounce-First";
/// On a debounced task's pending run: how many triggers the window collapsed so far.
pub const HDR_DEBOUNCE_TRIGGERS: &str = "Jetsched-Debounce-Triggers";

/// The largest trigger payload, in bytes of JSON.
pub const MAX_TRIGGER_PAYLOAD: usize = 64 * 1024;
/// The longest de-duplication key, in bytes.
pub const MAX_DEDUPE_KEY: usize = 256;
/// How long a de-duplication key holds when the request gives no time to live.
pub const DEFAULT_DEDUPE_TTL: Duration = Duration::from_secs(10 * 60);
/// The longest time to live of a de-duplication key (also the bucket's `max_age`).
pub const MAX_DEDUPE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Checks a de-duplication key: 1 to [`MAX_DEDUPE_KEY`] bytes, no control characters
/// (`invalid_value` at `field`).
pub fn check_dedupe_key(field: &str, key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_DEDUPE_KEY {
        return Err(ApiError::at(
            ErrorCode::InvalidValue,
            field,
            format!("must be 1 to {MAX_DEDUPE_KEY} bytes, not {}", key.len()),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::at(ErrorCode::InvalidValue, field, "must not hold control characters"));
    }
    Ok(())
}

/// A de-duplication time to live: a duration of whole seconds from 1s to [`MAX_DEDUPE_TTL`]
/// (`invalid_duration` at `field`); [`DEFAULT_DEDUPE_TTL`] when absent.
pub fn dedupe_ttl(field: &str, text: Option<&str>) -> Result<Duration, ApiError> {
    let Some(text) = text else { return Ok(DEFAULT_DEDUPE_TTL) };
    let ttl = parse_duration(field, text)?;
    if ttl < Duration::from_secs(1) || ttl > MAX_DEDUPE_TTL || ttl.subsec_nanos() != 0 {
        return Err(ApiError::at(
            ErrorCode::InvalidDuration,
            field,
            format!("must be whole seconds from 1s to 7d, not {text:?}"),
        ));
    }
    Ok(ttl)
}

/// Checks the size of a trigger payload (`payload_too_large` at `payload`).
pub fn check_payload(json: &str) -> Result<(), ApiError> {
    if json.len() > MAX_TRIGGER_PAYLOAD {
        return Err(ApiError::at(
            ErrorCode::PayloadTooLarge,
            "payload",
            format!("is {} bytes of JSON; the limit is {MAX_TRIGGER_PAYLOAD}", json.len()),
        ));
    }
    Ok(())
}

/// The claim of a de-duplication key, stored with the key's time to live: the first trigger's
/// execution (and what it asked for, so that whoever finds the claim not yet dispatched, after
/// a registry died between claim and dispatch, can finish it), or the intake message that
/// first carried the key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DedupeClaim {
    #[serde(with = "millis")]
    pub at: DateTime<Utc>,
    /// The time to live the claim was stored with, in seconds.
    pub ttl_s: u64,
    /// A trigger's execution (the window's, once a debounced trigger joined one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Whether the trigger's run is dispatched (or joined its debounce window).
    #[serde(default)]
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// A submission's intake stream sequence (its redelivery is not a duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intake_sequence: Option<u64>,
}

impl DedupeClaim {
    /// Whether the claim has outlived its time to live at `now` (the server removes it soon).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        let ttl = chrono::TimeDelta::seconds(i64::try_from(self.ttl_s).unwrap_or(i64::MAX / 1000));
        self.at.checked_add_signed(ttl).is_none_or(|end| end <= now)
    }

    /// The whole seconds of its time to live left at `now` (at least 1).
    pub fn ttl_left(&self, now: DateTime<Utc>) -> u64 {
        let spent = (now - self.at).num_seconds().max(0) as u64;
        self.ttl_s.saturating_sub(spent).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ttls_and_payloads_are_bounded() {
        assert!(check_dedupe_key("dedupe_key", "invoice 42/ü").is_ok());
        assert_eq!(check_dedupe_key("dedupe_key", "").unwrap_err().field.as_deref(), Some("dedupe_key"));
        assert!(check_dedupe_key("k", &"x".repeat(MAX_DEDUPE_KEY)).is_ok());
        assert!(check_dedupe_key("k", &"x".repeat(MAX_DEDUPE_KEY + 1)).is_err());
        assert!(check_dedupe_key("k", "a\nb").is_err());
        assert_eq!(dedupe_ttl("t", None), Ok(DEFAULT_DEDUPE_TTL));
        assert_eq!(dedupe_ttl("t", Some("7d")), Ok(MAX_DEDUPE_TTL));
        for bad in ["8d", "500ms", "1500ms", "soon", "0s"] {
            let error = dedupe_ttl("dedupe_ttl", Some(bad)).unwrap_err();
            assert_eq!(
                (error.code, error.field.as_deref()),
                (ErrorCode::InvalidDuration, Some("dedupe_ttl"))
            );
        }
        assert!(check_payload(&"1".repeat(MAX_TRIGGER_PAYLOAD)).is_ok());
        assert_eq!(
            check_payload(&"1".repeat(MAX_TRIGGER_PAYLOAD + 1)).unwrap_err().code,
            ErrorCode::PayloadTooLarge
        );
    }

    #[test]
    fn a_claim_expires_after_its_ttl() {
        let at = Utc::now();
        let claim = DedupeClaim {
            at,
            ttl_s: 10,
            execution_id: None,
            done: false,
            payload: None,
            priority: None,
            intake_sequence: None,
        };
        assert!(!claim.expired(at + chrono::TimeDelta::seconds(9)));
        assert!(claim.expired(at + chrono::TimeDelta::seconds(10)));
        assert_eq!(claim.ttl_left(at + chrono::TimeDelta::seconds(4)), 6);
        assert_eq!(claim.ttl_left(at + chrono::TimeDelta::seconds(40)), 1);
    }
}
