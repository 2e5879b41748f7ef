//! The breaker API, `jetsched.api.breaker.{list,get,reset}`: the circuit breakers the workers
//! keep in `JETSCHED_BREAKERS`, with the tasks whose spec uses each, and their reset.
//!
//! A breaker belongs to a namespace: a task's own (`task.<namespace>.<id>`, named
//! `<namespace>/<id>`) or a key named by tasks of one namespace (`key.<namespace>.<key>`, named
//! `<namespace>:<key>`); a key the workers declare shared (`--shared-breakers`) has one breaker
//! for every namespace (`key.=shared.<key>`, named by its bare key).
//!
//! Requests (JSON):
//! - `list`: `{}` → `{"breakers": [<breaker>...]}` in key order: every record of the bucket,
//!   and every breaker a task's spec names that has no record yet (closed, nothing counted).
//! - `get`: `{"namespace": "billing", "key": "payments-api"}` (a namespace's named breaker),
//!   `{"namespace": "billing", "id": "nightly-report"}` (a task's own), `{"key":
//!   "key.=shared.payments-api"}` (a bucket key as `list` shows it) or `{"key":
//!   "payments-api"}` (the key alone: its shared breaker when one is stored, otherwise the one
//!   namespace's that has it; `bad_request` naming them when several namespaces do) →
//!   `<breaker>`.
//! - `reset`: the same → `{"breaker": <breaker>, "previous_state": "open"}`: the record is
//!   replaced by a closed one with nothing counted (and, for a task's own key, its
//!   consecutive-failure count at 0) with compare-and-set; `breaker.closed` (reason `reset`)
//!   is published when it was not closed. Workers watching the bucket follow within a second.
//!
//! The registry is not told which keys the workers share: a task naming a key is listed under
//! the shared breaker of that key when one is stored, and under its namespace's breaker when
//! that one is stored or no shared one is. A shared breaker spans namespaces, so these
//! endpoints exist only un-namespaced, for administrators.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use chrono::Utc;
use futures::StreamExt;
use jetsched_shared::cas::is_revision_mismatch;
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::{BreakerKey, breaker_named_key, breaker_shared_key, breaker_task_key};
use jetsched_shared::spec::{TaskSpec, validate_id};
use jetsched_shared::wire::{
    BreakerInfo, BreakerListReply, BreakerRecord, BreakerRef, BreakerResetReply, BreakerState, Event,
    EventKind,
};

use crate::breaker_users::{BreakerUsers, Users};
use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;

/// The breaker endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerEndpoint {
    List,
    Get,
    Reset,
}

/// How long reading a whole bucket may take before the request fails `unavailable`.
const SCAN_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times a reset retries a lost compare-and-set race with a worker's merge.
const RESET_ATTEMPTS: usize = 16;

/// What a request addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// One key of the breakers bucket.
    Key(String),
    /// A named breaker's key without its namespace: the shared breaker of that key when one is
    /// stored, otherwise the breaker of the one namespace that has that key.
    Bare(String),
}

/// The breaker a request addresses: a namespace's named breaker, a task's own, a bucket key as
/// `list` shows it, or a key alone.
pub fn resolve(request: &BreakerRef) -> Result<Address, ApiError> {
    match (&request.key, &request.namespace, &request.id) {
        (Some(key), None, None) => {
            if BreakerKey::parse(key).is_some() {
                return Ok(Address::Key(key.clone()));
            }
            validate_key(key)?;
            Ok(Address::Bare(key.clone()))
        }
        (Some(key), Some(namespace), None) => {
            validate_id("namespace", namespace)?;
            validate_key(key)?;
            Ok(Address::Key(breaker_named_key(namespace, key)))
        }
        (None, namespace, Some(id)) => {
            let namespace = namespace.as_deref().unwrap_or("default");
            validate_id("namespace", namespace)?;
            validate_id("id", id)?;
            Ok(Address::Key(breaker_task_key(namespace, id)))
        }
        _ => Err(ApiError::new(
            ErrorCode::BadRequest,
            "give a breaker key (with its namespace, or alone when it is shared or only one \
             namespace uses it), or a task's namespace and id for its own breaker",
        )),
    }
}

fn validate_key(key: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::at(ErrorCode::InvalidId, "key", format!("{key:?} must match [A-Za-z0-9_-]{{1,64}}")))
    }
}

