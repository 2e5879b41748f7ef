//! `/breakers`, `/breakers/<key>` and `POST /breakers/<key>/reset`: the circuit breakers from
//! the registry's breaker API, the runs each holds in the dispatch stream, the settings its
//! tasks give it, its recent events, and the reset (an action, through `breaker.reset`).

use std::collections::HashMap;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use futures::StreamExt;
use jetsched_shared::wire::{BreakerInfo, BreakerListReply, BreakerRef, Event};
use serde_json::{Value, json};

use crate::actions::{ActionForm, accept};
use crate::pages::{self, breakers::BreakerRow};
use crate::state::{AppState, decoded, held_subjects, html, is_valid_key};

/// Task specs read at once for the breakers' settings.
const SPEC_READS: usize = 16;
/// Events listed on a breaker's page.
const EVENTS_SHOWN: usize = 50;

/// Held runs per task (`<namespace>/<id>`): one listing of the held subjects of the dispatch
/// stream, whatever the number of breakers.
async fn held_by_task(state: &AppState) -> Result<HashMap<String, u64>, String> {
    let mut held = HashMap::new();
    for (subject, count) in held_subjects(state, state.names.delayed_wildcard()).await? {
        if let Some((namespace, id)) = state.names.parse_delayed_task(&subject) {
            *held.entry(format!("{namespace}/{id}")).or_default() += count as u64;
        }
    }
    Ok(held)
}

/// Held runs of one task: the held subjects of the dispatch stream under the task's filter.
pub(crate) async fn held_of_task(state: &AppState, namespace: &str, id: &str) -> Result<u64, String> {
    let listed = held_subjects(state, state.names.delayed_task_filter(namespace, id)).await?;
    Ok(listed.iter().map(|(_, count)| *count as u64).sum())
}

/// The `breaker` settings of a task's spec (`<namespace>/<id>`), when the registry answers.
async fn settings_of(state: &AppState, task: Option<&String>) -> Option<Value> {
    let (namespace, id) = task?.split_once('/')?;
    let stored = state.api.task("get", namespace, json!({"namespace": namespace, "id": id})).await.ok()?;
    stored.get("task")?.get("breaker").cloned()
}

fn row(
    info: BreakerInfo,
    held: &Result<HashMap<String, u64>, String>,
    settings: Option<Value>,
) -> BreakerRow {
    let held =
        held.as_ref().ok().map(|held| info.tasks.iter().map(|t| held.get(t).copied().unwrap_or(0)).sum());
    BreakerRow { info, held, settings }
}

pub(crate) async fn list(State(state): State<AppState>) -> Response {
    let reply = state.api.breaker("list", &BreakerRef::default()).await;
    let breakers = match decoded::<BreakerListReply>(reply, "Breakers") {
        Ok(listed) => listed.breakers,
        Err(response) => return response,
    };
    let held = held_by_task(&state).await;
    let first_tasks: Vec<Option<String>> = breakers.iter().map(|b| b.tasks.first().cloned()).collect();
    let settings: Vec<Option<Value>> = futures::stream::iter(first_tasks)
        .map(|task| {
            let state = state.clone();
            async move { settings_of(&state, task.as_ref()).await }
        })
        .buffered(SPEC_READS)
        .collect()
        .await;
    let problem = held.as_ref().err().map(|e| format!("held runs unavailable: {e}"));
    let rows: Vec<BreakerRow> =
        breakers.into_iter().zip(settings).map(|(info, settings)| row(info, &held, settings)).collect();
    html(StatusCode::OK, pages::breakers::list(&state.ctx(), &rows, problem.as_deref()))
}

/// A breaker's path: its bucket key, or `<namespace>:<key>` for a named one (what a task's
/// page links to; the registry resolves a key shared across namespaces).
fn reference(path: &str) -> Option<BreakerRef> {
    match path.split_once(':') {
        Some((namespace, key)) if is_valid_key(namespace) && is_valid_key(key) => Some(BreakerRef {
            namespace: Some(namespace.into()),
            key: Some(key.into()),
            ..BreakerRef::default()
        }),
        Some(_) => None,
        None => is_valid_key(path).then(|| BreakerRef { key: Some(path.into()), ..BreakerRef::default() }),
    }
}

pub(crate) async fn breaker(State(state): State<AppState>, Path(path): Path<String>) -> Response {
    let Some(reference) = reference(&path) else {
        return html(
            StatusCode::NOT_FOUND,
            pages::problem("Not found", &["No breaker has that key.".into()]),
        );
    };
    let info = match state.api.breaker("get", &reference).await.map(serde_json::from_value::<BreakerInfo>) {
        Ok(Ok(info)) => info,
        Ok(Err(error)) => {
            return html(StatusCode::BAD_GATEWAY, pages::problem("Breaker", &[error.to_string()]));
        }
        Err(error) => return error.into_response(),
    };
    let held = held_by_task(&state).await;
    let per_task: Vec<(String, Option<u64>)> = info
        .tasks
        .iter()
        .map(|t| (t.clone(), held.as_ref().ok().map(|h| h.get(t).copied().unwrap_or(0))))
        .collect();
    let settings = settings_of(&state, info.tasks.first()).await;
    let events: Vec<Event> = {
        let activity = state.activity.read().expect("activity lock");
        activity
            .events()
            .filter(|e| e.key.as_deref() == Some(info.key.as_str()))
            .take(EVENTS_SHOWN)
            .cloned()
            .collect()
    };
    let row = row(info, &held, settings);
    html(StatusCode::OK, pages::breakers::breaker(&state.ctx(), &row, &per_task, &events))
}

/// `POST /breakers/<key>/reset`: closes the breaker and clears its counts.
pub(crate) async fn reset(
    State(state): State<AppState>,
    Path(key): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = accept(&state, form, "reset", &["reset"], &[]) {
        return refusal;
    }
    if !is_valid_key(&key) {
        return html(
            StatusCode::NOT_FOUND,
            pages::problem("Not found", &["No breaker has that key.".into()]),
        );
    }
    let reference = BreakerRef { key: Some(key.clone()), ..BreakerRef::default() };
    match state.api.breaker("reset", &reference).await {
        Ok(_) => {
            tracing::info!(breaker = %key, "console breaker reset");
            Redirect::to(&pages::breaker_href(&key)).into_response()
        }
        Err(error) => error.into_response(),
    }
}
