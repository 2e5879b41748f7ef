//! The task store: every write to the tasks bucket goes through here, with compare-and-set,
//! and each change emits its event. Used by the API and by the intake consumer.

use std::collections::BTreeMap;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use jetsched_shared::cas::{self, is_already_exists, is_revision_mismatch, keys_once};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode, ErrorReply};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::{Names, breaker_task_key, task_key};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{
    BreakerRecord, DeleteReply, Event, EventKind, ListReply, ListRequest, TaskReply,
};

use crate::failure::Failure;
use crate::quota::Quotas;

mod checks;
mod claim;
mod debounce;
mod graph;
pub mod trigger;

/// What a `put` requires of the stored revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Write whatever is stored.
    None,
    /// Fail with `conflict` when the task exists.
    CreateOnly,
    /// Fail with `conflict` unless the stored revision is this one (0 = must not exist).
    Revision(u64),
}

/// How many times a conflict reply re-reads a revision that has not caught up yet.
const CONFLICT_READ_ATTEMPTS: usize = 40;

/// How many times an unconditional write retries a lost compare-and-set race.
const CAS_ATTEMPTS: usize = 16;

/// What `put` stored: the canonical spec JSON exactly as written, its revision, and whether
/// the task was new or changed.
#[derive(Debug, Clone)]
pub struct Stored {
    pub body: bytes::Bytes,
    pub revision: u64,
    pub kind: EventKind,
}

impl Stored {
    /// The reply of `put`, `{"task": <spec>, "revision": n}`, built from the stored bytes
    /// without serializing the spec a second time.
    pub fn reply_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 40);
        out.extend_from_slice(b"{\"task\":");
        out.extend_from_slice(&self.body);
        out.extend_from_slice(format!(",\"revision\":{}}}", self.revision).as_bytes());
        out
    }
}

/// The latest value of a key, read from the stream leader.
pub struct Latest {
    pub key: String,
    pub value: bytes::Bytes,
    pub revision: u64,
}

#[derive(Clone)]
pub struct TaskStore {
    js: jetstream::Context,
    tasks: kv::Store,
    /// The stream behind the tasks bucket, for leader reads (read-your-writes on R3).
    tasks_stream: jetstream::stream::Stream<()>,
    tasks_bucket: String,
    state: kv::Store,
    /// The breakers bucket: a resumed task's consecutive-failure count starts over there.
    breakers: kv::Store,
    /// The calendars bucket: the calendars a task names must exist in its namespace.
    calendars: kv::Store,
    names: Names,
    events: EventSink,
    /// `jetsched_task_changes_total{kind}`.
    changes: prometheus::IntCounterVec,
    quotas: Quotas,
    flow: Flow,
    /// Dependencies: the graph the checks of `after` read, and the verdicts consumer a child
    /// needs before its `put` answers.
    after: Option<crate::after::After>,
    /// Whether `after` may name parents of other namespaces.
    after_across_namespaces: bool,
}

/// The streams flow control reads: the de-duplication bucket's (leader reads of claims) and
/// the dispatch stream (debounced tasks' pending runs).
#[derive(Clone)]
struct Flow {
    dedupe_bucket: String,
    dedupe_stream: jetstream::stream::Stream<()>,
    dispatch_stream: jetstream::stream::Stream<()>,
}

/// A task written by someone else meanwhile, every attempt.
fn concurrently(key: &str) -> Failure {
    ApiError::new(ErrorCode::Unavailable, format!("task {key} is being changed concurrently; retry")).into()
}

fn not_found(namespace: &str, id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("task {namespace}/{id} does not exist"))
}

fn decode(entry: &Latest) -> Result<TaskSpec, Failure> {
    TaskSpec::parse(&entry.value)
        .map_err(|e| Failure::internal(format!("stored spec {} is not valid", entry.key), e))
}

impl TaskStore {
    #[allow(clippy::too_many_arguments, reason = "one handle per bucket the store reads or writes")]
    pub async fn new(
        js: jetstream::Context,
        tasks: kv::Store,
        state: kv::Store,
        breakers: kv::Store,
        calendars: kv::Store,
        names: Names,
        events: EventSink,
        changes: prometheus::IntCounterVec,
    ) -> anyhow::Result<TaskStore> {
        let tasks_bucket = names.tasks_bucket();
        let tasks_stream = js
            .get_stream_no_info(Names::kv_stream(&tasks_bucket))
            .await
            .with_context(|| format!("open the stream of bucket {tasks_bucket}"))?;
        let dedupe_bucket = names.dedupe_bucket();
        let flow = Flow {
            dedupe_stream: js
                .get_stream_no_info(Names::kv_stream(&dedupe_bucket))
                .await
                .with_context(|| format!("open the stream of bucket {dedupe_bucket}"))?,
            dispatch_stream: js
                .get_stream_no_info(names.dispatch_stream())
                .await
                .context("open the dispatch stream")?,
            dedupe_bucket,
        };
        Ok(TaskStore {
            js,
            tasks,
            tasks_stream,
            tasks_bucket,
            state,
            breakers,
            calendars,
            names,
            events,
            changes,
            quotas: Quotas::default(),
            flow,
            after: None,
            after_across_namespaces: false,
        })
    }

