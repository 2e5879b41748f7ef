//! The calendar API, `<prefix>.api.calendar.{put,get,list,delete}` (and `.<namespace>`
//! confined to one namespace): business calendars stored in the calendars bucket with
//! compare-and-set, one key `<namespace>.<name>` each.
//!
//! Requests (JSON):
//! - `put`: the calendar document itself (`{"namespace", "name", "zone", "holidays",
//!   "working_days", "working_hours", "base"}`), with the task `put`'s compare-and-set headers
//!   (`Jetsched-Expected-Revision`, `Jetsched-Create-Only`) → `{"calendar", "revision"}`. A bad
//!   calendar is refused naming every problem; so are bases unknown in its namespace and a
//!   cycle of bases (named `a -> b -> a`).
//! - `get`: `{"namespace", "name"}` → `{"calendar", "revision", "used_by"}`: `used_by` names
//!   the tasks and calendars of the namespace referring to it.
//! - `list`: `{"namespace"?}` → `{"calendars": [...]}` in key order.
//! - `delete`: `{"namespace", "name"}` → `{"namespace", "name", "deleted": true}`; refused
//!   with `conflict` naming its users while a task or another calendar refers to it.
//!
//! A task naming a calendar its namespace does not have is refused at `put` (by the task
//! store). Nothing here stops a `put` of a task and a `delete` of the
//! calendar it names racing each other: the scheduler takes a calendar it does not know as
//! refusing nothing, and `get` shows who still refers to one.

use anyhow::Context as _;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use jetsched_shared::calendar::{Calendar, Calendars};
use jetsched_shared::cas::{self, is_already_exists, is_revision_mismatch, keys_once};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::names::{Names, calendar_key};
use jetsched_shared::spec::{TaskSpec, validate_id};
use jetsched_shared::wire::{
    CalendarDeleteReply, CalendarListReply, CalendarListRequest, CalendarRef, CalendarReply,
};

use crate::codec::{self, Detail, Empty, Limits, check_size, decode, encode};
use crate::failure::Failure;
use crate::scope;
use crate::tasks::Precondition;

/// The calendar endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarEndpoint {
    Put,
    Get,
    List,
    Delete,
}

/// How many times an unconditional write retries a lost compare-and-set race.
const CAS_ATTEMPTS: usize = 16;

/// Reads and writes the calendars bucket; reads the tasks bucket for a calendar's users.
#[derive(Clone)]
pub struct CalendarApi {
    calendars: kv::Store,
    /// The stream behind the calendars bucket, for leader reads (read-your-writes on R3).
    stream: jetstream::stream::Stream<()>,
    bucket: String,
    tasks: kv::Store,
}

/// A stored calendar with its revision.
struct Stored {
    calendar: Calendar,
    revision: u64,
}

fn not_found(namespace: &str, name: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("calendar {namespace}/{name} does not exist"))
}

impl CalendarApi {
    pub async fn new(
        js: &jetstream::Context,
        calendars: kv::Store,
        tasks: kv::Store,
    ) -> anyhow::Result<Self> {
        let bucket = calendars.name.clone();
        let stream = js
            .get_stream_no_info(Names::kv_stream(&bucket))
            .await
            .with_context(|| format!("open the stream of bucket {bucket}"))?;
        Ok(CalendarApi { calendars, stream, bucket, tasks })
    }

    /// Handles one request; confined to `scope` when it came on a namespaced subject.
    pub(crate) async fn handle(
        &self,
        endpoint: CalendarEndpoint,
        scope: Option<&str>,
        limits: Limits,
        payload: &[u8],
        headers: Option<&HeaderMap>,
    ) -> Result<Vec<u8>, Failure> {
        let confined;
        let payload = match scope {
            None => payload,
            Some(namespace) => {
                scope::check_namespace(namespace)?;
                if endpoint == CalendarEndpoint::Put {
                    check_size(payload, limits)?;
                }
                confined = scope::confine_object(namespace, payload)?;
                confined.as_slice()
            }
        };
        match endpoint {
            CalendarEndpoint::Put => {
                let precondition = codec::precondition(headers)?;
                if scope.is_none() {
                    check_size(payload, limits)?;
                }
                let value: serde_json::Value = serde_json::from_slice(payload)
                    .map_err(|e| Failure::caused(ErrorCode::InvalidJson, "invalid calendar", e))?;
                let calendar = Calendar::parse_value(&value)?;
                encode(&self.put(calendar, precondition).await?)
            }
            CalendarEndpoint::Get => {
                let request = address(payload)?;
                encode(&self.get(&request.namespace, &request.name).await?)
            }
            CalendarEndpoint::List => {
                let request: CalendarListRequest = decode(payload, Empty::Object, Detail::Fields)?;
                if let Some(namespace) = &request.namespace {
                    validate_id("namespace", namespace)?;
                }
                encode(&self.list(request.namespace.as_deref()).await?)
            }
            CalendarEndpoint::Delete => {
                let request = address(payload)?;
                encode(&self.delete(&request.namespace, &request.name).await?)
            }
        }
    }

