//! Converging one existing stream or bucket on its desired configuration: the settings that
//! differ, updated in place where JetStream allows it, a conflict where it does not.

use async_nats::jetstream::{
    self,
    context::{CreateStreamError, CreateStreamErrorKind, GetStreamErrorKind},
    kv,
    stream::{self, DiscardPolicy, RetentionPolicy},
};

use super::{Change, TopologyError, nats_error};
use crate::partition;

/// One setting that differs between an existing resource and the desired configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub setting: &'static str,
    pub existing: String,
    pub desired: String,
    /// Whether JetStream can update it in place.
    pub mutable: bool,
}

/// The settings of `desired` that `existing` does not have. Only the settings jetsched manages
/// are compared; server-filled defaults are ignored.
pub fn differences(existing: &stream::Config, desired: &stream::Config) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut check = |setting: &'static str, existing: String, desired: String, mutable: bool| {
        if existing != desired {
            out.push(Difference { setting, existing, desired, mutable });
        }
    };
    let debug = |value: &dyn std::fmt::Debug| format!("{value:?}");
    check("storage", debug(&existing.storage), debug(&desired.storage), false);
    check("retention", debug(&existing.retention), debug(&desired.retention), false);
    let sorted = |subjects: &[String]| {
        let mut subjects = subjects.to_vec();
        subjects.sort();
        subjects.join(",")
    };
    check("subjects", sorted(&existing.subjects), sorted(&desired.subjects), true);
    let replicas = |config: &stream::Config| config.num_replicas.max(1).to_string();
    check("replicas", replicas(existing), replicas(desired), true);
    check("max_age", debug(&existing.max_age), debug(&desired.max_age), true);
    // The server reports "unlimited" as -1 where a config may say 0.
    let limit = |n: i64| if n <= 0 { -1 } else { n }.to_string();
    check("max_bytes", limit(existing.max_bytes), limit(desired.max_bytes), true);
    check("discard", debug(&existing.discard), debug(&desired.discard), true);
    let history = |config: &stream::Config| limit(config.max_messages_per_subject);
    check("history", history(existing), history(desired), true);
    let flag = |on: fn(&stream::Config) -> bool| (on(existing).to_string(), on(desired).to_string());
    let (have, want) = flag(|c| c.discard_new_per_subject);
    check("discard_new_per_subject", have, want, true);
    // Message schedules can be turned on by an update, never off; likewise fast-ingest batches.
    if desired.allow_message_schedules {
        let (have, want) = flag(|c| c.allow_message_schedules);
        check("allow_message_schedules", have, want, true);
    }
    if desired.allow_batch_publish {
        let (have, want) = flag(|c| c.allow_batch_publish);
        check("allow_batched", have, want, true);
    }
    // Direct gets, likewise: an upgrade turns them on, nothing turns them off.
    if desired.allow_direct {
        let (have, want) = flag(|c| c.allow_direct);
        check("allow_direct", have, want, true);
    }
    // The number of partitions is recorded once: a stream made before partitions gets it, and
    // no later start may change it (tasks would move between partitions under their leaders).
    if let Some(want) = desired.metadata.get(partition::METADATA_KEY) {
        let have = existing.metadata.get(partition::METADATA_KEY);
        let mutable = have.is_none();
        check("partitions", have.cloned().unwrap_or_else(|| "none".into()), want.clone(), mutable);
    }
    if !desired.duplicate_window.is_zero() {
        check("duplicate_window", debug(&existing.duplicate_window), debug(&desired.duplicate_window), true);
    }
    out
}

pub(super) fn conflict(resource: &str, diffs: &[Difference]) -> Option<TopologyError> {
    diffs.iter().find(|d| !d.mutable).map(|d| TopologyError::Conflict {
        resource: resource.to_string(),
        setting: d.setting,
        existing: d.existing.clone(),
        desired: d.desired.clone(),
    })
}

async fn existing_stream(
    js: &jetstream::Context,
    name: &str,
) -> Result<Option<stream::Config>, TopologyError> {
    match js.get_stream(name).await {
        Ok(mut stream) => {
            let info = stream.info().await.map_err(|e| nats_error(name, "read stream info", e))?;
            Ok(Some(info.config.clone()))
        }
        Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(ref j) if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) => {
            Ok(None)
        }
        Err(e) => Err(nats_error(name, "look up stream", e)),
    }
}

