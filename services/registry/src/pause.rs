//! The durable consumer of pause requests (`<prefix>.control.pause.<namespace>.<id>` on the
//! control stream): a worker whose run brought a task's consecutive failures to its
//! `pause_after_failures` asks for the pause there, and the registry (the only writer of the
//! tasks bucket) pauses the task with compare-and-set, sets its `paused_reason` and publishes
//! `task.paused`. A request is acked once the task is paused (or already was, or is gone).

use async_nats::jetstream::{self, consumer::PullConsumer};
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::names::Names;
use jetsched_shared::spec::validate_id;
use jetsched_shared::wire::PauseRequest;
use tokio_util::sync::CancellationToken;

use crate::codec::paused_reason;
use crate::failure::Failure;
use crate::metrics::Metrics;
use crate::pull::{self, Verdict};
use crate::tasks::TaskStore;

/// Requests pulled at a time.
const BATCH: usize = 8;

/// Creates (or binds to, updating its settings) the registry's durable consumer of pause
/// requests.
pub(crate) async fn consumer(js: &jetstream::Context, names: &Names) -> anyhow::Result<PullConsumer> {
    let description = "jetsched registry: pauses tasks on workers' requests";
    let filter = names.pause_request_wildcard();
    pull::consumer(js, &names.control_stream(), names.pause_consumer(), description, filter).await
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Paused now, or already paused.
    Paused,
    /// The task no longer exists.
    Gone,
    /// Not a pause request (subject or body): acked so it is not redelivered forever.
    Invalid,
    /// The tasks bucket could not be written: redelivered later.
    Retry,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Paused => "paused",
            Outcome::Gone => "gone",
            Outcome::Invalid => "invalid",
            Outcome::Retry => "retried",
        }
    }
}

/// Applies pause requests one at a time until `shutdown`.
pub(crate) async fn run(
    consumer: PullConsumer,
    store: TaskStore,
    names: Names,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    pull::run(consumer, "pause request", BATCH, Pauses { store, names, metrics }, shutdown).await
}

struct Pauses {
    store: TaskStore,
    names: Names,
    metrics: Metrics,
}

impl pull::Handler for Pauses {
    async fn handle(&mut self, message: &jetstream::Message) -> Verdict {
        let outcome = apply(&self.store, &self.names, &message.subject, &message.payload).await;
        self.metrics.pause_requests.with_label_values(&[outcome.label()]).inc();
        if outcome == Outcome::Retry { Verdict::Retry } else { Verdict::Done }
    }
}

/// The request of a message, checked: its subject names the task the body names, the reason
/// is a valid `paused_reason`.
fn decode(names: &Names, subject: &str, payload: &[u8]) -> Result<PauseRequest, Failure> {
    let (namespace, id) = names.parse_pause_request_subject(subject).ok_or_else(|| {
        ApiError::new(ErrorCode::BadRequest, format!("subject {subject} is not a pause request subject"))
    })?;
    let request: PauseRequest = serde_json::from_slice(payload)
        .map_err(|e| Failure::caused(ErrorCode::InvalidJson, "pause request is not valid", e))?;
    validate_id("namespace", namespace)?;
    validate_id("id", id)?;
    if request.namespace != namespace || request.task_id != id {
        return Err(ApiError::new(
            ErrorCode::InvalidValue,
            format!(
                "request for {}/{} on the subject of {namespace}/{id}",
                request.namespace, request.task_id
            ),
        )
        .into());
    }
    paused_reason(&request.reason)?;
    Ok(request)
}

async fn apply(store: &TaskStore, names: &Names, subject: &str, payload: &[u8]) -> Outcome {
    let request = match decode(names, subject, payload) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%subject, error = %error.wire(), "pause request ignored");
            return Outcome::Invalid;
        }
    };
    let (namespace, id) = (&request.namespace, &request.task_id);
    match store.pause(namespace, id, Some(&request.reason)).await {
        Ok(reply) => {
            tracing::info!(
                namespace = %namespace, task = %id, reason = %request.reason, count = request.count,
                execution = request.execution_id.as_deref().unwrap_or(""), revision = reply.revision,
                "task paused on request"
            );
            Outcome::Paused
        }
        Err(failure) if failure.code() == ErrorCode::NotFound => Outcome::Gone,
        Err(failure) if failure.code() == ErrorCode::Unavailable => {
            let error = failure.wire();
            tracing::warn!(namespace = %namespace, task = %id, %error, "pause failed; will retry");
            Outcome::Retry
        }
        Err(failure) => {
            let error = failure.wire();
            tracing::error!(namespace = %namespace, task = %id, %error, "pause request not applied");
            Outcome::Invalid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(namespace: &str, id: &str, reason: &str) -> Vec<u8> {
        serde_json::to_vec(&PauseRequest {
            namespace: namespace.into(),
            task_id: id.into(),
            reason: reason.into(),
            count: 3,
            execution_id: Some("e1".into()),
            time: chrono::Utc::now(),
        })
        .unwrap()
    }

    #[test]
    fn a_request_must_match_its_subject_and_carry_a_reason() {
        let names = Names::default();
        let subject = names.pause_request_subject("ns", "t");
        let ok = decode(&names, &subject, &body("ns", "t", "consecutive_failures")).unwrap();
        assert_eq!((ok.namespace.as_str(), ok.task_id.as_str(), ok.count), ("ns", "t", 3));
        let code = |subject: &str, payload: &[u8]| decode(&names, subject, payload).unwrap_err().code();
        assert_eq!(code(&subject, &body("ns", "other", "x")), ErrorCode::InvalidValue);
        assert_eq!(code(&subject, &body("ns", "t", "")), ErrorCode::InvalidValue);
        assert_eq!(code(&subject, b"{"), ErrorCode::InvalidJson);
        assert_eq!(code("jetsched.control.pause.ns", &body("ns", "t", "x")), ErrorCode::BadRequest);
        let bad = names.pause_request_subject("n s", "t");
        assert_eq!(code(&bad, &body("n s", "t", "x")), ErrorCode::InvalidId);
    }
}
