//! The breaker API, `jetsched.api.breaker.{list,get,reset}`: the circuit breakers the workers
//! keep in `JETSCHED_BREAKERS`, with the tasks whose spec uses each, and their reset.
//!
//! Requests (JSON):
//! - `list`: `{}` → `{"breakers": [<breaker>...]}` in key order: every record of the bucket,
//!   and every breaker a task's spec names that has no record yet (closed, nothing counted).
//! - `get`: `{"key": "payments-api"}` (a named breaker) or `{"namespace": "billing", "id":
//!   "nightly-report"}` (a task's own) → `<breaker>`.
//! - `reset`: the same → `{"breaker": <breaker>, "previous_state": "open"}`: the record is
//!   replaced by a closed one with nothing counted (and, for a task's own key, its
//!   consecutive-failure count at 0) with compare-and-set; `breaker.closed` (reason `reset`)
//!   is published when it was not closed. Workers watching the bucket follow within a second.
//!
//! Breakers span namespaces (a named one is shared by tasks of any namespace), so these
//! endpoints exist only un-namespaced, for administrators.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use chrono::Utc;
use futures::StreamExt;
use jetsched_shared::cas::is_revision_mismatch;
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::{BreakerKey, breaker_named_key, breaker_task_key};
use jetsched_shared::spec::{TaskSpec, validate_id};
use jetsched_shared::wire::{
    BreakerInfo, BreakerListReply, BreakerRecord, BreakerRef, BreakerResetReply, BreakerState, Event,
    EventKind,
};

/// The breaker endpoints, in registration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerEndpoint {
    List,
    Get,
    Reset,
}

impl BreakerEndpoint {
    pub(crate) const ALL: [BreakerEndpoint; 3] =
        [BreakerEndpoint::List, BreakerEndpoint::Get, BreakerEndpoint::Reset];

    /// The last subject token (`jetsched.api.breaker.<name>`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            BreakerEndpoint::List => "list",
            BreakerEndpoint::Get => "get",
            BreakerEndpoint::Reset => "reset",
        }
    }

    /// The micro-service endpoint name and metrics label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            BreakerEndpoint::List => "breaker-list",
            BreakerEndpoint::Get => "breaker-get",
            BreakerEndpoint::Reset => "breaker-reset",
        }
    }
}

/// How long reading a whole bucket may take before the request fails `unavailable`.
const SCAN_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times a reset retries a lost compare-and-set race with a worker's merge.
const RESET_ATTEMPTS: usize = 16;

fn unavailable(what: &str, error: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorCode::Unavailable, format!("{what}: {error}"))
}

/// The bucket key a request addresses: a named breaker's key (or a bucket key as `list` shows
/// it), or a task's own.
pub fn resolve(request: &BreakerRef) -> Result<String, ApiError> {
    match (&request.key, &request.id) {
        (Some(key), None) if request.namespace.is_none() => {
            if BreakerKey::parse(key).is_some() {
                return Ok(key.clone());
            }
            let ok = (1..=64).contains(&key.len())
                && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                return Err(ApiError::at(
                    ErrorCode::InvalidId,
                    "key",
                    format!("{key:?} must match [A-Za-z0-9_-]{{1,64}}"),
                ));
            }
            Ok(breaker_named_key(key))
        }
        (None, Some(id)) => {
            let namespace = request.namespace.as_deref().unwrap_or("default");
            validate_id("namespace", namespace)?;
            validate_id("id", id)?;
            Ok(breaker_task_key(namespace, id))
        }
        _ => Err(ApiError::new(
            ErrorCode::BadRequest,
            "give either a breaker key, or a task's namespace and id for its own breaker",
        )),
    }
}

/// Reads the breakers bucket and the specs that use it.
#[derive(Clone)]
pub struct BreakerApi {
    js: jetstream::Context,
    breakers: kv::Store,
    tasks: kv::Store,
    events: EventSink,
    instance: String,
}

impl BreakerApi {
    pub fn new(
        js: jetstream::Context,
        breakers: kv::Store,
        tasks: kv::Store,
        events: EventSink,
        instance: String,
    ) -> BreakerApi {
        BreakerApi { js, breakers, tasks, events, instance }
    }

    /// Handles one request; returns the reply body.
    pub async fn handle(&self, endpoint: BreakerEndpoint, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
        let payload: &[u8] = if payload.iter().all(u8::is_ascii_whitespace) { b"{}" } else { payload };
        let request: BreakerRef = serde_json::from_slice(payload).map_err(|e| {
            let code = if e.is_syntax() || e.is_eof() {
                ErrorCode::InvalidJson
            } else if e.to_string().starts_with("unknown field") {
                ErrorCode::UnknownField
            } else {
                ErrorCode::BadRequest
            };
            ApiError::new(code, format!("invalid request: {e}"))
        })?;
        let reply = match endpoint {
            BreakerEndpoint::List => {
                if request != BreakerRef::default() {
                    return Err(ApiError::new(ErrorCode::BadRequest, "list takes no fields"));
                }
                serde_json::to_vec(&self.list().await?)
            }
            BreakerEndpoint::Get => serde_json::to_vec(&self.get(&resolve(&request)?).await?),
            BreakerEndpoint::Reset => serde_json::to_vec(&self.reset(&resolve(&request)?).await?),
        };
        reply.map_err(|e| ApiError::new(ErrorCode::Internal, format!("encode reply: {e}")))
    }

