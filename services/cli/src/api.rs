//! The registry's request/reply API as the CLI calls it: one client, typed requests, task
//! references (`namespace/id`), and why a command failed.
//!
//! Replies are read as JSON values (or tolerant views of them) rather than the registry's
//! strict types, so a CLI talks to a newer registry whose specs have fields it does not know.

use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use jetsched_shared::api_client::{ApiClient, CallError};
use jetsched_shared::error::{ApiError, ApiErrors};
use jetsched_shared::names::Names;
use jetsched_shared::wire::{DlqRequest, HDR_CREATE_ONLY, HDR_EXPECTED_REVISION, TaskRef};
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

impl From<CallError> for Failure {
    fn from(error: CallError) -> Failure {
        match error {
            CallError::Api(errors) => Failure::Api(errors),
            CallError::Transport(error) => Failure::Other(error),
        }
    }
}

/// `namespace/id`, or `id` in namespace `default`.
pub(crate) fn task_ref(task: &str) -> TaskRef {
    let (namespace, id) = task.split_once('/').unwrap_or(("default", task));
    TaskRef { namespace: namespace.to_string(), id: id.to_string() }
}

/// An RFC 3339 instant given on the command line (`--after`, `--from`, `--to`).
pub(crate) fn parse_instant(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("not an RFC 3339 instant ({e}), e.g. 2026-03-07T00:00:00Z"))
}

/// The registry's API over one NATS connection.
pub(crate) struct Api {
    client: ApiClient,
}

impl Api {
    pub(crate) fn new(client: async_nats::Client, names: Names) -> Api {
        Api { client: ApiClient::new(client, names, REPLY_WAIT) }
    }

    /// A task endpoint (`get`, `list`, `next`, `pause`, ...) with a typed request; the reply
    /// decoded as `T` (a `Value` or a view of it).
    pub(crate) async fn task<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().task_api_subject(endpoint), request).await
    }

    /// A task endpoint on the subject of one namespace (`<endpoint>.<namespace>`): the one a
    /// team confined to its namespace is allowed to call.
    pub(crate) async fn task_in<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        namespace: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().task_api_namespaced(endpoint, namespace), request).await
    }

    /// `put`: the body is the spec itself, sent on the subject of its namespace.
    pub(crate) async fn put(&self, spec: &Value, create_only: bool) -> Result<Value, Failure> {
        let mut headers = HeaderMap::new();
        if create_only {
            headers.insert(HDR_CREATE_ONLY, "true");
        }
        let body = serde_json::to_vec(spec).context("encode the spec")?;
        let subject = self.client.names().task_api_namespaced("put", spec_namespace(spec));
        Ok(self.client.request(subject, headers, body).await?)
    }

    /// A dead-letter endpoint (`list`, `get`, `replay`, `purge`), on the subject of the
    /// request's namespace when it names one.
    pub(crate) async fn dlq<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &DlqRequest,
    ) -> Result<T, Failure> {
        decode(endpoint, self.client.dlq(endpoint, request).await?)
    }

    /// The event history of one namespace (`<prefix>.api.events.history.<namespace>`), the
    /// way a team in an account of its own reads it: the last `last` events, oldest first.
    pub(crate) async fn event_history(
        &self,
        namespace: &str,
        task_id: Option<&str>,
        last: u64,
    ) -> Result<Vec<Value>, Failure> {
        let request = serde_json::json!({ "task_id": task_id, "last": last.clamp(1, 1000) });
        let subject = self.client.names().events_api_namespaced("history", namespace);
        let reply: Value = self.call("history", subject, &request).await?;
        Ok(reply.get("events").and_then(Value::as_array).cloned().unwrap_or_default())
    }

    /// A run endpoint (`get`, `cancel`, `cancel-task`) on the subject of `namespace`.
    pub(crate) async fn runs<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        namespace: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().runs_api_namespaced(endpoint, namespace), request).await
    }

    /// A breaker endpoint (`list`, `get`, `reset`).
    pub(crate) async fn breaker<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().breaker_api_subject(endpoint), request).await
    }

    /// A calendar endpoint (`get`, `list`, `delete`) on the subject of `namespace`, or on the
    /// plain subject (every namespace: administrators) without one.
    pub(crate) async fn calendar<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        namespace: Option<&str>,
        request: &R,
    ) -> Result<T, Failure> {
        let names = self.client.names();
        let subject = match namespace {
            Some(namespace) => names.calendar_api_namespaced(endpoint, namespace),
            None => names.calendar_api_subject(endpoint),
        };
        self.call(endpoint, subject, request).await
    }

    /// A calendar's `put`: the body is the calendar itself, sent on the subject of its
    /// namespace, with compare-and-set on `revision` (0: must not exist) when given.
    pub(crate) async fn calendar_put(
        &self,
        calendar: &Value,
        revision: Option<u64>,
        create_only: bool,
    ) -> Result<Value, Failure> {
        let mut headers = HeaderMap::new();
        if create_only {
            headers.insert(HDR_CREATE_ONLY, "true");
        }
        if let Some(revision) = revision {
            headers.insert(HDR_EXPECTED_REVISION, revision.to_string().as_str());
        }
        let body = serde_json::to_vec(calendar).context("encode the calendar")?;
        let subject = self.client.names().calendar_api_namespaced("put", spec_namespace(calendar));
        Ok(self.client.request(subject, headers, body).await?)
    }

    /// A queue endpoint (`list`, `pause`, `resume`).
    pub(crate) async fn queue<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().queue_api_subject(endpoint), request).await
    }

    /// A limits endpoint (`list`, `set`, `clear`).
    pub(crate) async fn limits<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().limits_api_subject(endpoint), request).await
    }

    /// A backfill endpoint (`start`, `status`, `list`, `cancel`) on the subject of `namespace`.
    pub(crate) async fn backfill<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        namespace: &str,
        request: &R,
    ) -> Result<T, Failure> {
        self.call(endpoint, self.client.names().backfill_api_namespaced(endpoint, namespace), request).await
    }

    /// `endpoint` on `subject` with a typed request, its reply decoded as `T`.
    async fn call<R: Serialize, T: DeserializeOwned>(
        &self,
        endpoint: &str,
        subject: String,
        request: &R,
    ) -> Result<T, Failure> {
        let body = serde_json::to_vec(request).context("encode the request")?;
        decode(endpoint, self.client.request(subject, HeaderMap::new(), body).await?)
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

/// Every item of a paged listing: `page` fetches the page at a cursor (`None`: the first) and
/// returns its items and the next page's cursor, until there is none.
pub(crate) async fn every_page<C>(
    mut page: impl AsyncFnMut(Option<C>) -> Result<(Vec<Value>, Option<C>), Failure>,
) -> Result<Vec<Value>, Failure> {
    let mut items = Vec::new();
    let mut cursor = None;
    loop {
        let (more, next) = page(cursor).await?;
        items.extend(more);
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
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
}
