//! Dead letters: the entry stored in `JETSCHED_DLQ` (spec snapshot, execution id, nominal time,
//! every attempt and the final reason), its publication, and the mover that dead-letters runs
//! which exhausted `max_deliver` without a verdict (crash loops), driven by the max-deliveries
//! advisories captured in `JETSCHED_ADVISORIES`.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, message::PublishMessage};
use chrono::Utc;
use futures::StreamExt;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::{Names, dead_letter_msg_id, task_key};
use jetsched_shared::priority::Priority;
use jetsched_shared::wire::{
    Dispatch, Event, EventKind, HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_TASK, Trigger, format_time,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::runs::{AttemptOutcome, RunRecord, RunStatus, RunStore};
pub use jetsched_shared::wire::{DeadLetter, DeadLetterSource};

/// Stores dead letters (counted by source) and keeps the DLQ depth gauge.
#[derive(Clone)]
pub(crate) struct DeadLetters {
    js: jetstream::Context,
    names: Names,
    metrics: Metrics,
    /// When a run whose dead letter the stream refused is delivered again (`--dlq-retry-delay`).
    pub(crate) retry_delay: Duration,
}

impl DeadLetters {
    pub(crate) fn new(
        js: jetstream::Context,
        names: Names,
        metrics: Metrics,
        retry_delay: Duration,
    ) -> DeadLetters {
        DeadLetters { js, names, metrics, retry_delay }
    }

    /// Stores `entry`, waits for the stream's ack and counts it by source. An error means it
    /// is not stored (the stream is full and discards new entries, or NATS failed): the caller
    /// must not `Term`.
    pub(crate) async fn publish(&self, entry: &DeadLetter) -> anyhow::Result<()> {
        let subject = self.names.dlq_subject(&entry.queue, &entry.namespace, &entry.task_id);
        let body = serde_json::to_vec(entry).context("encode dead letter")?;
        let message = PublishMessage::build()
            .payload(body.into())
            .message_id(dead_letter_msg_id(&entry.execution_id))
            .header(HDR_EXECUTION_ID, entry.execution_id.as_str())
            .header(HDR_TASK, task_key(&entry.namespace, &entry.task_id).as_str())
            .header(HDR_NOMINAL_TIME, format_time(entry.nominal_time).as_str());
        self.js
            .send_publish(subject.clone(), message)
            .await
            .with_context(|| format!("publish dead letter to {subject}"))?
            .await
            .with_context(|| format!("store dead letter on {subject}"))?;
        self.metrics.dead_letters.with_label_values(&[entry.source.as_str()]).inc();
        Ok(())
    }

    /// [`DeadLetters::publish`] for a delivery: a refusal is counted and logged here, and
    /// returned (then the caller must not `Term`).
    pub(crate) async fn store(&self, entry: &DeadLetter) -> anyhow::Result<()> {
        let stored = self.publish(entry).await;
        if let Err(error) = &stored {
            self.metrics.dlq_rejected.inc();
            tracing::error!(
                error = format!("{error:#}"),
                "the dead-letter stream refused the entry; retrying later"
            );
        }
        stored
    }

    /// Messages in the dead-letter stream.
    async fn depth(&self) -> anyhow::Result<u64> {
        let name = self.names.dlq_stream();
        let mut stream = self.js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
        Ok(stream.info().await.with_context(|| format!("read {name} info"))?.state.messages)
    }

    /// Sets `jetsched_dlq_depth` from the stream (a failed read is logged at debug level).
    pub(crate) async fn measure(&self) {
        match self.depth().await {
            Ok(depth) => self.metrics.dlq_depth.set(i64::try_from(depth).unwrap_or(i64::MAX)),
            Err(error) => tracing::debug!(error = format!("{error:#}"), "read DLQ depth"),
        }
    }
}

/// The advisory the server publishes when a message reaches the consumer's `max_deliver`.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

/// Creates (or converges) the advisory consumer.
pub(crate) async fn advisory_consumer(
    js: &jetstream::Context,
    names: &Names,
) -> anyhow::Result<PullConsumer> {
    let name = names.advisories_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up stream {name}"))?;
    let consumer = names.worker_advisory_consumer();
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(consumer.to_string()),
            description: Some("jetsched workers: moves runs that hit max_deliver to the DLQ".to_string()),
            filter_subject: names.max_deliveries_advisory_subject(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .with_context(|| format!("ensure consumer {consumer} on {name}"))
}

/// What the advisory mover needs.
pub(crate) struct Mover {
    pub(crate) js: jetstream::Context,
    pub(crate) names: Names,
    pub(crate) runs: RunStore,
    pub(crate) dlq: DeadLetters,
    pub(crate) events: EventPublisher,
    pub(crate) metrics: Metrics,
    pub(crate) worker: String,
}

impl Mover {
    /// Moves every run reported by a max-deliveries advisory to the DLQ until `shutdown`.
    pub(crate) async fn run(self, consumer: PullConsumer, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        'outer: loop {
            let mut messages = match consumer.messages().await {
                Ok(messages) => messages,
                Err(error) => {
                    tracing::warn!(%error, "advisory consumer: cannot pull");
                    self.metrics.errors.with_label_values(&["advisory_pull"]).inc();
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                    continue;
                }
            };
            loop {
                let next = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break 'outer,
                    next = messages.next() => next,
                };
                match next {
                    None => continue 'outer,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "advisory consumer");
                        self.metrics.errors.with_label_values(&["advisory_pull"]).inc();
                    }
                    Some(Ok(message)) => {
                        backoff.reset();
                        let ack = match self.handle(&message.payload).await {
                            Ok(()) => AckKind::Ack,
                            Err(error) => {
                                tracing::warn!(
                                    error = format!("{error:#}"),
                                    "moving a crash-looping run to the DLQ; will retry"
                                );
                                self.metrics.errors.with_label_values(&["advisory_move"]).inc();
                                AckKind::Nak(Some(Duration::from_secs(5)))
                            }
                        };
                        if let Err(error) = message.ack_with(ack).await {
                            tracing::warn!(%error, "ack advisory");
                        }
                    }
                }
            }
        }
    }

    async fn handle(&self, payload: &[u8]) -> anyhow::Result<()> {
        let advisory: MaxDeliveries =
            serde_json::from_slice(payload).context("decode max-deliveries advisory")?;
        if advisory.stream != self.names.dispatch_stream() {
            return Ok(());
        }
        let stream = self.js.get_stream(&advisory.stream).await.context("look up the dispatch stream")?;
        let raw = match stream.get_raw_message(advisory.stream_seq).await {
            Ok(raw) => raw,
            Err(error) if error.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                return Ok(());
            }
            Err(error) => return Err(error).context("read the dispatch message"),
        };
        let reason = format!(
            "no verdict after {} deliveries (consumer {} max_deliver): the run keeps crashing or stalling its worker",
            advisory.deliveries, advisory.consumer
        );
        // A body that does not decode, or names another run than its subject, is never
        // dead-lettered as the run it names (whose record it would close).
        let (refused, decoded) = match serde_json::from_slice::<Dispatch>(&raw.payload) {
            Err(error) => {
                let entry =
                    undecodable(&self.names, &raw.subject, &raw.payload, &error, &self.worker, raw.sequence);
                (Some(entry), None)
            }
            Ok(dispatch) => match disagreement(&self.names, &raw.subject, &dispatch) {
                Some(reason) => {
                    let entry = mismatched(
                        &self.names,
                        &raw.subject,
                        &raw.payload,
                        &dispatch,
                        reason,
                        &self.worker,
                        raw.sequence,
                    );
                    (Some(entry), None)
                }
                None => (None, Some(dispatch)),
            },
        };
        let Some(mut dispatch) = decoded else {
            if let Some(entry) = refused {
                self.dlq.publish(&entry).await?;
            }
            stream.delete_message(raw.sequence).await.context("delete the dispatch message")?;
            return Ok(());
        };
        dispatch.trace_id = jetsched_shared::trace::trace_id_in(Some(&raw.headers));
        let record = self.runs.get(&dispatch.execution_id).await?;
        if let Some((record, _)) = &record
            && matches!(record.status, RunStatus::Succeeded | RunStatus::Dead)
        {
            // A verdict was reached; only the ack got lost.
            stream.delete_message(raw.sequence).await.context("delete the dispatch message")?;
            return Ok(());
        }
        let now = Utc::now();
        let close = |r: &mut RunRecord| {
            if let Some(last) = r.attempts.last_mut()
                && last.outcome.is_none()
            {
                last.outcome = Some(AttemptOutcome::Abandoned);
                last.finished = Some(now);
                last.error = Some("no verdict before ack_wait: the worker died or stalled".to_string());
            }
            r.status = RunStatus::Failed;
            r.error = Some(reason.clone());
            r.finished.get_or_insert(now);
        };
        let saved = match record {
            Some((mut record, revision)) => {
                close(&mut record);
                Some(self.runs.save(record, revision, close).await?)
            }
            None => None,
        };
        let entry = DeadLetter::new(
            &dispatch,
            saved.as_ref().map(|(r, _)| r),
            reason.clone(),
            DeadLetterSource::MaxDeliveries,
            &self.worker,
            raw.sequence,
        );
        self.dlq.publish(&entry).await?;
        if let Some((mut record, revision)) = saved {
            record.status = RunStatus::Dead;
            self.runs.save(record, revision, |r| r.status = RunStatus::Dead).await?;
        }
        stream.delete_message(raw.sequence).await.context("delete the dispatch message")?;
        let event = Event {
            execution_id: Some(dispatch.execution_id.clone()),
            nominal_time: Some(dispatch.nominal_time),
            trigger: Some(dispatch.trigger),
            attempt: u32::try_from(advisory.deliveries).ok(),
            worker: Some(self.worker.clone()),
            error: Some(reason),
            reason: Some(DeadLetterSource::MaxDeliveries.as_str().to_string()),
            trace_id: entry.trace_id.clone(),
            ..Event::new(EventKind::RunDead, &dispatch.namespace, &dispatch.task_id)
        };
        if let Err(error) = self.events.publish(&event).await {
            self.events.give_up(&event, &error);
        }
        self.dlq.measure().await;
        tracing::warn!(
            namespace = %dispatch.namespace, task = %dispatch.task_id, execution = %dispatch.execution_id,
            deliveries = advisory.deliveries, "crash-looping run moved to the dead-letter stream"
        );
        Ok(())
    }
}

