//! The registry's codec: request bodies decoded and validated at the edge (the task requests
//! into [`ApiRequest`], the other APIs' bodies through [`decode`]), replies encoded, and the
//! error reply every failure is answered with.
//!
//! Every failure is a structured `{"error": {code, message, field}, "errors": [...]}` reply
//! (`errors` lists every problem, a spec's each with its field path; `error` is the first) with
//! the micro-service error headers of the first set; nothing a client sends can make the
//! registry panic.

use async_nats::HeaderMap;
use chrono::{DateTime, Utc};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode, ErrorReply};
use jetsched_shared::spec::{MAX_PAUSED_REASON, Priority, TaskSpec, validate_id};
use jetsched_shared::wire::{
    DEFAULT_DEDUPE_TTL, HDR_CREATE_ONLY, HDR_EXPECTED_REVISION, ListRequest, NextRequest, TaskRef,
    check_dedupe_key, check_payload, dedupe_ttl,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::failure::Failure;
use crate::tasks::Precondition;
use crate::tasks::trigger::{DedupeAsk, TriggerAsk};

/// The task endpoints (`<prefix>.api.task.<endpoint>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEndpoint {
    Put,
    Get,
    List,
    Delete,
    Pause,
    Resume,
    Trigger,
    Next,
    Graph,
}

impl TaskEndpoint {
    pub const ALL: [TaskEndpoint; 9] = [
        TaskEndpoint::Put,
        TaskEndpoint::Get,
        TaskEndpoint::List,
        TaskEndpoint::Delete,
        TaskEndpoint::Pause,
        TaskEndpoint::Resume,
        TaskEndpoint::Trigger,
        TaskEndpoint::Next,
        TaskEndpoint::Graph,
    ];
}

/// Limits applied to requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_spec_bytes: usize,
}

/// Where `next` takes its schedule from.
#[derive(Debug, Clone)]
pub enum NextSource {
    Stored(TaskRef),
    Inline(Box<TaskSpec>),
}

/// A decoded, validated request: everything a client sent, parsed at the edge.
#[derive(Debug, Clone)]
pub enum ApiRequest {
    Put {
        spec: Box<TaskSpec>,
        precondition: Precondition,
    },
    Get(TaskRef),
    List(ListRequest),
    Delete(TaskRef),
    /// `{"namespace", "id", "reason"?}`: the reason becomes the task's `paused_reason`.
    Pause {
        task: TaskRef,
        reason: Option<String>,
    },
    Resume(TaskRef),
    /// `{"namespace", "id", "priority"?, "payload"?, "dedupe_key"?, "dedupe_ttl"?}`: the
    /// priority overrides the spec's for this run, the payload its body.
    Trigger {
        task: TaskRef,
        ask: TriggerAsk,
    },
    Next {
        source: NextSource,
        count: usize,
        after: DateTime<Utc>,
    },
    /// `{"namespace", "id"}`: the task's parents and children (`after`).
    Graph(TaskRef),
}

/// Decodes and validates a task request without touching NATS: size, JSON, every field,
/// headers. A spec is refused with every problem it has. Pure apart from `now` (used to admit
/// `after` schedules and to default `next`'s start).
pub fn decode_request(
    endpoint: TaskEndpoint,
    payload: &[u8],
    headers: Option<&HeaderMap>,
    limits: Limits,
    now: DateTime<Utc>,
) -> Result<ApiRequest, Failure> {
    Ok(match endpoint {
        TaskEndpoint::Put => {
            let precondition = precondition(headers)?;
            check_size(payload, limits)?;
            ApiRequest::Put { spec: Box::new(TaskSpec::parse(payload)?.admit(now)?), precondition }
        }
        TaskEndpoint::Get => ApiRequest::Get(task_ref(payload)?),
        TaskEndpoint::List => {
            let request: ListRequest = decode(payload, Empty::Object, Detail::Fields)?;
            if let Some(namespace) = &request.namespace {
                validate_id("namespace", namespace)?;
            }
            if let Some(limit) = request.limit {
                within("limit", limit as u64, 1000)?;
            }
            ApiRequest::List(request)
        }
        TaskEndpoint::Delete => ApiRequest::Delete(task_ref(payload)?),
        TaskEndpoint::Pause => decode_pause(payload)?,
        TaskEndpoint::Resume => ApiRequest::Resume(task_ref(payload)?),
        TaskEndpoint::Trigger => decode_trigger(payload)?,
        TaskEndpoint::Next => decode_next(payload, limits, now)?,
        TaskEndpoint::Graph => ApiRequest::Graph(task_ref(payload)?),
    })
}