/// The breaker `address` names among `breakers` (every breaker, as `list` shows them).
fn pick(breakers: Vec<BreakerInfo>, address: &Address) -> Result<BreakerInfo, ApiError> {
    let name = match address {
        Address::Key(key) => {
            return breakers
                .into_iter()
                .find(|b| &b.key == key)
                .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no breaker {key}")));
        }
        Address::Bare(name) => name,
    };
    let mut found: Vec<BreakerInfo> = breakers
        .into_iter()
        .filter(|b| BreakerKey::parse(&b.key).and_then(BreakerKey::spec_key) == Some(name.as_str()))
        .collect();
    if let Some(shared) = found.iter().position(|b| b.key == breaker_shared_key(name)) {
        return Ok(found.swap_remove(shared));
    }
    match found.len() {
        0 => Err(ApiError::new(ErrorCode::NotFound, format!("no breaker {name}"))),
        1 => Ok(found.swap_remove(0)),
        _ => {
            let names: Vec<&str> = found.iter().map(|b| b.name.as_str()).collect();
            Err(ApiError::at(
                ErrorCode::BadRequest,
                "namespace",
                format!(
                    "breaker key {name:?} is used in several namespaces ({}): give its namespace too",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// Where the tasks using each key are listed (`users`: bucket key → tasks, as their specs
/// name them; `stored`: whether a key has a record). A task naming key K in namespace N uses
/// `key.N.K`; when the shared `key.=shared.K` is stored (a worker declared K shared) it is
/// listed there, and under `key.N.K` only while that one is stored too.
fn attribute(
    users: BTreeMap<String, Vec<String>>,
    stored: impl Fn(&str) -> bool,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, tasks) in users {
        if let Some(BreakerKey::Named(_, name)) = BreakerKey::parse(&key) {
            let shared = breaker_shared_key(name);
            if stored(&shared) {
                out.entry(shared).or_default().extend(tasks.iter().cloned());
                if !stored(&key) {
                    continue;
                }
            }
        }
        out.entry(key).or_default().extend(tasks);
    }
    for tasks in out.values_mut() {
        tasks.sort();
        tasks.dedup();
    }
    out
}

/// Reads the breakers bucket and the specs that use it.
#[derive(Clone)]
pub struct BreakerApi {
    js: jetstream::Context,
    breakers: kv::Store,
    tasks: kv::Store,
    users: BreakerUsers,
    events: EventSink,
    instance: String,
}

impl BreakerApi {
    pub(crate) fn new(
        js: jetstream::Context,
        breakers: kv::Store,
        tasks: kv::Store,
        events: EventSink,
        instance: String,
        users: BreakerUsers,
    ) -> BreakerApi {
        BreakerApi { js, breakers, tasks, users, events, instance }
    }

    /// Handles one request; returns the reply body.
    pub(crate) async fn handle(&self, endpoint: BreakerEndpoint, payload: &[u8]) -> Result<Vec<u8>, Failure> {
        let request: BreakerRef = decode(payload, Empty::Object, Detail::UnknownField)?;
        match endpoint {
            BreakerEndpoint::List => {
                if request != BreakerRef::default() {
                    return Err(ApiError::new(ErrorCode::BadRequest, "list takes no fields").into());
                }
                encode(&self.list().await?)
            }
            BreakerEndpoint::Get => encode(&self.get(&resolve(&request)?).await?),
            BreakerEndpoint::Reset => encode(&self.reset(&resolve(&request)?).await?),
        }
    }

    /// Every breaker: the bucket's records and those the specs name without a record yet.
    pub async fn list(&self) -> Result<BreakerListReply, Failure> {
        let (records, users) = tokio::try_join!(latest(&self.js, &self.breakers), self.users())?;
        let mut users = attribute(users, |key| records.contains_key(key));
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
    pub async fn get(&self, address: &Address) -> Result<BreakerInfo, Failure> {
        Ok(pick(self.list().await?.breakers, address)?)
    }

    /// Closes a breaker and clears its counts with compare-and-set.
    pub async fn reset(&self, address: &Address) -> Result<BreakerResetReply, Failure> {
        let key = match address {
            Address::Key(key) => key.clone(),
            Address::Bare(_) => self.get(address).await?.key,
        };
        let key = key.as_str();
        let target = BreakerKey::parse(key)
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, format!("bad key {key}")))?;
        let exact = Address::Key(key.to_string());
        for _ in 0..RESET_ATTEMPTS {
            let Some((revision, value)) = self.entry(key).await? else {
                // Nothing stored: it is closed with nothing counted already.
                let breaker = self.get(&exact).await?;
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
                Err(e) => return Err(Failure::unavailable("write breakers bucket", e)),
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
            let breaker = self.get(&exact).await?;
            return Ok(BreakerResetReply { breaker, previous_state: previous.state });
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("breaker {key} is being changed concurrently; retry"),
        )
        .into())
    }

    async fn entry(&self, key: &str) -> Result<Option<(u64, bytes::Bytes)>, Failure> {
        let entry =
            self.breakers.entry(key).await.map_err(|e| Failure::unavailable("read breakers bucket", e))?;
        Ok(entry.filter(|e| e.operation == kv::Operation::Put).map(|e| (e.revision, e.value)))
    }

    /// Bucket key → `<namespace>/<id>` of the tasks using it (sorted): a task's breaker (a
    /// named one in the task's namespace: see [`attribute`] for shared keys), and its own key
    /// when it counts consecutive failures. From the follower of the tasks bucket; read from
    /// the bucket itself while the follower lags.
    async fn users(&self) -> Result<Users, Failure> {
        if let Some(users) = self.users.current(&self.tasks).await {
            return Ok(users);
        }
        let mut users = Users::new();
        for (_, (_, value)) in latest(&self.js, &self.tasks).await? {
            let Ok(spec) = TaskSpec::parse(&value) else { continue };
            let name = format!("{}/{}", spec.namespace, spec.id);
            for key in BreakerUsers::keys_of(&spec) {
                users.entry(key).or_default().push(name.clone());
            }
        }
        users.values_mut().for_each(|tasks| tasks.sort());
        Ok(users)
    }
}

/// The latest live value of every key of a bucket, through one ordered consumer that delivers
/// the last message per key (fast, and consistent with writes that happen meanwhile).
pub(crate) async fn latest(
    js: &jetstream::Context,
    store: &kv::Store,
) -> Result<BTreeMap<String, (u64, bytes::Bytes)>, Failure> {
    let mut out = BTreeMap::new();
    // An empty bucket delivers nothing to a watch: learn first whether there is anything to
    // wait for (a store's own status is the one cached when it was opened).
    let stream =
        js.get_stream(&store.stream_name).await.map_err(|e| Failure::unavailable("read bucket status", e))?;
    if stream.cached_info().state.messages == 0 {
        return Ok(out);
    }
    let mut watch =
        store.watch_with_history(">").await.map_err(|e| Failure::unavailable("watch bucket", e))?;
    let reading = async {
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| Failure::unavailable("read bucket", e))?;
            if entry.operation == kv::Operation::Put {
                out.insert(entry.key.clone(), (entry.revision, entry.value));
            } else {
                out.remove(&entry.key);
            }
            if entry.delta == 0 {
                break;
            }
        }
        Ok::<_, Failure>(())
    };
    tokio::time::timeout(SCAN_TIMEOUT, reading).await.map_err(|_| {
        Failure::from(ApiError::new(ErrorCode::Unavailable, "reading the bucket took too long"))
    })??;
    Ok(out)
}

/// A breaker as the API shows it, from its record (`None`: none stored yet).
fn info(key: &str, entry: Option<(u64, &bytes::Bytes)>, tasks: Vec<String>) -> Option<BreakerInfo> {
    let name = BreakerKey::parse(key)?.name();
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
        opened_runs: if record.state == BreakerState::Closed { 0 } else { record.opened_runs },
        opened_failures: if record.state == BreakerState::Closed { 0 } else { record.opened_failures },
        consecutive_failures: record.consecutive_failures,
        tasks,
        revision,
        updated_at: record.updated_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(key: Option<&str>, namespace: Option<&str>, id: Option<&str>) -> Result<Address, ErrorCode> {
        let request = BreakerRef {
            key: key.map(Into::into),
            namespace: namespace.map(Into::into),
            id: id.map(Into::into),
        };
        resolve(&request).map_err(|e| e.code)
    }

    fn key(key: &str) -> Result<Address, ErrorCode> {
        Ok(Address::Key(key.into()))
    }

    #[test]
    fn a_request_names_a_breaker_by_namespace_and_key_by_task_or_by_key_alone() {
        assert_eq!(by(Some("payments-api"), Some("billing"), None), key("key.billing.payments-api"));
        assert_eq!(by(Some("payments-api"), None, None), Ok(Address::Bare("payments-api".into())));
        assert_eq!(by(Some("key.billing.payments-api"), None, None), key("key.billing.payments-api"));
        assert_eq!(by(Some("key.=shared.payments-api"), None, None), key("key.=shared.payments-api"));
        assert_eq!(by(Some("task.billing.r"), None, None), key("task.billing.r"));
        assert_eq!(by(None, Some("billing"), Some("r")), key("task.billing.r"));
        assert_eq!(by(None, None, Some("r")), key("task.default.r"));
        assert_eq!(by(Some("a b"), None, None), Err(ErrorCode::InvalidId));
        // The earlier un-namespaced bucket key is no key any more.
        assert_eq!(by(Some("key.payments-api"), None, None), Err(ErrorCode::InvalidId));
        assert_eq!(by(Some("k"), Some("=shared"), None), Err(ErrorCode::InvalidId));
        assert_eq!(by(Some("a b"), Some("ns"), None), Err(ErrorCode::InvalidId));
        assert_eq!(by(None, Some("bil ling"), Some("r")), Err(ErrorCode::InvalidId));
        assert_eq!(by(None, None, None), Err(ErrorCode::BadRequest));
        assert_eq!(by(Some("k"), None, Some("r")), Err(ErrorCode::BadRequest));
        assert_eq!(by(Some("k"), Some("ns"), Some("r")), Err(ErrorCode::BadRequest));
    }

    fn listed(key: &str, tasks: &[&str]) -> BreakerInfo {
        info(key, None, tasks.iter().map(|t| t.to_string()).collect()).unwrap()
    }

    #[test]
    fn a_key_alone_is_its_shared_breaker_or_the_only_namespaces() {
        let bare = |name: &str| Address::Bare(name.into());
        let only_billing =
            vec![listed("key.billing.pay", &["billing/a"]), listed("task.demo.pay", &["demo/pay"])];
        assert_eq!(pick(only_billing.clone(), &bare("pay")).unwrap().key, "key.billing.pay");
        assert_eq!(pick(only_billing, &bare("mail")).unwrap_err().code, ErrorCode::NotFound);
        let two = vec![listed("key.billing.pay", &["billing/a"]), listed("key.demo.pay", &["demo/b"])];
        let error = pick(two.clone(), &bare("pay")).unwrap_err();
        assert_eq!((error.code, error.field.as_deref()), (ErrorCode::BadRequest, Some("namespace")));
        assert!(error.message.contains("billing:pay, demo:pay"), "{}", error.message);
        assert_eq!(pick(two.clone(), &Address::Key("key.demo.pay".into())).unwrap().name, "demo:pay");
        let mut with_shared = two;
        with_shared.push(listed("key.=shared.pay", &["billing/a", "demo/b"]));
        let shared = pick(with_shared, &bare("pay")).unwrap();
        assert_eq!((shared.key.as_str(), shared.name.as_str()), ("key.=shared.pay", "pay"));
    }

    #[test]
    fn tasks_naming_a_key_are_listed_under_its_shared_breaker_once_that_is_stored() {
        let users: BTreeMap<String, Vec<String>> = [
            ("key.billing.pay", vec!["billing/a"]),
            ("key.demo.pay", vec!["demo/b", "demo/c"]),
            ("key.demo.mail", vec!["demo/m"]),
            ("task.demo.b", vec!["demo/b"]),
        ]
        .into_iter()
        .map(|(k, t)| (k.to_string(), t.into_iter().map(String::from).collect()))
        .collect();
        let plain = attribute(users.clone(), |_| false);
        assert_eq!(plain, users, "no shared record: every task under its namespace's breaker");
        // Shared `pay` stored, and demo's own record of `pay` from before it was declared shared.
        let stored = ["key.=shared.pay", "key.demo.pay"];
        let attributed = attribute(users, |key| stored.contains(&key));
        let keys: Vec<&str> = attributed.keys().map(String::as_str).collect();
        assert_eq!(keys, ["key.=shared.pay", "key.demo.mail", "key.demo.pay", "task.demo.b"]);
        assert_eq!(attributed["key.=shared.pay"], ["billing/a", "demo/b", "demo/c"]);
        assert_eq!(attributed["key.demo.pay"], ["demo/b", "demo/c"]);
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
        let closed = info("key.ns.pay", Some((8, &value)), vec![]).unwrap();
        assert_eq!((closed.name.as_str(), closed.open_until), ("ns:pay", None));
        let fresh = info("key.=shared.pay", None, vec!["a/b".into()]).unwrap();
        assert_eq!((fresh.state, fresh.revision, fresh.runs), (BreakerState::Closed, 0, 0));
        assert_eq!(fresh.name, "pay");
        assert!(info("other", None, vec![]).is_none());
        assert!(info("key.pay", None, vec![]).is_none(), "the earlier un-namespaced key");
    }
}
