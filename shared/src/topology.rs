//! Idempotent creation of every JetStream bucket and stream jetsched uses (README, Architecture).
//!
//! Every service calls [`ensure`] at start-up. A missing resource is created; an existing one
//! with the same settings is left alone; a differing setting that JetStream can change
//! (replicas, ages, sizes, duplicate window, history, subjects) is updated so the deployment
//! converges; a differing setting it cannot change (storage, retention) is a
//! [`TopologyError::Conflict`] naming the resource and the setting.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    context::{CreateStreamError, CreateStreamErrorKind, GetStreamErrorKind},
    kv,
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
};
use clap::{Args, ValueEnum};

use crate::backoff::Backoff;
use crate::config::parse_duration;
use crate::names::Names;

/// Storage of every stream and bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Storage {
    File,
    Memory,
}

impl From<Storage> for StorageType {
    fn from(s: Storage) -> StorageType {
        match s {
            Storage::File => StorageType::File,
            Storage::Memory => StorageType::Memory,
        }
    }
}

/// Topology settings, shared by every service (give them all the same values).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "JetStream topology")]
pub struct TopologyArgs {
    /// Replicas of every stream and bucket (3 in a 3-node cluster).
    #[arg(long, env = "JETSCHED_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
    /// Storage of every stream and bucket.
    #[arg(long, env = "JETSCHED_STORAGE", value_enum, default_value_t = Storage::File)]
    pub storage: Storage,
    /// Revisions kept per task in the tasks bucket (`nats kv history`).
    #[arg(long, env = "JETSCHED_TASKS_HISTORY", default_value_t = 5)]
    pub tasks_history: i64,
    /// Scheduler leader lease length (the leader bucket's max age).
    #[arg(long, env = "JETSCHED_LEASE", default_value = "3s", value_parser = parse_duration)]
    pub lease: Duration,
    /// How long run records are kept.
    #[arg(long, env = "JETSCHED_RUNS_TTL", default_value = "7d", value_parser = parse_duration)]
    pub runs_ttl: Duration,
    /// De-duplication window of the dispatch stream: longer than failover + catch-up of coalesced state writes.
    #[arg(long, env = "JETSCHED_DUPLICATE_WINDOW", default_value = "10m", value_parser = parse_duration)]
    pub duplicate_window: Duration,
    /// How long events are kept.
    #[arg(long, env = "JETSCHED_EVENTS_MAX_AGE", default_value = "7d", value_parser = parse_duration)]
    pub events_max_age: Duration,
    /// Size limit of the events stream (oldest discarded).
    #[arg(long, env = "JETSCHED_EVENTS_MAX_BYTES", default_value_t = 1 << 30)]
    pub events_max_bytes: i64,
    /// Size limit of the dead-letter stream; when full, new dead letters are refused (never evicted).
    #[arg(long, env = "JETSCHED_DLQ_MAX_BYTES", default_value_t = 1 << 30)]
    pub dlq_max_bytes: i64,
    /// Events kept per subject, that is per task and event kind (oldest of that subject
    /// discarded); 0: no such limit. With a task quota per namespace this bounds what one
    /// namespace can hold of the events stream: tasks × kinds × this, so one team's events never
    /// evict another's history.
    #[arg(long, env = "JETSCHED_EVENTS_MAX_PER_SUBJECT", default_value_t = 0)]
    pub events_max_per_subject: i64,
    /// Dead letters kept per subject, that is per task; 0: no such limit. When a task's share is
    /// full its new dead letters are refused (the worker keeps the run and retries storing it),
    /// never the other tasks' or namespaces'.
    #[arg(long, env = "JETSCHED_DLQ_MAX_PER_SUBJECT", default_value_t = 0)]
    pub dlq_max_per_subject: i64,
    /// How long unprocessed intake submissions are kept.
    #[arg(long, env = "JETSCHED_INTAKE_MAX_AGE", default_value = "7d", value_parser = parse_duration)]
    pub intake_max_age: Duration,
    /// How long start-up keeps retrying while JetStream cannot answer (server starting, cluster
    /// electing its meta leader, requests timing out); conflicting or invalid settings fail at once.
    #[arg(long, env = "JETSCHED_TOPOLOGY_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub topology_wait: Duration,
}

impl Default for TopologyArgs {
    fn default() -> Self {
        TopologyArgs {
            replicas: 1,
            storage: Storage::File,
            tasks_history: 5,
            lease: Duration::from_secs(3),
            runs_ttl: Duration::from_secs(7 * 24 * 3600),
            duplicate_window: Duration::from_secs(600),
            events_max_age: Duration::from_secs(7 * 24 * 3600),
            events_max_bytes: 1 << 30,
            dlq_max_bytes: 1 << 30,
            events_max_per_subject: 0,
            dlq_max_per_subject: 0,
            intake_max_age: Duration::from_secs(7 * 24 * 3600),
            topology_wait: Duration::from_secs(60),
        }
    }
}