    /// Every breaker: the bucket's records and those the specs name without a record yet.
    pub async fn list(&self) -> Result<BreakerListReply, ApiError> {
        let (records, mut users) = tokio::try_join!(latest(&self.js, &self.breakers), self.users())?;
        let mut breakers = Vec::new();
        for (key, (revision, value)) in records {
            let tasks = users.remove(&key).unwrap_or_default();
            if let Some(info) = info(&key, Some((revision, &value)), tasks) {
                breakers.push(info);
            }
        }
        breakers.extend(users.into_iter().filter_map(|(key, tasks)| info(&key, None, tasks)));
        breakers.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(BreakerListReply { breakers })
    }

    /// One breaker; `not_found` when it has no record and no task uses it.
    pub async fn get(&self, key: &str) -> Result<BreakerInfo, ApiError> {
        let (entry, mut users) = tokio::try_join!(self.entry(key), self.users())?;
        let tasks = users.remove(key).unwrap_or_default();
        if entry.is_none() && tasks.is_empty() {
            return Err(ApiError::new(ErrorCode::NotFound, format!("no breaker {key}")));
        }
        let entry = entry.as_ref().map(|(revision, value)| (*revision, value));
        info(key, entry, tasks).ok_or_else(|| ApiError::new(ErrorCode::Internal, format!("bad key {key}")))
    }

    /// Closes a breaker and clears its counts with compare-and-set.
    pub async fn reset(&self, key: &str) -> Result<BreakerResetReply, ApiError> {
        let target = BreakerKey::parse(key)
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, format!("bad key {key}")))?;
        for _ in 0..RESET_ATTEMPTS {
            let Some((revision, value)) = self.entry(key).await? else {
                // Nothing stored: it is closed with nothing counted already.
                let breaker = self.get(key).await?;
                return Ok(BreakerResetReply { breaker, previous_state: BreakerState::Closed });
            };
            let previous: BreakerRecord = serde_json::from_slice(&value).unwrap_or_default();
            let fresh = BreakerRecord {
                updated_at: Some(Utc::now()),
                updated_by: self.instance.clone(),
                ..BreakerRecord::default()
            };
            let body = serde_json::to_vec(&fresh).expect("a record serializes");
            match self.breakers.update(key, body.into(), revision).await {
                Ok(_) => {}
                Err(e) if is_revision_mismatch(&e) => continue,
                Err(e) => return Err(unavailable("write breakers bucket", e)),
            }
            if previous.state != BreakerState::Closed {
                let (runs, failures) = previous.window_counts(Utc::now());
                let (namespace, id) = target.event_target();
                let event = Event {
                    key: Some(key.to_string()),
                    state: Some(BreakerState::Closed.as_str().to_string()),
                    reason: Some("reset".to_string()),
                    runs: Some(runs),
                    failures: Some(failures),
                    failure_rate: Some(previous.failure_rate(Utc::now())),
                    ..Event::new(EventKind::BreakerClosed, namespace, id)
                };
                self.events.emit(event).await;
            }
            tracing::info!(breaker = %key, previous = previous.state.as_str(), "breaker reset");
            let breaker = self.get(key).await?;
            return Ok(BreakerResetReply { breaker, previous_state: previous.state });
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("breaker {key} is being changed concurrently; retry"),
        ))
    }

    async fn entry(&self, key: &str) -> Result<Option<(u64, bytes::Bytes)>, ApiError> {
        let entry = self.breakers.entry(key).await.map_err(|e| unavailable("read breakers bucket", e))?;
        Ok(entry.filter(|e| e.operation == kv::Operation::Put).map(|e| (e.revision, e.value)))
    }

    /// Bucket key → `<namespace>/<id>` of the tasks using it (sorted): a task's breaker, and
    /// its own key when it counts consecutive failures.
    async fn users(&self) -> Result<BTreeMap<String, Vec<String>>, ApiError> {
        let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (_, (_, value)) in latest(&self.js, &self.tasks).await? {
            let Ok(spec) = TaskSpec::parse(&value) else { continue };
            let name = format!("{}/{}", spec.namespace, spec.id);
            let mut keys = Vec::new();
            if let Some(breaker) = &spec.breaker {
                keys.push(breaker.bucket_key(&spec.namespace, &spec.id));
            }
            if spec.pause_after_failures.is_some() {
                keys.push(breaker_task_key(&spec.namespace, &spec.id));
            }
            keys.dedup();
            for key in keys {
                users.entry(key).or_default().push(name.clone());
            }
        }
        users.values_mut().for_each(|tasks| tasks.sort());
        Ok(users)
    }
}

