//! The task endpoints (`<prefix>.api.task.<endpoint>`, and `.<namespace>` confined to one
//! namespace): a request decoded by the [`codec`](crate::codec) and carried out against the
//! task store.

use async_nats::Message;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use jetsched_shared::calendar::{Calendars, Decision, Refusal, decide};
use jetsched_shared::schedule::Schedule;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{self, NextReply};

use crate::codec::{self, ApiRequest, Limits, NextSource, TaskEndpoint, check_size, encode};
use crate::failure::Failure;
use crate::scope;
use crate::tasks::TaskStore;

/// Handles one task request; confined to `scope` when it came on a namespaced subject.
pub(crate) async fn handle(
    store: &TaskStore,
    limits: Limits,
    endpoint: TaskEndpoint,
    scope: Option<&str>,
    message: &Message,
) -> Result<Vec<u8>, Failure> {
    let headers = message.headers.as_ref();
    let request = match scope {
        None => codec::decode_request(endpoint, &message.payload, headers, limits, Utc::now())?,
        Some(namespace) => {
            scope::check_namespace(namespace)?;
            // The size limit applies to what the client sent, before the namespace is added.
            if endpoint == TaskEndpoint::Put {
                check_size(&message.payload, limits)?;
            }
            let body = scope::confine_body(endpoint, namespace, &message.payload)?;
            let limits = Limits { max_spec_bytes: limits.max_spec_bytes.saturating_add(body.len()) };
            codec::decode_request(endpoint, &body, headers, limits, Utc::now())?
        }
    };
    answer(store, request).await
}

/// Carries out a decoded request: the store's answer, or its failure.
async fn answer(store: &TaskStore, request: ApiRequest) -> Result<Vec<u8>, Failure> {
    match request {
        ApiRequest::Put { spec, precondition } => Ok(store.put(*spec, precondition).await?.reply_json()),
        ApiRequest::Get(task) => {
            let mut reply = store.get(&task.namespace, &task.id).await?;
            store.fill_status(std::slice::from_mut(&mut reply)).await?;
            encode(&reply)
        }
        ApiRequest::List(request) => {
            let mut reply = store.list(&request).await?;
            store.fill_status(&mut reply.tasks).await?;
            encode(&reply)
        }
        ApiRequest::Delete(task) => encode(&store.delete(&task.namespace, &task.id).await?),
        ApiRequest::Graph(task) => encode(&store.graph(&task.namespace, &task.id).await?),
        ApiRequest::Pause { task, reason } => {
            encode(&store.pause(&task.namespace, &task.id, reason.as_deref()).await?)
        }
        ApiRequest::Resume(task) => encode(&store.resume(&task.namespace, &task.id).await?),
        ApiRequest::Trigger { task, ask } => encode(&store.trigger(&task.namespace, &task.id, ask).await?),
        ApiRequest::Next { source, count, after } => {
            let spec = match source {
                NextSource::Inline(spec) => *spec,
                NextSource::Stored(task) => store.get(&task.namespace, &task.id).await?.task,
            };
            let names = spec.calendars.iter().map(|c| c.name.as_str());
            let calendars = Calendars::stored(store.calendars(), &spec.namespace, names)
                .await
                .map_err(|e| Failure::unavailable("read calendars bucket", e))?;
            let mut reply = preview(&spec, count, after, &calendars);
            reply.waits_for = store.waits_for(&spec).await?;
            encode(&reply)
        }
    }
}

/// What the task's calendars do with each of `times` (in order: a fire shifted onto one made
/// already runs once, with it).
fn notes(spec: &TaskSpec, times: &[DateTime<Utc>], tz: Tz, calendars: &Calendars) -> Vec<String> {
    let by = |r: &Refusal| format!("calendar {} ({})", r.calendar, r.date.format("%Y-%m-%d"));
    let mut last: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    let mut notes = Vec::with_capacity(times.len());
    for &nominal in times {
        let (effective, note) = match decide(&spec.calendars, calendars, nominal, tz) {
            Decision::Fire => (nominal, String::new()),
            Decision::Skip(refusal) => {
                notes.push(format!("skipped: {}", by(&refusal)));
                continue;
            }
            Decision::Shift { at, refusal } => {
                (at, format!("shifted to {}: {}", wire::format_time(at), by(&refusal)))
            }
        };
        match last {
            Some((last_at, last_nominal)) if effective <= last_at => {
                let with = wire::format_time(last_nominal);
                notes.push(format!(
                    "runs once with the fire of {with}, shifted to {}",
                    wire::format_time(last_at)
                ));
            }
            _ => {
                last = Some((effective, nominal));
                notes.push(note);
            }
        }
    }
    notes
}

/// The next `count` fires of a spec after `after`, in UTC and on the zone's wall clock.
fn preview(spec: &TaskSpec, count: usize, after: DateTime<Utc>, calendars: &Calendars) -> NextReply {
    let window = spec.window_with(calendars);
    let mut times = Vec::with_capacity(count.min(1024));
    let mut cursor = after;
    while times.len() < count {
        let Some(next) = window.next_after(&spec.schedule, cursor) else { break };
        times.push(next);
        cursor = next;
    }
    let ended = times.len() < count;
    let tz: Tz = match &spec.schedule {
        Schedule::Cron(cron) => cron.timezone(),
        _ => Tz::UTC,
    };
    let notes = if spec.calendars.is_empty() { Vec::new() } else { notes(spec, &times, tz, calendars) };
    NextReply {
        waits_for: Vec::new(),
        notes,
        timezone: tz.name().to_string(),
        local_times: times.iter().map(|t| t.with_timezone(&tz).to_rfc3339()).collect(),
        times: times.into_iter().map(wire::format_time).collect(),
        ends_by: window.ends_by.filter(|_| ended).map(|reason| reason.as_str().to_string()),
        last_fire: window.last_fire(&spec.schedule).map(wire::format_time),
    }
}
