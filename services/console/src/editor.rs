//! Creating and editing a task's spec in a form: `GET /tasks/new`, `GET /tasks/<ns>/<id>/edit`
//! and their `POST`s, each stored through the registry's `put`. An edit is stored only over
//! the revision the form was loaded with (compare-and-set): when someone else saved the task
//! since, nothing is overwritten and the page says so, showing their version next to the
//! operator's text. Every problem the registry names is shown at once, the text kept.

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{Value, json};

use crate::actions::{self, ActionForm};
use crate::api::CallError;
use crate::pages::{self, editor::Editor};
use crate::state::{AppState, html};

/// What a new task's form starts from.
const TEMPLATE: &str = r#"{
  "namespace": "default",
  "id": "new-task",
  "schedule": {"every": "1h"},
  "executor": {"kind": "http", "method": "POST", "url": "http://example.internal/run"}
}"#;

pub(crate) async fn new_page(State(state): State<AppState>) -> Response {
    let editor =
        Editor { task: None, revision: None, text: TEMPLATE.to_string(), problems: &[], theirs: None };
    html(StatusCode::OK, pages::editor::page(&state.ctx(), &editor))
}

pub(crate) async fn edit_page(
    State(state): State<AppState>,
    Path((namespace, id)): Path<(String, String)>,
) -> Response {
    let stored = match state.api.task("get", &namespace, json!({"namespace": namespace, "id": id})).await {
        Ok(stored) => stored,
        Err(error) => return error.into_response(),
    };
    let spec = stored.get("task").cloned().unwrap_or(Value::Null);
    let editor = Editor {
        task: Some((&namespace, &id)),
        revision: stored.get("revision").and_then(Value::as_u64),
        text: serde_json::to_string_pretty(&spec).unwrap_or_default(),
        problems: &[],
        theirs: None,
    };
    html(StatusCode::OK, pages::editor::page(&state.ctx(), &editor))
}

/// The form's fields: the action's (CSRF token) and the editor's (`spec`, `revision`).
type Fields = BTreeMap<String, String>;

fn action_form(fields: &Fields) -> Result<Form<ActionForm>, FormRejection> {
    Ok(Form(serde_json::from_value(json!(fields)).unwrap_or_default()))
}

pub(crate) async fn create(
    State(state): State<AppState>,
    form: Result<Form<Fields>, FormRejection>,
) -> Response {
    let fields = form.map(|Form(fields)| fields).unwrap_or_default();
    if let Err(refusal) = actions::accept(&state, action_form(&fields), "create", &["create"], &[]) {
        return refusal;
    }
    let text = fields.get("spec").cloned().unwrap_or_default();
    // The namespace's subject when the text names one (a team may use only its own); the
    // registry finds every problem of the text otherwise.
    let namespace = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|spec| spec.get("namespace").and_then(Value::as_str).map(str::to_string));
    let stored = state.api.put(namespace.as_deref(), text.clone().into_bytes(), None, true).await;
    saved(&state, None, None, text, stored).await
}

pub(crate) async fn save(
    State(state): State<AppState>,
    Path((namespace, id)): Path<(String, String)>,
    form: Result<Form<Fields>, FormRejection>,
) -> Response {
    let fields = form.map(|Form(fields)| fields).unwrap_or_default();
    if let Err(refusal) = actions::accept(&state, action_form(&fields), "edit", &["edit"], &[]) {
        return refusal;
    }
    let text = fields.get("spec").cloned().unwrap_or_default();
    let Some(revision) = fields.get("revision").and_then(|r| r.trim().parse::<u64>().ok()) else {
        let problem = "The form carries no revision to save over: reload the page.".to_string();
        return html(StatusCode::BAD_REQUEST, pages::problem("Refused", &[problem]));
    };
    let stored = state.api.put(Some(&namespace), text.clone().into_bytes(), Some(revision), false).await;
    saved(&state, Some((&namespace, &id)), Some(revision), text, stored).await
}

/// The task's page once stored; otherwise the form again with every problem and the
/// operator's text, and on a conflict the version someone else saved.
async fn saved(
    state: &AppState,
    task: Option<(&str, &str)>,
    revision: Option<u64>,
    text: String,
    stored: Result<Value, CallError>,
) -> Response {
    let error = match stored {
        Ok(reply) => {
            let spec = reply.get("task").unwrap_or(&Value::Null);
            let field = |key: &str| spec.get(key).and_then(Value::as_str).unwrap_or("");
            tracing::info!(namespace = field("namespace"), task = field("id"), "console spec saved");
            return Redirect::to(&pages::task_href(field("namespace"), field("id"))).into_response();
        }
        Err(error) => error,
    };
    let conflict = error.code.as_deref() == Some("conflict");
    let (status, problems, theirs) = match (conflict, task) {
        (true, Some((namespace, id))) => {
            let current = state.api.task("get", namespace, json!({"namespace": namespace, "id": id})).await;
            let theirs = current.ok().map(|current| {
                let at = current.get("revision").and_then(Value::as_u64).unwrap_or(0);
                let spec = current.get("task").cloned().unwrap_or(Value::Null);
                (at, serde_json::to_string_pretty(&spec).unwrap_or_default())
            });
            let now = theirs
                .as_ref()
                .map_or_else(|| "a newer revision".to_string(), |(at, _)| format!("revision {at}"));
            let message = format!(
                "Not saved: someone else changed this task since you loaded the form (you loaded revision {}, it is now at {now}). Nothing was overwritten: compare their version below, then reload the form to edit it.",
                revision.unwrap_or(0)
            );
            (StatusCode::CONFLICT, vec![message], theirs)
        }
        (true, None) => (StatusCode::CONFLICT, error.messages, None),
        (false, _) if error.code.is_none() => (StatusCode::BAD_GATEWAY, error.messages, None),
        (false, _) => (StatusCode::UNPROCESSABLE_ENTITY, error.messages, None),
    };
    let editor = Editor { task, revision, text, problems: &problems, theirs };
    html(status, pages::editor::page(&state.ctx(), &editor))
}
