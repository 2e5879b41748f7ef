//! Why a request failed, kept typed until its reply is written: a refusal (every problem as
//! clients are told it) or a failure that carries its cause. [`Failure::wire`] is the one
//! place a cause becomes words, the error reply's.

use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};

/// The cause of a failure as it came (NATS, JetStream, serde, a stored value's problems).
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A request's failure.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Refused: every problem, as the client is told them.
    #[error(transparent)]
    Refused(#[from] ApiErrors),
    /// `what` could not be done because of `source`: answered `code` (at `field`), saying
    /// `<what>: <source>`.
    #[error("{what}")]
    Caused {
        code: ErrorCode,
        what: String,
        field: Option<String>,
        #[source]
        source: Cause,
    },
}

impl Failure {
    /// `what` failed for `source`, answered `code`.
    pub(crate) fn caused(code: ErrorCode, what: impl Into<String>, source: impl Into<Cause>) -> Failure {
        Failure::Caused { code, what: what.into(), field: None, source: source.into() }
    }

    /// NATS or JetStream could not do `what` (`unavailable`: retrying may help).
    pub(crate) fn unavailable(what: impl Into<String>, source: impl Into<Cause>) -> Failure {
        Failure::caused(ErrorCode::Unavailable, what, source)
    }

    /// Something the registry always manages failed (`internal`: a bug, or a stored value it
    /// cannot read).
    pub(crate) fn internal(what: impl Into<String>, source: impl Into<Cause>) -> Failure {
        Failure::caused(ErrorCode::Internal, what, source)
    }

    /// The same failure, placed at `field` (of a caused failure; a refusal names its own).
    pub(crate) fn at(self, at: &str) -> Failure {
        match self {
            Failure::Caused { code, what, source, .. } => {
                Failure::Caused { code, what, field: Some(at.to_string()), source }
            }
            refused => refused,
        }
    }

    /// The code of the (first) problem.
    pub fn code(&self) -> ErrorCode {
        match self {
            Failure::Refused(errors) => errors.first().code,
            Failure::Caused { code, .. } => *code,
        }
    }

    /// The problems the error reply names.
    pub fn wire(&self) -> ApiErrors {
        match self {
            Failure::Refused(errors) => errors.clone(),
            Failure::Caused { code, what, field, source } => {
                let error = ApiError::new(*code, format!("{what}: {source}"));
                ApiError { field: field.clone(), ..error }.into()
            }
        }
    }
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Failure {
        Failure::Refused(error.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_reaches_the_reply_in_words_and_stays_the_source() {
        let json = serde_json::from_slice::<u64>(b"{").unwrap_err();
        let words = json.to_string();
        let failure = Failure::caused(ErrorCode::InvalidJson, "invalid request", json).at("body");
        assert_eq!(failure.code(), ErrorCode::InvalidJson);
        assert!(std::error::Error::source(&failure).is_some());
        let wire = failure.wire();
        assert_eq!(wire.first().message, format!("invalid request: {words}"));
        assert_eq!(wire.first().field.as_deref(), Some("body"));
        let refused = Failure::from(ApiError::new(ErrorCode::NotFound, "no task"));
        assert_eq!(
            (refused.code(), refused.wire().first().message.as_str()),
            (ErrorCode::NotFound, "no task")
        );
    }
}
