//! Debounced triggers: a task with `debounce` runs once per window of triggers. The window is
//! one message in the dispatch stream on the task's debounce subject, held by the server until
//! its time (`Nats-Schedule: @at`) and then published to the run's dispatch subject: the run's
//! dispatch with the latest trigger's payload, the window's execution id and its first
//! trigger's time in a header.
//!
//! A trigger reads the pending message and publishes its replacement on the same subject
//! expecting that message as the subject's last (`Nats-Expected-Last-Subject-Sequence`), so
//! two registries racing keep one window and its earliest first trigger; the server's
//! schedule rolls up the subject, so only the newest message fires. The run starts at
//! `min(last trigger + period, first trigger + max_wait)`. Nothing lives in a registry's
//! memory: a registry that dies loses no window.

use async_nats::HeaderMap;
use async_nats::header::{NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_MESSAGE_ID};
use async_nats::jetstream::message::PublishMessage;
use chrono::{DateTime, TimeDelta, Utc};
use jetsched_shared::cas;
use jetsched_shared::dispatch::{self, DispatchMessage, Origin, SpecBody, Target};
use jetsched_shared::spec::{DebounceSpec, Priority, TaskSpec};
use jetsched_shared::wire::{
    self, HDR_DEBOUNCE_FIRST, HDR_DEBOUNCE_TRIGGERS, HDR_EXECUTION_ID, HDR_SCHEDULE, HDR_SCHEDULE_TARGET,
};

use super::{CAS_ATTEMPTS, Latest, TaskStore, concurrently};
use crate::failure::Failure;

/// The window a trigger joined.
pub(super) struct Joined {
    pub execution_id: String,
    pub starts_at: DateTime<Utc>,
    /// Triggers the window collapsed, this one included.
    pub triggers: u64,
}

/// The pending window read from its message.
struct Window {
    sequence: u64,
    execution_id: String,
    first: DateTime<Utc>,
    triggers: u64,
}

impl TaskStore {
    /// Adds a trigger to the task's pending run (opening one with `execution_id` when none is
    /// pending), carrying `payload` as the run's.
    #[allow(clippy::too_many_arguments, reason = "one trigger's parts")]
    pub(super) async fn debounce(
        &self,
        spec: &TaskSpec,
        entry: &Latest,
        debounce: DebounceSpec,
        execution_id: &str,
        payload: Option<&serde_json::Value>,
        priority: Option<Priority>,
        now: DateTime<Utc>,
    ) -> Result<Joined, Failure> {
        let subject = self.names.debounce_subject(&spec.namespace, &spec.id);
        for _ in 0..CAS_ATTEMPTS {
            let pending = self.pending_window(&subject).await?;
            let (expected, first, execution_id, triggers) = match &pending {
                Some(window) => {
                    (window.sequence, window.first, window.execution_id.as_str(), window.triggers + 1)
                }
                None => (0, now, execution_id, 1),
            };
            let period = TimeDelta::from_std(debounce.period).unwrap_or(TimeDelta::MAX);
            let max_wait = TimeDelta::from_std(debounce.max_wait).unwrap_or(TimeDelta::MAX);
            let latest = now.checked_add_signed(period).unwrap_or(DateTime::<Utc>::MAX_UTC);
            let bound = first.checked_add_signed(max_wait).unwrap_or(DateTime::<Utc>::MAX_UTC);
            let starts_at = latest.min(bound).max(now);
            let DispatchMessage { subject: target, message, .. } = dispatch::build_traced(
                &self.names,
                Target::of(spec, entry.revision).with_priority(priority),
                Origin::Requested { at: starts_at, execution_id, payload },
                SpecBody::Json(&entry.value),
                crate::spans::dispatch_parent().as_ref(),
            )
            .map_err(|e| Failure::internal("encode dispatch", e))?;
            let message = pending_message(message, &target, expected, first, triggers, starts_at);
            let published = self.js.send_publish(subject.clone(), message).await;
            let acked = match published {
                Ok(ack) => ack.await,
                Err(error) => Err(error),
            };
            match acked {
                Ok(_) => {
                    return Ok(Joined { execution_id: execution_id.to_string(), starts_at, triggers });
                }
                Err(error) if cas::is_wrong_last_sequence(&error) => continue,
                Err(error) => return Err(Failure::unavailable("store the debounced run", error)),
            }
        }
        Err(concurrently(&subject))
    }

    /// The task's pending window, if a message waits on its debounce subject.
    async fn pending_window(&self, subject: &str) -> Result<Option<Window>, Failure> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let message = match self.flow.dispatch_stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(error) => return Err(Failure::unavailable("read the pending debounced run", error)),
        };
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_string());
        let first = header(HDR_DEBOUNCE_FIRST).and_then(|t| DateTime::parse_from_rfc3339(&t).ok());
        let execution_id = header(HDR_EXECUTION_ID);
        let triggers = header(HDR_DEBOUNCE_TRIGGERS).and_then(|n| n.parse().ok()).unwrap_or(1);
        match (first, execution_id) {
            (Some(first), Some(execution_id)) => Ok(Some(Window {
                sequence: message.sequence,
                execution_id,
                first: first.with_timezone(&Utc),
                triggers,
            })),
            // Not a window this registry wrote: replaced by a new one.
            _ => Ok(Some(Window {
                sequence: message.sequence,
                execution_id: wire::fresh_execution_id(),
                first: Utc::now(),
                triggers: 0,
            })),
        }
    }
}

/// The dispatch `message` as the pending message of a window: held until `starts_at`, then
/// published to `target`; no message id (the server drops it from what it publishes, and the
/// compare-and-set orders the window's messages).
fn pending_message(
    message: PublishMessage,
    target: &str,
    expected: u64,
    first: DateTime<Utc>,
    triggers: u64,
    starts_at: DateTime<Utc>,
) -> PublishMessage {
    let outbound = message.outbound_message(target.to_string());
    let mut headers = HeaderMap::new();
    for (name, values) in outbound.headers.iter().flat_map(HeaderMap::iter) {
        if <_ as AsRef<str>>::as_ref(name) == AsRef::<str>::as_ref(&NATS_MESSAGE_ID) {
            continue;
        }
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, expected.to_string());
    headers.insert(HDR_SCHEDULE, format!("@at {}", wire::format_time(starts_at)));
    headers.insert(HDR_SCHEDULE_TARGET, target);
    headers.insert(HDR_DEBOUNCE_FIRST, wire::format_time(first));
    headers.insert(HDR_DEBOUNCE_TRIGGERS, triggers.to_string());
    PublishMessage::build().headers(headers).payload(outbound.payload)
}
