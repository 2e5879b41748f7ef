//! The registry's request/reply API as the console calls it: every read that needs the
//! registry (a task's spec, next fires, dead letters) and every action. The console never
//! writes a bucket or stream itself.

use std::time::Duration;

use async_nats::HeaderMap;
use jetsched_shared::api_client::{self, ApiClient};
use jetsched_shared::names::Names;
use jetsched_shared::wire::{BreakerRef, DlqRequest, HDR_CREATE_ONLY, HDR_EXPECTED_REVISION};
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
    pub(crate) fn is_not_found(&self) -> bool {
        self.code.as_deref() == Some("not_found")
    }
}

impl From<api_client::CallError> for CallError {
    fn from(error: api_client::CallError) -> CallError {
        match error {
            api_client::CallError::Api(errors) => CallError {
                code: Some(errors.first().code.as_str().to_string()),
                messages: errors.as_slice().iter().map(ToString::to_string).collect(),
            },
            api_client::CallError::Transport(error) => {
                CallError { code: None, messages: vec![format!("{error:#}")] }
            }
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.messages.join("; "))
    }
}

/// The registry's API over the console's connection.
#[derive(Clone)]
pub(crate) struct Api {
    client: ApiClient,
}

impl Api {
    pub(crate) fn new(client: async_nats::Client, names: Names) -> Api {
        Api { client: ApiClient::new(client, names, REPLY_WAIT) }
    }

    /// A task endpoint (`get`, `next`, `pause`, `resume`, `trigger`, `delete`) for one task,
    /// on the subject of its namespace.
    pub(crate) async fn task(
        &self,
        endpoint: &str,
        namespace: &str,
        body: Value,
    ) -> Result<Value, CallError> {
        let subject = self.client.names().task_api_namespaced(endpoint, namespace);
        Ok(self.client.request(subject, HeaderMap::new(), body.to_string().into_bytes()).await?)
    }

    /// `put`: stores `spec` (the body as the operator wrote it) on the subject of `namespace`
    /// (the one without a namespace when `None`); only over `expected` when given
    /// (compare-and-set), only as a new task when `None` and `create_only`.
    pub(crate) async fn put(
        &self,
        namespace: Option<&str>,
        spec: Vec<u8>,
        expected: Option<u64>,
        create_only: bool,
    ) -> Result<Value, CallError> {
        let mut headers = HeaderMap::new();
        match expected {
            Some(revision) => headers.insert(HDR_EXPECTED_REVISION, revision.to_string()),
            None if create_only => headers.insert(HDR_CREATE_ONLY, "true"),
            None => {}
        }
        let names = self.client.names();
        let subject = match namespace {
            Some(namespace) => names.task_api_namespaced("put", namespace),
            None => names.task_api_subject("put"),
        };
        Ok(self.client.request(subject, headers, spec).await?)
    }

    /// The next `count` fires of a stored task.
    pub(crate) async fn next(&self, namespace: &str, id: &str, count: usize) -> Result<Value, CallError> {
        self.task("next", namespace, json!({"namespace": namespace, "id": id, "count": count})).await
    }

    /// A run endpoint (`cancel`, `cancel-task`) on the subject of `namespace`.
    pub(crate) async fn runs(
        &self,
        endpoint: &str,
        namespace: &str,
        body: Value,
    ) -> Result<Value, CallError> {
        let subject = self.client.names().runs_api_namespaced(endpoint, namespace);
        Ok(self.client.request(subject, HeaderMap::new(), body.to_string().into_bytes()).await?)
    }

    /// A backfill endpoint (`start`, `list`, `cancel`) on the subject of `namespace`.
    pub(crate) async fn backfill(
        &self,
        endpoint: &str,
        namespace: &str,
        body: Value,
    ) -> Result<Value, CallError> {
        let subject = self.client.names().backfill_api_namespaced(endpoint, namespace);
        Ok(self.client.request(subject, HeaderMap::new(), body.to_string().into_bytes()).await?)
    }

    /// A breaker endpoint (`list`, `get`, `reset`).
    pub(crate) async fn breaker(&self, endpoint: &str, reference: &BreakerRef) -> Result<Value, CallError> {
        let subject = self.client.names().breaker_api_subject(endpoint);
        let body = serde_json::to_vec(reference)
            .map_err(|e| CallError { code: None, messages: vec![e.to_string()] })?;
        Ok(self.client.request(subject, HeaderMap::new(), body).await?)
    }

    /// A queue endpoint (`list`, `pause`, `resume`).
    pub(crate) async fn queue(&self, endpoint: &str, body: Value) -> Result<Value, CallError> {
        let subject = self.client.names().queue_api_subject(endpoint);
        Ok(self.client.request(subject, HeaderMap::new(), body.to_string().into_bytes()).await?)
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`).
    pub(crate) async fn dlq(&self, endpoint: &str, request: &DlqRequest) -> Result<Value, CallError> {
        Ok(self.client.dlq(endpoint, request).await?)
    }
}
