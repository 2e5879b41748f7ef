//! The queue API, `jetsched.api.queue.{list,pause,resume}`: operators pause a whole queue and
//! resume it. The state lives in `JETSCHED_QUEUES` (one key per queue, `{paused, reason, by,
//! at}`), written with compare-and-set; every worker follows the bucket and pulls nothing from a
//! paused queue's lanes. The scheduler is not told: it keeps dispatching into a paused queue,
//! whose runs wait in the stream.
//!
//! Requests (JSON):
//! - `list`: `{}` → `{"queues": [<queue>...]}` by name: every queue with a stored state or a
//!   worker consumer, with its lanes' waiting and in-flight counts.
//! - `pause`: `{"queue": "default", "reason": "...", "by": "alice"}` (`reason`, `by` optional)
//!   → `{"queue": <queue>, "changed": true}`; `queue.paused` is published when it changed.
//! - `resume`: `{"queue": "default"}` → the same; `queue.resumed` when it changed.
//!
//! A queue spans namespaces: these endpoints exist only un-namespaced, for operators (a team's
//! account is given no import of them).

use std::collections::BTreeMap;

use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::{Names, SYSTEM_NAMESPACE};
use jetsched_shared::priority::Priority;
use jetsched_shared::spec::{MAX_PAUSED_REASON, validate_queue};
use jetsched_shared::wire::{
    Event, EventKind, LaneInfo, QueueInfo, QueueListReply, QueueReply, QueueRequest, QueueState,
};

use crate::breakers::latest;
use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;

/// The queue endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueEndpoint {
    List,
    Pause,
    Resume,
}

/// How many times a pause or resume retries a lost compare-and-set race.
const CAS_ATTEMPTS: usize = 8;

/// Longest `by`.
const MAX_BY: usize = 128;

/// Reads and writes the queues bucket.
#[derive(Clone)]
pub struct QueueApi {
    js: jetstream::Context,
    queues: kv::Store,
    names: Names,
    events: EventSink,
}

impl QueueApi {
    pub fn new(js: jetstream::Context, queues: kv::Store, names: Names, events: EventSink) -> QueueApi {
        QueueApi { js, queues, names, events }
    }

    /// Handles one request; returns the reply body.
    pub(crate) async fn handle(&self, endpoint: QueueEndpoint, payload: &[u8]) -> Result<Vec<u8>, Failure> {
        match endpoint {
            QueueEndpoint::List => {
                let _: NoFields = decode(payload, Empty::Object, Detail::UnknownField)?;
                encode(&self.list().await?)
            }
            QueueEndpoint::Pause => encode(&self.set(checked(payload, true)?, true).await?),
            QueueEndpoint::Resume => encode(&self.set(checked(payload, false)?, false).await?),
        }
    }

    /// Every queue with a stored state or a worker consumer, by name.
    pub async fn list(&self) -> Result<QueueListReply, Failure> {
        let (states, lanes) = tokio::try_join!(latest(&self.js, &self.queues), self.lanes())?;
        let mut queues: BTreeMap<String, QueueInfo> = BTreeMap::new();
        for (queue, (revision, value)) in states {
            let state = serde_json::from_slice::<QueueState>(&value).ok();
            queues.insert(queue.clone(), info(&queue, state.as_ref(), revision, Vec::new()));
        }
        for (queue, queue_lanes) in lanes {
            let entry = queues.entry(queue.clone()).or_insert_with(|| info(&queue, None, 0, Vec::new()));
            with_lanes(entry, queue_lanes);
        }
        Ok(QueueListReply { queues: queues.into_values().collect() })
    }

