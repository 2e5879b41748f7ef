//! A failed run's "retry now" (`POST /runs/<execution>/retry`) and the links between a run, its
//! dead letter and its replays: a dead-lettered run is retried by replaying its dead letter
//! (the registry's DLQ replay, which consumes the entry), a run that failed for good without
//! one by a manual run of its task.

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jetsched_shared::wire::{DlqRequest, RunRecord, RunStatus};
use serde_json::{Value, json};

use crate::actions::{ActionForm, accept};
use crate::api::CallError;
use crate::pages;
use crate::state::{AppState, html, is_valid_key};

/// Whether a run may be retried from its page: it failed for good (dead-lettered or not).
pub(crate) fn retriable(record: &RunRecord) -> bool {
    matches!(record.status, RunStatus::Failed | RunStatus::Dead)
}

/// The sequence of the run's entry in the dead-letter stream, if it is still there: one
/// request, which reads only the dead letters of the run's task.
pub(crate) async fn dead_letter_of(state: &AppState, record: &RunRecord) -> Result<Option<u64>, CallError> {
    let request = DlqRequest {
        namespace: Some(record.namespace.clone()),
        task_id: Some(record.task_id.clone()),
        execution_id: Some(record.execution_id.clone()),
        limit: Some(1),
        ..DlqRequest::default()
    };
    let listed = state.api.dlq("list", &request).await?;
    Ok(listed
        .get("entries")
        .and_then(Value::as_array)
        .and_then(|entries| entries.first())
        .and_then(|entry| entry.get("sequence"))
        .and_then(Value::as_u64))
}

fn refused(status: StatusCode, why: String) -> Response {
    html(status, pages::problem("Not retried", &[why]))
}

pub(crate) async fn retry(
    State(state): State<AppState>,
    Path(execution): Path<String>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = accept(&state, form, "retry", &["retry"], &[]) {
        return refusal;
    }
    if !is_valid_key(&execution) {
        return refused(StatusCode::NOT_FOUND, "No run has that id.".into());
    }
    let record = match state.runs.get(&execution).await {
        Ok(Some(value)) => match serde_json::from_slice::<RunRecord>(&value) {
            Ok(record) => record,
            Err(error) => return refused(StatusCode::BAD_GATEWAY, format!("read the run record: {error}")),
        },
        Ok(None) => {
            return refused(StatusCode::NOT_FOUND, format!("The runs bucket has no record of {execution}."));
        }
        Err(error) => return refused(StatusCode::BAD_GATEWAY, format!("read the run record: {error}")),
    };
    if !retriable(&record) {
        let why = format!(
            "Run {execution} is {}: only a run that failed for good is retried.",
            record.status.as_str()
        );
        return refused(StatusCode::CONFLICT, why);
    }
    let started = if record.status == RunStatus::Dead {
        let sequence = match dead_letter_of(&state, &record).await {
            Ok(Some(sequence)) => sequence,
            Ok(None) => {
                let why = format!(
                    "The dead letter of {execution} is gone (replayed or purged already): trigger the task to run it again."
                );
                return refused(StatusCode::CONFLICT, why);
            }
            Err(error) => return error.into_response(),
        };
        let request = DlqRequest { namespace: Some(record.namespace.clone()), ..DlqRequest::entry(sequence) };
        state
            .api
            .dlq("replay", &request)
            .await
            .map(|reply| reply["replayed"][0]["execution_id"].as_str().map(str::to_string))
    } else {
        let reference = json!({"namespace": record.namespace, "id": record.task_id});
        state
            .api
            .task("trigger", &record.namespace, reference)
            .await
            .map(|reply| reply["execution_id"].as_str().map(str::to_string))
    };
    match started {
        Ok(Some(new)) => {
            tracing::info!(execution = %execution, retry = %new, "console retry");
            Redirect::to(&format!("/runs/{new}")).into_response()
        }
        Ok(None) => Redirect::to(&format!("/runs/{execution}")).into_response(),
        Err(error) => error.into_response(),
    }
}
