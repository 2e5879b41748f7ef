//! Shared test fixtures: a task spec builder, publishing a dispatch as the scheduler does,
//! reading back run records and dead letters, and downstreams that fail (or recover) on
//! demand: a responder of the `nats` executor and a named handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishAckFuture, kv};
use futures::StreamExt;
use jetsched_shared::cas::read_leader;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::{Names, task_key};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{
    BreakerRecord, BreakerState, DeadLetter, Event, EventKind, HDR_EXECUTION_ID, HDR_STATUS, RunRecord,
    RunStatus, scheduled_execution_id,
};
use serde_json::{Value, json};

use crate::{eventually, read_stream};

/// A task spec as JSON, with defaults a test rarely cares about: every hour, a `nats`
/// executor on `jobs.test`, queue `default`. Every setter replaces one top-level field.
///
/// ```
/// let spec = jetsched_tests::spec("billing", "nightly").cron("0 30 2 * * *").handler("report");
/// assert_eq!(spec.json()["executor"]["name"], "report");
/// ```
#[derive(Debug, Clone)]
pub struct SpecBuilder {
    value: Value,
}

/// Starts a [`SpecBuilder`] for task `id` in `namespace`.
pub fn spec(namespace: &str, id: &str) -> SpecBuilder {
    SpecBuilder {
        value: json!({
            "id": id, "namespace": namespace,
            "schedule": {"every": "1h"},
            "executor": {"kind": "nats", "subject": "jobs.test"},
        }),
    }
}

impl SpecBuilder {
    /// Sets (or replaces) any top-level field.
    pub fn field(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.value[name] = value.into();
        self
    }

    /// `schedule: {"cron": expr}` (UTC).
    pub fn cron(self, expr: &str) -> Self {
        self.field("schedule", json!({"cron": expr}))
    }

    /// `schedule: {"cron": expr, "timezone": zone}`.
    pub fn cron_in(self, expr: &str, zone: &str) -> Self {
        self.field("schedule", json!({"cron": expr, "timezone": zone}))
    }

    /// `schedule: {"every": interval}`.
    pub fn every(self, interval: &str) -> Self {
        self.field("schedule", json!({"every": interval}))
    }

    /// Any schedule object.
    pub fn schedule(self, schedule: Value) -> Self {
        self.field("schedule", schedule)
    }

    /// Any executor object.
    pub fn executor(self, executor: Value) -> Self {
        self.field("executor", executor)
    }

    /// An embedded handler registered with the worker under `name`.
    pub fn handler(self, name: &str) -> Self {
        self.executor(json!({"kind": "handler", "name": name}))
    }

    /// A `nats` executor requesting `subject`.
    pub fn nats(self, subject: &str) -> Self {
        self.executor(json!({"kind": "nats", "subject": subject}))
    }

    pub fn queue(self, queue: &str) -> Self {
        self.field("queue", queue)
    }

    pub fn timeout(self, timeout: &str) -> Self {
        self.field("timeout", timeout)
    }

    /// Any retry policy object.
    pub fn retry(self, retry: Value) -> Self {
        self.field("retry", retry)
    }

    /// `max_attempts` attempts 100 ms apart, without jitter.
    pub fn fast_retry(self, max_attempts: u32) -> Self {
        self.retry(json!({
            "max_attempts": max_attempts, "initial": "100ms", "multiplier": 1.0,
            "max_interval": "100ms", "jitter": 0.0,
        }))
    }

    pub fn misfire(self, policy: &str) -> Self {
        self.field("misfire", policy)
    }

    pub fn paused(self, paused: bool) -> Self {
        self.field("paused", paused)
    }

    /// `labels` as `(name, value)` pairs.
    pub fn labels(self, labels: &[(&str, &str)]) -> Self {
        let labels: serde_json::Map<String, Value> =
            labels.iter().map(|(name, value)| (name.to_string(), Value::from(*value))).collect();
        self.field("labels", labels)
    }

