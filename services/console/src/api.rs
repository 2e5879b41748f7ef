//! The registry's request/reply API as the console calls it: every read that needs the
//! registry (a task's spec, next fires, dead letters) and every action. The console never
//! writes a bucket or stream itself.

use std::time::Duration;

use anyhow::Context;
use jetsched_shared::error::ErrorReply;
use jetsched_shared::names::Names;
use serde::Serialize;
use serde_json::{Value, json};

/// How long a request waits for its reply.
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// Why a call failed, as shown to the operator: the API's problems, or the transport's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallError {
    /// `not_found` when the registry says so (pages answer 404 then).
    pub(crate) code: Option<String>,
    pub(crate) messages: Vec<String>,
}

impl CallError {
    fn other(error: anyhow::Error) -> CallError {
        CallError { code: None, messages: vec![format!("{error:#}")] }
    }

    pub(crate) fn is_not_found(&self) -> bool {
        self.code.as_deref() == Some("not_found")
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.messages.join("; "))
    }
}

/// A dead-letter request: one entry by sequence, or a filtered page.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct DlqRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sequence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) task_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cursor: Option<u64>,
}

/// The registry's API over the console's connection.
#[derive(Clone)]
pub(crate) struct Api {
    client: async_nats::Client,
    names: Names,
}

impl Api {
    pub(crate) fn new(client: async_nats::Client, names: Names) -> Api {
        Api { client, names }
    }

    /// A task endpoint (`get`, `next`, `pause`, `resume`, `trigger`, `delete`) for one task,
    /// on the subject of its namespace.
    pub(crate) async fn task(
        &self,
        endpoint: &str,
        namespace: &str,
        body: Value,
    ) -> Result<Value, CallError> {
        self.request(self.names.task_api_namespaced(endpoint, namespace), body).await
    }

    /// The next `count` fires of a stored task.
    pub(crate) async fn next(&self, namespace: &str, id: &str, count: usize) -> Result<Value, CallError> {
        self.task("next", namespace, json!({"namespace": namespace, "id": id, "count": count})).await
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`).
    pub(crate) async fn dlq(&self, endpoint: &str, request: &DlqRequest) -> Result<Value, CallError> {
        let body = serde_json::to_value(request).context("encode the request").map_err(CallError::other)?;
        let subject = match &request.namespace {
            Some(namespace) => self.names.dlq_api_namespaced(endpoint, namespace),
            None => self.names.dlq_api_subject(endpoint),
        };
        self.request(subject, body).await
    }

    async fn request(&self, subject: String, body: Value) -> Result<Value, CallError> {
        let payload = serde_json::to_vec(&body).context("encode the request").map_err(CallError::other)?;
        let reply = tokio::time::timeout(REPLY_WAIT, self.client.request(subject.clone(), payload.into()))
            .await
            .map_err(|_| anyhow::anyhow!("no reply on {subject} within {}s", REPLY_WAIT.as_secs()))
            .map_err(CallError::other)?
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => {
                    anyhow::anyhow!("nobody serves {subject}: is jetsched-registry running?")
                }
                _ => anyhow::anyhow!("request {subject}: {e}"),
            })
            .map_err(CallError::other)?;
        let value: Value = serde_json::from_slice(&reply.payload)
            .context("the reply is not JSON")
            .map_err(CallError::other)?;
        if value.get("error").is_some() {
            let reply: ErrorReply =
                serde_json::from_value(value).context("an error reply").map_err(CallError::other)?;
            let errors = reply.into_errors();
            let code = errors.as_slice().first().map(|e| e.code.as_str().to_string());
            return Err(CallError {
                code,
                messages: errors.as_slice().iter().map(ToString::to_string).collect(),
            });
        }
        Ok(value)
    }
}
