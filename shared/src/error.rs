//! The structured errors every API reply, intake rejection and CLI message uses: one problem
//! ([`ApiError`]) and every problem of a request ([`ApiErrors`]).
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
    /// A request on a namespaced subject names (or addresses) another namespace.
    NamespaceMismatch,
    /// The request would take a namespace past a limit its operator set (`field` names the
    /// limit, e.g. `quota.tasks`); nothing was changed.
    QuotaExceeded,
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
            ErrorCode::NamespaceMismatch => "namespace_mismatch",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The numeric code sent in the `Nats-Service-Error-Code` header (HTTP-like classes).
    pub fn status(self) -> usize {
        match self {
            ErrorCode::NotFound | ErrorCode::UnknownEndpoint => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::NamespaceMismatch => 403,
            ErrorCode::QuotaExceeded => 429,
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

/// Every problem found in one request, in the order found; never empty. A spec with three bad
/// fields is refused with three errors, each with its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiErrors(Vec<ApiError>);

impl ApiErrors {
    /// The list of `errors`, or `None` when it is empty.
    pub fn from_vec(errors: Vec<ApiError>) -> Option<ApiErrors> {
        (!errors.is_empty()).then_some(ApiErrors(errors))
    }

    /// The first problem: the reply's `error`, and the micro-service error headers.
    pub fn first(&self) -> &ApiError {
        &self.0[0]
    }

    pub fn as_slice(&self) -> &[ApiError] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<ApiError> {
        self.0
    }

    /// The same problems with `prefix` before each field path (a spec nested in a request).
    pub fn within(self, prefix: &str) -> ApiErrors {
        ApiErrors(
            self.0
                .into_iter()
                .map(|mut error| {
                    error.field = Some(match error.field {
                        Some(field) => format!("{prefix}.{field}"),
                        None => prefix.to_owned(),
                    });
                    error
                })
                .collect(),
        )
    }
}

impl From<ApiError> for ApiErrors {
    fn from(error: ApiError) -> Self {
        ApiErrors(vec![error])
    }
}

/// The problems one after the other: `invalid_id at id: ...; invalid_cron at schedule.cron: ...`.
impl std::fmt::Display for ApiErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiErrors {}

impl<'a> IntoIterator for &'a ApiErrors {
    type Item = &'a ApiError;
    type IntoIter = std::slice::Iter<'a, ApiError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The envelope of a failed reply: `{"error": {...}, "errors": [{...}, ...]}`. `error` is the
/// first of `errors`, so a client that reads one error keeps working.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: ApiError,
    /// Every problem, `error` first (absent from the replies of older registries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ApiError>,
}

impl ErrorReply {
    pub fn new(errors: &ApiErrors) -> ErrorReply {
        ErrorReply { error: errors.first().clone(), errors: errors.as_slice().to_vec() }
    }

    /// Every problem the reply names: `errors`, or `error` alone when the list is absent.
    pub fn into_errors(self) -> ApiErrors {
        ApiErrors::from_vec(self.errors).unwrap_or_else(|| ApiErrors::from(self.error))
    }
}
