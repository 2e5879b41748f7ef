//! The dead-letter API, `jetsched.api.dlq.{list,get,replay,purge}`: inspect the entries the
//! workers stored in `JETSCHED_DLQ`, replay them (a new dispatch with a new execution id and
//! trigger `replay`, then the entry is removed), and purge them.
//!
//! Requests (JSON; a filter is any of `queue`, `namespace`, `task_id`, and of what entries
//! hold: `execution_id`, `error` (text of the reason or an attempt's error, ignoring case),
//! `since`/`until` (when dead-lettered), `through` (a last sequence)):
//! - `list`: `{filter..., "limit": 100, "cursor": <sequence>}` → `{"entries": [{"sequence", "entry"}], "next_cursor"}`
//! - `get`: `{"sequence": n}` → `{"sequence", "entry"}`
//! - `replay`: `{"sequence": n}` or `{filter..., "limit": 100, "rate": 50}` (bulk, at most `rate`
//!   per second) → `{"replayed": [{"sequence", "original_execution_id", "execution_id"}], "failed": [...]}`
//! - `purge`: `{"sequence": n}` or `{filter...}` (at most `limit` entries when it filters on
//!   content) or `{"all": true}` → `{"purged": n}`
//!
//! Each endpoint is also served on `jetsched.api.dlq.<endpoint>.<namespace>`: the filter is
//! then that namespace (a body naming another is refused with `namespace_mismatch`), and an
//! entry addressed by sequence must belong to it.
//!
//! Entries are the workers' dead letters; only the fields a replay needs are typed here.

use std::time::Duration;

use async_nats::jetstream::{self, stream::RawMessageErrorKind};
use jetsched_shared::dispatch::{self, DispatchMessage, Origin, SpecBody, Target};
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::names::Names;
use jetsched_shared::spec::{Priority, validate_id};
use jetsched_shared::wire::{DeadLetter, DlqRequest};
use serde::Serialize;
use serde_json::Value;

use crate::codec::{self, Detail, Empty, encode, priority_field, within};
use crate::failure::Failure;
use crate::scope::{check_namespace, same_namespace};

mod select;

/// A dead letter as stored: its sequence, the subject it was stored on (which names its queue,
/// namespace and task) and its body.
struct Stored {
    sequence: u64,
    subject: String,
    payload: bytes::Bytes,
}

impl From<jetstream::message::StreamMessage> for Stored {
    fn from(message: jetstream::message::StreamMessage) -> Stored {
        Stored { sequence: message.sequence, subject: message.subject.to_string(), payload: message.payload }
    }
}

/// The dead-letter endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlqEndpoint {
    List,
    Get,
    Replay,
    Purge,
}

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
const DEFAULT_RATE: u32 = 100;
const MAX_RATE: u32 = 1000;

#[derive(Debug, Serialize)]
struct Listed {
    sequence: u64,
    entry: Value,
}

#[derive(Debug, Serialize)]
struct Replayed {
    sequence: u64,
    original_execution_id: String,
    execution_id: String,
}

#[derive(Debug, Serialize)]
struct NotReplayed {
    sequence: u64,
    error: String,
}

/// The dead-letter API; cheap to clone.
#[derive(Clone)]
pub(crate) struct DlqApi {
    js: jetstream::Context,
    names: Names,
}

impl DlqApi {
    pub(crate) fn new(js: jetstream::Context, names: Names) -> DlqApi {
        DlqApi { js, names }
    }

