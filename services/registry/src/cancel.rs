//! Cancelling runs, `<prefix>.api.runs.cancel.<namespace>` (one run by its execution id) and
//! `<prefix>.api.runs.cancel-task.<namespace>` (a task's runs not started: held, queued or
//! both). Namespaced only, like `runs.get`: a run record's key carries no namespace, so the
//! registry checks it, and a run of another namespace is answered `not_found` like an unknown one.
//!
//! A cancel first writes a marker in the cancels bucket (every worker follows it: a marked run
//! is never started, an attempt under way is stopped), then settles the run record with
//! compare-and-set: a held or retrying run, or one without a record yet (queued), becomes
//! `cancelled` now (`run.cancelled` is told) and never starts; a running run is answered
//! `cancelling` (its worker stops it and records `cancelled`); an ended run is answered
//! `finished` with its status, and nothing is written for it. A run without a record is
//! looked for in the dispatch stream (queued on a lane, or held by its breaker): an execution
//! found nowhere is refused `not_found` (field `execution_id`) and nothing is written.

use async_nats::jetstream::{self, kv};
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch, live};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::Names;
use jetsched_shared::spec::validate_id;
use jetsched_shared::wire::{
    CancelMarker, CancelOutcome, CancelReply, CancelRequest, CancelTaskReply, CancelTaskRequest, Dispatch,
    DispatchDecoder, Event, HDR_EXECUTION_ID, RunRecord, RunStatus,
};

use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;
use crate::scope::{check_namespace, same_namespace};

/// Compare-and-set rounds before a cancel gives up.
const CAS_ROUNDS: usize = 8;
/// Messages read at most when looking for runs in the dispatch stream, per subject filter.
const MAX_SCAN: usize = 10_000;
/// Longest `reason` and `by`.
const MAX_REASON: usize = 200;
const MAX_BY: usize = 100;

/// The cancel endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelEndpoint {
    /// `runs.cancel`: one run.
    Run,
    /// `runs.cancel-task`: a task's runs not started.
    Task,
}

/// What the cancel endpoints read and write.
pub(crate) struct CancelApi {
    js: jetstream::Context,
    names: Names,
    runs: kv::Store,
    cancels: kv::Store,
    events: EventSink,
}

/// A run found in the dispatch stream, and where it waits.
struct Found {
    dispatch: Dispatch,
    was: &'static str,
    /// Delivered to a worker already (its lane's consumer has passed it): running, though
    /// its record may not be written yet (deferred run records).
    delivered: bool,
}

impl CancelApi {
    pub(crate) fn new(
        js: jetstream::Context,
        names: Names,
        runs: kv::Store,
        cancels: kv::Store,
        events: EventSink,
    ) -> CancelApi {
        CancelApi { js, names, runs, cancels, events }
    }

    pub(crate) async fn handle(
        &self,
        endpoint: CancelEndpoint,
        namespace: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        check_namespace(namespace)?;
        match endpoint {
            CancelEndpoint::Run => {
                let request: CancelRequest = decode(payload, Empty::Refused, Detail::Fields)?;
                let mut problems = texts(request.reason.as_deref(), request.by.as_deref());
                if let Err(error) = same_namespace(request.namespace.as_deref(), namespace) {
                    problems.insert(0, error);
                }
                if let Err(error) = validate_id("execution_id", &request.execution_id) {
                    problems.insert(0, error);
                }
                refuse(problems)?;
                let reason = reason_of(request.reason.as_deref(), request.by.as_deref());
                encode(&self.cancel_run(namespace, &request.execution_id, &reason).await?)
            }
            CancelEndpoint::Task => {
                let request: CancelTaskRequest = decode(payload, Empty::Refused, Detail::Fields)?;
                let mut problems = texts(request.reason.as_deref(), request.by.as_deref());
                if let Err(error) = same_namespace(request.namespace.as_deref(), namespace) {
                    problems.insert(0, error);
                }
                if let Err(error) = validate_id("id", &request.id) {
                    problems.insert(0, error);
                }
                refuse(problems)?;
                let reason = reason_of(request.reason.as_deref(), request.by.as_deref());
                let both = !request.held && !request.queued;
                let (held, queued) = (request.held || both, request.queued || both);
                let runs = self.cancel_task(namespace, &request.id, held, queued, &reason).await?;
                encode(&CancelTaskReply { namespace: namespace.to_string(), id: request.id, runs })
            }
        }
    }

