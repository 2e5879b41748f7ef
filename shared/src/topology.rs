//! Idempotent creation of every JetStream bucket and stream jetsched uses (README, Architecture).
//!
//! Every service calls [`ensure`] at start-up. A missing resource is created; an existing one
//! with the same settings is left alone; a differing setting that JetStream can change
//! (replicas, ages, sizes, duplicate window, history, subjects) is updated so the deployment
//! converges; a differing setting it cannot change (storage, retention) is a
//! [`TopologyError::Conflict`] naming the resource and the setting.

mod converge;

use std::time::Duration;

use async_nats::jetstream::{
    self, kv,
    stream::{self, DiscardPolicy, RetentionPolicy, StorageType},
};
use clap::{Args, ValueEnum};

pub use self::converge::{Difference, differences};
use self::converge::{ensure_bucket, ensure_stream};
use crate::backoff::Backoff;
use crate::flags::parse_duration;
use crate::names::Names;
use crate::partition::{self, DEFAULT_PARTITIONS};

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
    /// How long start-up keeps retrying while NATS cannot be reached or JetStream cannot answer
    /// (server starting, cluster electing its meta leader, requests timing out); refused
    /// credentials, conflicting or invalid settings fail at once.
    #[arg(long, env = "JETSCHED_TOPOLOGY_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub topology_wait: Duration,
    /// Partitions of the tasks (1..=4096): fixed when the topology is created, recorded in the
    /// dispatch stream's metadata; a service configured with another number refuses to start.
    #[arg(long, env = "JETSCHED_PARTITIONS", default_value_t = DEFAULT_PARTITIONS)]
    pub partitions: u16,
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
            partitions: DEFAULT_PARTITIONS,
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
    /// Queue states (paused or not) set by operators, followed by every worker.
    pub queues: kv::Store,
    /// Cancel markers written by the registry, followed by every worker.
    pub cancels: kv::Store,
    /// Concurrency limits: slots held with leases and runs waiting, shared by every worker.
    pub limits: kv::Store,
    /// Rate-limit state per key, written by workers with compare-and-set.
    pub rates: kv::Store,
    /// De-duplication claims of triggers and submissions, each with its own time to live.
    pub dedupe: kv::Store,
    /// Backfill progress: created by the registry, advanced by the scheduler leader.
    pub backfills: kv::Store,
    /// Business calendars by namespace, written by the registry, followed by the scheduler.
    pub calendars: kv::Store,
    /// Children's waits for their parents' runs, written by the registry.
    pub waits: kv::Store,
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
    // Each claim carries its own time to live (`Nats-TTL`); none outlives the longest.
    let mut dedupe = base(
        names.dedupe_bucket(),
        "jetsched de-duplication keys of triggers and submissions",
        1,
        crate::wire::MAX_DEDUPE_TTL,
    );
    dedupe.limit_markers = Some(Duration::from_secs(1));
    vec![
        base(names.tasks_bucket(), "jetsched task specs", args.tasks_history, Duration::ZERO),
        leader,
        base(names.state_bucket(), "jetsched per-task fire state", 1, Duration::ZERO),
        base(names.runs_bucket(), "jetsched run records", 1, args.runs_ttl),
        base(names.breakers_bucket(), "jetsched circuit breakers and failure counts", 1, Duration::ZERO),
        base(names.queues_bucket(), "jetsched queue states (paused by operators)", 1, Duration::ZERO),
        // A marker lives as long as a run record: a run queued or held longer than that is
        // gone from the runs bucket too.
        base(names.cancels_bucket(), "jetsched cancel markers (runs cancelled on request)", 1, args.runs_ttl),
        base(
            names.limits_bucket(),
            "jetsched concurrency limits (slots, leases, waiting runs)",
            1,
            Duration::ZERO,
        ),
        // Kept without an age: a key's state may lie far ahead (a long backlog of delayed runs).
        base(names.rates_bucket(), "jetsched rate limits (GCRA state per key)", 1, Duration::ZERO),
        dedupe,
        base(names.backfills_bucket(), "jetsched backfill progress", 1, Duration::ZERO),
        // History like the tasks': `nats kv history` shows a calendar's edits.
        base(names.calendars_bucket(), "jetsched business calendars", args.tasks_history, Duration::ZERO),
        // A wait outlives its longest `within` by a day, so a verdict redelivered late still
        // finds the wait it ended.
        base(
            names.waits_bucket(),
            "jetsched children's waits for their parents' runs",
            1,
            crate::spec::MAX_WITHIN + Duration::from_secs(24 * 3600),
        ),
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
            // Runs delayed by an open breaker, and debounced tasks' pending runs, wait in the
            // stream as server-scheduled messages
            // (the server turns rollups on for them; declared so a start finds no difference).
            allow_message_schedules: true,
            allow_rollup: true,
            metadata: [(partition::METADATA_KEY.to_string(), args.partitions.to_string())].into(),
            ..base(
                names.dispatch_stream(),
                vec![
                    names.dispatch_wildcard(),
                    names.lanes_wildcard(),
                    names.delayed_wildcard(),
                    names.debounce_wildcard(),
                ],
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
            // The run history walks one task's events back with direct gets (`multi_last`
            // up to a sequence), which no consumer's pending count slows.
            allow_direct: true,
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
            // Each wait's deadline waits here as a server-scheduled message (`within`).
            allow_message_schedules: true,
            allow_rollup: true,
            ..base(
                names.after_stream(),
                vec![names.after_wildcard()],
                "jetsched deadlines of children's waits",
            )
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
    if let Some(message) = partition::invalid(args.partitions) {
        return Err(TopologyError::Invalid { setting: "partitions", message });
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
    let mut next = || stores.next().expect("one store per bucket config");
    Ok(Topology {
        tasks: next(),
        leader: next(),
        state: next(),
        runs: next(),
        breakers: next(),
        queues: next(),
        cancels: next(),
        limits: next(),
        rates: next(),
        dedupe: next(),
        backfills: next(),
        calendars: next(),
        waits: next(),
        changes,
    })
}
