//! The registry's request/reply API as the CLI calls it: one client, typed requests, task
//! references (`namespace/id`), and why a command failed.
//!
//! Replies are read as JSON values (or tolerant views of them) rather than the registry's
//! strict types, so a CLI talks to a newer registry whose specs have fields it does not know.

use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use jetsched_shared::error::{ApiError, ApiErrors, ErrorReply};
use jetsched_shared::names::Names;
use jetsched_shared::wire::{HDR_CREATE_ONLY, TaskRef};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How long a request waits for its reply.
const REPLY_WAIT: Duration = Duration::from_secs(15);

/// Why a command failed: the API said no (exit 1), problems already printed with a summary
/// (exit 1), or anything else: usage, connection, files (exit 2).
pub(crate) enum Failure {
    /// Every problem the API reported, in its order.
    Api(ApiErrors),
    /// The problems were printed as they came (per file by `apply`); this is the summary.
    Reported(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Other(error)
    }
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Failure {
        Failure::Api(ApiErrors::from(error))
    }
}

/// `namespace/id`, or `id` in namespace `default`.
pub(crate) fn task_ref(task: &str) -> TaskRef {
    let (namespace, id) = task.split_once('/').unwrap_or(("default", task));
    TaskRef { namespace: namespace.to_string(), id: id.to_string() }
}

/// A request of the dead-letter API: one entry by `sequence`, or a filter, with paging,
/// bulk-replay rate or purge-all where the endpoint takes them.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) all: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) priority: Option<String>,
}

/// The registry's API over one NATS connection.
pub(crate) struct Api {
    client: async_nats::Client,
    names: Names,
}

impl Api {
    pub(crate) fn new(client: async_nats::Client, names: Names) -> Api {
        Api { client, names }
    }

    /// A task endpoint (`get`, `list`, `next`, `pause`, ...) with a typed request; the reply
    /// decoded as `T` (a `Value` or a view of it).
    pub(crate) async fn task<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        let reply = self.request(self.names.task_api_subject(endpoint), body, HeaderMap::new()).await?;
        decode(endpoint, reply)
    }

    /// A task endpoint on the subject of one namespace (`<endpoint>.<namespace>`): the one a
    /// team confined to its namespace is allowed to call.
    pub(crate) async fn task_in<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        namespace: &str,
        request: &R,
    ) -> Result<T, Failure> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        let subject = self.names.task_api_namespaced(endpoint, namespace);
        let reply = self.request(subject, body, HeaderMap::new()).await?;
        decode(endpoint, reply)
    }

    /// `put`: the body is the spec itself, sent on the subject of its namespace.
    pub(crate) async fn put(&self, spec: &Value, create_only: bool) -> Result<Value, Failure> {
        let mut headers = HeaderMap::new();
        if create_only {
            headers.insert(HDR_CREATE_ONLY, "true");
        }
        let body = serde_json::to_vec(spec).context("encode the spec")?;
        self.request(self.names.task_api_namespaced("put", spec_namespace(spec)), body, headers).await
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`), on the subject of the
    /// request's namespace when it names one.
    pub(crate) async fn dlq<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &DlqRequest,
    ) -> Result<T, Failure> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        let subject = match &request.namespace {
            Some(namespace) => self.names.dlq_api_namespaced(endpoint, namespace),
            None => self.names.dlq_api_subject(endpoint),
        };
        let reply = self.request(subject, body, HeaderMap::new()).await?;
        decode(endpoint, reply)
    }

    /// A breaker endpoint (`list`, `get`, `reset`).
    pub(crate) async fn breaker<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        let reply = self.request(self.names.breaker_api_subject(endpoint), body, HeaderMap::new()).await?;
        decode(endpoint, reply)
    }

    async fn request(&self, subject: String, body: Vec<u8>, headers: HeaderMap) -> Result<Value, Failure> {
        let reply = tokio::time::timeout(
            REPLY_WAIT,
            self.client.request_with_headers(subject.clone(), headers, body.into()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no reply on {subject} within {}s", REPLY_WAIT.as_secs()))?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => {
                anyhow::anyhow!("nobody serves {subject}: is jetsched-registry running?")
            }
            _ => anyhow::anyhow!("request {subject}: {e}"),
        })?;
        let value: Value = serde_json::from_slice(&reply.payload).context("reply is not JSON")?;
        if value.get("error").is_some() {
            // `errors` when the registry sends it (every problem of a spec), else `error`.
            let reply: ErrorReply = serde_json::from_value(value).context("error reply")?;
            return Err(Failure::Api(reply.into_errors()));
        }
        Ok(value)
    }
}

/// The namespace a spec names, `default` when it names none (or not as a string: the registry
/// then names the mistake).
pub(crate) fn spec_namespace(spec: &Value) -> &str {
    spec.get("namespace").and_then(Value::as_str).unwrap_or("default")
}

fn decode<T: DeserializeOwned>(endpoint: &str, reply: Value) -> Result<T, Failure> {
    serde_json::from_value(reply)
        .with_context(|| format!("unexpected reply of {endpoint}"))
        .map_err(Failure::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_reference_defaults_to_the_default_namespace() {
        assert_eq!(
            task_ref("billing/nightly"),
            TaskRef { namespace: "billing".into(), id: "nightly".into() }
        );
        assert_eq!(task_ref("pulse"), TaskRef { namespace: "default".into(), id: "pulse".into() });
        assert_eq!(spec_namespace(&serde_json::json!({"namespace": "billing"})), "billing");
        assert_eq!(spec_namespace(&serde_json::json!({"id": "x"})), "default");
    }

    #[test]
    fn a_dlq_request_sends_only_what_is_set() {
        let request = DlqRequest { namespace: Some("ops".into()), limit: Some(1000), ..Default::default() };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({"namespace": "ops", "limit": 1000})
        );
    }
}
