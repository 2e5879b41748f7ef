//! The registry's request/reply API as a client calls it (the CLI, the console): a request
//! waits a bounded time for its reply, and an `{"error": ...}` reply comes back as every
//! problem it names.

use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use serde_json::Value;

use crate::error::{ApiErrors, ErrorReply};
use crate::names::Names;
use crate::wire::DlqRequest;

/// Why a call failed: the API said no, or the request did not get an answer it could read
/// (no responder, no reply in time, a reply that is not JSON).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Api(ApiErrors),
    #[error(transparent)]
    Transport(#[from] anyhow::Error),
}

/// The registry's API over one NATS connection; cheap to clone.
#[derive(Clone)]
pub struct ApiClient {
    client: async_nats::Client,
    names: Names,
    reply_wait: Duration,
}

impl ApiClient {
    /// Every request waits at most `reply_wait` for its reply.
    pub fn new(client: async_nats::Client, names: Names, reply_wait: Duration) -> ApiClient {
        ApiClient { client, names, reply_wait }
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`), on the subject of the
    /// request's namespace when it names one.
    pub async fn dlq(&self, endpoint: &str, request: &DlqRequest) -> Result<Value, CallError> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        let subject = match &request.namespace {
            Some(namespace) => self.names.dlq_api_namespaced(endpoint, namespace),
            None => self.names.dlq_api_subject(endpoint),
        };
        self.request(subject, HeaderMap::new(), body).await
    }

    /// One request; the reply as JSON, or the problems of an error reply (`errors` when the
    /// registry sends every problem of a spec, else `error`).
    pub async fn request(
        &self,
        subject: String,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Value, CallError> {
        let reply = tokio::time::timeout(
            self.reply_wait,
            self.client.request_with_headers(subject.clone(), headers, body.into()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no reply on {subject} within {}s", self.reply_wait.as_secs()))?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => {
                anyhow::anyhow!("nobody serves {subject}: is jetsched-registry running?")
            }
            _ => anyhow::anyhow!("request {subject}: {e}"),
        })?;
        let value: Value = serde_json::from_slice(&reply.payload).context("the reply is not JSON")?;
        if value.get("error").is_some() {
            let reply: ErrorReply = serde_json::from_value(value).context("an error reply")?;
            return Err(CallError::Api(reply.into_errors()));
        }
        Ok(value)
    }
}
