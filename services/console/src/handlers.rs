//! The read-only pages: each gathers its data (index, recent activity, registry API, buckets)
//! and hands it to its renderer in `pages`.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use jetsched_shared::wire::{DlqRequest, Event, GraphReply, RunRecord, RunStatus, TaskState, TaskStatus};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::api::CallError;
use crate::index::TaskQuery;
use crate::pages::{self, dlq::DlqFilter, events::EventFilter, tasks::TaskView};
use crate::runs::runs_from_events;
use crate::state::{AppState, html, is_valid_key};
use crate::status;

/// Events listed on a task's page and on the events page.
const EVENTS_SHOWN: usize = 100;
/// Dead letters per page.
const DLQ_PAGE: usize = 50;

fn not_found(what: &str) -> Response {
    html(StatusCode::NOT_FOUND, pages::problem("Not found", &[what.to_string()]))
}

fn failed(title: &str, error: &CallError) -> Response {
    let status = if error.is_not_found() { StatusCode::NOT_FOUND } else { StatusCode::BAD_GATEWAY };
    html(status, pages::problem(title, &error.messages))
}

pub(crate) async fn overview(State(state): State<AppState>) -> Response {
    let tasks = state.index.read().expect("task index lock").len();
    let overview =
        status::overview(&state.client, &state.js, &state.names, &state.activity, &state.replicas, tasks)
            .await;
    let overview = pages::overview::Overview { trace: state.trace.clone(), ..overview };
    html(StatusCode::OK, pages::overview::page(&overview))
}

pub(crate) async fn tasks(
    State(state): State<AppState>,
    Query(query): Query<TaskQuery>,
    RawQuery(raw): RawQuery,
) -> Response {
    // Only `state=failing` needs the failing tasks (a copy of their keys).
    let failing = match query.state.as_str() {
        "failing" => state.activity.read().expect("activity lock").task_runs().failing().clone(),
        _ => Default::default(),
    };
    let (page, queues) = {
        let index = state.index.read().expect("task index lock");
        (index.search(&query, state.page_size, &failing), index.queues())
    };
    let states = crate::status::task_states(&state.client, &state.names, &page.tasks).await;
    let extras = crate::task_list::extras(&state, &page.tasks).await;
    let raw = raw.as_deref().unwrap_or("");
    html(StatusCode::OK, pages::tasks::list(&page, &states, &extras, &query, raw, &queues))
}

pub(crate) async fn task(
    State(state): State<AppState>,
    Path((namespace, id)): Path<(String, String)>,
) -> Response {
    let reference = json!({"namespace": namespace, "id": id});
    let (stored, next, held, backfills, graph) = tokio::join!(
        state.api.task("get", &namespace, reference.clone()),
        state.api.next(&namespace, &id, 10),
        crate::breakers::held_of_task(&state, &namespace, &id),
        state.api.backfill("list", &namespace, json!({"id": id})),
        state.api.task("graph", &namespace, reference)
    );
    let graph = graph.map_err(|e| e.to_string()).and_then(|reply| {
        serde_json::from_value::<GraphReply>(reply).map_err(|e| format!("the registry's graph reply: {e}"))
    });
    let backfills = backfills
        .map(|reply| reply.get("backfills").and_then(Value::as_array).cloned().unwrap_or_default())
        .map_err(|e| e.to_string());
    let stored = match stored {
        Ok(stored) => stored,
        Err(error) => return failed(&format!("Task {id}"), &error),
    };
    let spec = stored.get("task").cloned().unwrap_or(Value::Null);
    let revision = stored.get("revision").and_then(Value::as_u64).unwrap_or(0);
    // The registry's state by the shared rule (a fired one-shot is completed).
    let task_state = stored.get("status").and_then(|s| serde_json::from_value::<TaskStatus>(s.clone()).ok());
    let paused = spec.get("paused").and_then(Value::as_bool).unwrap_or(false);
    let remaining_runs = task_state.as_ref().and_then(|s| s.remaining_runs);
    let task_state = task_state.map(|s| s.state).unwrap_or_else(|| {
        TaskState::derive(spec.get("schedule").and_then(TaskState::one_shot_at), paused, None)
    });
    let (runs, events) = {
        let activity = state.activity.read().expect("activity lock");
        let of_task = |e: &&Event| e.namespace == namespace && e.task_id == id;
        let runs = runs_from_events(activity.events().filter(of_task), |_| true);
        let events: Vec<Event> = activity.events().filter(of_task).take(EVENTS_SHOWN).cloned().collect();
        (runs, events)
    };
    let view = TaskView {
        namespace: &namespace,
        id: &id,
        spec: &spec,
        revision,
        state: task_state,
        remaining_runs,
        next: next.map_err(|e| e.to_string()),
        runs: &runs,
        events: &events,
        held,
        backfills,
        graph,
        trace: &state.trace,
    };
    html(StatusCode::OK, pages::tasks::task(&state.ctx(), &view))
}