    /// Handles one request and returns the reply body; confined to `scope` when it came on a
    /// namespaced subject (`<prefix>.api.dlq.<endpoint>.<namespace>`): the filter is that
    /// namespace, a body naming another is refused, and an entry addressed by sequence must
    /// belong to it.
    pub(crate) async fn handle(
        &self,
        endpoint: DlqEndpoint,
        scope: Option<&str>,
        payload: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        let mut request = decode(payload)?;
        if let Some(scope) = scope {
            check_namespace(scope)?;
            same_namespace(request.namespace.as_deref(), scope)?;
            request.namespace = Some(scope.to_string());
        }
        for (field, value) in
            [("namespace", &request.namespace), ("task_id", &request.task_id), ("queue", &request.queue)]
        {
            if let Some(value) = value {
                validate_id(field, value)?;
            }
        }
        let limit = request.limit.unwrap_or(DEFAULT_LIMIT);
        within("limit", limit as u64, MAX_LIMIT as u64)?;
        let reply = match endpoint {
            DlqEndpoint::List => {
                let (entries, next) = self.scan(&request, request.cursor.unwrap_or(1), limit).await?;
                let entries: Vec<Listed> = entries
                    .into_iter()
                    .map(|stored| Listed { sequence: stored.sequence, entry: json_or_text(&stored.payload) })
                    .collect();
                let mut reply = serde_json::json!({ "entries": entries });
                if let Some(next) = next {
                    reply["next_cursor"] = next.into();
                }
                reply
            }
            DlqEndpoint::Get => {
                let sequence = required_sequence(&request)?;
                let stored = self.entry_in(sequence, scope).await?;
                serde_json::json!({ "sequence": sequence, "entry": json_or_text(&stored.payload) })
            }
            DlqEndpoint::Replay => {
                let priority = priority_field(request.priority.as_deref())?;
                self.replay(&request, priority, scope, limit).await?
            }
            DlqEndpoint::Purge => self.purge(&request, scope).await?,
        };
        encode(&reply)
    }

    fn stream_name(&self) -> String {
        self.names.dlq_stream()
    }

    async fn stream(&self) -> Result<jetstream::stream::Stream, Failure> {
        self.js.get_stream(self.stream_name()).await.map_err(unavailable)
    }

    fn filter(&self, request: &DlqRequest) -> String {
        let any = |v: &Option<String>| v.clone().unwrap_or_else(|| "*".to_string());
        self.names.dlq_subject(&any(&request.queue), &any(&request.namespace), &any(&request.task_id))
    }

    /// Up to `limit` entries matching the request's filter from sequence `from`, and the cursor
    /// of the next page.
    async fn scan(
        &self,
        request: &DlqRequest,
        from: u64,
        limit: usize,
    ) -> Result<(Vec<Stored>, Option<u64>), Failure> {
        let stream = self.stream().await?;
        let filter = self.filter(request);
        let content = request.has_content_filter();
        let mut out = Vec::new();
        let mut next = from.max(1);
        let mut examined = 0;
        while out.len() < limit {
            if content && examined == select::MAX_EXAMINED {
                return Ok((out, Some(next)));
            }
            match stream.get_first_raw_message_by_subject(&filter, next).await {
                Ok(message) if request.through.is_some_and(|through| message.sequence > through) => {
                    return Ok((out, None));
                }
                Ok(message) => {
                    next = message.sequence + 1;
                    examined += 1;
                    let stored = Stored::from(message);
                    if !content || select::selects(request, &json_or_text(&stored.payload)) {
                        out.push(stored);
                    }
                }
                Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => return Ok((out, None)),
                Err(error) => return Err(unavailable(error)),
            }
        }
        // A full page: there may be more.
        Ok((out, Some(next)))
    }