    /// Pauses (`paused`) or resumes a queue with compare-and-set; the event when it changed.
    async fn set(&self, request: QueueRequest, paused: bool) -> Result<QueueReply, Failure> {
        let queue = request.queue.as_str();
        let by = request.by.clone().unwrap_or_else(|| "api".to_string());
        for _ in 0..CAS_ATTEMPTS {
            let entry =
                self.queues.entry(queue).await.map_err(|e| Failure::unavailable("read queues bucket", e))?;
            let current = entry.as_ref().filter(|e| e.operation == kv::Operation::Put);
            let state = current.and_then(|e| serde_json::from_slice::<QueueState>(&e.value).ok());
            if state.as_ref().is_some_and(|s| s.paused) == paused {
                let revision = current.map_or(0, |e| e.revision);
                let queue = self.with_lanes(info(queue, state.as_ref(), revision, Vec::new())).await;
                return Ok(QueueReply { queue, changed: false });
            }
            let fresh = QueueState { paused, reason: request.reason.clone(), by: by.clone(), at: Utc::now() };
            let body = serde_json::to_vec(&fresh).expect("a queue state serializes");
            let written = match current {
                Some(entry) => self.queues.update(queue, body.into(), entry.revision).await.map_err(|e| {
                    if is_revision_mismatch(&e) {
                        None
                    } else {
                        Some(Failure::unavailable("write queues bucket", e))
                    }
                }),
                None => self.queues.create(queue, body.into()).await.map_err(|e| {
                    if is_already_exists(&e) {
                        None
                    } else {
                        Some(Failure::unavailable("write queues bucket", e))
                    }
                }),
            };
            let revision = match written {
                Ok(revision) => revision,
                Err(None) => continue,
                Err(Some(failure)) => return Err(failure),
            };
            let kind = if paused { EventKind::QueuePaused } else { EventKind::QueueResumed };
            let event = Event {
                reason: fresh.reason.clone(),
                instance: Some(by.clone()),
                state: Some(if paused { "paused" } else { "running" }.to_string()),
                ..Event::new(kind, SYSTEM_NAMESPACE, queue)
            };
            self.events.emit(event).await;
            tracing::info!(%queue, paused, %by, reason = fresh.reason.as_deref().unwrap_or(""), "queue state set");
            let queue = self.with_lanes(info(queue, Some(&fresh), revision, Vec::new())).await;
            return Ok(QueueReply { queue, changed: true });
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("queue {queue} is being changed concurrently; retry"),
        )
        .into())
    }

    /// `info` with its lanes' counts (none when they cannot be read: the state is the answer).
    async fn with_lanes(&self, mut info: QueueInfo) -> QueueInfo {
        match self.lanes().await {
            Ok(mut lanes) => {
                let lanes = lanes.remove(&info.queue).unwrap_or_default();
                with_lanes(&mut info, lanes);
            }
            Err(failure) => tracing::debug!(error = %failure.wire(), "queue lanes not read"),
        }
        info
    }

    /// Every worker consumer of the dispatch stream, by queue: its lanes, most urgent first.
    async fn lanes(&self) -> Result<BTreeMap<String, Vec<LaneInfo>>, Failure> {
        let stream_name = self.names.dispatch_stream();
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| Failure::unavailable("read dispatch stream", e))?;
        let consumers: Vec<_> = stream
            .consumers()
            .try_collect()
            .await
            .map_err(|e| Failure::unavailable("list dispatch consumers", e))?;
        let mut out: BTreeMap<String, Vec<(Priority, LaneInfo)>> = BTreeMap::new();
        for consumer in consumers {
            let Some((queue, priority)) = self.names.lane_of_worker_consumer(&consumer.name) else {
                continue;
            };
            // The oldest waiting run: the lane's first message after the last one delivered.
            let oldest_waiting = if consumer.num_pending == 0 {
                None
            } else {
                let filter = self.names.lane_filter(queue, priority);
                let after = consumer.delivered.stream_sequence + 1;
                match stream.get_first_raw_message_by_subject(&filter, after).await {
                    Ok(message) => {
                        Some(DateTime::from_timestamp_nanos(message.time.unix_timestamp_nanos() as i64))
                    }
                    Err(error) => {
                        tracing::debug!(%error, %filter, "oldest waiting run not read");
                        None
                    }
                }
            };
            let lane = LaneInfo {
                priority: priority.as_str().to_string(),
                waiting: consumer.num_pending,
                in_flight: consumer.num_ack_pending as u64,
                oldest_waiting,
            };
            out.entry(queue.to_string()).or_default().push((priority, lane));
        }
        Ok(out
            .into_iter()
            .map(|(queue, mut lanes)| {
                lanes.sort_by_key(|(priority, _)| priority.index());
                (queue, lanes.into_iter().map(|(_, lane)| lane).collect())
            })
            .collect())
    }
}

