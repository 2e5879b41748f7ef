//! The `nats` executor: a request to the spec's subject, so handlers can be written in any
//! language.
//!
//! The request carries the trigger's payload, or else the spec's `payload`, as JSON (empty when
//! absent), the spec's headers and
//! the execution headers `Jetsched-Execution-Id`, `Jetsched-Task`, `Jetsched-Nominal-Time`,
//! `Jetsched-Attempt` and `Jetsched-Trigger`. Reply contract, first match wins:
//!
//! 1. header `Jetsched-Status: ok | retry | fail` (the body, if any, is the detail or error);
//! 2. a JSON object body with `"status": "ok" | "retry" | "fail"` and an optional `"error"`;
//! 3. NATS micro-service error headers (`Nats-Service-Error-Code`): 5xx → retry, others → fail;
//! 4. any other reply → ok (so a plain `nats reply` responder works).
//!
//! No responders, a timeout or a connection error → retry. An unknown status → fail.
//!
//! Confinement: a subject in a reserved space (the server's `$...`, reply subjects `_INBOX...`
//! and `_R_`, jetsched's own `<prefix>.>`) is refused before anything is sent, whatever the
//! registry let through (a spec stored before the rule, or written straight into the tasks
//! bucket): the attempt fails permanently, naming `executor.subject`. A namespace given
//! `--executor-credentials` sends its requests on a connection of its own, authenticated as
//! that namespace's NATS user, so a task reaches only what that user may; with
//! `--executor-credentials-required`, a namespace without credentials is refused instead of
//! borrowing the worker's rights.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use async_nats::client::{Request, RequestErrorKind};
use jetsched_shared::config::{NatsArgs, NatsCredentials};
use jetsched_shared::names::Names;
use jetsched_shared::spec::confined_subject;
use jetsched_shared::wire::HDR_STATUS;

use super::attempt::{Attempt, head};
use crate::verdict::Outcome;

const SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";
const SERVICE_ERROR: &str = "Nats-Service-Error";

pub(crate) struct NatsExecutor {
    names: Names,
    /// The worker's own connection.
    client: async_nats::Client,
    /// The connection of each namespace given credentials.
    by_namespace: HashMap<String, async_nats::Client>,
    /// Refuse namespaces without a connection of their own.
    required: bool,
    body_limit: usize,
}

/// Opens one connection per namespace in `credentials`, to the servers of `nats` with its TLS
/// settings, authenticated with that namespace's credentials and receiving replies under
/// `_INBOX.<namespace>` (all a team's NATS user needs to subscribe to).
pub(crate) async fn connect_namespaces(
    nats: &NatsArgs,
    credentials: &BTreeMap<String, PathBuf>,
    instance: &str,
) -> anyhow::Result<HashMap<String, async_nats::Client>> {
    let mut clients = HashMap::new();
    for (namespace, path) in credentials {
        let what = || format!("--executor-credentials {namespace}={}", path.display());
        let credentials = NatsCredentials::read(path).with_context(what)?;
        let client = nats
            .with_credentials(&credentials)
            .connect_with_inbox_prefix(
                &format!("jetsched-worker {instance} executor {namespace}"),
                Some(&Names::namespace_inbox_prefix(namespace)),
            )
            .await
            .with_context(|| format!("{} ({})", what(), credentials.kind()))?;
        clients.insert(namespace.clone(), client);
    }
    Ok(clients)
}

impl NatsExecutor {
    pub(crate) fn new(
        names: Names,
        client: async_nats::Client,
        by_namespace: HashMap<String, async_nats::Client>,
        required: bool,
        body_limit: usize,
    ) -> NatsExecutor {
        NatsExecutor { names, client, by_namespace, required, body_limit }
    }

    /// Drains the namespaces' connections (the worker drains its own).
    pub(crate) async fn drain(&self) {
        for (namespace, client) in &self.by_namespace {
            if let Err(error) = client.drain().await {
                tracing::warn!(%error, namespace, "drain the executor connection");
            }
        }
    }

    /// The connection `namespace`'s requests go out on, or why there is none.
    fn client_of(&self, namespace: &str) -> Result<&async_nats::Client, String> {
        match self.by_namespace.get(namespace) {
            Some(client) => Ok(client),
            None if self.required => Err(format!(
                "namespace {namespace:?} has no NATS credentials on this worker \
                 (--executor-credentials {namespace}=PATH) and --executor-credentials-required \
                 refuses to send its requests with the worker's own rights"
            )),
            None => Ok(&self.client),
        }
    }