    async fn entry(&self, sequence: u64) -> Result<Stored, Failure> {
        let stream = self.stream().await?;
        match stream.get_raw_message(sequence).await {
            Ok(message) => Ok(Stored::from(message)),
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => {
                Err(ApiError::new(ErrorCode::NotFound, format!("no dead letter at sequence {sequence}"))
                    .into())
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// The entry at `sequence`, refused when `scope` is set and the entry (its subject) is of
    /// another namespace.
    async fn entry_in(&self, sequence: u64, scope: Option<&str>) -> Result<Stored, Failure> {
        let stored = self.entry(sequence).await?;
        let Some(scope) = scope else { return Ok(stored) };
        match self.names.parse_dlq_subject(&stored.subject) {
            Some((_, namespace, _)) if namespace == scope => Ok(stored),
            _ => Err(ApiError::at(
                ErrorCode::NamespaceMismatch,
                "sequence",
                format!("dead letter {sequence} is not in namespace {scope:?}"),
            )
            .into()),
        }
    }

    async fn replay(
        &self,
        request: &DlqRequest,
        priority: Option<Priority>,
        scope: Option<&str>,
        limit: usize,
    ) -> Result<Value, Failure> {
        let entries = match request.sequence {
            Some(sequence) => vec![self.entry_in(sequence, scope).await?],
            None if request.has_filter() => self.scan(request, 1, limit).await?.0,
            None => {
                return Err(ApiError::new(
                    ErrorCode::BadRequest,
                    "give a sequence, or a filter (queue, namespace, task_id, execution_id, error, since, until, through) for a bulk replay",
                )
                .into());
            }
        };
        let rate = request.rate.unwrap_or(DEFAULT_RATE);
        within("rate", rate.into(), MAX_RATE.into())?;
        let mut pace = tokio::time::interval(Duration::from_secs(1) / rate);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stream = self.stream().await?;
        let mut replayed = Vec::new();
        let mut failed = Vec::new();
        for stored in entries {
            pace.tick().await;
            let sequence = stored.sequence;
            match self.replay_one(&stream, &stored, priority).await {
                Ok(done) => replayed.push(done),
                Err(error) if request.sequence.is_some() => return Err(error),
                Err(error) => {
                    let error = error.wire().first().message.clone();
                    failed.push(NotReplayed { sequence, error });
                }
            }
        }
        Ok(serde_json::json!({ "replayed": replayed, "failed": failed }))
    }

    /// Dispatches the entry again under a new execution id, then removes it from the DLQ.
    ///
    /// The task is the one the entry's subject names: only the services may publish on
    /// dead-letter subjects, while the body is a copy of a dispatch whose fields a spec shaped.
    /// A body (or its spec snapshot) naming another namespace, task or queue is refused.
    async fn replay_one(
        &self,
        stream: &jetstream::stream::Stream,
        stored: &Stored,
        priority: Option<Priority>,
    ) -> Result<Replayed, Failure> {
        let sequence = stored.sequence;
        let entry: DeadLetter = serde_json::from_slice(&stored.payload).map_err(|e| {
            Failure::caused(ErrorCode::BadRequest, format!("dead letter {sequence} cannot be replayed"), e)
        })?;
        let Some((queue, namespace, task_id)) = self.names.parse_dlq_subject(&stored.subject) else {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!(
                    "dead letter {sequence} is stored on {:?}, not a dead-letter subject",
                    stored.subject
                ),
            )
            .into());
        };
        let Some(spec) = entry.spec else {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!(
                    "dead letter {sequence} has no spec snapshot (undecodable dispatch): purge it instead"
                ),
            )
            .into());
        };
        let disagreements: Vec<String> = [
            ("namespace", entry.namespace.as_str(), namespace),
            ("task_id", entry.task_id.as_str(), task_id),
            ("spec.namespace", spec.namespace.as_str(), namespace),
            ("spec.id", spec.id.as_str(), task_id),
            ("spec.queue", spec.queue.as_str(), queue),
        ]
        .into_iter()
        .filter(|(_, body, subject)| body != subject)
        .map(|(field, body, subject)| format!("{field} {body:?} (its subject says {subject:?})"))
        .collect();
        if !disagreements.is_empty() {
            return Err(ApiError::at(
                ErrorCode::NamespaceMismatch,
                "sequence",
                format!(
                    "dead letter {sequence} cannot be replayed: its body disagrees with its subject: {}",
                    disagreements.join(", ")
                ),
            )
            .into());
        }
        // Keyed by the dead letter: a retried replay request (entry not yet deleted) is absorbed.
        let target = Target {
            namespace,
            task_id,
            queue,
            revision: entry.revision,
            priority: priority.unwrap_or(entry.priority),
        };
        let origin =
            Origin::Replay { nominal_time: entry.nominal_time, dead_execution_id: &entry.execution_id };
        // The replay request's span, when traced, is the parent of the new run.
        let parent = crate::spans::dispatch_parent();
        let DispatchMessage { subject, execution_id, message, .. } =
            dispatch::build_traced(&self.names, target, origin, SpecBody::Spec(&spec), parent.as_ref())
                .map_err(|e| Failure::internal("encode dispatch", e))?;
        self.js.send_publish(subject, message).await.map_err(unavailable)?.await.map_err(unavailable)?;
        stream.delete_message(sequence).await.map_err(unavailable)?;
        Ok(Replayed { sequence, original_execution_id: entry.execution_id, execution_id })
    }

    async fn purge(&self, request: &DlqRequest, scope: Option<&str>) -> Result<Value, Failure> {
        let stream = self.stream().await?;
        let purged = match request.sequence {
            Some(sequence) => {
                if scope.is_some() {
                    self.entry_in(sequence, scope).await?;
                }
                let deleted = stream.delete_message(sequence).await.map_err(|e| {
                    Failure::caused(ErrorCode::NotFound, format!("no dead letter at sequence {sequence}"), e)
                })?;
                u64::from(deleted)
            }
            None if request.has_content_filter() => {
                let limit = request.limit.unwrap_or(DEFAULT_LIMIT);
                let mut purged = 0;
                for stored in self.scan(request, 1, limit).await?.0 {
                    // An entry replayed or purged meanwhile is not counted.
                    match stream.delete_message(stored.sequence).await {
                        Ok(deleted) => purged += u64::from(deleted),
                        Err(error) => {
                            tracing::debug!(%error, sequence = stored.sequence, "dead letter not purged")
                        }
                    }
                }
                purged
            }
            None if request.has_filter() => {
                stream.purge().filter(self.filter(request)).await.map_err(unavailable)?.purged
            }
            None if request.all => stream.purge().await.map_err(unavailable)?.purged,
            None => {
                return Err(ApiError::new(
                    ErrorCode::BadRequest,
                    "give a sequence, a filter (queue, namespace, task_id, execution_id, error, since, until, through) or \"all\": true",
                )
                .into());
            }
        };
        Ok(serde_json::json!({ "purged": purged }))
    }
}