    /// Cancels one run of `namespace`.
    async fn cancel_run(
        &self,
        namespace: &str,
        execution_id: &str,
        reason: &str,
    ) -> Result<CancelReply, Failure> {
        let unknown = || {
            ApiError::at(
                ErrorCode::NotFound,
                "execution_id",
                format!("no run {execution_id} in namespace {namespace} (unknown, or its record expired)"),
            )
        };
        let found = match self.record(execution_id).await? {
            Some((record, _)) if record.namespace != namespace => return Err(unknown().into()),
            Some(_) => None,
            None => match self.find(namespace, execution_id).await? {
                Some(found) => Some(found),
                // Started and recorded while the stream was read?
                None if self.record(execution_id).await?.is_some() => None,
                None => return Err(unknown().into()),
            },
        };
        let settled = self.settle(namespace, execution_id, found.as_ref(), reason, false).await?;
        settled.ok_or_else(|| unknown().into())
    }

    /// Cancels the runs of task `id` not started: held ones, queued ones.
    async fn cancel_task(
        &self,
        namespace: &str,
        id: &str,
        held: bool,
        queued: bool,
        reason: &str,
    ) -> Result<Vec<CancelReply>, Failure> {
        let mut filters = Vec::new();
        if held {
            filters.push((self.names.delayed_task_filter(namespace, id), "held"));
        }
        if queued {
            filters.extend(self.names.queued_filters(namespace, id).map(|filter| (filter, "queued")));
        }
        let mut replies: Vec<CancelReply> = Vec::new();
        for (filter, was) in filters {
            for (sequence, dispatch) in self.scan(&filter, |_| true).await? {
                if replies.iter().any(|reply| reply.execution_id == dispatch.execution_id) {
                    continue;
                }
                let execution_id = dispatch.execution_id.clone();
                let delivered = was == "queued" && self.delivered(&dispatch, sequence).await?;
                let found = Found { dispatch, was, delivered };
                // A run ended already (cancelled earlier, its message not delivered yet) is not
                // one of the task's runs waiting.
                let settled = self.settle(namespace, &execution_id, Some(&found), reason, true).await?;
                if let Some(reply) = settled.filter(|reply| reply.outcome != CancelOutcome::Finished) {
                    replies.push(reply);
                }
            }
        }
        Ok(replies)
    }

    /// Writes the marker and settles the record of `execution_id` (found in the stream as
    /// `found`, when it has no record). `unstarted_only`: a running run is left alone (`None`).
    /// `None` too for a run with neither record nor dispatch, or of another namespace.
    async fn settle(
        &self,
        namespace: &str,
        execution_id: &str,
        found: Option<&Found>,
        reason: &str,
        unstarted_only: bool,
    ) -> Result<Option<CancelReply>, Failure> {
        let mut marked = false;
        for _ in 0..CAS_ROUNDS {
            let stored = self.record(execution_id).await?;
            let (namespace_of, task_id) = match (&stored, found) {
                (Some((record, _)), _) => (record.namespace.clone(), record.task_id.clone()),
                (None, Some(found)) => (found.dispatch.namespace.clone(), found.dispatch.task_id.clone()),
                (None, None) => return Ok(None),
            };
            if namespace_of != namespace {
                return Ok(None);
            }
            let reply = |outcome, status, was: Option<&str>| CancelReply {
                execution_id: execution_id.to_string(),
                namespace: namespace.to_string(),
                task_id: task_id.clone(),
                outcome,
                status,
                was: was.map(str::to_string),
            };
            let status = stored.as_ref().map(|(record, _)| record.status);
            let delivered = stored.is_none() && found.is_some_and(|found| found.delivered);
            match status {
                Some(status) if status.is_final() => {
                    return Ok(Some(reply(CancelOutcome::Finished, status, None)));
                }
                Some(RunStatus::Running) if unstarted_only => return Ok(None),
                None if delivered && unstarted_only => return Ok(None),
                _ => {}
            }
            if !marked {
                self.mark(execution_id, namespace, &task_id, reason).await?;
                marked = true;
            }
            let now = Utc::now();
            let was = found.map(|found| found.was);
            let written = match stored {
                Some((record, _)) if record.status == RunStatus::Running => {
                    return Ok(Some(reply(CancelOutcome::Cancelling, RunStatus::Running, None)));
                }
                None if delivered => {
                    return Ok(Some(reply(CancelOutcome::Cancelling, RunStatus::Running, None)));
                }
                Some((mut record, revision)) => {
                    let was = was.unwrap_or(if record.status == RunStatus::Held { "held" } else { "queued" });
                    record.status = RunStatus::Cancelled;
                    record.reason = Some(reason.to_string());
                    record.release_at = None;
                    record.finished = Some(now);
                    match self.runs.update(execution_id, to_bytes(&record)?, revision).await {
                        Ok(_) => Some((record, was)),
                        Err(error) if is_revision_mismatch(&error) => None,
                        Err(error) => return Err(Failure::unavailable("update run record", error)),
                    }
                }
                None => {
                    let Some(found) = found else { return Ok(None) };
                    let mut record = RunRecord::new(&found.dispatch, 1, "", now);
                    record.attempts.clear();
                    record.attempt = 0;
                    record.status = RunStatus::Cancelled;
                    record.reason = Some(reason.to_string());
                    record.finished = Some(now);
                    match self.runs.create(execution_id, to_bytes(&record)?).await {
                        Ok(_) => Some((record, found.was)),
                        Err(error) if is_already_exists(&error) => None,
                        Err(error) => return Err(Failure::unavailable("create run record", error)),
                    }
                }
            };
            if let Some((record, was)) = written {
                self.tell(&record, reason).await;
                return Ok(Some(reply(CancelOutcome::Cancelled, RunStatus::Cancelled, Some(was))));
            }
        }
        Err(ApiError::new(ErrorCode::Conflict, format!("run {execution_id} kept changing; try again")).into())
    }

