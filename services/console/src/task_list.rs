//! What the task list shows beside each task's summary, for the page's tasks only: its next
//! fire (the scheduler's fire state; the registry's `task.next` for a task that never fired),
//! its recent runs (kept in memory from the run events) and its breaker's state (the breakers
//! bucket). One read per task of the page, all at once; no page scans the buckets or the events.

use chrono::{DateTime, Utc};
use futures::future::join_all;
use jetsched_shared::names::{breaker_named_key, breaker_shared_key, breaker_task_key, task_key};
use jetsched_shared::wire::{BreakerRecord, FireState};
use serde_json::Value;

use crate::activity::TaskRuns;
use crate::index::TaskSummary;
use crate::state::AppState;

/// One row's extras.
#[derive(Debug, Clone)]
pub(crate) struct TaskExtras {
    /// `Err`: the fire state could not be read.
    pub(crate) next_fire: Result<Option<DateTime<Utc>>, String>,
    pub(crate) runs: Option<TaskRuns>,
    /// The breaker's bucket key (for its page: the task's own key, or `<namespace>:<key>`) and
    /// state (`closed` when it has no record); `None` without a breaker.
    pub(crate) breaker: Option<(String, Result<String, String>)>,
}

/// The extras of each task of `tasks`, in order.
pub(crate) async fn extras(state: &AppState, tasks: &[TaskSummary]) -> Vec<TaskExtras> {
    let runs: Vec<Option<TaskRuns>> = {
        let activity = state.activity.read().expect("activity lock");
        tasks.iter().map(|t| activity.task_runs().get(t.key()).cloned()).collect()
    };
    let (fire_states, breakers) = tokio::join!(
        state.js.get_key_value(state.names.state_bucket()),
        state.js.get_key_value(state.names.breakers_bucket())
    );
    let next_fires = join_all(tasks.iter().map(|task| {
        let store = fire_states.as_ref();
        async move {
            let store = store.map_err(|e| e.to_string())?;
            let entry = store.get(task_key(task.namespace(), task.id())).await.map_err(|e| e.to_string())?;
            match entry.and_then(|value| serde_json::from_slice::<FireState>(&value).ok()) {
                Some(fire_state) => Ok(fire_state.next_fire),
                // Never fired yet (or paused before it did): the registry computes it.
                None if task.paused => Ok(None),
                None => {
                    let next =
                        state.api.next(task.namespace(), task.id(), 1).await.map_err(|e| e.to_string())?;
                    Ok(next
                        .pointer("/times/0")
                        .and_then(Value::as_str)
                        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                        .map(|t| t.to_utc()))
                }
            }
        }
    }));
    let breaker_states = join_all(tasks.iter().map(|task| {
        let store = breakers.as_ref();
        async move {
            let name = task.breaker.as_deref()?;
            let (page, keys) = match name.split_once(':') {
                Some((namespace, key)) => {
                    (name.to_string(), vec![breaker_named_key(namespace, key), breaker_shared_key(key)])
                }
                None => {
                    let own = breaker_task_key(task.namespace(), task.id());
                    (own.clone(), vec![own])
                }
            };
            Some((page, breaker_state(store.map_err(|e| e.to_string()), &keys).await))
        }
    }));
    let (next_fires, breaker_states) = tokio::join!(next_fires, breaker_states);
    next_fires
        .into_iter()
        .zip(breaker_states)
        .zip(runs)
        .map(|((next_fire, breaker), runs)| TaskExtras { next_fire, runs, breaker })
        .collect()
}

/// The state of the first of `keys` the breakers bucket holds; `closed` when none.
async fn breaker_state(
    store: Result<&async_nats::jetstream::kv::Store, String>,
    keys: &[String],
) -> Result<String, String> {
    let store = store?;
    for key in keys {
        if let Some(value) = store.get(key).await.map_err(|e| e.to_string())? {
            let record: BreakerRecord = serde_json::from_slice(&value).map_err(|e| e.to_string())?;
            return Ok(record.state.as_str().to_string());
        }
    }
    Ok("closed".to_string())
}
