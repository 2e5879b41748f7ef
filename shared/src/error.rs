//! The structured error every API reply, intake rejection and CLI message uses.
//!
//! The `code` strings are part of the wire contract: clients match on them.

use serde::{Deserialize, Serialize};

/// Machine-readable error codes. Serialized in `snake_case`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not valid JSON (or not UTF-8).
    InvalidJson,
    /// A field that the spec does not define.
    UnknownField,
    /// A required field is absent.
    MissingField,
    /// A field has the wrong JSON type.
    InvalidType,
    /// A field has the right type but an unacceptable value.
    InvalidValue,
    /// An id, namespace, queue or label that breaks the naming rules.
    InvalidId,
    /// A cron expression that does not parse or never fires.
    InvalidCron,
    /// A time zone that is not an IANA name.
    UnknownTimezone,
    /// A duration that does not parse, or is zero/negative where that is not allowed.
    InvalidDuration,
    /// A one-shot instant already older than its catch-up window.
    InThePast,
    /// A request body larger than the server accepts.
    PayloadTooLarge,
    /// The request is well-formed JSON but not a valid request for this endpoint.
    BadRequest,
    /// The addressed task (or DLQ entry) does not exist.
    NotFound,
    /// Compare-and-set failed: the stored revision differs (or the key exists with create-only).
    Conflict,
    /// No such API endpoint.
    UnknownEndpoint,
    /// The service could not complete the request (NATS or storage failure); retrying may help.
    Unavailable,
    /// A bug: the service hit a state it does not expect.
    Internal,
}

impl ErrorCode {
    /// The wire string, e.g. `invalid_cron`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::UnknownField => "unknown_field",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::InvalidType => "invalid_type",
            ErrorCode::InvalidValue => "invalid_value",
            ErrorCode::InvalidId => "invalid_id",
            ErrorCode::InvalidCron => "invalid_cron",
            ErrorCode::UnknownTimezone => "unknown_timezone",
            ErrorCode::InvalidDuration => "invalid_duration",
            ErrorCode::InThePast => "in_the_past",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::UnknownEndpoint => "unknown_endpoint",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The numeric code sent in the `Nats-Service-Error-Code` header (HTTP-like classes).
    pub fn status(self) -> usize {
        match self {
            ErrorCode::NotFound | ErrorCode::UnknownEndpoint => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            _ => 400,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A structured error: what went wrong (`code`), in words (`message`), and where (`field`,
/// a dotted path such as `schedule.cron` or `retry.initial`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}{}: {message}", field.as_deref().map(|f| format!(" at {f}")).unwrap_or_default())]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `conflict`: the revision currently stored (0 when the key does not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), field: None, current_revision: None }
    }

    pub fn at(code: ErrorCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), field: Some(field.into()), current_revision: None }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
}

/// The envelope of a failed reply: `{"error": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: ApiError,
}
