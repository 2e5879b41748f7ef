//! Bulk replay and purge of the dead letters a filter selects: `GET /dlq/bulk?action=..&<filter>`
//! counts the selection and asks for confirmation (a checkbox stating the count);
//! `POST /dlq/bulk/{replay,purge}` does it through the registry's DLQ API with the same filter,
//! bounded by the last sequence and the count confirmed, so an entry dead-lettered after the
//! confirmation is left alone.

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use jetsched_shared::wire::DlqRequest;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actions::{ActionForm, accept};
use crate::pages::{self, dlq::DlqFilter};
use crate::state::{AppState, html};

/// Entries one bulk action takes at most (the registry's largest page).
pub(crate) const MAX_SELECTED: usize = 1000;
/// Entries replayed per second by a bulk replay (the registry's highest rate).
const RATE: u32 = 1000;

#[derive(Debug, Deserialize)]
pub(crate) struct BulkQuery {
    #[serde(default)]
    action: String,
    #[serde(flatten)]
    filter: DlqFilter,
}

/// What the confirmation shows: the entries selected (sequence and entry), up to
/// [`MAX_SELECTED`], and whether more match.
pub(crate) struct Selection {
    pub(crate) entries: Vec<Value>,
    pub(crate) more: bool,
}

impl Selection {
    /// The last sequence selected: the bound of the action.
    pub(crate) fn through(&self) -> u64 {
        self.entries.iter().filter_map(|e| e.get("sequence").and_then(Value::as_u64)).max().unwrap_or(0)
    }
}

fn known(action: &str) -> bool {
    matches!(action, "replay" | "purge")
}

pub(crate) async fn confirm(State(state): State<AppState>, Query(query): Query<BulkQuery>) -> Response {
    if !known(&query.action) {
        return html(StatusCode::NOT_FOUND, pages::problem("Not found", &["No such action.".into()]));
    }
    let request = match query.filter.request() {
        Ok(request) => DlqRequest { cursor: None, ..request },
        Err(problems) => return html(StatusCode::BAD_REQUEST, pages::problem("Dead letters", &problems)),
    };
    let mut selection = Selection { entries: Vec::new(), more: false };
    let mut cursor = None;
    loop {
        let left = MAX_SELECTED - selection.entries.len();
        let page = DlqRequest { limit: Some(left), cursor, ..request.clone() };
        let listed = match state.api.dlq("list", &page).await {
            Ok(listed) => listed,
            Err(error) => return error.into_response(),
        };
        selection
            .entries
            .extend(listed.get("entries").and_then(Value::as_array).cloned().unwrap_or_default());
        cursor = listed.get("next_cursor").and_then(Value::as_u64);
        if cursor.is_none() {
            break;
        }
        if selection.entries.len() >= MAX_SELECTED {
            selection.more = true;
            break;
        }
    }
    html(StatusCode::OK, pages::bulk::confirm(&state.ctx(), &query.action, &query.filter, &selection))
}

pub(crate) async fn act(
    State(state): State<AppState>,
    Path(action): Path<String>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let fields = form.map(|Form(fields)| fields).unwrap_or_default();
    let action_form: ActionForm = serde_json::from_value(json!(fields)).unwrap_or_default();
    if let Err(refusal) =
        accept(&state, Ok(Form(action_form)), &action, &["replay", "purge"], &["replay", "purge"])
    {
        return refusal;
    }
    let filter: DlqFilter = serde_json::from_value(json!(fields)).unwrap_or_default();
    let number = |key: &str| fields.get(key).and_then(|v| v.trim().parse::<u64>().ok());
    let (Some(through), Some(count)) = (number("through"), number("count")) else {
        let why = "The form carries no confirmed selection: open the confirmation again.".to_string();
        return html(StatusCode::BAD_REQUEST, pages::problem("Refused", &[why]));
    };
    let request = match filter.request() {
        Ok(request) => DlqRequest {
            cursor: None,
            through: Some(through),
            limit: Some((count as usize).clamp(1, MAX_SELECTED)),
            rate: (action == "replay").then_some(RATE),
            ..request
        },
        Err(problems) => return html(StatusCode::BAD_REQUEST, pages::problem("Dead letters", &problems)),
    };
    match state.api.dlq(&action, &request).await {
        Ok(reply) => {
            tracing::info!(action, count, "console bulk dead-letter action");
            html(StatusCode::OK, pages::bulk::done(&action, &filter, &reply))
        }
        Err(error) => error.into_response(),
    }
}