    /// The run record of `execution_id` and its revision.
    async fn record(&self, execution_id: &str) -> Result<Option<(RunRecord, u64)>, Failure> {
        let entry =
            self.runs.entry(execution_id).await.map_err(|e| Failure::unavailable("read runs bucket", e))?;
        let Some(entry) = live(entry) else { return Ok(None) };
        let record: RunRecord = serde_json::from_slice(&entry.value)
            .map_err(|e| Failure::internal("stored run record does not decode", e))?;
        Ok(Some((record, entry.revision)))
    }

    /// The marker every worker follows.
    async fn mark(
        &self,
        execution_id: &str,
        namespace: &str,
        task_id: &str,
        reason: &str,
    ) -> Result<(), Failure> {
        let marker = CancelMarker {
            namespace: namespace.to_string(),
            task_id: task_id.to_string(),
            reason: reason.to_string(),
            time: Utc::now(),
        };
        let body = serde_json::to_vec(&marker).map_err(|e| Failure::internal("encode cancel marker", e))?;
        self.cancels
            .put(execution_id, body.into())
            .await
            .map_err(|e| Failure::unavailable("write cancel marker", e))?;
        Ok(())
    }

    /// `run.cancelled` about a run the registry cancelled before it started.
    async fn tell(&self, record: &RunRecord, reason: &str) {
        self.events.emit(Event::run_cancelled(record, reason)).await;
    }

    /// The run `execution_id` of `namespace` waiting in the dispatch stream: held by its
    /// breaker, or queued.
    async fn find(&self, namespace: &str, execution_id: &str) -> Result<Option<Found>, Failure> {
        let held = self.names.delayed_run_filter(namespace, execution_id);
        if let Some((_, dispatch)) = self.scan(&held, |_| true).await?.into_iter().next() {
            return Ok(Some(Found { dispatch, was: "held", delivered: false }));
        }
        let ours = |message: &jetstream::message::StreamMessage| {
            message.headers.get(HDR_EXECUTION_ID).is_some_and(|value| value.as_str() == execution_id)
        };
        for filter in self.names.queued_filters(namespace, "*") {
            if let Some((sequence, dispatch)) = self.scan(&filter, ours).await?.into_iter().next() {
                let delivered = self.delivered(&dispatch, sequence).await?;
                return Ok(Some(Found { dispatch, was: "queued", delivered }));
            }
        }
        Ok(None)
    }