/// Where the subject a dispatch was delivered on and its body disagree about the run (the
/// queue, namespace and task of the subject against the body's and its spec snapshot's): the
/// reason, naming both sides of each disagreement; `None` when they agree.
pub(crate) fn disagreement(names: &Names, subject: &str, dispatch: &Dispatch) -> Option<String> {
    let Some((queue, _, namespace, task_id)) = names.parse_lane_subject(subject) else {
        return Some(format!(
            "subject {subject} is not a dispatch subject of a queue, namespace and task: nothing was run"
        ));
    };
    let spec = &dispatch.spec;
    let differences: Vec<String> = [
        ("queue", queue, "spec.queue", spec.queue.as_str()),
        ("namespace", namespace, "namespace", dispatch.namespace.as_str()),
        ("namespace", namespace, "spec.namespace", spec.namespace.as_str()),
        ("task", task_id, "task_id", dispatch.task_id.as_str()),
        ("task", task_id, "spec.id", spec.id.as_str()),
    ]
    .into_iter()
    .filter(|(_, in_subject, _, in_body)| in_subject != in_body)
    .map(|(what, in_subject, field, in_body)| {
        format!("the subject's {what} is {in_subject:?}, the body's {field} {in_body:?}")
    })
    .collect();
    (!differences.is_empty()).then(|| {
        format!(
            "the dispatch's subject ({subject}) and body disagree: {}; nothing was run",
            differences.join("; ")
        )
    })
}