/// `list` takes no fields.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// A pause or resume request, every problem named.
fn checked(payload: &[u8], pause: bool) -> Result<QueueRequest, Failure> {
    let request: QueueRequest = decode(payload, Empty::Refused, Detail::Fields)?;
    let mut problems = Vec::new();
    problems.extend(validate_queue(&request.queue).err());
    if let Some(reason) = &request.reason {
        let length = reason.chars().count();
        if !pause {
            problems.push(ApiError::at(ErrorCode::InvalidValue, "reason", "a resume takes no reason"));
        } else if length == 0 || length > MAX_PAUSED_REASON {
            let message = format!("must be 1 to {MAX_PAUSED_REASON} characters");
            problems.push(ApiError::at(ErrorCode::InvalidValue, "reason", message));
        }
    }
    if let Some(by) = &request.by
        && (by.is_empty() || by.chars().count() > MAX_BY)
    {
        problems.push(ApiError::at(
            ErrorCode::InvalidValue,
            "by",
            format!("must be 1 to {MAX_BY} characters"),
        ));
    }
    match ApiErrors::from_vec(problems) {
        Some(errors) => Err(errors.into()),
        None => Ok(request),
    }
}

/// A queue as the API shows it, from its state (`None`: never paused).
fn info(queue: &str, state: Option<&QueueState>, revision: u64, lanes: Vec<LaneInfo>) -> QueueInfo {
    let mut info = QueueInfo {
        queue: queue.to_string(),
        paused: state.is_some_and(|s| s.paused),
        reason: state.and_then(|s| s.reason.clone()).filter(|_| state.is_some_and(|s| s.paused)),
        by: state.map(|s| s.by.clone()),
        at: state.map(|s| s.at),
        revision,
        waiting: 0,
        in_flight: 0,
        lanes: Vec::new(),
    };
    with_lanes(&mut info, lanes);
    info
}

fn with_lanes(info: &mut QueueInfo, lanes: Vec<LaneInfo>) {
    info.waiting = lanes.iter().map(|lane| lane.waiting).sum();
    info.in_flight = lanes.iter().map(|lane| lane.in_flight).sum();
    info.lanes = lanes;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str, pause: bool) -> Vec<(ErrorCode, Option<String>)> {
        match checked(body.as_bytes(), pause) {
            Ok(_) => Vec::new(),
            Err(failure) => failure.wire().as_slice().iter().map(|e| (e.code, e.field.clone())).collect(),
        }
    }

    #[test]
    fn a_request_names_every_problem() {
        assert!(code(r#"{"queue": "default", "reason": "deploy", "by": "alice"}"#, true).is_empty());
        assert!(code(r#"{"queue": "default"}"#, false).is_empty());
        let both = code(r#"{"queue": "a b", "reason": "", "by": ""}"#, true);
        let fields: Vec<_> = both.iter().map(|(_, field)| field.as_deref()).collect();
        assert_eq!(fields, [Some("queue"), Some("reason"), Some("by")]);
        assert_eq!(code(r#"{"queue": "q", "reason": "x"}"#, false)[0].1.as_deref(), Some("reason"));
        assert_eq!(code(r#"{"queue": "q", "other": 1}"#, true)[0].0, ErrorCode::UnknownField);
        assert_eq!(code(r#"{}"#, true)[0].0, ErrorCode::MissingField);
    }

    #[test]
    fn a_resumed_queue_shows_no_reason() {
        let at = Utc::now();
        let paused = QueueState { paused: true, reason: Some("deploy".into()), by: "alice".into(), at };
        let shown = info("q", Some(&paused), 3, vec![]);
        assert_eq!((shown.paused, shown.reason.as_deref(), shown.revision), (true, Some("deploy"), 3));
        let resumed = QueueState { paused: false, ..paused };
        assert_eq!(info("q", Some(&resumed), 4, vec![]).reason, None);
        let lanes = vec![
            LaneInfo { priority: "high".into(), waiting: 2, in_flight: 1, oldest_waiting: None },
            LaneInfo { priority: "normal".into(), waiting: 5, in_flight: 0, oldest_waiting: None },
        ];
        let counted = info("q", None, 0, lanes);
        assert_eq!((counted.paused, counted.waiting, counted.in_flight), (false, 7, 1));
    }
}
