//! The actions: `POST /tasks/<ns>/<id>/{pause,resume,trigger,delete}` and
//! `POST /dlq/<seq>/{replay,purge}`, each refused (403) unless actions are allowed and the
//! form carries the page's CSRF token, each done through the registry API.

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jetsched_shared::wire::DlqRequest;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::pages;
use crate::state::{AppState, html};

/// The fields of an action's form.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    csrf: String,
    /// The confirmation checkbox of destructive actions.
    #[serde(default)]
    confirm: String,
    /// Why (a queue's pause).
    #[serde(default)]
    pub(crate) reason: String,
}

fn refused(status: StatusCode, why: &str) -> Response {
    html(status, pages::problem("Refused", &[why.to_string()]))
}

/// Why the action may not run, if it may not.
pub(crate) fn check(state: &AppState, form: &ActionForm, destructive: bool) -> Option<Response> {
    if !state.access.allow_actions {
        return Some(refused(
            StatusCode::FORBIDDEN,
            "Actions are off: the console was started without --allow-actions.",
        ));
    }
    if !state.access.csrf_ok(&form.csrf) {
        return Some(refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token is missing or stale: reload the page.",
        ));
    }
    if destructive && form.confirm != "yes" {
        return Some(refused(StatusCode::BAD_REQUEST, "Tick the confirmation box first."));
    }
    None
}

pub(crate) async fn task(
    State(state): State<AppState>,
    Path((namespace, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let form = form.map(|Form(form)| form).unwrap_or_default();
    if !matches!(action.as_str(), "pause" | "resume" | "trigger" | "delete") {
        return refused(StatusCode::NOT_FOUND, "No such action.");
    }
    if let Some(refusal) = check(&state, &form, action == "delete") {
        return refusal;
    }
    let reference = json!({"namespace": namespace, "id": id});
    match state.api.task(&action, &namespace, reference).await {
        Ok(reply) => {
            tracing::info!(%namespace, task = %id, action, "console action");
            match action.as_str() {
                "delete" => Redirect::to("/tasks").into_response(),
                "trigger" => match reply.get("execution_id").and_then(Value::as_str) {
                    Some(execution) => Redirect::to(&format!("/runs/{execution}")).into_response(),
                    None => Redirect::to(&pages::task_href(&namespace, &id)).into_response(),
                },
                _ => Redirect::to(&pages::task_href(&namespace, &id)).into_response(),
            }
        }
        Err(error) => error.into_response(),
    }
}

pub(crate) async fn dlq(
    State(state): State<AppState>,
    Path((sequence, action)): Path<(u64, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let form = form.map(|Form(form)| form).unwrap_or_default();
    if !matches!(action.as_str(), "replay" | "purge") {
        return refused(StatusCode::NOT_FOUND, "No such action.");
    }
    if let Some(refusal) = check(&state, &form, action == "purge") {
        return refusal;
    }
    match state.api.dlq(&action, &DlqRequest::entry(sequence)).await {
        Ok(reply) => {
            tracing::info!(sequence, action, "console dead-letter action");
            let replayed = reply
                .get("replayed")
                .and_then(Value::as_array)
                .and_then(|r| r.first())
                .and_then(|r| r.get("execution_id"))
                .and_then(Value::as_str);
            match replayed {
                Some(execution) => Redirect::to(&format!("/runs/{execution}")).into_response(),
                None => Redirect::to("/dlq").into_response(),
            }
        }
        Err(error) => error.into_response(),
    }
}