/// The queue, lane, namespace and task a dispatch subject names (`unknown` for a subject that
/// is not one).
fn subject_address(names: &Names, subject: &str) -> (String, Priority, String, String) {
    match names.parse_lane_subject(subject) {
        Some((queue, priority, namespace, task_id)) => {
            (queue.to_string(), priority, namespace.to_string(), task_id.to_string())
        }
        None => ("unknown".to_string(), Priority::Normal, "unknown".to_string(), "unknown".to_string()),
    }
}

/// A dead letter for a dispatch body that does not decode: queue, namespace and task come
/// from the subject (`<prefix>.dispatch.<queue>.<namespace>.<task_id>`).
pub(crate) fn undecodable(
    names: &Names,
    subject: &str,
    payload: &[u8],
    error: &serde_json::Error,
    worker: &str,
    sequence: u64,
) -> DeadLetter {
    let reason = format!("the dispatch message does not decode: {error}");
    let message = Unrun { subject, payload, sequence, dispatch: None };
    message.dead_letter(names, DeadLetterSource::Undecodable, reason, worker)
}

/// A dead letter for a dispatch whose subject and body disagree ([`disagreement`]'s
/// `reason`). It is addressed by the subject (what the publisher's permissions vouched for), so
/// the run the body names is left untouched; its execution id is the message's
/// (`mismatched-<sequence>`), never the body's, and it carries the body as it came, not as a
/// spec snapshot: it cannot be replayed, only purged.
pub(crate) fn mismatched(
    names: &Names,
    subject: &str,
    payload: &[u8],
    dispatch: &Dispatch,
    reason: String,
    worker: &str,
    sequence: u64,
) -> DeadLetter {
    let message = Unrun { subject, payload, sequence, dispatch: Some(dispatch) };
    message.dead_letter(names, DeadLetterSource::Mismatched, reason, worker)
}

