//! Reading JSON documents field by field: dotted field paths, typed field access, durations and
//! instants, and the list of problems a document has.
//!
//! Serde's derive errors name neither the field path nor a stable code, and stop at the first
//! problem, so the spec and its schedule are read from a `serde_json::Value` one field at a time
//! through these helpers. Each helper judges one field and returns that field's problem; the
//! reader of a whole object records it in [`Problems`] and goes on with the next field.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiErrors, ErrorCode};

/// The longest duration any field accepts (100 years): keeps instant arithmetic far from overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `prefix.key`, or `key` at the root.
pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") }
}

/// An error at `path`; the root (empty path) has no field.
pub(crate) fn err(code: ErrorCode, path: &str, message: impl Into<String>) -> ApiError {
    if path.is_empty() { ApiError::new(code, message) } else { ApiError::at(code, path, message) }
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn wrong_type(path: &str, expected: &str, got: &Value) -> ApiError {
    err(ErrorCode::InvalidType, path, format!("expected {expected}, got {}", type_name(got)))
}

/// A humantime duration string ("90s", "5m", "1h 30m"): positive and at most [`MAX_DURATION`].
pub(crate) fn parse_duration(path: &str, text: &str) -> Result<Duration, ApiError> {
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        err(
            ErrorCode::InvalidDuration,
            path,
            format!("{text:?} is not a duration ({e}); use e.g. \"90s\", \"5m\", \"1h 30m\""),
        )
    })?;
    if duration.is_zero() {
        return Err(err(ErrorCode::InvalidDuration, path, "must be greater than zero"));
    }
    if duration > MAX_DURATION {
        return Err(err(ErrorCode::InvalidDuration, path, "must be at most 100 years"));
    }
    Ok(duration)
}

/// An RFC 3339 instant, truncated to milliseconds.
pub(crate) fn parse_instant(path: &str, text: &str) -> Result<DateTime<Utc>, ApiError> {
    let parsed = DateTime::parse_from_rfc3339(text).map_err(|e| {
        err(
            ErrorCode::InvalidValue,
            path,
            format!("{text:?} is not an RFC 3339 instant ({e}); use e.g. \"2026-01-31T09:00:00Z\""),
        )
    })?;
    Ok(truncate_ms(parsed.with_timezone(&Utc)))
}

/// A duration in its canonical humantime form ("5m", "1h 30m").
pub(crate) fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Truncates an instant to whole milliseconds (the precision of every instant in the spec).
pub(crate) fn truncate_ms(instant: DateTime<Utc>) -> DateTime<Utc> {
    instant.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(instant)
}