pub(crate) async fn run(State(state): State<AppState>, Path(execution): Path<String>) -> Response {
    if !is_valid_key(&execution) {
        return not_found("No run has that id.");
    }
    let record = match state.runs.get(&execution).await {
        Ok(Some(value)) => serde_json::from_slice::<RunRecord>(&value).ok(),
        Ok(None) => None,
        Err(error) => {
            return html(
                StatusCode::BAD_GATEWAY,
                pages::problem("Run", &[format!("read the run record: {error}")]),
            );
        }
    };
    let (events, mut replays) = {
        let activity = state.activity.read().expect("activity lock");
        let mut events = Vec::new();
        let mut replays = Vec::new();
        for event in activity.events() {
            if event.execution_id.as_deref() == Some(execution.as_str()) {
                events.push(event.clone());
            } else if event.replay_of.as_deref() == Some(execution.as_str())
                && let Some(replay) = &event.execution_id
            {
                replays.push(replay.clone());
            }
        }
        (events, replays)
    };
    replays.sort();
    replays.dedup();
    let replay_of = record
        .as_ref()
        .and_then(|r| r.replay_of.clone())
        .or_else(|| events.iter().find_map(|e| e.replay_of.clone()));
    let dead_letter = match &record {
        Some(record) if record.status == RunStatus::Dead => {
            crate::retry::dead_letter_of(&state, record).await.map_err(|e| e.to_string())
        }
        _ => Ok(None),
    };
    let related = pages::runs::Related {
        replay_of,
        dead_letter,
        replays,
        retriable: record.as_ref().is_some_and(crate::retry::retriable),
    };
    html(
        StatusCode::OK,
        pages::runs::run(&state.ctx(), &execution, record.as_ref(), &events, &related, &state.trace),
    )
}

pub(crate) async fn dlq(State(state): State<AppState>, Query(filter): Query<DlqFilter>) -> Response {
    let request = match filter.request() {
        Ok(request) => DlqRequest { limit: Some(DLQ_PAGE), ..request },
        Err(problems) => return html(StatusCode::BAD_REQUEST, pages::problem("Dead letters", &problems)),
    };
    let listed = match state.api.dlq("list", &request).await {
        Ok(listed) => listed,
        Err(error) => return failed("Dead letters", &error),
    };
    let entries = listed.get("entries").and_then(Value::as_array).cloned().unwrap_or_default();
    let next = listed.get("next_cursor").and_then(Value::as_u64);
    let total = async {
        let mut stream = state.js.get_stream(state.names.dlq_stream()).await.ok()?;
        Some(stream.info().await.ok()?.state.messages)
    }
    .await;
    html(StatusCode::OK, pages::dlq::list(&entries, next, &filter, total))
}

pub(crate) async fn dlq_entry(State(state): State<AppState>, Path(sequence): Path<u64>) -> Response {
    match state.api.dlq("get", &DlqRequest::entry(sequence)).await {
        Ok(listed) => {
            let entry = listed.get("entry").cloned().unwrap_or(Value::Null);
            html(StatusCode::OK, pages::dlq::entry(&state.ctx(), sequence, &entry))
        }
        Err(error) => failed(&format!("Dead letter {sequence}"), &error),
    }
}

pub(crate) async fn events(State(state): State<AppState>, Query(filter): Query<EventFilter>) -> Response {
    let events: Vec<Event> = {
        let activity = state.activity.read().expect("activity lock");
        activity.events().filter(|e| filter.matches(e)).take(EVENTS_SHOWN).cloned().collect()
    };
    html(StatusCode::OK, pages::events::page(&events, &filter, &state.trace))
}

/// New events matching the filter as they are stored, each a rendered table row.
pub(crate) async fn event_stream(
    State(state): State<AppState>,
    Query(filter): Query<EventFilter>,
) -> Sse<impl Stream<Item = Result<sse::Event, Infallible>>> {
    let receiver = state.live.subscribe();
    let trace = state.trace.clone();
    let stream =
        futures::stream::unfold((receiver, filter, trace), |(mut receiver, filter, trace)| async move {
            loop {
                match receiver.recv().await {
                    Ok(event) if filter.matches(&event) => {
                        let row = pages::events::row(&event, &trace).into_string();
                        let message = sse::Event::default().event("event").data(row);
                        return Some((Ok(message), (receiver, filter, trace)));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        let message = sse::Event::default().event("lagged").data(missed.to_string());
                        return Some((Ok(message), (receiver, filter, trace)));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

impl IntoResponse for CallError {
    fn into_response(self) -> Response {
        failed("Request failed", &self)
    }
}