/// The latest live value of every key of a bucket, through one ordered consumer that delivers
/// the last message per key (fast, and consistent with writes that happen meanwhile).
async fn latest(
    js: &jetstream::Context,
    store: &kv::Store,
) -> Result<BTreeMap<String, (u64, bytes::Bytes)>, ApiError> {
    let mut out = BTreeMap::new();
    // An empty bucket delivers nothing to a watch: learn first whether there is anything to
    // wait for (a store's own status is the one cached when it was opened).
    let stream = js.get_stream(&store.stream_name).await.map_err(|e| unavailable("read bucket status", e))?;
    if stream.cached_info().state.messages == 0 {
        return Ok(out);
    }
    let mut watch = store.watch_with_history(">").await.map_err(|e| unavailable("watch bucket", e))?;
    let reading = async {
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| unavailable("read bucket", e))?;
            if entry.operation == kv::Operation::Put {
                out.insert(entry.key.clone(), (entry.revision, entry.value));
            } else {
                out.remove(&entry.key);
            }
            if entry.delta == 0 {
                break;
            }
        }
        Ok::<_, ApiError>(())
    };
    tokio::time::timeout(SCAN_TIMEOUT, reading)
        .await
        .map_err(|_| ApiError::new(ErrorCode::Unavailable, "reading the bucket took too long"))??;
    Ok(out)
}

/// A breaker as the API shows it, from its record (`None`: none stored yet).
fn info(key: &str, entry: Option<(u64, &bytes::Bytes)>, tasks: Vec<String>) -> Option<BreakerInfo> {
    let name = match BreakerKey::parse(key)? {
        BreakerKey::Named(name) => name.to_string(),
        BreakerKey::Task(namespace, id) => format!("{namespace}/{id}"),
    };
    let (revision, record) = match entry {
        Some((revision, value)) => (revision, serde_json::from_slice(value).unwrap_or_default()),
        None => (0, BreakerRecord::default()),
    };
    let now = Utc::now();
    let (runs, failures) = record.window_counts(now);
    Some(BreakerInfo {
        key: key.to_string(),
        name,
        state: record.state,
        failure_rate: record.failure_rate(now),
        runs,
        failures,
        opened_at: record.opened_at.filter(|_| record.state != BreakerState::Closed),
        open_until: record.open_until.filter(|_| record.state != BreakerState::Closed),
        consecutive_failures: record.consecutive_failures,
        tasks,
        revision,
        updated_at: record.updated_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(key: Option<&str>, namespace: Option<&str>, id: Option<&str>) -> Result<String, ErrorCode> {
        let request = BreakerRef {
            key: key.map(Into::into),
            namespace: namespace.map(Into::into),
            id: id.map(Into::into),
        };
        resolve(&request).map_err(|e| e.code)
    }

    #[test]
    fn a_request_names_a_breaker_by_key_or_by_task() {
        assert_eq!(by(Some("payments-api"), None, None), Ok("key.payments-api".into()));
        assert_eq!(by(Some("key.payments-api"), None, None), Ok("key.payments-api".into()));
        assert_eq!(by(Some("task.billing.r"), None, None), Ok("task.billing.r".into()));
        assert_eq!(by(None, Some("billing"), Some("r")), Ok("task.billing.r".into()));
        assert_eq!(by(None, None, Some("r")), Ok("task.default.r".into()));
        assert_eq!(by(Some("a b"), None, None), Err(ErrorCode::InvalidId));
        assert_eq!(by(None, Some("bil ling"), Some("r")), Err(ErrorCode::InvalidId));
        assert_eq!(by(None, None, None), Err(ErrorCode::BadRequest));
        assert_eq!(by(Some("k"), None, Some("r")), Err(ErrorCode::BadRequest));
        assert_eq!(by(Some("k"), Some("ns"), None), Err(ErrorCode::BadRequest));
    }

    #[test]
    fn info_reads_the_record_and_hides_stale_open_times_of_a_closed_breaker() {
        let now = chrono::DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
        let record = BreakerRecord {
            state: BreakerState::Open,
            open_until: Some(now),
            opened_at: Some(now),
            consecutive_failures: 2,
            ..BreakerRecord::default()
        };
        let value = bytes::Bytes::from(serde_json::to_vec(&record).unwrap());
        let open = info("task.ns.t", Some((7, &value)), vec!["ns/t".into()]).unwrap();
        assert_eq!((open.name.as_str(), open.state, open.revision), ("ns/t", BreakerState::Open, 7));
        assert_eq!(open.open_until, Some(now));
        assert_eq!(open.consecutive_failures, 2);
        let closed = BreakerRecord { state: BreakerState::Closed, ..record };
        let value = bytes::Bytes::from(serde_json::to_vec(&closed).unwrap());
        let closed = info("key.pay", Some((8, &value)), vec![]).unwrap();
        assert_eq!((closed.name.as_str(), closed.open_until), ("pay", None));
        let fresh = info("key.pay", None, vec!["a/b".into()]).unwrap();
        assert_eq!((fresh.state, fresh.revision, fresh.runs), (BreakerState::Closed, 0, 0));
        assert!(info("other", None, vec![]).is_none());
    }
}