    /// The store with the operator's quotas per namespace (none by default).
    pub fn with_quotas(self, quotas: Quotas) -> TaskStore {
        TaskStore { quotas, ..self }
    }

    /// The store with the dependency engine `after` checks and starts; `across_namespaces`:
    /// whether a task may wait for tasks of other namespaces.
    pub(crate) fn with_after(self, after: crate::after::After, across_namespaces: bool) -> TaskStore {
        TaskStore { after: Some(after), after_across_namespaces: across_namespaces, ..self }
    }

    /// The latest live value of a key. Read from the stream leader, not with a direct get: on
    /// a replicated bucket a direct get may be served by a replica that has not yet applied
    /// the write a client just made.
    async fn entry(&self, key: &str) -> Result<Option<Latest>, Failure> {
        Ok(self.read_leader(key).await?.and_then(|(latest, live)| live.then_some(latest)))
    }

    /// The latest message of a key from the stream leader, and whether it is a live value
    /// (not a delete or purge marker).
    async fn read_leader(&self, key: &str) -> Result<Option<(Latest, bool)>, Failure> {
        let latest = cas::read_leader(&self.tasks_stream, &self.tasks_bucket, key)
            .await
            .map_err(|e| Failure::unavailable("read tasks bucket", e))?;
        Ok(latest.map(|message| {
            let live = !message.is_kv_marker();
            (Latest { key: key.to_string(), value: message.payload, revision: message.sequence }, live)
        }))
    }

    async fn current_revision(&self, key: &str) -> u64 {
        self.entry(key).await.ok().flatten().map(|e| e.revision).unwrap_or(0)
    }

    async fn conflict(&self, key: &str, expected: Option<u64>) -> ApiError {
        // On a replicated bucket the leader rejects a write against the newest *proposed*
        // revision, which reads show only once it is applied: wait (briefly) until the read
        // shows something other than what the client expected, so the reply is useful.
        let mut current = self.current_revision(key).await;
        for _ in 0..CONFLICT_READ_ATTEMPTS {
            if current != expected.unwrap_or(0) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            current = self.current_revision(key).await;
        }
        let message = match expected {
            Some(expected) => format!("task {key} is at revision {current}, not {expected}"),
            None => format!("task {key} already exists (revision {current})"),
        };
        ApiError { current_revision: Some(current), ..ApiError::new(ErrorCode::Conflict, message) }
    }

    /// Queues the event of a change; the event pump stores it in order, without adding a
    /// round trip to the request.
    async fn emit(&self, event: Event) {
        self.changes.with_label_values(&[event.kind.as_str()]).inc();
        self.events.emit(event).await;
    }

    /// Emits `task.rejected` for a submission that could not be applied: `error` is the first
    /// problem's message, `reason` the reply an API `put` would have given (`{"error": {...},
    /// "errors": [...]}`, every problem with its field path).
    pub async fn reject(&self, namespace: &str, id: &str, errors: &ApiErrors) {
        let error = errors.first();
        let event = Event {
            error: Some(error.message.clone()),
            reason: Some(
                serde_json::to_string(&ErrorReply::new(errors)).unwrap_or_else(|_| error.code.to_string()),
            ),
            ..Event::new(EventKind::TaskRejected, namespace, id)
        };
        self.emit(event).await;
    }

