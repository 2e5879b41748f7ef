//! Backfill endpoints, `<prefix>.api.backfill.{start,status,list,cancel}` (and their
//! namespaced forms `<...>.<namespace>`, so a team starts and sees only its own backfills).
//!
//! `start` checks the request against the stored task (every problem named at once: an unknown
//! task, a bad or reversed range, too many nominal times, `max_active` out of range) and
//! creates the backfill's progress record in the backfills bucket; the scheduler leader
//! follows that bucket and dispatches. `cancel` stops a running backfill with compare-and-set
//! (the batch the leader is dispatching finishes; no further one starts). Nothing is written
//! for a refused request.

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use jetsched_shared::backfill::progress::{BackfillProgress, BackfillRequest, DEFAULT_MAX_ACTIVE};
use jetsched_shared::backfill::{BackfillOverlap, Reprocess};
use jetsched_shared::cas::{is_revision_mismatch, live};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::Names;
use jetsched_shared::spec::{TaskSpec, validate_id};
use jetsched_shared::wire::{Event, EventKind};
use serde::{Deserialize, Serialize};

use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;
use crate::scope::{check_namespace, mismatch, same_namespace};

/// Compare-and-set rounds before a cancel gives up.
const CAS_ROUNDS: usize = 8;
/// The most backfills one `list` answers.
const MAX_LISTED: usize = 1_000;

/// The backfill endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackfillEndpoint {
    Start,
    Status,
    List,
    Cancel,
}

/// `start`: the task, the range and the options, each read and checked on its own so that a
/// refusal names every problem.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    namespace: Option<String>,
    id: Option<String>,
    from: Option<String>,
    to: Option<String>,
    reprocess: Option<Reprocess>,
    max_active: Option<i64>,
    #[serde(default)]
    backwards: bool,
    /// Read by [`BackfillOverlap::parse`], which names the task policies a backfill refuses.
    overlap: Option<String>,
    /// Whether the backfilled runs start the task's children (`after`); default true.
    chain: Option<bool>,
}

/// `status` and `cancel`: a backfill by its id.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ByIdBody {
    namespace: Option<String>,
    backfill: String,
}

/// `list`: a namespace's backfills, or one task's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListBody {
    namespace: Option<String>,
    id: Option<String>,
}

#[derive(Serialize)]
struct ListReply {
    backfills: Vec<BackfillProgress>,
}

/// What the backfill endpoints read and write.
pub(crate) struct BackfillApi {
    tasks: kv::Store,
    backfills: kv::Store,
    events: EventSink,
}

impl BackfillApi {
    pub(crate) fn new(tasks: kv::Store, backfills: kv::Store, events: EventSink) -> BackfillApi {
        BackfillApi { tasks, backfills, events }
    }

    /// Answers one request; `scope` is the namespace of a namespaced subject.
    pub(crate) async fn handle(
        &self,
        endpoint: BackfillEndpoint,
        scope: Option<&str>,
        payload: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        if let Some(namespace) = scope {
            check_namespace(namespace)?;
        }
        match endpoint {
            BackfillEndpoint::Start => {
                let body: StartBody = decode(payload, Empty::Refused, Detail::Fields)?;
                encode(&self.start(scope, body).await?)
            }
            BackfillEndpoint::Status => {
                let body: ByIdBody = decode(payload, Empty::Refused, Detail::Fields)?;
                let key = backfill_key(scope, &body)?;
                let (progress, _) = self.read(&key).await?.ok_or_else(|| unknown(&key))?;
                encode(&progress)
            }
            BackfillEndpoint::List => {
                let body: ListBody = decode(payload, Empty::Object, Detail::Fields)?;
                encode(&self.list(scope, body).await?)
            }
            BackfillEndpoint::Cancel => {
                let body: ByIdBody = decode(payload, Empty::Refused, Detail::Fields)?;
                let key = backfill_key(scope, &body)?;
                encode(&self.cancel(&key).await?)
            }
        }
    }