    /// Without a top-level field (a spec whose subject names its namespace or id).
    pub fn without(mut self, name: &str) -> Self {
        if let Some(object) = self.value.as_object_mut() {
            object.remove(name);
        }
        self
    }

    /// The spec as JSON.
    pub fn json(&self) -> Value {
        self.value.clone()
    }

    /// The spec as the bytes a client sends.
    pub fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).expect("a JSON value encodes")
    }

    /// The validated spec; panics with the problems when it is invalid.
    pub fn task(&self) -> TaskSpec {
        TaskSpec::parse_value(self.json()).unwrap_or_else(|e| panic!("test spec {}: {e}", self.value))
    }
}

/// Writes `spec` straight into the tasks bucket, without a registry (as one stores it);
/// returns the revision.
pub async fn write_task(tasks: &kv::Store, spec: &SpecBuilder) -> u64 {
    let value = spec.json();
    let (namespace, id) =
        (value["namespace"].as_str().unwrap_or_default(), value["id"].as_str().unwrap_or_default());
    tasks
        .put(task_key(namespace, id), spec.bytes().into())
        .await
        .unwrap_or_else(|e| panic!("write {value}: {e}"))
}

/// Writes twenty tasks `<prefix>-00` to `<prefix>-19` of `namespace` firing every second on
/// `jobs.run` (`fire_all`), their phases spread over the second: some fire is due every 50 ms.
pub async fn write_spread_tasks(tasks: &kv::Store, namespace: &str, prefix: &str) {
    for i in 0..20 {
        let anchor = format!("1970-01-01T00:00:00.{:03}Z", i * 50);
        let task = spec(namespace, &format!("{prefix}-{i:02}"))
            .schedule(json!({"every": "1s", "anchor": anchor}))
            .nats("jobs.run")
            .misfire("fire_all");
        write_task(tasks, &task).await;
    }
}

/// The execution id a worker's request carries in its headers (empty without one).
pub fn execution_id_header(message: &async_nats::Message) -> String {
    message.headers.as_ref().and_then(|h| h.get(HDR_EXECUTION_ID)).map(|v| v.to_string()).unwrap_or_default()
}

/// A downstream of the `nats` executor on one subject: answers every request with the status
/// it is set to (`ok`, `retry` or `fail` in `Jetsched-Status`, the status as the body too) and
/// records each request's execution id. Stops answering when dropped.
pub struct Responder {
    status: Arc<Mutex<&'static str>>,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    /// Answers requests on `subject` with `status` from now on (the subscription is flushed).
    pub async fn start(client: &async_nats::Client, subject: &str, status: &'static str) -> Responder {
        let mut sub = client.subscribe(subject.to_string()).await.expect("subscribe the responder");
        client.flush().await.expect("flush the responder's subscription");
        let status = Arc::new(Mutex::new(status));
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let (answer, seen, client) = (status.clone(), requests.clone(), client.clone());
        let task = tokio::spawn(async move {
            while let Some(request) = sub.next().await {
                seen.lock().expect("requests").push(execution_id_header(&request));
                let Some(reply) = request.reply else { continue };
                let status = *answer.lock().expect("status");
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(HDR_STATUS, status);
                let _ = client.publish_with_headers(reply, headers, status.into()).await;
            }
        });
        Responder { status, requests, task }
    }

    /// Answers `status` from now on.
    pub fn set_status(&self, status: &'static str) {
        *self.status.lock().expect("status") = status;
    }