    /// Stores an admitted spec; returns the stored task and whether it was new or changed.
    pub async fn put(&self, spec: TaskSpec, precondition: Precondition) -> Result<Stored, Failure> {
        crate::spans::task(&spec.namespace, &spec.id);
        // A `nats` executor never reaches into the server's or jetsched's own subjects.
        spec.executor.check_confined(&self.names)?;
        self.check_calendars(&spec).await?;
        self.check_after(&spec).await?;
        let key = spec.key();
        let body = bytes::Bytes::from(serde_json::to_vec(&spec.to_json()).expect("a spec serializes"));
        self.quotas.check_spec_bytes(&spec.namespace, body.len())?;
        // A write that may create a task counts the namespace's tasks first, one creation of
        // the namespace at a time; an update of a known revision never adds one.
        let creation = match precondition {
            Precondition::Revision(expected) if expected > 0 => None,
            _ => self.quotas.creation_lock(&spec.namespace),
        };
        let _creating = match &creation {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        if creation.is_some() && self.entry(&key).await?.is_none() {
            let client = self.js.client();
            let count =
                cas::count_live_keys(&self.tasks_stream, &client, &self.tasks_bucket, &spec.namespace)
                    .await
                    .map_err(|e| Failure::unavailable("count the namespace's tasks", e))?;
            self.quotas.check_tasks(&spec.namespace, count)?;
        }
        let (revision, kind) = match precondition {
            Precondition::CreateOnly | Precondition::Revision(0) => {
                match self.tasks.create(&key, body.clone()).await {
                    Ok(revision) => (revision, EventKind::TaskRegistered),
                    Err(e) if is_already_exists(&e) => {
                        let expected = (precondition == Precondition::Revision(0)).then_some(0);
                        return Err(self.conflict(&key, expected).await.into());
                    }
                    Err(e) => return Err(Failure::unavailable("write tasks bucket", e)),
                }
            }
            Precondition::Revision(expected) => match self.tasks.update(&key, body.clone(), expected).await {
                Ok(revision) => (revision, EventKind::TaskUpdated),
                Err(e) if is_revision_mismatch(&e) => {
                    return Err(self.conflict(&key, Some(expected)).await.into());
                }
                Err(e) => return Err(Failure::unavailable("write tasks bucket", e)),
            },
            Precondition::None => self.put_unconditional(&key, body.clone()).await?,
        };
        let event = Event { revision: Some(revision), ..Event::new(kind, &spec.namespace, &spec.id) };
        self.emit(event).await;
        Ok(Stored { body, revision, kind })
    }

    /// The calendars bucket (read by the `next` preview).
    pub(crate) fn calendars(&self) -> &kv::Store {
        &self.calendars
    }

    async fn put_unconditional(&self, key: &str, body: bytes::Bytes) -> Result<(u64, EventKind), Failure> {
        // Registering a new task is the common case: one write when the key was never used.
        // (`kv::Store::create` would read the key back after any failure; we read once.)
        // `expected` is the revision to write over and whether it holds a live spec.
        let mut expected = (0, false);
        for attempt in 0..CAS_ATTEMPTS {
            match self.tasks.update(key, body.clone(), expected.0).await {
                Ok(revision) => {
                    let kind = if expected.1 { EventKind::TaskUpdated } else { EventKind::TaskRegistered };
                    return Ok((revision, kind));
                }
                Err(e) if is_revision_mismatch(&e) => {}
                Err(e) => return Err(Failure::unavailable("write tasks bucket", e)),
            }
            // Someone wrote the key: learn its revision. A direct get is cheap but may lag on a
            // replicated bucket; after a first miss, ask the stream leader.
            expected = if attempt == 0 {
                self.tasks
                    .entry(key)
                    .await
                    .map_err(|e| Failure::unavailable("read tasks bucket", e))?
                    .map(|e| (e.revision, e.operation == kv::Operation::Put))
            } else {
                self.read_leader(key).await?.map(|(latest, live)| (latest.revision, live))
            }
            .unwrap_or((0, false));
        }
        Err(concurrently(key))
    }

    pub async fn get(&self, namespace: &str, id: &str) -> Result<TaskReply, Failure> {
        let entry = self.entry(&task_key(namespace, id)).await?.ok_or_else(|| not_found(namespace, id))?;
        Ok(TaskReply {
            task: decode(&entry)?,
            revision: entry.revision,
            status: None,
            waiting_children: Vec::new(),
        })
    }

    /// Sets each task's status (state, fires, recent outcomes) in a few batched reads.
    pub async fn fill_status(&self, tasks: &mut [TaskReply]) -> Result<(), Failure> {
        crate::status::fill(&self.js.client(), &self.names, &self.calendars, tasks).await
    }

    /// Lists tasks in key order, filtered by namespace and labels, one page at a time.
    pub async fn list(&self, request: &ListRequest) -> Result<ListReply, Failure> {
        let limit = request.limit.unwrap_or(100).clamp(1, 1000);
        let prefix = request.namespace.as_ref().map(|ns| format!("{ns}."));
        let mut keys =
            keys_once(&self.tasks).await.map_err(|e| Failure::unavailable("list tasks bucket", e))?;
        keys.retain(|k| prefix.as_deref().is_none_or(|p| k.starts_with(p)));
        keys.retain(|k| request.cursor.as_deref().is_none_or(|c| k.as_str() > c));
        let mut tasks = Vec::new();
        let mut next_cursor = None;
        for key in keys {
            if tasks.len() == limit {
                next_cursor = tasks.last().map(|t: &TaskReply| t.task.key());
                break;
            }
            let Some(entry) = self.entry(&key).await? else { continue };
            let task = decode(&entry)?;
            if matches_labels(&task.labels, &request.labels) {
                tasks.push(TaskReply {
                    task,
                    revision: entry.revision,
                    status: None,
                    waiting_children: Vec::new(),
                });
            }
        }
        Ok(ListReply { tasks, next_cursor })
    }

    pub async fn delete(&self, namespace: &str, id: &str) -> Result<DeleteReply, Failure> {
        crate::spans::task(namespace, id);
        let key = task_key(namespace, id);
        let entry = self.entry(&key).await?.ok_or_else(|| not_found(namespace, id))?;
        match self.tasks.delete_expect_revision(&key, Some(entry.revision)).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("wrong last sequence") || e.to_string().contains("10071") => {
                return Err(self.conflict(&key, Some(entry.revision)).await.into());
            }
            Err(e) => return Err(Failure::unavailable("delete from tasks bucket", e)),
        }
        // Fire state of a deleted task must not make a re-created task catch up on old fires.
        if let Err(error) = self.state.purge(&key).await {
            tracing::warn!(%error, task = %key, "fire state not purged");
        }
        self.emit(Event {
            revision: Some(entry.revision),
            ..Event::new(EventKind::TaskDeleted, namespace, id)
        })
        .await;
        Ok(DeleteReply {
            namespace: namespace.to_string(),
            id: id.to_string(),
            deleted: true,
            waiting_children: self.waiting_children(namespace, id),
        })
    }

