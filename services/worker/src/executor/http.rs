//! The `http` executor: one request per attempt. 2xx succeeds; 408, 429, 5xx and network
//! errors are retryable (a `Retry-After` in seconds is honoured, capped by the policy); any
//! other status is permanent. The status and a bounded body excerpt are recorded.
//!
//! A task's request never reaches an internal address (loopback, private, link-local with
//! the cloud metadata service, ...) unless `--http-allow` lets its namespace reach that network
//! ([`destination`]): checked after name resolution and at every redirect, a refusal is
//! permanent and names `executor.url` and the address. Each namespace with networks of its own
//! has its own client (its resolver and redirect policy carry the networks); the others share
//! one. The worker's `HTTP_PROXY`/`HTTPS_PROXY` variables are not used: through a proxy the
//! address finally reached could not be checked.

pub(crate) mod destination;

use jetsched_shared::wire::MAX_RESULT_BYTES;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use reqwest::{Method, StatusCode, Url};

use self::destination::{GuardedResolver, HttpAllow, Networks, Refused, literal_refusal, refusal};
use super::attempt::{Attempt, head};
use crate::verdict::Outcome;

/// Redirects followed per request (reqwest's default).
const MAX_REDIRECTS: usize = 10;

pub(crate) struct HttpExecutor {
    /// For namespaces without networks of their own.
    common: Guarded,
    by_namespace: HashMap<String, Guarded>,
    body_limit: usize,
}

/// A client and the internal networks it may reach.
struct Guarded {
    client: reqwest::Client,
    networks: Arc<Networks>,
}

impl Guarded {
    fn new(networks: Networks, user_agent: &str) -> anyhow::Result<Guarded> {
        let networks = Arc::new(networks);
        let client = reqwest::Client::builder()
            .user_agent(user_agent)
            .connect_timeout(Duration::from_secs(10))
            .no_proxy()
            .dns_resolver(GuardedResolver::new(networks.clone()))
            .redirect(destination::redirect_policy(networks.clone(), MAX_REDIRECTS))
            .build()
            .context("build HTTP client")?;
        Ok(Guarded { client, networks })
    }
}

