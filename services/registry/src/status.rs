//! The status `get` and `list` report with each task: its state by the shared rule
//! ([`TaskState::derive`]), next and last fire from the scheduler's fire state, the status of
//! its last run and the outcomes of its last [`RECENT_RUNS`] scheduled runs from the runs
//! bucket. Read in batches (the latest value of up to 256 keys per request: the fire states
//! of a page, then the run records their fires name), so a page of a thousand tasks costs a
//! few dozen requests, not one per task. Scheduled execution ids derive from the task and the
//! nominal time, so the records of past fires are found without an index.

use std::collections::HashMap;

use jetsched_shared::calendar::Calendars;
use jetsched_shared::direct_batch::latest_values;
use jetsched_shared::names::{Names, task_key};
use jetsched_shared::schedule::Schedule;
use jetsched_shared::wire::{
    FireState, RECENT_RUNS, RunStatus, TaskReply, TaskState, TaskStatus, scheduled_execution_id,
};
use serde::Deserialize;

use crate::failure::Failure;

/// The one field of a run record the status needs.
#[derive(Deserialize)]
struct RunView {
    status: RunStatus,
}

/// The latest live value of each of `keys` in `bucket` that has one, by key.
async fn latest(
    client: &async_nats::Client,
    bucket: &str,
    keys: &[String],
) -> Result<HashMap<String, bytes::Bytes>, Failure> {
    latest_values(client, bucket, keys)
        .await
        .map_err(|e| Failure::unavailable(format!("read bucket {bucket}"), e))
}

/// Sets the status of every task of `tasks`.
pub(crate) async fn fill(
    client: &async_nats::Client,
    names: &Names,
    calendars_bucket: &async_nats::jetstream::kv::Store,
    tasks: &mut [TaskReply],
) -> Result<(), Failure> {
    let now = chrono::Utc::now();
    let keys: Vec<String> = tasks.iter().map(|t| task_key(&t.task.namespace, &t.task.id)).collect();
    let states = latest(client, &names.state_bucket(), &keys).await?;
    let fires: Vec<Option<FireState>> =
        keys.iter().map(|key| states.get(key).and_then(|value| serde_json::from_slice(value).ok())).collect();
    // The execution ids of each task's latest scheduled fires, newest last.
    let recent: Vec<Vec<String>> = tasks
        .iter()
        .zip(&fires)
        .map(|(reply, fire)| match fire {
            Some(fire) => recent_fires(&reply.task.schedule, fire)
                .into_iter()
                .map(|ms| scheduled_execution_id(&reply.task.namespace, &reply.task.id, ms))
                .collect(),
            None => Vec::new(),
        })
        .collect();
    let ids: Vec<String> = recent.iter().flatten().cloned().collect();
    let records = latest(client, &names.runs_bucket(), &ids).await?;
    let status_of = |id: &String| {
        records.get(id).and_then(|value| serde_json::from_slice::<RunView>(value).ok()).map(|r| r.status)
    };
    // The calendars of a namespace's tasks, read once per set of names for the whole page.
    let mut read: HashMap<(String, Vec<String>), Calendars> = HashMap::new();
    let none = Calendars::default();
    for ((reply, fire), recent) in tasks.iter_mut().zip(fires).zip(recent) {
        let spec = &reply.task;
        // A count (`max_runs`) leaves out the fires the task's calendars keep from running.
        let calendars = if spec.max_runs.is_some() && !spec.calendars.is_empty() {
            let names: Vec<String> = spec.calendars.iter().map(|c| c.name.clone()).collect();
            let set = (spec.namespace.clone(), names);
            if !read.contains_key(&set) {
                let stored = Calendars::stored(calendars_bucket, &set.0, set.1.iter().map(String::as_str))
                    .await
                    .map_err(|e| Failure::unavailable("read calendars bucket", e))?;
                read.insert(set.clone(), stored);
            }
            &read[&set]
        } else {
            &none
        };
        let window = spec.window_with(calendars);
        let last_fire = window.last_fire(&spec.schedule);
        let recorded = fire.as_ref().map(|f| f.last_nominal_fire);
        // Nothing left to fire: past the last fire, or no fire of the window remains after
        // the oldest instant a catch-up still reaches.
        let oldest = chrono::TimeDelta::from_std(spec.catchup_window)
            .ok()
            .and_then(|w| now.checked_sub_signed(w))
            .unwrap_or(now);
        let closed = window.ends_by.is_some()
            && window.next_after(&spec.schedule, recorded.map_or(oldest, |r| r.max(oldest))).is_none();
        let ended: Vec<RunStatus> = recent
            .iter()
            .filter_map(status_of)
            .filter(|s| matches!(s, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Dead))
            .collect();
        let last_execution_id = fire.as_ref().and_then(|f| f.last_execution_id.clone());
        reply.status = Some(TaskStatus {
            state: if closed {
                TaskState::Completed
            } else {
                TaskState::derive(last_fire, reply.task.paused, fire.as_ref())
            },
            next_fire: fire.as_ref().and_then(|f| f.next_fire),
            last_fire: fire.as_ref().map(|f| f.last_nominal_fire),
            last_outcome: last_execution_id.as_ref().and_then(status_of),
            last_execution_id,
            recent_runs: ended.len() as u32,
            recent_succeeded: ended.iter().filter(|s| **s == RunStatus::Succeeded).count() as u32,
            fires: fire.as_ref().map_or(0, |f| f.fires),
            remaining_runs: spec.remaining_runs_with(&window, calendars, recorded),
            ends_by: window.ends_by.map(|reason| reason.as_str().to_string()),
        });
    }
    Ok(())
}

/// The nominal times (Unix milliseconds) of a task's last [`RECENT_RUNS`] scheduled fires up to
/// its last recorded one.
fn recent_fires(schedule: &Schedule, fire: &FireState) -> Vec<i64> {
    let mut times: Vec<i64> = schedule
        .fires_up_to(fire.last_nominal_fire, RECENT_RUNS)
        .into_iter()
        .map(|t| t.timestamp_millis())
        .collect();
    // The schedule changed since (the fire state is older than the spec): the last recorded
    // fire counts all the same.
    let last = fire.last_nominal_fire.timestamp_millis();
    if times.last() != Some(&last) {
        times.push(last);
    }
    times
}