    async fn start(&self, scope: Option<&str>, body: StartBody) -> Result<BackfillProgress, Failure> {
        let mut problems = Vec::new();
        let namespace = namespace_of(scope, body.namespace.as_deref(), &mut problems);
        let task_id = body.id.unwrap_or_default();
        if let Err(error) = validate_id("id", &task_id) {
            problems.push(error);
        }
        let names_valid = problems.is_empty();
        let from = instant("from", body.from.as_deref(), &mut problems);
        let to = instant("to", body.to.as_deref(), &mut problems);
        let now = Utc::now();
        if to.is_some_and(|to| to > now) {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "to",
                "must not be in the future: the live schedule fires those times",
            ));
        }
        let max_active = match body.max_active.map(u32::try_from) {
            None => DEFAULT_MAX_ACTIVE,
            Some(Ok(n)) => n,
            // Out of u32: refused below with the allowed range.
            Some(Err(_)) => u32::MAX,
        };
        let overlap = match body.overlap.as_deref().map(BackfillOverlap::parse) {
            None => BackfillOverlap::default(),
            Some(Ok(overlap)) => overlap,
            Some(Err(problem)) => {
                problems.push(problem);
                BackfillOverlap::default()
            }
        };
        let spec = if names_valid { self.spec(&namespace, &task_id).await? } else { None };
        if names_valid && spec.is_none() {
            problems.push(ApiError::at(
                ErrorCode::NotFound,
                "task",
                format!("no task {namespace}/{task_id}"),
            ));
        }
        let (Some(from), Some(to)) = (from, to) else {
            refuse(problems)?;
            unreachable!("a missing instant is a problem")
        };
        let request = BackfillRequest {
            from,
            to,
            reprocess: body.reprocess.unwrap_or_default(),
            max_active,
            backwards: body.backwards,
            overlap,
            chain: body.chain.unwrap_or(true),
        };
        // Every problem with the request itself (the task's absence is named above).
        let schedule = spec.as_ref().map(|spec| &spec.schedule);
        if let Err(errors) = request.check(schedule) {
            problems.extend(errors.into_vec().into_iter().filter(|e| e.field.as_deref() != Some("task")));
        }
        refuse(problems)?;
        let spec = spec.expect("a task found when nothing was refused");
        let key = Names::backfill_key(&namespace, &task_id, &token(now));
        let progress = BackfillProgress::start(
            key.clone(),
            namespace.clone(),
            task_id.clone(),
            request,
            &spec.schedule,
            now,
        )
        .map_err(Failure::Refused)?;
        let bytes = serde_json::to_vec(&progress).map_err(|e| Failure::internal("encode a backfill", e))?;
        self.backfills
            .create(&key, bytes.into())
            .await
            .map_err(|e| Failure::unavailable(format!("create backfill {key}"), e))?;
        let _queued = self.events.try_emit(event(EventKind::BackfillStarted, &progress));
        if progress.finished_at.is_some() {
            let _queued = self.events.try_emit(event(EventKind::BackfillFinished, &progress));
        }
        Ok(progress)
    }

    /// The stored spec of a task, `None` when there is none.
    async fn spec(&self, namespace: &str, task_id: &str) -> Result<Option<TaskSpec>, Failure> {
        let entry = self
            .tasks
            .entry(jetsched_shared::names::task_key(namespace, task_id))
            .await
            .map_err(|e| Failure::unavailable("read the task", e))?;
        let Some(entry) = live(entry) else { return Ok(None) };
        TaskSpec::parse(&entry.value).map(Some).map_err(|e| Failure::internal("read the stored spec", e))
    }

    async fn read(&self, key: &str) -> Result<Option<(BackfillProgress, u64)>, Failure> {
        let entry = self
            .backfills
            .entry(key)
            .await
            .map_err(|e| Failure::unavailable(format!("read backfill {key}"), e))?;
        let Some(entry) = live(entry) else { return Ok(None) };
        let progress = serde_json::from_slice(&entry.value)
            .map_err(|e| Failure::internal(format!("read backfill {key}"), e))?;
        Ok(Some((progress, entry.revision)))
    }

    async fn list(&self, scope: Option<&str>, body: ListBody) -> Result<ListReply, Failure> {
        let mut problems = Vec::new();
        let namespace = namespace_of(scope, body.namespace.as_deref(), &mut problems);
        if let Some(id) = &body.id
            && let Err(error) = validate_id("id", id)
        {
            problems.push(error);
        }
        refuse(problems)?;
        // Keys `<namespace>.<task>.<token>`: the namespace's (or the task's) are read.
        let prefix = match &body.id {
            Some(id) => format!("{namespace}.{id}."),
            None => format!("{namespace}."),
        };
        let keys: Vec<String> = self
            .backfills
            .keys()
            .await
            .map_err(|e| Failure::unavailable("list backfills", e))?
            .try_filter(|key| std::future::ready(key.starts_with(&prefix)))
            .take(MAX_LISTED)
            .try_collect()
            .await
            .map_err(|e| Failure::unavailable("list backfills", e))?;
        let mut backfills = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some((progress, _)) = self.read(&key).await? {
                backfills.push(progress);
            }
        }
        backfills.sort_by(|a, b| b.started_at.cmp(&a.started_at).then_with(|| a.id.cmp(&b.id)));
        Ok(ListReply { backfills })
    }

    async fn cancel(&self, key: &str) -> Result<BackfillProgress, Failure> {
        for _ in 0..CAS_ROUNDS {
            let (mut progress, revision) = self.read(key).await?.ok_or_else(|| unknown(key))?;
            if !progress.cancel(Utc::now()) {
                return Err(ApiError::at(
                    ErrorCode::Conflict,
                    "backfill",
                    format!("backfill {key} has ended ({:?})", progress.state).to_lowercase(),
                )
                .into());
            }
            let bytes =
                serde_json::to_vec(&progress).map_err(|e| Failure::internal("encode a backfill", e))?;
            match self.backfills.update(key, bytes.into(), revision).await {
                Ok(_) => {
                    let _queued = self.events.try_emit(event(EventKind::BackfillCancelled, &progress));
                    return Ok(progress);
                }
                Err(error) if is_revision_mismatch(&error) => continue,
                Err(error) => return Err(Failure::unavailable(format!("cancel backfill {key}"), error)),
            }
        }
        Err(ApiError::at(ErrorCode::Unavailable, "backfill", "the backfill kept changing; try again").into())
    }
}