/// A dispatch message that is dead-lettered without being run: its subject, body as it came,
/// stream sequence and, when the body decoded, what it says.
struct Unrun<'a> {
    subject: &'a str,
    payload: &'a [u8],
    sequence: u64,
    dispatch: Option<&'a Dispatch>,
}

impl Unrun<'_> {
    /// Its dead letter, addressed by the subject, identified as `<source>-<sequence>`.
    fn dead_letter(
        &self,
        names: &Names,
        source: DeadLetterSource,
        reason: String,
        worker: &str,
    ) -> DeadLetter {
        let (queue, priority, namespace, task_id) = subject_address(names, self.subject);
        let dispatch = self.dispatch;
        DeadLetter {
            execution_id: format!("{}-{}", source.as_str(), self.sequence),
            namespace,
            task_id,
            queue,
            nominal_time: dispatch.map_or_else(Utc::now, |d| d.nominal_time),
            trigger: dispatch.map_or(Trigger::Schedule, |d| d.trigger),
            term: dispatch.map_or(0, |d| d.term),
            revision: dispatch.map_or(0, |d| d.revision),
            spec: None,
            raw_dispatch: Some(String::from_utf8_lossy(self.payload).into_owned()),
            reason,
            source,
            dead_at: Utc::now(),
            worker: worker.to_string(),
            attempts: Vec::new(),
            dispatch_sequence: self.sequence,
            trace_id: None,
            priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undecodable_dispatch_is_addressed_by_its_subject() {
        let names = Names::default();
        let subject = names.dispatch_subject("q1", "billing", "report");
        let error = serde_json::from_slice::<Dispatch>(b"{not json").unwrap_err();
        let entry = undecodable(&names, &subject, b"{not json", &error, "w1", 42);
        assert_eq!(
            (entry.queue.as_str(), entry.namespace.as_str(), entry.task_id.as_str()),
            ("q1", "billing", "report")
        );
        assert_eq!(entry.source, DeadLetterSource::Undecodable);
        assert_eq!(entry.raw_dispatch.as_deref(), Some("{not json"));
        assert_eq!(entry.execution_id, "undecodable-42");
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["source"], "undecodable");
        assert!(json.get("spec").is_none(), "{json}");
        let subject = names.lane_subject("q1", Priority::High, "billing", "report");
        let entry = undecodable(&names, &subject, b"{not json", &error, "w1", 43);
        assert_eq!((entry.queue.as_str(), entry.priority), ("q1", Priority::High));
    }

    fn dispatch_of(namespace: &str, task_id: &str, spec: (&str, &str, &str)) -> Dispatch {
        let (queue, spec_namespace, spec_id) = spec;
        let spec = format!(
            r#"{{"id":"{spec_id}","namespace":"{spec_namespace}","queue":"{queue}","schedule":{{"every":"1m"}},"executor":{{"kind":"handler","name":"x"}}}}"#
        );
        let body = format!(
            r#"{{"execution_id":"e1","namespace":"{namespace}","task_id":"{task_id}","nominal_time":"2026-01-01T00:00:00.000Z","trigger":"manual","term":0,"revision":3,"spec":{spec}}}"#
        );
        serde_json::from_str(&body).unwrap()
    }

    #[test]
    fn a_dispatch_whose_subject_and_body_disagree_is_refused_naming_both() {
        let names = Names::default();
        let demo = names.dispatch_subject("q1", "demo", "report");
        let agreeing = dispatch_of("demo", "report", ("q1", "demo", "report"));
        assert_eq!(disagreement(&names, &demo, &agreeing), None);
        let high = names.lane_subject("q1", Priority::High, "demo", "report");
        assert_eq!(disagreement(&names, &high, &agreeing), None, "any lane");

        let billing = dispatch_of("billing", "report", ("q1", "billing", "report"));
        let reason = disagreement(&names, &demo, &billing).expect("refused");
        assert!(
            reason.contains(r#"the subject's namespace is "demo", the body's namespace "billing""#),
            "{reason}"
        );
        assert!(reason.contains(r#"the body's spec.namespace "billing""#), "{reason}");
        assert!(!reason.contains("task") && !reason.contains("queue"), "only what differs: {reason}");
        let other_spec = dispatch_of("demo", "report", ("q1", "demo", "other"));
        let reason = disagreement(&names, &demo, &other_spec).expect("refused");
        assert!(reason.contains(r#"the subject's task is "report", the body's spec.id "other""#), "{reason}");
        let other_queue = dispatch_of("demo", "report", ("q2", "demo", "report"));
        let reason = disagreement(&names, &demo, &other_queue).expect("refused");
        assert!(reason.contains(r#"the subject's queue is "q1", the body's spec.queue "q2""#), "{reason}");
        let reason =
            disagreement(&names, "jetsched.dispatch.q1.demo.report.extra", &agreeing).expect("refused");
        assert!(reason.contains("not a dispatch subject"), "{reason}");

        let reason = disagreement(&names, &high, &billing).unwrap();
        let entry = mismatched(&names, &high, b"{...}", &billing, reason.clone(), "w1", 7);
        assert_eq!(
            (entry.queue.as_str(), entry.namespace.as_str(), entry.task_id.as_str(), entry.priority),
            ("q1", "demo", "report", Priority::High),
            "addressed by its subject"
        );
        assert_eq!(
            (entry.execution_id.as_str(), entry.source),
            ("mismatched-7", DeadLetterSource::Mismatched)
        );
        assert_eq!((entry.reason, entry.raw_dispatch.as_deref()), (reason, Some("{...}")));
        assert!(entry.spec.is_none(), "no spec snapshot: it cannot be replayed");
    }

    #[test]
    fn the_max_deliveries_advisory_decodes() {
        let advisory: MaxDeliveries = serde_json::from_str(
            r#"{"type":"io.nats.jetstream.advisory.v1.max_deliver","id":"x","timestamp":"2026-01-01T00:00:00Z",
                "stream":"JETSCHED_DISPATCH","consumer":"workers-default","stream_seq":7,"deliveries":5}"#,
        )
        .unwrap();
        assert_eq!((advisory.stream_seq, advisory.deliveries), (7, 5));
        assert_eq!(advisory.consumer, "workers-default");
    }
}