/// Handles to the buckets, returned by [`ensure`].
#[derive(Clone)]
pub struct Topology {
    pub tasks: kv::Store,
    pub leader: kv::Store,
    pub state: kv::Store,
    pub runs: kv::Store,
    /// Circuit breakers and auto-pause counts shared by every worker.
    pub breakers: kv::Store,
    /// What this call changed: created resources and converged settings (empty when the
    /// deployment already matched).
    pub changes: Vec<Change>,
}

/// One change made by [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created { resource: String },
    Converged { resource: String, difference: Difference },
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "{resource}: existing setting `{setting}` is {existing} but this deployment wants {desired}; \
         JetStream cannot change it in place (delete the resource or align the configuration)"
    )]
    Conflict { resource: String, setting: &'static str, existing: String, desired: String },
    #[error("{resource}: {what}")]
    Nats {
        resource: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid topology setting `{setting}`: {message}")]
    Invalid { setting: &'static str, message: String },
    /// The server refused to reserve a stream's `max_bytes`: its JetStream storage limit is
    /// smaller than what the streams reserve. Not retried: only an operator can change that.
    #[error(
        "{resource}: the server has no room to reserve max_bytes = {max_bytes}; raise \
         the server's jetstream max_file_store / max_memory_store (when unset, 75% of the disk \
         space free at its start), or lower --dlq-max-bytes / --events-max-bytes"
    )]
    NoRoom {
        resource: String,
        max_bytes: i64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("JetStream could not set up the topology within {waited:?} ({attempts} attempts)")]
    Unavailable {
        waited: Duration,
        attempts: u32,
        #[source]
        last: Box<TopologyError>,
    },
}

fn nats_error(
    resource: &str,
    what: &'static str,
    source: impl std::error::Error + Send + Sync + 'static,
) -> TopologyError {
    TopologyError::Nats { resource: resource.to_string(), what, source: Box::new(source) }
}

/// The desired configuration of every bucket, as `kv::Config`.
pub fn bucket_configs(names: &Names, args: &TopologyArgs) -> Vec<kv::Config> {
    let storage: StorageType = args.storage.into();
    let base = |bucket: String, description: &str, history: i64, max_age: Duration| kv::Config {
        bucket,
        description: description.to_string(),
        history,
        max_age,
        storage,
        num_replicas: args.replicas,
        ..Default::default()
    };
    let mut leader = base(names.leader_bucket(), "jetsched scheduler leader lease", 1, args.lease);
    // Expiry of the lease arrives at watchers as a Purge marker, so followers campaign at once.
    leader.limit_markers = Some(Duration::from_secs(1));
    vec![
        base(names.tasks_bucket(), "jetsched task specs", args.tasks_history, Duration::ZERO),
        leader,
        base(names.state_bucket(), "jetsched per-task fire state", 1, Duration::ZERO),
        base(names.runs_bucket(), "jetsched run records", 1, args.runs_ttl),
        base(names.breakers_bucket(), "jetsched circuit breakers and failure counts", 1, Duration::ZERO),
    ]
}

/// The desired configuration of every stream.
pub fn stream_configs(names: &Names, args: &TopologyArgs) -> Vec<stream::Config> {
    let storage: StorageType = args.storage.into();
    let base = |name: String, subjects: Vec<String>, description: &str| stream::Config {
        name,
        subjects,
        description: Some(description.to_string()),
        storage,
        num_replicas: args.replicas,
        ..Default::default()
    };
    vec![
        stream::Config {
            retention: RetentionPolicy::WorkQueue,
            max_age: args.intake_max_age,
            ..base(
                names.intake_stream(),
                vec![names.submit_wildcard()],
                "jetsched fire-and-forget spec submissions",
            )
        },
        stream::Config {
            retention: RetentionPolicy::WorkQueue,
            duplicate_window: args.duplicate_window,
            // Runs delayed by an open breaker wait in the stream as server-scheduled messages
            // (the server turns rollups on for them; declared so a start finds no difference).
            allow_message_schedules: true,
            allow_rollup: true,
            ..base(
                names.dispatch_stream(),
                vec![names.dispatch_wildcard(), names.lanes_wildcard(), names.delayed_wildcard()],
                "jetsched dispatched runs",
            )
        },
        stream::Config {
            retention: RetentionPolicy::Limits,
            max_bytes: args.dlq_max_bytes,
            discard: DiscardPolicy::New,
            max_messages_per_subject: args.dlq_max_per_subject,
            discard_new_per_subject: args.dlq_max_per_subject > 0,
            ..base(names.dlq_stream(), vec![names.dlq_wildcard()], "jetsched dead letters")
        },
        stream::Config {
            retention: RetentionPolicy::Limits,
            max_age: args.events_max_age,
            max_bytes: args.events_max_bytes,
            max_messages_per_subject: args.events_max_per_subject,
            // Workers store their run events in fast-ingest batches (one reply per batch).
            allow_batch_publish: true,
            ..base(names.events_stream(), vec![names.events_wildcard()], "jetsched events")
        },
        stream::Config {
            retention: RetentionPolicy::Limits,
            max_age: args.events_max_age,
            ..base(
                names.advisories_stream(),
                names.advisory_subjects(),
                "jetsched captured JetStream advisories",
            )
        },
        stream::Config {
            retention: RetentionPolicy::Limits,
            max_age: args.events_max_age,
            ..base(names.alerts_stream(), vec![names.alerts_wildcard()], "jetsched alerts history")
        },
        stream::Config {
            retention: RetentionPolicy::WorkQueue,
            max_age: args.intake_max_age,
            ..base(
                names.control_stream(),
                vec![names.pause_request_wildcard()],
                "jetsched requests from workers to the registry (pause a task)",
            )
        },
    ]
}