fn required_sequence(request: &DlqRequest) -> Result<u64, ApiError> {
    request
        .sequence
        .ok_or_else(|| ApiError::at(ErrorCode::MissingField, "sequence", "give the entry's sequence"))
}

fn decode(payload: &[u8]) -> Result<DlqRequest, Failure> {
    codec::decode(payload, Empty::Object, Detail::Syntax)
}

fn json_or_text(payload: &[u8]) -> Value {
    serde_json::from_slice(payload)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into_owned()))
}

fn unavailable(error: impl Into<crate::failure::Cause>) -> Failure {
    Failure::unavailable("dead-letter stream", error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_strictly_and_filters_use_wildcards() {
        assert!(decode(b"").unwrap().sequence.is_none());
        assert_eq!(decode(br#"{"sequence": 4}"#).unwrap().sequence, Some(4));
        assert_eq!(decode(br#"{"sequence": "x"}"#).unwrap_err().code(), ErrorCode::BadRequest);
        assert_eq!(decode(br#"{"bogus": 1}"#).unwrap_err().code(), ErrorCode::BadRequest);
        assert_eq!(decode(b"{").unwrap_err().code(), ErrorCode::InvalidJson);
        let api_names = Names::default();
        let request = decode(br#"{"namespace": "billing"}"#).unwrap();
        let any = |v: &Option<String>| v.clone().unwrap_or_else(|| "*".to_string());
        assert_eq!(
            api_names.dlq_subject(&any(&request.queue), &any(&request.namespace), &any(&request.task_id)),
            api_names.dlq_subject("*", "billing", "*")
        );
        assert!(request.has_filter());
    }
}