    /// Pauses a task with compare-and-set, recording `reason` (`paused_reason`) and giving it to
    /// the `task.paused` event; a task already paused is returned unchanged (its reason kept),
    /// without a new revision or event.
    pub async fn pause(&self, namespace: &str, id: &str, reason: Option<&str>) -> Result<TaskReply, Failure> {
        self.set_paused(namespace, id, true, reason).await
    }

    /// Resumes a task with compare-and-set and clears its `paused_reason`; a running task is
    /// returned unchanged, without a new revision or event.
    pub async fn resume(&self, namespace: &str, id: &str) -> Result<TaskReply, Failure> {
        self.set_paused(namespace, id, false, None).await
    }

    async fn set_paused(
        &self,
        namespace: &str,
        id: &str,
        paused: bool,
        reason: Option<&str>,
    ) -> Result<TaskReply, Failure> {
        crate::spans::task(namespace, id);
        let key = task_key(namespace, id);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self.entry(&key).await?.ok_or_else(|| not_found(namespace, id))?;
            let mut task = decode(&entry)?;
            let waiting_children = if paused { self.waiting_children(namespace, id) } else { Vec::new() };
            if task.paused == paused && (paused || task.paused_reason.is_none()) {
                return Ok(TaskReply { task, revision: entry.revision, status: None, waiting_children });
            }
            task.paused = paused;
            task.paused_reason = reason.filter(|_| paused).map(str::to_owned);
            let body = bytes::Bytes::from(serde_json::to_vec(&task.to_json()).expect("a spec serializes"));
            match self.tasks.update(&key, body, entry.revision).await {
                Ok(revision) => {
                    let kind = if paused { EventKind::TaskPaused } else { EventKind::TaskResumed };
                    let event = Event {
                        revision: Some(revision),
                        reason: task.paused_reason.clone(),
                        ..Event::new(kind, namespace, id)
                    };
                    self.emit(event).await;
                    if !paused {
                        self.restart_failure_count(namespace, id).await;
                    }
                    return Ok(TaskReply { task, revision, status: None, waiting_children });
                }
                Err(e) if is_revision_mismatch(&e) => continue,
                Err(e) => return Err(Failure::unavailable("write tasks bucket", e)),
            }
        }
        Err(concurrently(&key))
    }

    /// Starts a resumed task's consecutive-failure count over (in its own breaker record), so
    /// `pause_after_failures` counts from its resumption; the breaker's state is left alone. A
    /// failure here is logged: the task is resumed either way.
    async fn restart_failure_count(&self, namespace: &str, id: &str) {
        let key = breaker_task_key(namespace, id);
        for _ in 0..CAS_ATTEMPTS {
            let entry = match self.breakers.entry(&key).await {
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => entry,
                Ok(_) => return,
                Err(error) => {
                    tracing::warn!(%error, breaker = %key, "failure count not restarted");
                    return;
                }
            };
            let Ok(mut record) = serde_json::from_slice::<BreakerRecord>(&entry.value) else { return };
            if record.consecutive_failures == 0 {
                return;
            }
            record.consecutive_failures = 0;
            let body = serde_json::to_vec(&record).expect("a record serializes");
            match self.breakers.update(&key, body.into(), entry.revision).await {
                Ok(_) => return,
                Err(e) if is_revision_mismatch(&e) => continue,
                Err(error) => {
                    tracing::warn!(%error, breaker = %key, "failure count not restarted");
                    return;
                }
            }
        }
    }
}

fn matches_labels(labels: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}
