//! The registry's API as the tests call it: the shared client the CLI and the console use,
//! with every reply (a refusal too) handed back as the JSON the registry sent, so a test
//! asserts on `reply["error"]["code"]` the way a client in any language reads it.

use std::time::Duration;

use async_nats::HeaderMap;
use jetsched_shared::api_client::{ApiClient, CallError};
use jetsched_shared::error::ErrorReply;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{HDR_CREATE_ONLY, HDR_EXPECTED_REVISION};
use serde_json::Value;

/// How long a request waits for its reply: long enough for a registry that just started.
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// The registry's API over one connection (of any user or account), with the default names.
#[derive(Clone)]
pub struct Api {
    client: ApiClient,
}

impl Api {
    pub fn new(client: &async_nats::Client) -> Api {
        Api { client: ApiClient::new(client.clone(), Names::default(), REPLY_WAIT) }
    }

    pub fn names(&self) -> &Names {
        self.client.names()
    }

    /// A task endpoint (`get`, `list`, `pause`, `trigger`, ...) with a JSON body.
    pub async fn task(&self, endpoint: &str, body: Value) -> Value {
        self.call(self.names().task_api_subject(endpoint), body).await
    }

    /// [`Api::task`] with headers (a caller's `traceparent`).
    pub async fn task_with(&self, endpoint: &str, headers: HeaderMap, body: Value) -> Value {
        self.call_with(self.names().task_api_subject(endpoint), headers, body).await
    }

    /// A task endpoint on the subject of one namespace (`<endpoint>.<namespace>`).
    pub async fn task_in(&self, endpoint: &str, namespace: &str, body: Value) -> Value {
        self.call(self.names().task_api_namespaced(endpoint, namespace), body).await
    }

    /// A task endpoint about one task (`{"namespace", "id"}`), on its namespace's subject.
    pub async fn on(&self, endpoint: &str, namespace: &str, id: &str) -> Value {
        self.task_in(endpoint, namespace, serde_json::json!({"namespace": namespace, "id": id})).await
    }

    /// `put` of a spec (on the subject of every namespace).
    pub async fn put(&self, spec: &Value) -> Value {
        self.put_with(spec, HeaderMap::new()).await
    }

    /// `put` that must succeed; the reply.
    pub async fn store(&self, spec: &Value) -> Value {
        let reply = self.put(spec).await;
        assert!(reply.get("error").is_none(), "put {spec}: {reply}");
        reply
    }

    /// `put` with compare-and-set: only over `revision` (0: only when the task is new).
    pub async fn put_over(&self, spec: &Value, revision: u64) -> Value {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_EXPECTED_REVISION, revision.to_string().as_str());
        self.put_with(spec, headers).await
    }

    /// `put` that only creates.
    pub async fn create(&self, spec: &Value) -> Value {
        let mut headers = HeaderMap::new();
        headers.insert(HDR_CREATE_ONLY, "true");
        self.put_with(spec, headers).await
    }

    /// `put` with any headers (a `traceparent`, a raw compare-and-set value).
    pub async fn put_with(&self, spec: &Value, headers: HeaderMap) -> Value {
        self.call_with(self.names().task_api_subject("put"), headers, spec.clone()).await
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`).
    pub async fn dlq(&self, endpoint: &str, body: Value) -> Value {
        self.call(self.names().dlq_api_subject(endpoint), body).await
    }

    /// A breaker endpoint (`list`, `get`, `reset`).
    pub async fn breaker(&self, endpoint: &str, body: Value) -> Value {
        self.call(self.names().breaker_api_subject(endpoint), body).await
    }

    /// A queue endpoint (`list`, `pause`, `resume`).
    pub async fn queue(&self, endpoint: &str, body: Value) -> Value {
        self.call(self.names().queue_api_subject(endpoint), body).await
    }

    /// A request with a JSON body on any API subject; panics when no reply comes.
    pub async fn call(&self, subject: String, body: Value) -> Value {
        self.call_with(subject, HeaderMap::new(), body).await
    }

    /// [`Api::call`] with headers.
    pub async fn call_with(&self, subject: String, headers: HeaderMap, body: Value) -> Value {
        let what = subject.clone();
        let body = serde_json::to_vec(&body).expect("a JSON value encodes");
        self.reply(subject, headers, body).await.unwrap_or_else(|e| panic!("{what}: {e:#}"))
    }

    /// One request; the reply as JSON (an error reply as its `{"error", "errors"}` envelope),
    /// or why none came (no responder, no reply in time, not JSON): for checks that retry.
    pub async fn reply(&self, subject: String, headers: HeaderMap, body: Vec<u8>) -> anyhow::Result<Value> {
        match self.client.request(subject, headers, body).await {
            Ok(value) => Ok(value),
            Err(CallError::Api(errors)) => Ok(serde_json::to_value(ErrorReply::new(&errors))?),
            Err(CallError::Transport(error)) => Err(error),
        }
    }
}