pub fn check_size(payload: &[u8], limits: Limits) -> Result<(), ApiError> {
    if payload.len() > limits.max_spec_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("spec is {} bytes; the limit is {}", payload.len(), limits.max_spec_bytes),
        ));
    }
    Ok(())
}

/// Refuses a count outside `1..=max` (`bad_request` at `field`).
pub(crate) fn within(field: &str, value: u64, max: u64) -> Result<(), ApiError> {
    if (1..=max).contains(&value) {
        return Ok(());
    }
    Err(ApiError::at(ErrorCode::BadRequest, field, format!("{field} must be within 1..={max}")))
}

/// Reads the compare-and-set headers of a `put` (API or intake).
pub fn precondition(headers: Option<&HeaderMap>) -> Result<Precondition, ApiError> {
    let Some(headers) = headers else { return Ok(Precondition::None) };
    let create_only = match headers.get(HDR_CREATE_ONLY).map(|v| v.as_str().trim().to_ascii_lowercase()) {
        None => false,
        Some(v) if v == "true" => true,
        Some(v) if v == "false" => false,
        Some(v) => {
            return Err(ApiError::at(
                ErrorCode::BadRequest,
                HDR_CREATE_ONLY,
                format!("{v:?} is not true or false"),
            ));
        }
    };
    let expected = match headers.get(HDR_EXPECTED_REVISION) {
        None => None,
        // The value is the client's: quoted back to it, the parse error says nothing more.
        Some(v) => Some(v.as_str().trim().parse::<u64>().map_err(|_| {
            ApiError::at(
                ErrorCode::BadRequest,
                HDR_EXPECTED_REVISION,
                format!("{:?} is not a revision number", v.as_str()),
            )
        })?),
    };
    Ok(match (create_only, expected) {
        (true, Some(n)) if n != 0 => {
            return Err(ApiError::at(
                ErrorCode::BadRequest,
                HDR_CREATE_ONLY,
                "create-only contradicts an expected revision other than 0",
            ));
        }
        (true, _) => Precondition::CreateOnly,
        (false, Some(n)) => Precondition::Revision(n),
        (false, None) => Precondition::None,
    })
}

fn task_ref(payload: &[u8]) -> Result<TaskRef, Failure> {
    let task: TaskRef = decode(payload, Empty::Refused, Detail::Fields)?;
    validate_id("namespace", &task.namespace)?;
    validate_id("id", &task.id)?;
    Ok(task)
}

/// The body of `pause`: a task and an optional reason (1 to 256 characters).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default = "default_namespace")]
    namespace: String,
    id: String,
    #[serde(default)]
    reason: Option<String>,
}

/// The body of `trigger`: a task, and optionally a priority and a payload for this run and a
/// de-duplication key with its time to live.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    #[serde(default = "default_namespace")]
    namespace: String,
    id: String,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    payload: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    dedupe_key: Option<String>,
    #[serde(default)]
    dedupe_ttl: Option<String>,
}

fn default_namespace() -> String {
    "default".to_string()
}

/// Every problem of a task's `namespace` and `id`, then `more`: refused together.
fn refuse_all(namespace: &str, id: &str, more: impl IntoIterator<Item = ApiError>) -> Result<(), ApiErrors> {
    let mut problems = Vec::new();
    problems.extend(validate_id("namespace", namespace).err());
    problems.extend(validate_id("id", id).err());
    problems.extend(more);
    ApiErrors::from_vec(problems).map_or(Ok(()), Err)
}