    /// The execution id of every request so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A named handler whose downstream fails until it recovers: while failing, every run fails
/// permanently with its reason; after, every run succeeds. Clones share the switch.
#[derive(Clone)]
pub struct Flaky {
    failing: Arc<AtomicBool>,
    reason: &'static str,
}

impl Flaky {
    /// Failing with `reason` until [`Flaky::set_failing`] says otherwise.
    pub fn failing(reason: &'static str) -> Flaky {
        Flaky { failing: Arc::new(AtomicBool::new(true)), reason }
    }

    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl jetsched_worker::Handler for Flaky {
    fn call(
        &self,
        _run: jetsched_worker::RunContext,
    ) -> futures::future::BoxFuture<'static, jetsched_worker::Outcome> {
        let outcome = if self.failing.load(Ordering::SeqCst) {
            jetsched_worker::Outcome::permanent(self.reason)
        } else {
            jetsched_worker::Outcome::ok()
        };
        Box::pin(std::future::ready(outcome))
    }
}

/// The execution id of the scheduled fire of `spec` at `nominal_ms`.
pub fn execution_of(spec: &TaskSpec, nominal_ms: i64) -> String {
    scheduled_execution_id(&spec.namespace, &spec.id, nominal_ms)
}

/// Publishes the scheduled dispatch of `spec` at `nominal_ms` (term 1, revision 1) with the
/// body, headers and message id the scheduler sends; returns the ack future.
pub async fn publish_dispatch(
    js: &jetstream::Context,
    names: &Names,
    spec: &TaskSpec,
    nominal_ms: i64,
) -> PublishAckFuture {
    let origin = Origin::Scheduled { nominal_ms, term: 1, catchup: false };
    let built =
        dispatch::build(names, Target::of(spec, 1), origin, SpecBody::Spec(spec)).expect("encode dispatch");
    js.send_publish(built.subject, built.message).await.expect("publish dispatch")
}

/// [`publish_dispatch`] and wait until the stream stored it; returns the execution id.
pub async fn dispatch(js: &jetstream::Context, names: &Names, spec: &TaskSpec, nominal_ms: i64) -> String {
    publish_dispatch(js, names, spec, nominal_ms).await.await.expect("dispatch stored");
    execution_of(spec, nominal_ms)
}

/// The run record of `execution_id`, if there is one.
pub async fn run_record(js: &jetstream::Context, names: &Names, execution_id: &str) -> Option<RunRecord> {
    let bucket = js.get_key_value(names.runs_bucket()).await.ok()?;
    let value = bucket.get(execution_id).await.ok()??;
    Some(serde_json::from_slice(&value).expect("run record decodes"))
}

/// Waits until the run record of `execution_id` has `status`; returns it.
pub async fn wait_run_status(
    js: &jetstream::Context,
    names: &Names,
    execution_id: &str,
    status: RunStatus,
    timeout: Duration,
) -> RunRecord {
    eventually(timeout, &format!("run {execution_id} is {}", status.as_str()), || async {
        match run_record(js, names, execution_id).await {
            Some(record) if record.status == status => Ok(record),
            other => Err(other.map(|record| record.status)),
        }
    })
    .await
}

/// Every run record by execution id, read key by key (an ordered watch can stall while a
/// cluster node restarts; a partial read must never pass for a complete one) from the bucket
/// stream's leader: a direct get may be answered by a replica still catching up after a
/// partition, with a value the record has since moved past.
pub async fn run_records(runs: &kv::Store) -> Result<HashMap<String, RunRecord>, String> {
    let keys: Vec<String> = runs
        .keys()
        .await
        .map_err(|e| format!("list run keys: {e}"))?
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("list run keys: {e}"))?;
    let mut records = HashMap::new();
    for key in keys {
        let latest =
            read_leader(&runs.stream, &runs.name, &key).await.map_err(|e| format!("get run {key}: {e}"))?;
        let Some(message) = latest.filter(|message| !message.is_kv_marker()) else { continue };
        let record: RunRecord =
            serde_json::from_slice(&message.payload).map_err(|e| format!("run {key}: {e}"))?;
        records.insert(record.execution_id.clone(), record);
    }
    Ok(records)
}

/// A dead letter of the task `spec` (JSON) as a worker stores it: execution `execution_id`
/// of queue `default`, failed for good after no attempt.
pub fn dead_letter_entry(spec: &Value, execution_id: &str) -> Value {
    json!({
        "execution_id": execution_id, "namespace": spec["namespace"], "task_id": spec["id"],
        "queue": "default", "nominal_time": "2026-01-01T00:00:00.000Z", "trigger": "schedule",
        "term": 1, "revision": 1, "spec": spec,
        "reason": "failed for good", "source": "verdict", "dead_at": "2026-01-01T00:00:01.000Z",
        "worker": "w1", "attempts": [], "dispatch_sequence": 1,
    })
}

