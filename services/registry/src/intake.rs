//! The durable intake consumer: applies specs published fire-and-forget to
//! `<prefix>.submit.<namespace>.<id>`, so a spec sent while no registry runs is applied when
//! one comes back. Invalid submissions are acked and become `task.rejected` events naming
//! every problem of the spec.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{
    self, AckKind,
    consumer::{AckPolicy, PullConsumer, pull},
};
use futures::StreamExt;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::names::Names;
use jetsched_shared::spec::{TaskSpec, validate_id};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::{Limits, check_size, precondition};
use crate::metrics::Metrics;
use crate::spans;
use crate::tasks::TaskStore;

/// First pause after an intake pull error; it doubles up to [`PULL_RETRY_MAX`] while errors
/// last and starts over after a message.
const PULL_RETRY_FIRST: Duration = Duration::from_millis(200);
const PULL_RETRY_MAX: Duration = Duration::from_secs(5);

/// Creates (or binds to) the registry's durable consumer on the intake stream.
pub(crate) async fn consumer(js: &jetstream::Context, names: &Names) -> anyhow::Result<PullConsumer> {
    let stream = js.get_stream(names.intake_stream()).await.context("open intake stream")?;
    let durable = names.intake_consumer();
    stream
        .get_or_create_consumer(
            durable,
            pull::Config {
                durable_name: Some(durable.to_string()),
                description: Some("jetsched registry: applies submitted specs".to_string()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 1000,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("ensure consumer {durable}"))
}

/// Applies submissions one at a time (so two submissions of one task apply in order) until
/// `shutdown`.
pub(crate) async fn run(
    consumer: PullConsumer,
    store: TaskStore,
    names: Names,
    limits: Limits,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(64)
        .messages()
        .await
        .context("start pulling intake submissions")?;
    // Pull errors (a server restarting, a cluster electing) are waited out, longer each time.
    let mut pause = Backoff::new(PULL_RETRY_FIRST, PULL_RETRY_MAX);
    loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            next = messages.next() => next,
        };
        let message = match message {
            Some(Ok(message)) => {
                pause.reset();
                message
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "intake pull failed; continuing");
                tokio::time::sleep(pause.next_delay()).await;
                continue;
            }
            None => anyhow::bail!("intake message stream ended"),
        };
        let applying = apply(&store, &names, limits, &message);
        let outcome = match spans::submission(&message.subject, message.headers.as_ref()) {
            Some(span) => applying.instrument(span).await,
            None => applying.await,
        };
        let ack = match outcome {
            Ok(()) => {
                metrics.intake.with_label_values(&["applied"]).inc();
                AckKind::Ack
            }
            Err((namespace, id, error)) if error.first().code == ErrorCode::Unavailable => {
                tracing::warn!(namespace = %namespace, task = %id, error = %error, "intake write failed; will retry");
                metrics.intake.with_label_values(&["retried"]).inc();
                AckKind::Nak(Some(Duration::from_secs(1)))
            }
            Err((namespace, id, error)) => {
                tracing::info!(namespace = %namespace, task = %id, error = %error, "submission rejected");
                metrics.intake.with_label_values(&["rejected"]).inc();
                store.reject(&namespace, &id, &error).await;
                AckKind::Ack
            }
        };
        if let Err(error) = message.ack_with(ack).await {
            tracing::warn!(%error, subject = %message.subject, "intake ack failed; the submission will be redelivered");
        }
    }
}

type Rejection = (String, String, ApiErrors);

async fn apply(
    store: &TaskStore,
    names: &Names,
    limits: Limits,
    message: &jetstream::Message,
) -> Result<(), Rejection> {
    let Some((namespace, id)) = names.parse_submit_subject(&message.subject) else {
        let error = ApiError::new(
            ErrorCode::BadRequest,
            format!("subject {} is not {}", message.subject, names.submit_subject("<namespace>", "<id>")),
        );
        return Err(("_unknown".into(), "_unknown".into(), error.into()));
    };
    let reject = |errors: ApiErrors| (namespace.to_string(), id.to_string(), errors);
    let reject_one = |error: ApiError| reject(error.into());
    validate_id("namespace", namespace).map_err(reject_one)?;
    validate_id("id", id).map_err(reject_one)?;
    check_size(&message.payload, limits).map_err(reject_one)?;
    let precondition = precondition(message.headers.as_ref()).map_err(reject_one)?;
    let mut value: serde_json::Value = serde_json::from_slice(&message.payload)
        .map_err(|e| reject_one(ApiError::new(ErrorCode::InvalidJson, format!("spec is not JSON: {e}"))))?;
    // The subject names the task; the body may leave out its id and namespace.
    if let Some(object) = value.as_object_mut() {
        object.entry("id").or_insert_with(|| id.into());
        object.entry("namespace").or_insert_with(|| namespace.into());
    }
    let spec = TaskSpec::parse_value(value).map_err(reject)?;
    if spec.namespace != namespace || spec.id != id {
        return Err(reject_one(ApiError::at(
            ErrorCode::InvalidValue,
            if spec.namespace != namespace { "namespace" } else { "id" },
            format!("spec {}/{} was submitted on the subject of {namespace}/{id}", spec.namespace, spec.id),
        )));
    }
    let spec = spec.admit(chrono::Utc::now()).map_err(reject_one)?;
    store.put(spec, precondition).await.map_err(reject_one)?;
    Ok(())
}
