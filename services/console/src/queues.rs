//! `/queues` and `POST /queues/<queue>/{pause,resume}`: every queue from the registry's queue
//! API (paused or running, why, each lane's waiting and in-flight runs and its oldest waiting
//! run), the runs an open breaker holds per queue, and the pause and resume (actions, through
//! `queue.pause` and `queue.resume`).

use std::collections::HashMap;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jetsched_shared::wire::QueueListReply;
use serde_json::json;

use crate::actions::{ActionForm, accept};
use crate::pages;
use crate::state::{AppState, decoded, held_subjects, html};

/// Runs held by open breakers per queue: one listing of the held subjects of the dispatch stream.
async fn held_by_queue(state: &AppState) -> Result<HashMap<String, u64>, String> {
    let mut held = HashMap::new();
    for (subject, count) in held_subjects(state, state.names.delayed_wildcard()).await? {
        if let Some(queue) = state.names.parse_delayed_queue(&subject) {
            *held.entry(queue.to_string()).or_default() += count as u64;
        }
    }
    Ok(held)
}

pub(crate) async fn list(State(state): State<AppState>) -> Response {
    let queues = match decoded::<QueueListReply>(state.api.queue("list", json!({})).await, "Queues") {
        Ok(listed) => listed.queues,
        Err(response) => return response,
    };
    let held = held_by_queue(&state).await;
    let problem = held.as_ref().err().map(|e| format!("held runs unavailable: {e}"));
    let held = held.ok();
    let lanes = state.activity.read().expect("activity lock").lanes(chrono::Utc::now());
    html(
        StatusCode::OK,
        pages::queues::list(&state.ctx(), &queues, held.as_ref(), problem.as_deref(), &lanes),
    )
}

/// `POST /queues/<queue>/pause` (with the form's `reason`) and `/resume`.
pub(crate) async fn act(
    State(state): State<AppState>,
    Path((queue, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let form = match accept(&state, form, &action, &["pause", "resume"], &[]) {
        Ok(form) => form,
        Err(refusal) => return refusal,
    };
    let mut body = json!({"queue": queue, "by": "console"});
    let reason = form.reason.trim();
    if action == "pause" && !reason.is_empty() {
        body["reason"] = reason.into();
    }
    match state.api.queue(&action, body).await {
        Ok(_) => {
            tracing::info!(%queue, action, "console queue action");
            Redirect::to("/queues").into_response()
        }
        Err(error) => error.into_response(),
    }
}