/// Creates or converges every bucket and stream; returns handles to the buckets.
///
/// A request JetStream cannot answer yet (no meta leader, placement not possible, timeout) is
/// retried with backoff for up to `args.topology_wait`, then reported as
/// [`TopologyError::Unavailable`] with the last error. Every step is idempotent, so a retry
/// after a create that timed out but happened compares against what it made.
pub async fn ensure(
    js: &jetstream::Context,
    names: &Names,
    args: &TopologyArgs,
) -> Result<Topology, TopologyError> {
    let deadline = tokio::time::Instant::now() + args.topology_wait;
    let retryable = |error: &TopologyError, attempt: u32, pause: Duration| {
        let retry = matches!(error, TopologyError::Nats { .. });
        if retry {
            tracing::warn!(
                error = error as &dyn std::error::Error,
                attempt,
                retry_in = ?pause,
                "JetStream cannot set up the topology yet; retrying"
            );
        }
        retry
    };
    Backoff::new(Duration::from_millis(250), Duration::from_secs(2))
        .retry_until(deadline, |_| ensure_once(js, names, args), retryable)
        .await
        .map_err(|gave_up| match gave_up.error {
            error @ TopologyError::Nats { .. } => TopologyError::Unavailable {
                waited: gave_up.elapsed,
                attempts: gave_up.attempts,
                last: Box::new(error),
            },
            error => error,
        })
}

async fn ensure_once(
    js: &jetstream::Context,
    names: &Names,
    args: &TopologyArgs,
) -> Result<Topology, TopologyError> {
    if args.replicas == 0 || args.replicas > 5 {
        return Err(TopologyError::Invalid {
            setting: "replicas",
            message: format!("{} (use 1..=5)", args.replicas),
        });
    }
    if args.tasks_history < 1 || args.tasks_history > 64 {
        return Err(TopologyError::Invalid {
            setting: "tasks_history",
            message: format!("{} (use 1..=64)", args.tasks_history),
        });
    }
    let mut changes = Vec::new();
    for config in stream_configs(names, args) {
        ensure_stream(js, config, &mut changes).await?;
    }
    let mut stores = Vec::new();
    for config in bucket_configs(names, args) {
        stores.push(ensure_bucket(js, config, &mut changes).await?);
    }
    let mut stores = stores.into_iter();
    let mut next = || stores.next().expect("five buckets");
    Ok(Topology { tasks: next(), leader: next(), state: next(), runs: next(), breakers: next(), changes })
}

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
    check("storage", format!("{:?}", existing.storage), format!("{:?}", desired.storage), false);
    check("retention", format!("{:?}", existing.retention), format!("{:?}", desired.retention), false);
    let mut have = existing.subjects.clone();
    have.sort();
    let mut want = desired.subjects.clone();
    want.sort();
    check("subjects", have.join(","), want.join(","), true);
    check(
        "replicas",
        existing.num_replicas.max(1).to_string(),
        desired.num_replicas.max(1).to_string(),
        true,
    );
    check("max_age", format!("{:?}", existing.max_age), format!("{:?}", desired.max_age), true);
    // The server reports "unlimited" as -1 where a config may say 0.
    let limit = |n: i64| if n <= 0 { -1 } else { n };
    check("max_bytes", limit(existing.max_bytes).to_string(), limit(desired.max_bytes).to_string(), true);
    check("discard", format!("{:?}", existing.discard), format!("{:?}", desired.discard), true);
    check(
        "history",
        limit(existing.max_messages_per_subject).to_string(),
        limit(desired.max_messages_per_subject).to_string(),
        true,
    );
    check(
        "discard_new_per_subject",
        existing.discard_new_per_subject.to_string(),
        desired.discard_new_per_subject.to_string(),
        true,
    );
    // Message schedules can be turned on by an update, never off.
    if desired.allow_message_schedules {
        check(
            "allow_message_schedules",
            existing.allow_message_schedules.to_string(),
            desired.allow_message_schedules.to_string(),
            true,
        );
    }
    // Likewise fast-ingest batches.
    if desired.allow_batch_publish {
        check(
            "allow_batched",
            existing.allow_batch_publish.to_string(),
            desired.allow_batch_publish.to_string(),
            true,
        );
    }
    if !desired.duplicate_window.is_zero() {
        check(
            "duplicate_window",
            format!("{:?}", existing.duplicate_window),
            format!("{:?}", desired.duplicate_window),
            true,
        );
    }
    out
}

fn conflict(resource: &str, diffs: &[Difference]) -> Option<TopologyError> {
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

async fn ensure_stream(
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
fn bucket_as_stream(config: &kv::Config) -> stream::Config {
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

async fn ensure_bucket(
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