pub(super) async fn ensure_stream(
    js: &jetstream::Context,
    desired: stream::Config,
    changes: &mut Vec<Change>,
) -> Result<(), TopologyError> {
    let name = desired.name.clone();
    let existing = match existing_stream(js, &name).await? {
        Some(existing) => existing,
        None => match js.create_stream(desired.clone()).await {
            Ok(_) => {
                tracing::info!(stream = %name, "created stream");
                changes.push(Change::Created { resource: name });
                return Ok(());
            }
            // Another service created it between our look-up and create: compare with theirs.
            Err(e) if has_code(&e, jetstream::ErrorCode::STREAM_NAME_EXIST) => {
                existing_stream(js, &name).await?.ok_or_else(|| nats_error(&name, "create stream", e))?
            }
            Err(e) => return Err(stream_error(&desired, "create stream", e)),
        },
    };
    let diffs = differences(&existing, &desired);
    if diffs.is_empty() {
        return Ok(());
    }
    if let Some(error) = conflict(&name, &diffs) {
        return Err(error);
    }
    let mut updated = existing;
    for diff in &diffs {
        tracing::info!(stream = %name, setting = diff.setting, from = %diff.existing, to = %diff.desired, "converging stream setting");
    }
    updated.subjects = desired.subjects;
    updated.num_replicas = desired.num_replicas;
    updated.max_age = desired.max_age;
    updated.max_bytes = desired.max_bytes;
    updated.discard = desired.discard;
    updated.max_messages_per_subject = desired.max_messages_per_subject;
    updated.discard_new_per_subject = desired.discard_new_per_subject;
    updated.allow_message_schedules |= desired.allow_message_schedules;
    updated.allow_rollup |= desired.allow_rollup;
    updated.allow_batch_publish |= desired.allow_batch_publish;
    updated.allow_direct |= desired.allow_direct;
    // A stream made before partitions gets the number recorded (a differing one is a conflict).
    updated.metadata.extend(desired.metadata);
    if !desired.duplicate_window.is_zero() {
        updated.duplicate_window = desired.duplicate_window;
    }
    js.update_stream(&updated).await.map_err(|e| stream_error(&updated, "update stream", e))?;
    changes
        .extend(diffs.into_iter().map(|difference| Change::Converged { resource: name.clone(), difference }));
    Ok(())
}

/// A failed create or update of `config`: [`TopologyError::NoRoom`] when the server cannot
/// reserve its `max_bytes`, otherwise [`TopologyError::Nats`] (retried by [`ensure`]).
fn stream_error(config: &stream::Config, what: &'static str, error: CreateStreamError) -> TopologyError {
    if has_code(&error, jetstream::ErrorCode::STORAGE_RESOURCES_EXCEEDED) {
        TopologyError::NoRoom {
            resource: config.name.clone(),
            max_bytes: config.max_bytes,
            source: Box::new(error),
        }
    } else {
        nats_error(&config.name, what, error)
    }
}

/// Whether JetStream answered a stream create or update with error `code`.
fn has_code(error: &CreateStreamError, code: jetstream::ErrorCode) -> bool {
    matches!(error.kind(), CreateStreamErrorKind::JetStream(ref j) if j.error_code() == code)
}

/// The stream settings a KV config implies, for comparison with the existing `KV_<bucket>`.
pub(super) fn bucket_as_stream(config: &kv::Config) -> stream::Config {
    stream::Config {
        name: format!("KV_{}", config.bucket),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        retention: RetentionPolicy::Limits,
        storage: config.storage,
        num_replicas: config.num_replicas.max(1),
        max_age: config.max_age,
        max_bytes: if config.max_bytes == 0 { -1 } else { config.max_bytes },
        discard: DiscardPolicy::New,
        max_messages_per_subject: config.history.max(1),
        ..Default::default()
    }
}

pub(super) async fn ensure_bucket(
    js: &jetstream::Context,
    desired: kv::Config,
    changes: &mut Vec<Change>,
) -> Result<kv::Store, TopologyError> {
    let bucket = desired.bucket.clone();
    let stream_name = format!("KV_{bucket}");
    let existing = match existing_stream(js, &stream_name).await? {
        Some(existing) => existing,
        None => match js.create_key_value(desired.clone()).await {
            Ok(store) => {
                tracing::info!(bucket = %bucket, "created bucket");
                changes.push(Change::Created { resource: bucket });
                return Ok(store);
            }
            Err(e) => match existing_stream(js, &stream_name).await? {
                Some(existing) => existing,
                None => return Err(nats_error(&bucket, "create bucket", e)),
            },
        },
    };
    let diffs = differences(&existing, &bucket_as_stream(&desired));
    if let Some(error) = conflict(&bucket, &diffs) {
        return Err(error);
    }
    if !diffs.is_empty() {
        for diff in &diffs {
            tracing::info!(bucket = %bucket, setting = diff.setting, from = %diff.existing, to = %diff.desired, "converging bucket setting");
        }
        js.update_key_value(desired).await.map_err(|e| nats_error(&bucket, "update bucket", e))?;
        changes.extend(
            diffs.into_iter().map(|difference| Change::Converged { resource: bucket.clone(), difference }),
        );
    }
    js.get_key_value(&bucket).await.map_err(|e| nats_error(&bucket, "open bucket", e))
}