    pub(crate) async fn execute(
        &self,
        attempt: &Attempt<'_>,
        subject: &str,
        payload: Option<&serde_json::Value>,
        spec_headers: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Outcome {
        if let Err(error) = confined_subject(subject, &self.names) {
            return Outcome::permanent(format!("refused, nothing was sent: {error}"));
        }
        let client = match self.client_of(&attempt.dispatch.namespace) {
            Ok(client) => client,
            Err(refusal) => return Outcome::permanent(format!("refused, nothing was sent: {refusal}")),
        };
        let mut headers = HeaderMap::new();
        for (name, value) in spec_headers {
            headers.insert(name.as_str(), value.as_str());
        }
        for (name, value) in attempt.header_pairs() {
            headers.insert(name, value.as_str());
        }
        for (name, value) in attempt.trace.pairs() {
            headers.insert(name, value);
        }
        let body = match payload {
            Some(payload) => match serde_json::to_vec(payload) {
                Ok(body) => body,
                Err(error) => return Outcome::permanent(format!("encode payload: {error}")),
            },
            None => Vec::new(),
        };
        let request = Request::new().payload(body.into()).headers(headers).timeout(Some(timeout));
        match client.send_request(subject.to_string(), request).await {
            Ok(reply) => classify(reply.headers.as_ref(), &reply.payload, self.body_limit),
            Err(error) => match error.kind() {
                RequestErrorKind::NoResponders => Outcome::retry(format!("no responders on {subject}")),
                RequestErrorKind::TimedOut => {
                    Outcome::retry(format!("no reply from {subject} within {timeout:?}"))
                }
                RequestErrorKind::InvalidSubject | RequestErrorKind::MaxPayloadExceeded => {
                    Outcome::permanent(format!("request to {subject} cannot be sent: {error}"))
                }
                _ => Outcome::retry(format!("request to {subject} failed: {error}")),
            },
        }
    }
}

/// The outcome a reply's status names; an `ok` reply's whole payload is the run's result.
fn status_outcome(status: &str, text: String, payload: &[u8]) -> Outcome {
    match status.trim().to_ascii_lowercase().as_str() {
        "ok" => Outcome::Ok { detail: Some(text).filter(|t| !t.is_empty()), result: Some(payload.to_vec()) },
        "retry" => {
            Outcome::retry(if text.is_empty() { "responder asked to retry".to_string() } else { text })
        }
        "fail" => {
            Outcome::permanent(if text.is_empty() { "responder reported failure".to_string() } else { text })
        }
        other => {
            Outcome::permanent(format!("unknown reply status {other:?} (expected ok, retry or fail): {text}"))
        }
    }
}

/// Applies the reply contract (see the module documentation).
pub(crate) fn classify(headers: Option<&HeaderMap>, payload: &[u8], limit: usize) -> Outcome {
    let text = head(payload, limit);
    if let Some(status) = headers.and_then(|h| h.get(HDR_STATUS)) {
        return status_outcome(status.as_str(), text, payload);
    }
    if let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(payload)
        && let Some(serde_json::Value::String(status)) = object.get("status")
    {
        let error = match object.get("error") {
            Some(serde_json::Value::String(error)) => error.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        return status_outcome(status, head(error.as_bytes(), limit), payload);
    }
    if let Some(code) = headers.and_then(|h| h.get(SERVICE_ERROR_CODE)) {
        let message =
            headers.and_then(|h| h.get(SERVICE_ERROR)).map(|v| v.as_str().to_string()).unwrap_or_default();
        let error = format!("service error {}: {message}", code.as_str());
        return match code.as_str().trim().parse::<u16>() {
            Ok(code) if code >= 500 => Outcome::retry(error),
            _ => Outcome::permanent(error),
        };
    }
    Outcome::Ok { detail: Some(text).filter(|t| !t.is_empty()), result: Some(payload.to_vec()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value);
        h
    }

    #[test]
    fn the_reply_contract() {
        assert!(matches!(classify(None, b"", 100), Outcome::Ok { .. }));
        assert!(matches!(classify(None, b"anything", 100), Outcome::Ok { .. }));
        assert!(
            matches!(classify(Some(&with(HDR_STATUS, "retry")), b"busy", 100), Outcome::Retry { ref error, .. } if error == "busy")
        );
        assert!(matches!(classify(Some(&with(HDR_STATUS, "FAIL")), b"", 100), Outcome::Permanent { .. }));
        assert!(matches!(classify(Some(&with(HDR_STATUS, "maybe")), b"", 100), Outcome::Permanent { .. }));
        assert!(matches!(classify(None, br#"{"status":"ok"}"#, 100), Outcome::Ok { .. }));
        assert!(
            matches!(classify(None, br#"{"status":"fail","error":"bad input"}"#, 100), Outcome::Permanent { ref error } if error == "bad input")
        );
        assert!(matches!(classify(None, br#"{"status":"retry"}"#, 100), Outcome::Retry { .. }));
        assert!(matches!(classify(None, br#"{"other":1}"#, 100), Outcome::Ok { .. }));
        assert!(matches!(classify(Some(&with(SERVICE_ERROR_CODE, "503")), b"", 100), Outcome::Retry { .. }));
        assert!(matches!(
            classify(Some(&with(SERVICE_ERROR_CODE, "400")), b"", 100),
            Outcome::Permanent { .. }
        ));
    }
}
