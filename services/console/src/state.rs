//! What every page handler shares (`AppState`), and how a page becomes a response.

use std::sync::Arc;

use async_nats::jetstream;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use jetsched_shared::names::Names;
use jetsched_shared::wire::Event;
use maud::Markup;
use tokio::sync::broadcast;

use crate::access::Access;
use crate::activity::SharedActivity;
use crate::api::{Api, CallError};
use crate::index::SharedIndex;
use crate::pages::Ctx;
use crate::replicas::Replicas;

/// What every handler shares; cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) index: SharedIndex,
    pub(crate) activity: SharedActivity,
    pub(crate) replicas: Replicas,
    pub(crate) live: broadcast::Sender<Event>,
    pub(crate) api: Api,
    pub(crate) access: Access,
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) names: Names,
    pub(crate) runs: Arc<jetstream::kv::Store>,
    pub(crate) page_size: usize,
    pub(crate) trace: crate::trace::TraceLinks,
}

impl AppState {
    pub(crate) fn ctx(&self) -> Ctx {
        Ctx { csrf: self.access.csrf().to_string(), allow_actions: self.access.allow_actions }
    }
}

/// An HTML response.
/// The subjects of the runs open breakers hold in the dispatch stream under `filter` (all of
/// them: `names.delayed_wildcard()`), each with its count: one listing, whatever the number of
/// queues, tasks and breakers.
pub(crate) async fn held_subjects(state: &AppState, filter: String) -> Result<Vec<(String, usize)>, String> {
    use futures::TryStreamExt;
    let stream = state.js.get_stream(state.names.dispatch_stream()).await.map_err(|e| e.to_string())?;
    let subjects = stream.info_with_subjects(filter).await.map_err(|e| e.to_string())?;
    subjects.try_collect().await.map_err(|e| e.to_string())
}

/// A registry reply decoded as `T`, or the response to send instead: the call's error, or a
/// 502 page (titled `page`) saying what did not decode.
#[allow(clippy::result_large_err, reason = "the error is the response itself, returned at once")]
pub(crate) fn decoded<T: serde::de::DeserializeOwned>(
    reply: Result<serde_json::Value, CallError>,
    page: &str,
) -> Result<T, Response> {
    let reply = reply.map_err(IntoResponse::into_response)?;
    serde_json::from_value(reply)
        .map_err(|error| html(StatusCode::BAD_GATEWAY, crate::pages::problem(page, &[error.to_string()])))
}

pub(crate) fn html(status: StatusCode, markup: Markup) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], markup.into_string()).into_response()
}

/// Keys a bucket accepts (a run's execution id, a breaker's key).
pub(crate) fn is_valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 256
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'=' | b'.' | b'/'))
}
