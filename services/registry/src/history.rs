//! A namespace's event history read through the registry,
//! `<prefix>.api.events.history.<namespace>`: a team in an account of its own has no access to
//! the events stream (it lives in the services' account); it reads its history here and
//! follows new events on its live subjects (`<prefix>.event.*.*.<namespace>.>`, exported to it).
//!
//! Request `{"namespace"?, "task_id"?, "last"?}` → `{"events": [<event>, ...]}`, the last `last`
//! stored events of the namespace (or of one of its tasks), oldest first; `last` defaults to 50
//! and is at most 1000. The subject's namespace is the filter: a body naming another namespace
//! is refused with `namespace_mismatch`.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::spec::validate_id;
use serde::Deserialize;
use serde_json::Value;

use crate::codec::{Detail, Empty, decode, encode, within};
use crate::failure::{Cause, Failure};
use crate::scope::{check_namespace, same_namespace};

/// Most events one request returns.
const MAX_LAST: u64 = 1000;
const DEFAULT_LAST: u64 = 50;
/// The first window read back from the end of the stream, in messages per event asked for;
/// each further round reads a window eight times larger, until enough events are found or the
/// whole stream was read.
const FIRST_WINDOW_PER_EVENT: u64 = 20;
const WINDOW_GROWTH: u64 = 8;
/// How long a delivery the consumer announced may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryRequest {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    last: Option<u64>,
}

/// Reads event history for the namespaced endpoint.
#[derive(Clone)]
pub(crate) struct EventHistory {
    js: jetstream::Context,
    names: Names,
}

impl EventHistory {
    pub(crate) fn new(js: jetstream::Context, names: Names) -> EventHistory {
        EventHistory { js, names }
    }

    /// Answers `events.history` for `namespace`.
    pub(crate) async fn handle(&self, namespace: &str, payload: &[u8]) -> Result<Vec<u8>, Failure> {
        check_namespace(namespace)?;
        let request: HistoryRequest = decode(payload, Empty::Object, Detail::Syntax)?;
        same_namespace(request.namespace.as_deref(), namespace)?;
        let last = request.last.unwrap_or(DEFAULT_LAST);
        within("last", last, MAX_LAST)?;
        let filter = match request.task_id.as_deref() {
            Some(task) => {
                validate_id("task_id", task)?;
                self.names.event_subject("*.*", namespace, task)
            }
            None => self.names.namespace_events_filter(namespace),
        };
        let events = self.recent(filter, last).await?;
        encode(&serde_json::json!({ "events": events }))
    }

    /// The last `last` events matching `filter`, oldest first: windows read back from the end
    /// of the stream, each larger than the one before, so a busy stream is not read whole for
    /// a few events and a quiet namespace's old events are still found.
    async fn recent(&self, filter: String, last: u64) -> Result<Vec<Value>, Failure> {
        let mut stream = self.js.get_stream(self.names.events_stream()).await.map_err(unavailable)?;
        let state = stream.info().await.map_err(unavailable)?.state.clone();
        if state.messages == 0 {
            return Ok(Vec::new());
        }
        let first = state.first_sequence.max(1);
        let mut window = last.saturating_mul(FIRST_WINDOW_PER_EVENT).max(1000);
        loop {
            let start = state.last_sequence.saturating_sub(window).max(first);
            let found = self.read_from(&stream, &filter, start, state.last_sequence, last).await?;
            if found.len() as u64 >= last || start <= first {
                return Ok(found.into());
            }
            window = window.saturating_mul(WINDOW_GROWTH);
        }
    }

    /// The last `last` events matching `filter` stored from `start` up to `end` (later ones
    /// are left out, so every window reads the same end).
    async fn read_from(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &str,
        start: u64,
        end: u64,
        last: u64,
    ) -> Result<VecDeque<Value>, Failure> {
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.to_string(),
                deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: start },
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        let mut pending = consumer.cached_info().num_pending;
        let mut out = VecDeque::new();
        if pending == 0 {
            return Ok(out);
        }
        let mut messages = consumer.messages().await.map_err(unavailable)?;
        while pending > 0 {
            let Ok(Some(message)) = tokio::time::timeout(READ_TIMEOUT, messages.next()).await else {
                return Err(unavailable("the events stream stopped delivering"));
            };
            let message = message.map_err(unavailable)?;
            let info = message
                .info()
                .map_err(|e| Failure::unavailable("read the events stream: event metadata", e))?;
            if info.stream_sequence > end {
                break;
            }
            pending = info.pending;
            if let Ok(event) = serde_json::from_slice::<Value>(&message.payload) {
                out.push_back(event);
                if out.len() as u64 > last {
                    out.pop_front();
                }
            }
        }
        Ok(out)
    }
}

/// The events stream could not be read (`unavailable`).
fn unavailable(error: impl Into<Cause>) -> Failure {
    Failure::unavailable("read the events stream", error)
}