fn decode_trigger(payload: &[u8]) -> Result<ApiRequest, Failure> {
    let body: TriggerBody = decode(payload, Empty::Refused, Detail::Fields)?;
    let priority = priority_field(body.priority.as_deref());
    // `null` is no payload; anything else is given to the run as it is.
    let given = body.payload.as_deref().filter(|raw| raw.get() != "null");
    let size = given.map_or(Ok(()), |raw| check_payload(raw.get()));
    let key = body.dedupe_key.as_deref().map_or(Ok(()), |key| check_dedupe_key("dedupe_key", key));
    let ttl = dedupe_ttl("dedupe_ttl", body.dedupe_ttl.as_deref());
    let orphan_ttl = (body.dedupe_key.is_none() && body.dedupe_ttl.is_some()).then(|| {
        ApiError::at(ErrorCode::BadRequest, "dedupe_ttl", "dedupe_ttl is given only with dedupe_key")
    });
    let problems = [priority.clone().err(), size.err(), key.err(), ttl.clone().err(), orphan_ttl];
    refuse_all(&body.namespace, &body.id, problems.into_iter().flatten())?;
    let payload = match given {
        Some(raw) => Some(
            serde_json::from_str(raw.get())
                .map_err(|e| Failure::caused(ErrorCode::InvalidJson, "payload", e))?,
        ),
        None => None,
    };
    let dedupe = body.dedupe_key.map(|key| DedupeAsk { key, ttl: ttl.unwrap_or(DEFAULT_DEDUPE_TTL) });
    let ask = TriggerAsk { priority: priority.ok().flatten(), payload, dedupe };
    Ok(ApiRequest::Trigger { task: TaskRef { namespace: body.namespace, id: body.id }, ask })
}

/// An optional `priority` field of a request: `invalid_value` naming the choices otherwise.
pub(crate) fn priority_field(text: Option<&str>) -> Result<Option<Priority>, ApiError> {
    let Some(text) = text else { return Ok(None) };
    Priority::parse(text).map(Some).ok_or_else(|| {
        ApiError::at(
            ErrorCode::InvalidValue,
            "priority",
            format!("{text:?} is not one of {}", Priority::names()),
        )
    })
}

/// A `paused_reason` (of the API's `pause` or a worker's pause request): 1 to
/// [`MAX_PAUSED_REASON`] characters.
pub(crate) fn paused_reason(reason: &str) -> Result<(), ApiError> {
    let length = reason.chars().count();
    if length == 0 || length > MAX_PAUSED_REASON {
        return Err(ApiError::at(
            ErrorCode::InvalidValue,
            "reason",
            format!("must be 1 to {MAX_PAUSED_REASON} characters"),
        ));
    }
    Ok(())
}

fn decode_pause(payload: &[u8]) -> Result<ApiRequest, Failure> {
    let body: PauseBody = decode(payload, Empty::Refused, Detail::Fields)?;
    refuse_all(&body.namespace, &body.id, body.reason.as_deref().and_then(|r| paused_reason(r).err()))?;
    Ok(ApiRequest::Pause { task: TaskRef { namespace: body.namespace, id: body.id }, reason: body.reason })
}

fn decode_next(payload: &[u8], limits: Limits, now: DateTime<Utc>) -> Result<ApiRequest, Failure> {
    let request: NextRequest = decode(payload, Empty::Refused, Detail::Fields)?;
    let count = request.count.unwrap_or(10);
    within("count", count as u64, 1000)?;
    let source = match (request.spec, request.id) {
        (Some(spec), None) => {
            let bytes = serde_json::to_vec(&spec).expect("a JSON value serializes");
            check_size(&bytes, limits)?;
            let spec = TaskSpec::parse_value(spec)
                .and_then(|spec| Ok(spec.admit(now)?))
                .map_err(|errors| errors.within("spec"))?;
            NextSource::Inline(Box::new(spec))
        }
        (None, Some(id)) => {
            let namespace = request.namespace.unwrap_or_else(default_namespace);
            validate_id("namespace", &namespace)?;
            validate_id("id", &id)?;
            NextSource::Stored(TaskRef { namespace, id })
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "give either a stored task (namespace, id) or an inline spec, not both",
            )
            .into());
        }
    };
    Ok(ApiRequest::Next { source, count, after: request.after.unwrap_or(now) })
}

/// What an empty (all-whitespace) body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// `{}`: every field left out.
    Object,
    /// Not JSON (`invalid_json`).
    Refused,
}

