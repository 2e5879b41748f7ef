//! The task API: decoding requests, calling the task store, encoding replies.
//!
//! Every failure is a structured `{"error": {code, message, field}, "errors": [...]}` reply
//! (`errors` lists every problem, a spec's each with its field path; `error` is the first) with
//! the micro-service error headers of the first set; nothing a client sends can make the
//! registry panic.

use async_nats::HeaderMap;
use async_nats::service::Request;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode, ErrorReply};
use jetsched_shared::schedule::Schedule;
use jetsched_shared::spec::{MAX_PAUSED_REASON, Priority, TaskSpec, validate_id};
use jetsched_shared::wire::{
    self, HDR_CREATE_ONLY, HDR_EXPECTED_REVISION, ListRequest, NextReply, NextRequest, TaskRef,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::tasks::{Precondition, TaskStore};

/// The task endpoints, in the order they are registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Put,
    Get,
    List,
    Delete,
    Pause,
    Resume,
    Trigger,
    Next,
    /// A dead-letter endpoint (`<prefix>.api.dlq.*`), served by [`crate::dlq`].
    Dlq(crate::dlq::DlqEndpoint),
    /// A breaker endpoint (`<prefix>.api.breaker.*`), served by [`crate::breakers`].
    Breaker(crate::breakers::BreakerEndpoint),
    /// Reading a run record (`<prefix>.api.runs.get.<namespace>`), served by [`crate::runs`].
    RunsGet,
    /// A namespace's event history (`<prefix>.api.events.history.<namespace>`), served by
    /// [`crate::history`].
    EventsHistory,
    /// Anything else under `<prefix>.api.>`.
    Unknown,
}

impl Endpoint {
    pub const TASK: [Endpoint; 8] = [
        Endpoint::Put,
        Endpoint::Get,
        Endpoint::List,
        Endpoint::Delete,
        Endpoint::Pause,
        Endpoint::Resume,
        Endpoint::Trigger,
        Endpoint::Next,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Put => "put",
            Endpoint::Get => "get",
            Endpoint::List => "list",
            Endpoint::Delete => "delete",
            Endpoint::Pause => "pause",
            Endpoint::Resume => "resume",
            Endpoint::Trigger => "trigger",
            Endpoint::Next => "next",
            Endpoint::Dlq(endpoint) => endpoint.label(),
            Endpoint::Breaker(endpoint) => endpoint.label(),
            Endpoint::RunsGet => "runs-get",
            Endpoint::EventsHistory => "events-history",
            Endpoint::Unknown => "unknown",
        }
    }
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
    /// `{"namespace", "id", "priority"?}`: the priority overrides the spec's for this run.
    Trigger {
        task: TaskRef,
        priority: Option<Priority>,
    },
    Next {
        source: NextSource,
        count: usize,
        after: DateTime<Utc>,
    },
}

/// Decodes and validates a request without touching NATS: size, JSON, every field, headers.
/// A spec is refused with every problem it has. Pure apart from `now` (used to admit `after`
/// schedules and to default `next`'s start).
pub fn decode_request(
    endpoint: Endpoint,
    subject: &str,
    payload: &[u8],
    headers: Option<&HeaderMap>,
    limits: Limits,
    now: DateTime<Utc>,
) -> Result<ApiRequest, ApiErrors> {
    Ok(match endpoint {
        Endpoint::Put => {
            let precondition = precondition(headers)?;
            check_size(payload, limits)?;
            ApiRequest::Put { spec: Box::new(TaskSpec::parse(payload)?.admit(now)?), precondition }
        }
        Endpoint::Get => ApiRequest::Get(task_ref(payload)?),
        Endpoint::List => {
            let request: ListRequest = decode(payload, true)?;
            if let Some(namespace) = &request.namespace {
                validate_id("namespace", namespace)?;
            }
            if request.limit.is_some_and(|l| l == 0 || l > 1000) {
                return Err(
                    ApiError::at(ErrorCode::BadRequest, "limit", "limit must be within 1..=1000").into()
                );
            }
            ApiRequest::List(request)
        }
        Endpoint::Delete => ApiRequest::Delete(task_ref(payload)?),
        Endpoint::Pause => decode_pause(payload)?,
        Endpoint::Resume => ApiRequest::Resume(task_ref(payload)?),
        Endpoint::Trigger => decode_trigger(payload)?,
        Endpoint::Next => decode_next(payload, limits, now)?,
        Endpoint::Dlq(endpoint) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("{} requests are decoded by the dead-letter API", endpoint.label()),
            )
            .into());
        }
        Endpoint::RunsGet | Endpoint::EventsHistory => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "run and event requests are decoded by their own endpoints",
            )
            .into());
        }
        Endpoint::Breaker(_) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "breaker requests are decoded by the breaker API",
            )
            .into());
        }
        Endpoint::Unknown => {
            return Err(ApiError::new(
                ErrorCode::UnknownEndpoint,
                format!("no endpoint {subject}; see `nats micro info` for the endpoints"),
            )
            .into());
        }
    })
}

/// Handles one request; returns the reply body.
pub(crate) async fn handle(
    store: &TaskStore,
    limits: Limits,
    endpoint: Endpoint,
    request: &Request,
) -> Result<Vec<u8>, ApiErrors> {
    let message = &request.message;
    let now = Utc::now();
    let request =
        decode_request(endpoint, &message.subject, &message.payload, message.headers.as_ref(), limits, now)?;
    Ok(answer(store, request).await?)
}

