//! Dispatch messages (subject, `Nats-Msg-Id`, headers, body) and the event sink.
//!
//! The body is `wire::Dispatch`; the spec snapshot is spliced in as the stored JSON rather than
//! re-serialised for every fire (a test checks the result decodes as `wire::Dispatch`).

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage as Publish;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use jetsched_shared::names::{Names, dispatch_msg_id};
use jetsched_shared::wire::{
    self, Event, HDR_EXECUTION_ID, HDR_LEADER_TERM, HDR_NOMINAL_TIME, HDR_TASK, HDR_TRIGGER, Trigger,
    format_time, scheduled_execution_id,
};
use prometheus::IntCounter;
use serde::Serialize;

use crate::pipeline::Fire;
use crate::tasks::{TaskInfo, from_ms};

#[derive(Serialize)]
struct Head<'a> {
    execution_id: &'a str,
    namespace: &'a str,
    task_id: &'a str,
    #[serde(serialize_with = "wire::millis::serialize")]
    nominal_time: DateTime<Utc>,
    trigger: Trigger,
    term: u64,
    revision: u64,
}

/// A ready-to-publish dispatch.
pub(crate) struct Message {
    pub(crate) subject: String,
    pub(crate) publish: Publish,
}

/// Builds the dispatch of `fire` for `task` under leader `term`.
pub(crate) fn message(names: &Names, task: &TaskInfo, fire: &Fire, term: u64) -> anyhow::Result<Message> {
    let (namespace, task_id) = (task.namespace(), task.task_id());
    let nominal = from_ms(fire.nominal_ms);
    let execution_id = scheduled_execution_id(namespace, task_id, fire.nominal_ms);
    let head = Head {
        execution_id: &execution_id,
        namespace,
        task_id,
        nominal_time: nominal,
        trigger: fire.trigger,
        term,
        revision: task.revision,
    };
    let mut body = serde_json::to_vec(&head)?;
    body.pop(); // the closing brace
    body.reserve(task.spec_json.len() + 10);
    body.extend_from_slice(b",\"spec\":");
    body.extend_from_slice(&task.spec_json);
    body.push(b'}');
    let mut headers = HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        dispatch_msg_id(namespace, task_id, fire.nominal_ms).as_str(),
    );
    headers.insert(HDR_TASK, &*task.key);
    headers.insert(HDR_NOMINAL_TIME, format_time(nominal).as_str());
    headers.insert(HDR_EXECUTION_ID, execution_id.as_str());
    headers.insert(HDR_LEADER_TERM, term.to_string().as_str());
    headers.insert(HDR_TRIGGER, fire.trigger.as_str());
    Ok(Message {
        subject: names.dispatch_subject(&task.queue, namespace, task_id),
        publish: Publish::build().headers(headers).payload(Bytes::from(body)),
    })
}

/// Queues events for the shared event pump without ever blocking the dispatch loop: when the
/// queue is full the event is dropped and counted.
#[derive(Clone)]
pub(crate) struct EventSink {
    sink: jetsched_shared::events::EventSink,
    dropped: IntCounter,
}

impl EventSink {
    pub(crate) fn new(sink: jetsched_shared::events::EventSink, dropped: IntCounter) -> EventSink {
        EventSink { sink, dropped }
    }

    pub(crate) fn emit(&self, event: Event) {
        if !self.sink.try_emit(event) {
            self.dropped.inc();
        }
    }

    /// Resolves once every event emitted so far is stored (or failed for good).
    pub(crate) fn barrier(&self) -> jetsched_shared::events::Barrier {
        self.sink.barrier()
    }
}

#[cfg(test)]
mod tests {
    use jetsched_shared::spec::TaskSpec;

    use super::*;

    #[test]
    fn a_dispatch_body_decodes_as_the_wire_type_with_its_headers() {
        let json = br#"{"id":"report","namespace":"billing","queue":"q1","schedule":{"every":"1m"},"executor":{"kind":"nats","subject":"work.x"}}"#;
        let spec = TaskSpec::parse(json).expect("valid spec");
        let task = TaskInfo::new(spec.clone(), json, 7, 0);
        let fire = Fire { idx: 0, generation: 1, nominal_ms: 1_700_000_040_000, trigger: Trigger::Catchup };
        let message = message(&Names::default(), &task, &fire, 42).expect("builds");
        assert_eq!(message.subject, Names::default().dispatch_subject("q1", "billing", "report"));
        let publish = message.publish;
        let outbound = publish.outbound_message(message.subject.clone());
        let headers = outbound.headers.expect("headers");
        assert_eq!(
            headers.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.to_string()),
            Some(dispatch_msg_id("billing", "report", 1_700_000_040_000))
        );
        assert_eq!(headers.get(HDR_LEADER_TERM).map(|v| v.to_string()), Some("42".to_string()));
        assert_eq!(headers.get(HDR_TRIGGER).map(|v| v.to_string()), Some("catchup".to_string()));
        assert_eq!(headers.get(HDR_TASK).map(|v| v.to_string()), Some("billing.report".to_string()));
        let body: wire::Dispatch = serde_json::from_slice(&outbound.payload).expect("decodes");
        assert_eq!(body.execution_id, scheduled_execution_id("billing", "report", 1_700_000_040_000));
        assert_eq!(body.nominal_time.timestamp_millis(), 1_700_000_040_000);
        assert_eq!((body.term, body.revision, body.trigger), (42, 7, Trigger::Catchup));
        assert_eq!(body.spec, spec);
    }
}