/// Which decoding problems a body's API tells apart: each keeps the codes it has always
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Detail {
    /// `invalid_json` (not JSON) or `bad_request` (anything else).
    Syntax,
    /// ... and `unknown_field`.
    UnknownField,
    /// ... and `missing_field`, `invalid_type`, with the field serde names.
    Fields,
}

/// Decodes a small JSON request body; a problem is answered `invalid request: <serde's words>`.
pub(crate) fn decode<T: DeserializeOwned>(
    payload: &[u8],
    empty: Empty,
    detail: Detail,
) -> Result<T, Failure> {
    let blank = payload.iter().all(u8::is_ascii_whitespace);
    let payload: &[u8] = if blank && empty == Empty::Object { b"{}" } else { payload };
    serde_json::from_slice(payload).map_err(|e| {
        let text = e.to_string();
        let said = |prefix: &str, level: Detail| detail >= level && text.starts_with(prefix);
        let code = if e.is_syntax() || e.is_eof() {
            ErrorCode::InvalidJson
        } else if said("unknown field", Detail::UnknownField) {
            ErrorCode::UnknownField
        } else if said("missing field", Detail::Fields) {
            ErrorCode::MissingField
        } else if said("invalid type", Detail::Fields) {
            ErrorCode::InvalidType
        } else {
            ErrorCode::BadRequest
        };
        // serde names the offending field in backticks; surface it as the field.
        let field = text.split('`').nth(1).filter(|_| e.is_data() && detail == Detail::Fields);
        let failure = Failure::caused(code, "invalid request", e);
        match field {
            Some(field) => failure.at(field),
            None => failure,
        }
    })
}

/// A reply body.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, Failure> {
    serde_json::to_vec(value).map_err(|e| Failure::internal("encode reply", e))
}

/// The body and headers of an error reply: every problem in the body, the first in the headers.
pub(crate) fn error_reply(errors: &ApiErrors) -> (Vec<u8>, HeaderMap) {
    let error = errors.first();
    let mut headers = HeaderMap::new();
    // Header values cannot hold line breaks (cron and serde messages can).
    let status: String = error.message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    headers.insert(async_nats::service::NATS_SERVICE_ERROR, status.as_str());
    headers.insert(async_nats::service::NATS_SERVICE_ERROR_CODE, error.code.status().to_string().as_str());
    let body = serde_json::to_vec(&ErrorReply::new(errors)).expect("an error serializes");
    (body, headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only decoded")]
    struct Body {
        id: String,
    }

    fn code(payload: &str, detail: Detail) -> (ErrorCode, Option<String>) {
        let wire = decode::<Body>(payload.as_bytes(), Empty::Refused, detail).unwrap_err().wire();
        (wire.first().code, wire.first().field.clone())
    }

    #[test]
    fn each_detail_tells_apart_the_codes_its_api_always_answered() {
        let unknown = r#"{"id": "a", "x": 1}"#;
        assert_eq!(code(unknown, Detail::Syntax), (ErrorCode::BadRequest, None));
        assert_eq!(code(unknown, Detail::UnknownField), (ErrorCode::UnknownField, None));
        assert_eq!(code(unknown, Detail::Fields), (ErrorCode::UnknownField, Some("x".into())));
        assert_eq!(code("{}", Detail::UnknownField), (ErrorCode::BadRequest, None));
        assert_eq!(code("{}", Detail::Fields), (ErrorCode::MissingField, Some("id".into())));
        assert_eq!(code(r#"{"id": 1}"#, Detail::Fields).0, ErrorCode::InvalidType);
        assert_eq!(code("{", Detail::Fields), (ErrorCode::InvalidJson, None));
        assert_eq!(code("  ", Detail::Syntax), (ErrorCode::InvalidJson, None));
        let message = decode::<Body>(b"{", Empty::Refused, Detail::Syntax).unwrap_err().wire();
        assert!(message.first().message.starts_with("invalid request: EOF"), "{message}");
    }

    #[test]
    fn counts_are_within_their_range() {
        assert_eq!(within("limit", 1000, 1000), Ok(()));
        let refused = within("last", 0, 5).unwrap_err();
        assert_eq!(
            (refused.field.as_deref(), refused.message.as_str()),
            (Some("last"), "last must be within 1..=5")
        );
    }
}
