//! The `http` executor: one request per attempt. 2xx succeeds; 408, 429, 5xx and network
//! errors are retryable (a `Retry-After` in seconds is honoured, capped by the policy); any
//! other status is permanent. The status and a bounded body excerpt are recorded.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use reqwest::{Method, StatusCode};

use super::{Attempt, Outcome, head};

pub(crate) struct HttpExecutor {
    client: reqwest::Client,
    body_limit: usize,
}

impl HttpExecutor {
    pub(crate) fn new(body_limit: usize, user_agent: &str) -> anyhow::Result<HttpExecutor> {
        // reqwest is built without a bundled crypto provider: use ring, as async-nats does.
        // Installing fails harmlessly when a provider is already installed.
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(user_agent)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("build HTTP client")?;
        Ok(HttpExecutor { client, body_limit })
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
        let mut request = self.client.request(method, url).timeout(timeout);
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
            Err(error) => return Outcome::retry(format!("request failed: {}", error_chain(&error))),
        };
        let status = response.status();
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let excerpt = self.excerpt(response).await;
        let detail = format!("HTTP {status}: {excerpt}");
        classify(status, retry_after, detail)
    }

    /// Reads at most `body_limit` bytes of the body (the rest is not downloaded).
    async fn excerpt(&self, mut response: reqwest::Response) -> String {
        let mut body = Vec::new();
        let mut cut = false;
        loop {
            match response.chunk().await {
                Ok(None) => break,
                Ok(Some(chunk)) => {
                    let room = self.body_limit.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if chunk.len() > room {
                        cut = true;
                        break;
                    }
                }
                Err(error) => return format!("{} (body read failed: {error})", head(&body, self.body_limit)),
            }
        }
        let text = head(&body, self.body_limit);
        if cut { format!("{text}…") } else { text }
    }
}

fn classify(status: StatusCode, retry_after: Option<Duration>, detail: String) -> Outcome {
    if status.is_success() {
        Outcome::Ok { detail: Some(detail) }
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