/// An instant in its canonical RFC 3339 form (UTC, `Z`, fractional seconds only when non-zero).
pub(crate) fn format_instant(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// The problems of a document, in the order its reader met them.
#[derive(Debug, Default)]
pub(crate) struct Problems(Vec<ApiError>);

impl Problems {
    /// Runs a reader that records its problems here: its value when it found none.
    pub(crate) fn collect<T>(read: impl FnOnce(&mut Problems) -> Option<T>) -> Result<T, ApiErrors> {
        let mut problems = Problems::default();
        let value = read(&mut problems);
        problems.finish(value)
    }

    pub(crate) fn push(&mut self, error: ApiError) {
        self.0.push(error);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of a one-field check, or `None` once its problem is recorded.
    pub(crate) fn take<T>(&mut self, result: Result<T, ApiError>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    /// [`take`](Self::take) for an optional field: `None` when absent or refused.
    pub(crate) fn take_opt<T>(&mut self, result: Result<Option<T>, ApiError>) -> Option<T> {
        self.take(result).flatten()
    }

    /// `value` when no problem was recorded. A reader returns `None` only after recording why;
    /// should one not, the document is refused all the same, as an internal error.
    pub(crate) fn finish<T>(self, value: Option<T>) -> Result<T, ApiErrors> {
        match (ApiErrors::from_vec(self.0), value) {
            (None, Some(value)) => Ok(value),
            (Some(errors), _) => Err(errors),
            (None, None) => Err(ApiErrors::from(ApiError::new(
                ErrorCode::Internal,
                "the document was refused without a reason",
            ))),
        }
    }
}

/// A JSON object being validated, with its dotted path (empty at the root).
pub(crate) struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    pub(crate) fn new(value: &'a Value, path: &str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Obj { map, path: path.to_owned() }),
            other => Err(wrong_type(path, "an object", other)),
        }
    }

    /// The dotted path of `key` in this object.
    pub(crate) fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The keys present with a non-null value.
    pub(crate) fn present_keys(&self) -> impl Iterator<Item = &'a str> {
        self.map.iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k.as_str())
    }

    /// Records an `unknown_field` problem for each key not in `allowed`, in key order.
    pub(crate) fn deny_unknown(&self, allowed: &[&str], problems: &mut Problems) {
        for key in self.map.keys().filter(|k| !allowed.contains(&k.as_str())) {
            problems.push(err(
                ErrorCode::UnknownField,
                &self.path(key),
                format!("unknown field {key:?}; expected one of: {}", allowed.join(", ")),
            ));
        }
    }

    /// The value of `key`; JSON `null` counts as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn required(&self, key: &str) -> Result<&'a Value, ApiError> {
        self.get(key)
            .ok_or_else(|| err(ErrorCode::MissingField, &self.path(key), format!("{key:?} is required")))
    }

    pub(crate) fn string(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(&self.path(key), "a string", other)),
        }
    }

    pub(crate) fn required_string(&self, key: &str) -> Result<&'a str, ApiError> {
        self.required(key)?;
        Ok(self.string(key)?.unwrap_or_default())
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type(&self.path(key), "a boolean", other)),
        }
    }

    /// A non-negative integer that fits in `u32` (fractions are `invalid_type`, negatives `invalid_value`).
    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>, ApiError> {
        let path = self.path(key);
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(u) = n.as_u64() {
                    u32::try_from(u)
                        .map(Some)
                        .map_err(|_| err(ErrorCode::InvalidValue, &path, format!("{u} is too large")))
                } else if n.is_i64() {
                    Err(err(ErrorCode::InvalidValue, &path, format!("{n} is negative")))
                } else {
                    Err(err(ErrorCode::InvalidType, &path, format!("expected an integer, got {n}")))
                }
            }
            Some(other) => Err(wrong_type(&path, "an integer", other)),
        }
    }

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(wrong_type(&self.path(key), "a number", other)),
        }
    }

    pub(crate) fn object(&self, key: &str) -> Result<Option<Obj<'a>>, ApiError> {
        self.get(key).map(|v| Obj::new(v, &self.path(key))).transpose()
    }

    pub(crate) fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(wrong_type(&self.path(key), "an array", other)),
        }
    }

    /// A duration string (numbers are `invalid_type`: the unit would be a guess).
    pub(crate) fn duration(&self, key: &str) -> Result<Option<Duration>, ApiError> {
        let path = self.path(key);
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => parse_duration(&path, s).map(Some),
            Some(other) => Err(wrong_type(&path, "a duration string such as \"90s\"", other)),
        }
    }

    /// An RFC 3339 instant, truncated to milliseconds.
    pub(crate) fn instant(&self, key: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        let Some(text) = self.string(key)? else { return Ok(None) };
        parse_instant(&self.path(key), text).map(Some)
    }

    /// An object of string values; `check` validates each entry and gets its path. Every
    /// refused entry is a problem of its own; `None` when the field is not an object or an
    /// entry was refused.
    pub(crate) fn string_map(
        &self,
        key: &str,
        check: impl Fn(&str, &str, &str) -> Result<(), ApiError>,
        problems: &mut Problems,
    ) -> Option<BTreeMap<String, String>> {
        let Some(obj) = problems.take(self.object(key))? else { return Some(BTreeMap::new()) };
        let mut out = BTreeMap::new();
        let mut refused = false;
        for (name, value) in obj.map {
            let path = obj.path(name);
            let checked = match value {
                Value::String(value) => check(&path, name, value).map(|()| value),
                other => Err(wrong_type(&path, "a string", other)),
            };
            match checked {
                Ok(value) => {
                    out.insert(name.clone(), value.clone());
                }
                Err(error) => {
                    problems.push(error);
                    refused = true;
                }
            }
        }
        (!refused).then_some(out)
    }
}
