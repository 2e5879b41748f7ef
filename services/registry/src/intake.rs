//! The durable intake consumer: applies specs published fire-and-forget to
//! `<prefix>.submit.<namespace>.<id>`, so a spec sent while no registry runs is applied when
//! one comes back. Invalid submissions are acked and become `task.rejected` events naming
//! every problem of the spec. A submission whose de-duplication key (header
//! `Jetsched-Dedupe-Key`, for `Jetsched-Dedupe-TTL`) an earlier valid submission of the task
//! claimed within its time to live is acked and applies nothing (`trigger.deduplicated`).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::names::Names;
use jetsched_shared::spec::{TaskSpec, validate_id};
use jetsched_shared::wire::{
    DEFAULT_DEDUPE_TTL, HDR_DEDUPE_KEY, HDR_DEDUPE_TTL, check_dedupe_key, dedupe_ttl,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::codec::{Limits, check_size, precondition};
use crate::failure::Failure;
use crate::metrics::Metrics;
use crate::pull::{self, Verdict};
use crate::spans;
use crate::tasks::TaskStore;

/// Submissions pulled at a time: a few, so none waits long behind the others while a write
/// is slow.
const BATCH: usize = 8;

/// Creates (or binds to, updating its settings) the registry's durable consumer on the intake
/// stream.
pub(crate) async fn consumer(js: &jetstream::Context, names: &Names) -> anyhow::Result<PullConsumer> {
    let description = "jetsched registry: applies submitted specs";
    pull::consumer(js, &names.intake_stream(), names.intake_consumer(), description, String::new()).await
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
    let intake = Intake { store, names, limits, metrics };
    pull::run(consumer, "intake", BATCH, intake, shutdown).await
}

struct Intake {
    store: TaskStore,
    names: Names,
    limits: Limits,
    metrics: Metrics,
}

impl pull::Handler for Intake {
    async fn handle(&mut self, message: &jetstream::Message) -> Verdict {
        let applying = apply(&self.store, &self.names, self.limits, message);
        let outcome = match spans::submission(&message.subject, message.headers.as_ref()) {
            Some(span) => applying.instrument(span).await,
            None => applying.await,
        };
        match outcome {
            Ok(Applied::Stored) => {
                self.metrics.intake.with_label_values(&["applied"]).inc();
                Verdict::Done
            }
            Ok(Applied::Deduplicated) => {
                tracing::info!(subject = %message.subject, "submission de-duplicated: not applied");
                self.metrics.intake.with_label_values(&["deduplicated"]).inc();
                Verdict::Done
            }
            Err((namespace, id, error)) if error.first().code == ErrorCode::Unavailable => {
                tracing::warn!(namespace = %namespace, task = %id, error = %error, "intake write failed; will retry");
                self.metrics.intake.with_label_values(&["retried"]).inc();
                Verdict::Retry
            }
            Err((namespace, id, error)) => {
                tracing::info!(namespace = %namespace, task = %id, error = %error, "submission rejected");
                self.metrics.intake.with_label_values(&["rejected"]).inc();
                self.store.reject(&namespace, &id, &error).await;
                Verdict::Done
            }
        }
    }
}

type Rejection = (String, String, ApiErrors);

/// What became of a valid submission.
enum Applied {
    Stored,
    /// An earlier submission with its de-duplication key was applied within the key's time
    /// to live: nothing applied.
    Deduplicated,
}

/// A submission's de-duplication key and time to live (headers), each checked.
fn dedupe(headers: Option<&async_nats::HeaderMap>) -> Result<Option<(String, Duration)>, ApiErrors> {
    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str().to_string());
    let (key, ttl) = (header(HDR_DEDUPE_KEY), header(HDR_DEDUPE_TTL));
    let mut problems = Vec::new();
    problems.extend(key.as_deref().and_then(|key| check_dedupe_key(HDR_DEDUPE_KEY, key).err()));
    let parsed = dedupe_ttl(HDR_DEDUPE_TTL, ttl.as_deref());
    problems.extend(parsed.clone().err());
    if key.is_none() && ttl.is_some() {
        problems.push(ApiError::at(
            ErrorCode::BadRequest,
            HDR_DEDUPE_TTL,
            format!("{HDR_DEDUPE_TTL} is given only with {HDR_DEDUPE_KEY}"),
        ));
    }
    if let Some(problems) = ApiErrors::from_vec(problems) {
        return Err(problems);
    }
    Ok(key.map(|key| (key, parsed.unwrap_or(DEFAULT_DEDUPE_TTL))))
}

async fn apply(
    store: &TaskStore,
    names: &Names,
    limits: Limits,
    message: &jetstream::Message,
) -> Result<Applied, Rejection> {
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
    let dedupe = dedupe(message.headers.as_ref()).map_err(reject)?;
    let mut value: serde_json::Value = serde_json::from_slice(&message.payload)
        .map_err(|e| reject(Failure::caused(ErrorCode::InvalidJson, "spec is not JSON", e).wire()))?;
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
    // The key is claimed by the first valid submission carrying it.
    if let Some((key, ttl)) = dedupe {
        let sequence = message.info().map(|info| info.stream_sequence).unwrap_or(0);
        let first = store
            .claim_submission(namespace, id, &key, ttl, sequence)
            .await
            .map_err(|failure| reject(failure.wire()))?;
        if !first {
            return Ok(Applied::Deduplicated);
        }
    }
    store.put(spec, precondition).await.map_err(|failure| reject(failure.wire()))?;
    Ok(Applied::Stored)
}