impl HttpExecutor {
    pub(crate) fn new(
        allow: &HttpAllow,
        body_limit: usize,
        user_agent: &str,
    ) -> anyhow::Result<HttpExecutor> {
        // reqwest is built without a bundled crypto provider: use ring, as async-nats does.
        // Installing fails harmlessly when a provider is already installed.
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
        let common = Guarded::new(allow.common(), user_agent)?;
        let by_namespace = allow
            .namespaces()
            .map(|(namespace, networks)| Ok((namespace.to_string(), Guarded::new(networks, user_agent)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(HttpExecutor { common, by_namespace, body_limit })
    }

    pub(crate) async fn execute(
        &self,
        attempt: &Attempt<'_>,
        method: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Outcome {
        let method = match Method::from_bytes(method.as_bytes()) {
            Ok(method) => method,
            Err(error) => return Outcome::permanent(format!("invalid HTTP method {method:?}: {error}")),
        };
        let parsed = match Url::parse(url) {
            Ok(parsed) => parsed,
            Err(error) => {
                return Outcome::permanent(format!("invalid request: executor.url {url:?}: {error}"));
            }
        };
        let namespace = attempt.dispatch.namespace.as_str();
        let guarded = self.by_namespace.get(namespace).unwrap_or(&self.common);
        if let Some(refused) = literal_refusal(&parsed, &guarded.networks) {
            return refused_outcome(url, namespace, &refused);
        }
        let mut request = guarded.client.request(method, parsed).timeout(timeout);
        for (name, value) in attempt.header_pairs() {
            request = request.header(name, value);
        }
        for (name, value) in attempt.trace.pairs() {
            request = request.header(name, value);
        }
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_builder() => {
                return Outcome::permanent(format!("invalid request: {error}"));
            }
            Err(error) if error.is_timeout() => {
                return Outcome::retry(format!("timed out after {timeout:?}"));
            }
            Err(error) => match refusal(&error) {
                Some(refused) => return refused_outcome(url, namespace, refused),
                None => return Outcome::retry(format!("request failed: {}", error_chain(&error))),
            },
        };
        let status = response.status();
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let (excerpt, body) = self.excerpt(response).await;
        let detail = format!("HTTP {status}: {excerpt}");
        match classify(status, retry_after, detail) {
            Outcome::Ok { detail, .. } => Outcome::Ok { detail, result: body },
            other => other,
        }
    }

    /// Reads at most `body_limit` bytes of the body for the excerpt, and up to one byte past
    /// the largest result kept (the rest is not downloaded): the excerpt, and the whole body
    /// when it was read whole and no larger than a result may be.
    async fn excerpt(&self, mut response: reqwest::Response) -> (String, Option<Vec<u8>>) {
        let read_limit = self.body_limit.max(MAX_RESULT_BYTES + 1);
        let mut body = Vec::new();
        let mut cut = false;
        loop {
            match response.chunk().await {
                Ok(None) => break,
                Ok(Some(chunk)) => {
                    let room = read_limit.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if chunk.len() > room {
                        cut = true;
                        break;
                    }
                }
                Err(error) => {
                    return (format!("{} (body read failed: {error})", head(&body, self.body_limit)), None);
                }
            }
        }
        let text = head(&body, self.body_limit);
        // `head` marks a body longer than the excerpt; one cut at exactly its length is marked here.
        let excerpt = if cut && body.len() <= self.body_limit { format!("{text}…") } else { text };
        let whole = (!cut && body.len() <= MAX_RESULT_BYTES).then_some(body);
        (excerpt, whole)
    }
}

/// A destination refused before any byte was sent to it: permanent (the spec must change, or
/// the operator's --http-allow).
fn refused_outcome(url: &str, namespace: &str, refused: &Refused) -> Outcome {
    Outcome::permanent(format!(
        "executor.url {url:?} refused: {refused}; internal networks are reachable only where the \
         worker's --http-allow lets namespace {namespace:?} reach them"
    ))
}

fn classify(status: StatusCode, retry_after: Option<Duration>, detail: String) -> Outcome {
    if status.is_success() {
        Outcome::Ok { detail: Some(detail), result: None }
    } else if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        Outcome::Retry { error: detail, after: retry_after }
    } else {
        Outcome::permanent(detail)
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_name_is_found_in_the_clients_error() {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
        let guarded = Guarded::new(Networks::default(), "test").unwrap();
        let error = guarded.client.get("http://localhost:9/").send().await.unwrap_err();
        match refusal(&error) {
            Some(Refused::Resolved { host, addresses }) => {
                assert_eq!(host, "localhost");
                assert!(addresses.iter().all(|(ip, _)| ip.is_loopback()), "{addresses:?}");
            }
            other => panic!("{other:?}: {}", error_chain(&error)),
        }
        let outcome = refused_outcome("http://localhost:9/", "ops", refusal(&error).unwrap());
        let Outcome::Permanent { error } = outcome else { panic!("{outcome:?}") };
        assert!(
            error.starts_with("executor.url \"http://localhost:9/\" refused: localhost resolves"),
            "{error}"
        );
    }

    #[test]
    fn statuses_are_classified() {
        let class = |code: u16| match classify(StatusCode::from_u16(code).unwrap(), None, String::new()) {
            Outcome::Ok { .. } => "ok",
            Outcome::Retry { .. } => "retry",
            Outcome::Permanent { .. } => "permanent",
        };
        for (code, want) in
            [(200, "ok"), (204, "ok"), (400, "permanent"), (404, "permanent"), (408, "retry"), (429, "retry")]
        {
            assert_eq!(class(code), want, "{code}");
        }
        assert_eq!(class(500), "retry");
        assert_eq!(class(503), "retry");
        assert_eq!(class(301), "permanent");
    }
}