/// The namespace of a request: the subject's (a body naming another is refused) or the
/// body's (required on the plain subject).
fn namespace_of(scope: Option<&str>, named: Option<&str>, problems: &mut Vec<ApiError>) -> String {
    match scope {
        Some(namespace) => {
            if let Err(error) = same_namespace(named, namespace) {
                problems.push(error);
            }
            namespace.to_string()
        }
        None => {
            let namespace = named.unwrap_or("default").to_string();
            if let Err(error) = validate_id("namespace", &namespace) {
                problems.push(error);
            }
            namespace
        }
    }
}

/// The key of the backfill a `status` or `cancel` names, within the subject's namespace.
fn backfill_key(scope: Option<&str>, body: &ByIdBody) -> Result<String, Failure> {
    let Some((namespace, _, _)) = Names::parse_backfill_key(&body.backfill) else {
        return Err(ApiError::at(
            ErrorCode::InvalidValue,
            "backfill",
            "a backfill id is <namespace>.<task_id>.<token>",
        )
        .into());
    };
    let mut problems = Vec::new();
    if let Some(named) = body.namespace.as_deref()
        && named != namespace
    {
        problems.push(mismatch("namespace", named, namespace));
    }
    if let Some(scope) = scope
        && scope != namespace
    {
        problems.push(mismatch("backfill", namespace, scope));
    }
    refuse(problems)?;
    Ok(body.backfill.clone())
}

fn instant(field: &str, text: Option<&str>, problems: &mut Vec<ApiError>) -> Option<DateTime<Utc>> {
    let Some(text) = text else {
        problems.push(ApiError::at(ErrorCode::MissingField, field, "required (RFC 3339)"));
        return None;
    };
    match DateTime::parse_from_rfc3339(text) {
        Ok(at) => Some(at.to_utc()),
        Err(error) => {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                field,
                format!("{text:?} is not RFC 3339: {error}"),
            ));
            None
        }
    }
}

fn refuse(problems: Vec<ApiError>) -> Result<(), Failure> {
    match ApiErrors::from_vec(problems) {
        Some(errors) => Err(Failure::Refused(errors)),
        None => Ok(()),
    }
}

fn unknown(key: &str) -> Failure {
    ApiError::at(ErrorCode::NotFound, "backfill", format!("no backfill {key}")).into()
}

/// A backfill's token: its start in base 36 milliseconds (ids sort by start) and six random
/// hex digits.
fn token(now: DateTime<Utc>) -> String {
    let mut ms = now.timestamp_millis().max(0) as u64;
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((ms % 36) as u32, 36).expect("a base-36 digit"));
        ms /= 36;
        if ms == 0 {
            break;
        }
    }
    let random = uuid::Uuid::new_v4().simple().to_string();
    digits.iter().rev().collect::<String>() + &random[..6]
}

/// A backfill event: the task, and the backfill's id, state, cursor and counts.
pub(crate) fn event(kind: EventKind, progress: &BackfillProgress) -> Event {
    Event { backfill: Some(progress.summary()), ..Event::new(kind, &progress.namespace, &progress.task_id) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_sort_by_start_and_fit_a_key() {
        let early = token(DateTime::from_timestamp_millis(1_700_000_000_000).unwrap());
        let late = token(DateTime::from_timestamp_millis(1_800_000_000_000).unwrap());
        assert!(early[..early.len() - 6] < late[..late.len() - 6]);
        let key = Names::backfill_key("demo", "report", &early);
        assert_eq!(Names::parse_backfill_key(&key), Some(("demo", "report", early.as_str())));
    }

    #[test]
    fn a_status_outside_its_subjects_namespace_is_refused() {
        let body = |backfill: &str| ByIdBody { namespace: None, backfill: backfill.to_string() };
        assert!(backfill_key(Some("demo"), &body("demo.report.x1")).is_ok());
        let refused = backfill_key(Some("demo"), &body("billing.report.x1")).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::NamespaceMismatch);
        assert_eq!(backfill_key(None, &body("nonsense")).unwrap_err().code(), ErrorCode::InvalidValue);
    }
}