    /// Whether the dispatch stored at `sequence` was delivered to a worker already: its
    /// lane's consumer has delivered that far (on a work-queue stream, a message still stored
    /// there is in flight, or handed back for a retry).
    async fn delivered(&self, dispatch: &Dispatch, sequence: u64) -> Result<bool, Failure> {
        let consumer = self.names.lane_consumer(&dispatch.spec.queue, dispatch.priority);
        let stream_name = self.names.dispatch_stream();
        let stream = self
            .js
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|e| Failure::unavailable(format!("look up stream {stream_name}"), e))?;
        match stream.consumer_info(&consumer).await {
            Ok(info) => Ok(info.delivered.stream_sequence >= sequence),
            // No worker ever served the lane: nothing was delivered.
            Err(error) if error.to_string().contains("not found") => Ok(false),
            Err(error) => Err(Failure::unavailable(format!("read consumer {consumer}"), error)),
        }
    }

    /// The dispatches stored on `filter` that `wanted` picks (read by their headers), with
    /// their stream sequences, in stream order, reading at most [`MAX_SCAN`] messages.
    async fn scan(
        &self,
        filter: &str,
        wanted: impl Fn(&jetstream::message::StreamMessage) -> bool,
    ) -> Result<Vec<(u64, Dispatch)>, Failure> {
        let stream_name = self.names.dispatch_stream();
        let stream = self
            .js
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|e| Failure::unavailable(format!("look up stream {stream_name}"), e))?;
        let decoder = DispatchDecoder::default();
        let mut dispatches = Vec::new();
        let mut sequence = 1;
        for _ in 0..MAX_SCAN {
            let message =
                match stream.raw_message_builder().sequence(sequence).next_by_subject(filter).send().await {
                    Ok(message) => message,
                    Err(error) if error.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                        break;
                    }
                    Err(error) => return Err(Failure::unavailable(format!("read {filter}"), error)),
                };
            sequence = message.sequence + 1;
            if !wanted(&message) {
                continue;
            }
            match decoder.decode(&message.payload) {
                Ok(dispatch) => dispatches.push((message.sequence, dispatch)),
                Err(error) => {
                    tracing::warn!(%error, subject = %message.subject, "undecodable dispatch left alone")
                }
            }
        }
        Ok(dispatches)
    }
}

/// Problems of the free texts of a request.
fn texts(reason: Option<&str>, by: Option<&str>) -> Vec<ApiError> {
    let mut problems = Vec::new();
    for (field, text, max) in [("reason", reason, MAX_REASON), ("by", by, MAX_BY)] {
        if let Some(text) = text
            && (text.chars().count() > max || text.chars().any(char::is_control))
        {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                field,
                format!("{field} must be at most {max} characters, without control characters"),
            ));
        }
    }
    problems
}

/// Refuses a request with every problem found.
fn refuse(problems: Vec<ApiError>) -> Result<(), Failure> {
    match ApiErrors::from_vec(problems) {
        Some(errors) => Err(errors.into()),
        None => Ok(()),
    }
}

/// The reason recorded: who asked (default `api`) and why.
fn reason_of(reason: Option<&str>, by: Option<&str>) -> String {
    let by = by.filter(|by| !by.trim().is_empty()).unwrap_or("api");
    match reason.filter(|reason| !reason.trim().is_empty()) {
        Some(reason) => format!("cancelled by {by}: {reason}"),
        None => format!("cancelled by {by}"),
    }
}

fn to_bytes(record: &RunRecord) -> Result<bytes::Bytes, Failure> {
    Ok(serde_json::to_vec(record).map_err(|e| Failure::internal("encode run record", e))?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_says_who_asked_and_why() {
        assert_eq!(reason_of(None, None), "cancelled by api");
        assert_eq!(reason_of(Some("wrong day"), Some("ops")), "cancelled by ops: wrong day");
        assert_eq!(reason_of(Some(" "), Some("")), "cancelled by api");
    }

    #[test]
    fn long_or_control_texts_are_refused_each_by_its_field() {
        let long = "x".repeat(MAX_REASON + 1);
        let problems = texts(Some(&long), Some("a\nb"));
        let fields: Vec<_> = problems.iter().map(|p| p.field.clone().unwrap_or_default()).collect();
        assert_eq!(fields, ["reason", "by"]);
        assert!(texts(Some("fine"), Some("ops")).is_empty());
    }
}