/// Carries out a decoded request: the store's answer, or its one error.
pub(crate) async fn answer(store: &TaskStore, request: ApiRequest) -> Result<Vec<u8>, ApiError> {
    match request {
        ApiRequest::Put { spec, precondition } => Ok(store.put(*spec, precondition).await?.reply_json()),
        ApiRequest::Get(task) => encode(&store.get(&task.namespace, &task.id).await?),
        ApiRequest::List(request) => encode(&store.list(&request).await?),
        ApiRequest::Delete(task) => encode(&store.delete(&task.namespace, &task.id).await?),
        ApiRequest::Pause { task, reason } => {
            encode(&store.pause(&task.namespace, &task.id, reason.as_deref()).await?)
        }
        ApiRequest::Resume(task) => encode(&store.resume(&task.namespace, &task.id).await?),
        ApiRequest::Trigger { task, priority } => {
            encode(&store.trigger(&task.namespace, &task.id, priority).await?)
        }
        ApiRequest::Next { source, count, after } => {
            let spec = match source {
                NextSource::Inline(spec) => *spec,
                NextSource::Stored(task) => store.get(&task.namespace, &task.id).await?.task,
            };
            encode(&preview(&spec, count, after))
        }
    }
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

fn task_ref(payload: &[u8]) -> Result<TaskRef, ApiError> {
    let task: TaskRef = decode(payload, false)?;
    validate_id("namespace", &task.namespace)?;
    validate_id("id", &task.id)?;
    Ok(task)
}

/// The body of `pause`: a task and an optional reason (1 to 256 characters).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default = "default_namespace")]
    namespace: String,
    id: String,
    #[serde(default)]
    reason: Option<String>,
}

/// The body of `trigger`: a task and an optional priority for this run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    #[serde(default = "default_namespace")]
    namespace: String,
    id: String,
    #[serde(default)]
    priority: Option<String>,
}

fn decode_trigger(payload: &[u8]) -> Result<ApiRequest, ApiErrors> {
    let body: TriggerBody = decode(payload, false)?;
    let mut problems = Vec::new();
    problems.extend(validate_id("namespace", &body.namespace).err());
    problems.extend(validate_id("id", &body.id).err());
    let priority = priority_field(body.priority.as_deref());
    if let Some(errors) = ApiErrors::from_vec(problems.into_iter().chain(priority.clone().err()).collect()) {
        return Err(errors);
    }
    let task = TaskRef { namespace: body.namespace, id: body.id };
    Ok(ApiRequest::Trigger { task, priority: priority.ok().flatten() })
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

fn default_namespace() -> String {
    "default".to_string()
}

fn decode_pause(payload: &[u8]) -> Result<ApiRequest, ApiErrors> {
    let body: PauseBody = decode(payload, false)?;
    let mut problems = Vec::new();
    problems.extend(validate_id("namespace", &body.namespace).err());
    problems.extend(validate_id("id", &body.id).err());
    if let Some(reason) = &body.reason {
        let length = reason.chars().count();
        if length == 0 || length > MAX_PAUSED_REASON {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "reason",
                format!("must be 1 to {MAX_PAUSED_REASON} characters"),
            ));
        }
    }
    if let Some(errors) = ApiErrors::from_vec(problems) {
        return Err(errors);
    }
    Ok(ApiRequest::Pause { task: TaskRef { namespace: body.namespace, id: body.id }, reason: body.reason })
}

fn decode_next(payload: &[u8], limits: Limits, now: DateTime<Utc>) -> Result<ApiRequest, ApiErrors> {
    let request: NextRequest = decode(payload, false)?;
    let count = request.count.unwrap_or(10);
    if count == 0 || count > 1000 {
        return Err(ApiError::at(ErrorCode::BadRequest, "count", "count must be within 1..=1000").into());
    }
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
            let namespace = request.namespace.unwrap_or_else(|| "default".to_string());
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

/// The next `count` fires of a spec after `after`, in UTC and on the zone's wall clock.
fn preview(spec: &TaskSpec, count: usize, after: DateTime<Utc>) -> NextReply {
    let times = spec.schedule.upcoming(after, count);
    let tz: Tz = match &spec.schedule {
        Schedule::Cron(cron) => cron.timezone(),
        _ => Tz::UTC,
    };
    NextReply {
        timezone: tz.name().to_string(),
        local_times: times.iter().map(|t| t.with_timezone(&tz).to_rfc3339()).collect(),
        times: times.into_iter().map(wire::format_time).collect(),
    }
}

/// Decodes a small JSON request body. An empty body is `{}` when `empty_ok`.
fn decode<T: DeserializeOwned>(payload: &[u8], empty_ok: bool) -> Result<T, ApiError> {
    let payload: &[u8] =
        if empty_ok && payload.iter().all(u8::is_ascii_whitespace) { b"{}" } else { payload };
    serde_json::from_slice(payload).map_err(|e| {
        let text = e.to_string();
        let code = if e.is_syntax() || e.is_eof() {
            ErrorCode::InvalidJson
        } else if text.starts_with("unknown field") {
            ErrorCode::UnknownField
        } else if text.starts_with("missing field") {
            ErrorCode::MissingField
        } else if text.starts_with("invalid type") {
            ErrorCode::InvalidType
        } else {
            ErrorCode::BadRequest
        };
        // serde names the offending field in backticks; surface it as the field.
        let field = text.split('`').nth(1).filter(|_| e.is_data()).map(str::to_string);
        ApiError { field, ..ApiError::new(code, format!("invalid request: {text}")) }
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|e| ApiError::new(ErrorCode::Internal, format!("encode reply: {e}")))
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