    /// The latest live calendar at `key`, read from the stream leader.
    async fn entry(&self, key: &str) -> Result<Option<Stored>, Failure> {
        let latest = cas::read_leader(&self.stream, &self.bucket, key)
            .await
            .map_err(|e| Failure::unavailable("read calendars bucket", e))?;
        let Some(message) = latest.filter(|m| !m.is_kv_marker()) else { return Ok(None) };
        let value: serde_json::Value = serde_json::from_slice(&message.payload)
            .map_err(|e| Failure::internal(format!("stored calendar {key} is not JSON"), e))?;
        let calendar = Calendar::parse_value(&value)
            .map_err(|e| Failure::internal(format!("stored calendar {key} is not valid"), e))?;
        Ok(Some(Stored { calendar, revision: message.sequence }))
    }

    /// Every stored calendar, or a namespace's, in key order.
    async fn stored(&self, namespace: Option<&str>) -> Result<Vec<Stored>, Failure> {
        let prefix = namespace.map(|ns| format!("{ns}."));
        let mut keys =
            keys_once(&self.calendars).await.map_err(|e| Failure::unavailable("list calendars bucket", e))?;
        keys.retain(|k| prefix.as_deref().is_none_or(|p| k.starts_with(p)));
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(stored) = self.entry(&key).await? {
                out.push(stored);
            }
        }
        Ok(out)
    }

    /// A namespace's calendars, for checks.
    async fn namespace(&self, namespace: &str) -> Result<Calendars, Failure> {
        Ok(Calendars::new(self.stored(Some(namespace)).await?.into_iter().map(|s| s.calendar)))
    }

    async fn conflict(&self, key: &str, expected: Option<u64>) -> Failure {
        let current = match self.entry(key).await {
            Ok(stored) => stored.map_or(0, |s| s.revision),
            Err(failure) => return failure,
        };
        let message = match expected {
            Some(expected) => format!("calendar {key} is at revision {current}, not {expected}"),
            None => format!("calendar {key} already exists (revision {current})"),
        };
        ApiError { current_revision: Some(current), ..ApiError::new(ErrorCode::Conflict, message) }.into()
    }

    /// Stores a calendar with compare-and-set once its bases are known and form no cycle.
    pub async fn put(
        &self,
        calendar: Calendar,
        precondition: Precondition,
    ) -> Result<CalendarReply, Failure> {
        self.namespace(&calendar.namespace).await?.check_bases(&calendar)?;
        let key = calendar.key();
        let body =
            bytes::Bytes::from(serde_json::to_vec(&calendar.to_json()).expect("a calendar serializes"));
        let revision = match precondition {
            Precondition::CreateOnly | Precondition::Revision(0) => {
                match self.calendars.create(&key, body).await {
                    Ok(revision) => revision,
                    Err(e) if is_already_exists(&e) => {
                        let expected = (precondition == Precondition::Revision(0)).then_some(0);
                        return Err(self.conflict(&key, expected).await);
                    }
                    Err(e) => return Err(Failure::unavailable("write calendars bucket", e)),
                }
            }
            Precondition::Revision(expected) => match self.calendars.update(&key, body, expected).await {
                Ok(revision) => revision,
                Err(e) if is_revision_mismatch(&e) => return Err(self.conflict(&key, Some(expected)).await),
                Err(e) => return Err(Failure::unavailable("write calendars bucket", e)),
            },
            Precondition::None => self.put_unconditional(&key, body).await?,
        };
        Ok(CalendarReply { calendar, revision, used_by: None })
    }

    async fn put_unconditional(&self, key: &str, body: bytes::Bytes) -> Result<u64, Failure> {
        let mut expected = 0;
        for _ in 0..CAS_ATTEMPTS {
            match self.calendars.update(key, body.clone(), expected).await {
                Ok(revision) => return Ok(revision),
                Err(e) if is_revision_mismatch(&e) => {}
                Err(e) => return Err(Failure::unavailable("write calendars bucket", e)),
            }
            let latest = cas::read_leader(&self.stream, &self.bucket, key)
                .await
                .map_err(|e| Failure::unavailable("read calendars bucket", e))?;
            expected = latest.map_or(0, |m| m.sequence);
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("calendar {key} is being changed concurrently; retry"),
        )
        .into())
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<CalendarReply, Failure> {
        let stored =
            self.entry(&calendar_key(namespace, name)).await?.ok_or_else(|| not_found(namespace, name))?;
        let used_by = self.users(namespace, name).await?;
        Ok(CalendarReply { calendar: stored.calendar, revision: stored.revision, used_by: Some(used_by) })
    }

    pub async fn list(&self, namespace: Option<&str>) -> Result<CalendarListReply, Failure> {
        let calendars = self.stored(namespace).await?;
        Ok(CalendarListReply {
            calendars: calendars
                .into_iter()
                .map(|s| CalendarReply { calendar: s.calendar, revision: s.revision, used_by: None })
                .collect(),
        })
    }

    /// Deletes a calendar nothing refers to, with compare-and-set on the revision read.
    pub async fn delete(&self, namespace: &str, name: &str) -> Result<CalendarDeleteReply, Failure> {
        let key = calendar_key(namespace, name);
        let stored = self.entry(&key).await?.ok_or_else(|| not_found(namespace, name))?;
        let users = self.users(namespace, name).await?;
        if !users.is_empty() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("calendar {namespace}/{name} is in use by {}; change them first", users.join(", ")),
            )
            .into());
        }
        match self.calendars.delete_expect_revision(&key, Some(stored.revision)).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("wrong last sequence") || e.to_string().contains("10071") => {
                return Err(self.conflict(&key, Some(stored.revision)).await);
            }
            Err(e) => return Err(Failure::unavailable("delete from calendars bucket", e)),
        }
        Ok(CalendarDeleteReply { namespace: namespace.to_string(), name: name.to_string(), deleted: true })
    }

    /// The tasks (`task <ns>/<id>`) and calendars (`calendar <ns>/<name>`) of `namespace`
    /// referring to calendar `name`, sorted.
    async fn users(&self, namespace: &str, name: &str) -> Result<Vec<String>, Failure> {
        let mut users: Vec<String> = self
            .namespace(namespace)
            .await?
            .based_on(name)
            .into_iter()
            .map(|other| format!("calendar {namespace}/{other}"))
            .collect();
        let prefix = format!("{namespace}.");
        let mut keys =
            keys_once(&self.tasks).await.map_err(|e| Failure::unavailable("list tasks bucket", e))?;
        keys.retain(|k| k.starts_with(&prefix));
        for key in keys {
            let entry =
                self.tasks.get(&key).await.map_err(|e| Failure::unavailable("read tasks bucket", e))?;
            // Only a spec that has calendars at all is parsed.
            let Some(value) = entry.filter(|v| mentions_calendars(v)) else { continue };
            let Ok(spec) = TaskSpec::parse(&value) else { continue };
            if spec.calendars.iter().any(|c| c.name == name) {
                users.push(format!("task {}/{}", spec.namespace, spec.id));
            }
        }
        users.sort();
        Ok(users)
    }
}

/// Whether a stored spec mentions `"calendars"` at all (a cheap filter before parsing it).
fn mentions_calendars(value: &[u8]) -> bool {
    value.windows(b"\"calendars\"".len()).any(|w| w == b"\"calendars\"")
}

/// The calendar a `get` or `delete` addresses.
fn address(payload: &[u8]) -> Result<CalendarRef, Failure> {
    let request: CalendarRef = decode(payload, Empty::Refused, Detail::Fields)?;
    let mut problems = Vec::new();
    problems.extend(validate_id("namespace", &request.namespace).err());
    problems.extend(validate_id("name", &request.name).err());
    match ApiErrors::from_vec(problems) {
        Some(errors) => Err(errors.into()),
        None => Ok(request),
    }
}
