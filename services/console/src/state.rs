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
use crate::api::Api;
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
}

impl AppState {
    pub(crate) fn ctx(&self) -> Ctx {
        Ctx { csrf: self.access.csrf().to_string(), allow_actions: self.access.allow_actions }
    }
}

/// An HTML response.
pub(crate) fn html(status: StatusCode, markup: Markup) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], markup.into_string()).into_response()
}

/// Keys a bucket accepts (a run's execution id, a breaker's key).
pub(crate) fn is_valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 256
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'=' | b'.' | b'/'))
}