/// Stores `entry` in the dead-letter stream on `subject` (a worker's, or any other); the
/// stream's answer: the sequence, or why it refused.
pub async fn store_dead_letter(
    js: &jetstream::Context,
    subject: String,
    entry: &Value,
) -> Result<u64, jetstream::context::PublishError> {
    Ok(js.publish(subject, entry.to_string().into()).await?.await?.sequence)
}

/// Every entry of the dead-letter stream, oldest first.
pub async fn dead_letters(js: &jetstream::Context, names: &Names) -> Vec<DeadLetter> {
    let mut stream = js.get_stream(names.dlq_stream()).await.expect("DLQ stream");
    let state = stream.info().await.expect("DLQ info").state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return out;
    }
    for seq in state.first_sequence..=state.last_sequence {
        if let Ok(message) = stream.get_raw_message(seq).await {
            out.push(serde_json::from_slice(&message.payload).expect("dead letter decodes"));
        }
    }
    out
}

/// Waits until the dead letter of `execution_id` is stored; returns it.
pub async fn dead_letter_of(
    js: &jetstream::Context,
    names: &Names,
    execution_id: &str,
    timeout: Duration,
) -> DeadLetter {
    eventually(timeout, &format!("dead letter of {execution_id}"), || async {
        dead_letters(js, names).await.into_iter().find(|entry| entry.execution_id == execution_id)
    })
    .await
}

/// Every event of `kind` about `(namespace, id)` stored so far in the events stream (read
/// within `within`).
pub async fn events_about(
    js: &jetstream::Context,
    kind: EventKind,
    namespace: &str,
    id: &str,
    within: Duration,
) -> Vec<Event> {
    read_stream(js, &Names::default().events_stream(), within)
        .await
        .expect("read events")
        .iter()
        .filter_map(|m| serde_json::from_slice::<Event>(&m.payload).ok())
        .filter(|e| e.kind == kind && e.namespace == namespace && e.task_id == id)
        .collect()
}

/// Stores the breaker `key` (a bucket key: `task.<namespace>.<id>`, `key.<namespace>.<key>`)
/// open for `open_for` from now, as a worker writes it when 8 of 10 attempts failed; returns
/// the record.
pub async fn open_breaker(js: &jetstream::Context, key: &str, open_for: Duration) -> BreakerRecord {
    let names = Names::default();
    let breakers = js.get_key_value(names.breakers_bucket()).await.expect("breakers bucket");
    let record = BreakerRecord {
        state: BreakerState::Open,
        open_until: Some(chrono::Utc::now() + open_for),
        opened_runs: 10,
        opened_failures: 8,
        ..BreakerRecord::default()
    };
    breakers
        .put(key, serde_json::to_vec(&record).expect("a record encodes").into())
        .await
        .expect("record stored");
    record
}

/// Handlers with one handler, `name`, that notes `note(&run)` of every run it is given (in the
/// order they came), then answers as `answer` does; returns the handlers and the notes.
pub fn noting<T, Fut>(
    name: &str,
    note: impl Fn(&jetsched_worker::RunContext) -> T + Send + Sync + 'static,
    answer: impl Fn(jetsched_worker::RunContext) -> Fut + Send + Sync + 'static,
) -> (jetsched_worker::Handlers, Arc<Mutex<Vec<T>>>)
where
    T: Send + 'static,
    Fut: std::future::Future<Output = jetsched_worker::Outcome> + Send + 'static,
{
    let notes = Arc::new(Mutex::new(Vec::new()));
    let seen = notes.clone();
    let handlers =
        jetsched_worker::Handlers::new().register(name, move |run: jetsched_worker::RunContext| {
            seen.lock().expect("notes lock").push(note(&run));
            answer(run)
        });
    (handlers, notes)
}
