//! The actions: `POST /tasks/<ns>/<id>/{pause,resume,trigger,delete,backfill,cancel-held,cancel-queued}`
//! (a pause with its reason, a backfill with its range and options), `POST /backfills/<id>/cancel`,
//! `POST /runs/<execution>/cancel` and `POST /dlq/<seq>/{replay,purge}`,
//! each refused (403) unless actions are allowed and the
//! form carries the page's CSRF token, each done through the registry API.

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jetsched_shared::names::{CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT};
use jetsched_shared::wire::{DlqRequest, RunRecord};
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
    /// Why (a task's or a queue's pause).
    #[serde(default)]
    pub(crate) reason: String,
    /// A backfill's range and options, as typed (the registry checks them).
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    reprocess: String,
    #[serde(default)]
    max_active: String,
    #[serde(default)]
    overlap: String,
}

/// A task's actions that cancel its runs not started.
pub(crate) const CANCEL_HELD: &str = "cancel-held";
pub(crate) const CANCEL_QUEUED: &str = "cancel-queued";

fn refused(status: StatusCode, why: &str) -> Response {
    html(status, pages::problem("Refused", &[why.to_string()]))
}

/// The form of `action` once it may run; otherwise the refusal to answer: an action not among
/// `known` (404), actions off or a missing or stale CSRF token (403), an action among
/// `destructive` without its confirmation (400).
#[allow(clippy::result_large_err, reason = "the error is the response itself, returned at once")]
pub(crate) fn accept(
    state: &AppState,
    form: Result<Form<ActionForm>, FormRejection>,
    action: &str,
    known: &[&str],
    destructive: &[&str],
) -> Result<ActionForm, Response> {
    let form = form.map(|Form(form)| form).unwrap_or_default();
    if !known.contains(&action) {
        return Err(refused(StatusCode::NOT_FOUND, "No such action."));
    }
    if !state.access.allow_actions {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "Actions are off: the console was started without --allow-actions.",
        ));
    }
    if !state.access.csrf_ok(&form.csrf) {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token is missing or stale: reload the page.",
        ));
    }
    if destructive.contains(&action) && form.confirm != "yes" {
        return Err(refused(StatusCode::BAD_REQUEST, "Tick the confirmation box first."));
    }
    Ok(form)
}

pub(crate) async fn task(
    State(state): State<AppState>,
    Path((namespace, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let known = ["pause", "resume", "trigger", "delete", "backfill", CANCEL_HELD, CANCEL_QUEUED];
    let form = match accept(&state, form, &action, &known, &["delete", CANCEL_HELD, CANCEL_QUEUED]) {
        Ok(form) => form,
        Err(refusal) => return refusal,
    };
    if action == "backfill" {
        return backfill(&state, &namespace, &id, &form).await;
    }
    if action == CANCEL_HELD || action == CANCEL_QUEUED {
        let which = if action == CANCEL_HELD { "held" } else { "queued" };
        let request = json!({"id": id, which: true, "by": "console"});
        return match state.api.runs(CANCEL_TASK_ENDPOINT, &namespace, request).await {
            Ok(_) => {
                tracing::info!(%namespace, task = %id, action, "console action");
                Redirect::to(&pages::task_href(&namespace, &id)).into_response()
            }
            Err(error) => error.into_response(),
        };
    }
    let mut reference = json!({"namespace": namespace, "id": id});
    let reason = form.reason.trim();
    if action == "pause" && !reason.is_empty() {
        reference["reason"] = reason.into();
    }
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

/// Starts a backfill of a task from its page's form; a refusal lists every problem the
/// registry named.
async fn backfill(state: &AppState, namespace: &str, id: &str, form: &ActionForm) -> Response {
    let mut request = json!({"id": id, "from": form.from.trim(), "to": form.to.trim()});
    for (key, value) in [("reprocess", &form.reprocess), ("overlap", &form.overlap)] {
        if !value.trim().is_empty() {
            request[key] = value.trim().into();
        }
    }
    if !form.max_active.trim().is_empty() {
        match form.max_active.trim().parse::<i64>() {
            Ok(n) => request["max_active"] = n.into(),
            Err(_) => return refused(StatusCode::BAD_REQUEST, "Max active must be a whole number."),
        }
    }
    match state.api.backfill("start", namespace, request).await {
        Ok(reply) => {
            let backfill = reply.get("id").and_then(Value::as_str).unwrap_or_default();
            tracing::info!(%namespace, task = %id, backfill, "console backfill");
            Redirect::to(&format!("{}#backfills", pages::task_href(namespace, id))).into_response()
        }
        Err(error) if error.code.is_some() => {
            html(StatusCode::BAD_REQUEST, pages::problem("Backfill refused", &error.messages))
        }
        Err(error) => error.into_response(),
    }
}

/// `POST /backfills/<id>/cancel`: stops a running backfill (the batch being dispatched
/// finishes) and goes back to its task's page.
pub(crate) async fn backfill_cancel(
    State(state): State<AppState>,
    Path(backfill): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = accept(&state, form, "cancel", &["cancel"], &["cancel"]) {
        return refusal;
    }
    // `<namespace>.<task>.<token>`: the namespace and task name its subject and its page.
    let mut parts = backfill.splitn(3, '.');
    let (Some(namespace), Some(task), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return refused(StatusCode::NOT_FOUND, "No backfill has that id.");
    };
    match state.api.backfill("cancel", namespace, json!({"backfill": backfill})).await {
        Ok(_) => {
            tracing::info!(%backfill, "console backfill cancel");
            Redirect::to(&format!("{}#backfills", pages::task_href(namespace, task))).into_response()
        }
        Err(error) => error.into_response(),
    }
}

pub(crate) async fn dlq(
    State(state): State<AppState>,
    Path((sequence, action)): Path<(u64, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = accept(&state, form, &action, &["replay", "purge"], &["purge"]) {
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

/// `POST /runs/<execution>/cancel`: the run's namespace read from its record (or, for a run
/// queued without one, its events), then cancelled through the registry.
pub(crate) async fn run_cancel(
    State(state): State<AppState>,
    Path(execution): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let form = match accept(&state, form, "cancel", &["cancel"], &["cancel"]) {
        Ok(form) => form,
        Err(refusal) => return refusal,
    };
    let recorded = match state.runs.get(&execution).await {
        Ok(Some(value)) => serde_json::from_slice::<RunRecord>(&value).ok().map(|r| r.namespace),
        _ => None,
    };
    let namespace = recorded.or_else(|| {
        let activity = state.activity.read().expect("activity lock");
        activity
            .events()
            .find(|e| e.execution_id.as_deref() == Some(execution.as_str()))
            .map(|e| e.namespace.clone())
    });
    let Some(namespace) = namespace else {
        return refused(StatusCode::NOT_FOUND, "No run has that id.");
    };
    let mut request = json!({"execution_id": execution, "by": "console"});
    if !form.reason.trim().is_empty() {
        request["reason"] = json!(form.reason.trim());
    }
    match state.api.runs(CANCEL_ENDPOINT, &namespace, request).await {
        Ok(_) => {
            tracing::info!(%namespace, %execution, "console run cancel");
            Redirect::to(&format!("/runs/{execution}")).into_response()
        }
        Err(error) => error.into_response(),
    }
}
