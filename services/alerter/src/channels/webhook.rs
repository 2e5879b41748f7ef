//! The webhook channel: a JSON POST of the alert message (its `text` field is what Slack
//! incoming webhooks display), with a per-attempt timeout and retries with backoff. Any 2xx is
//! success.

use std::time::Duration;

use anyhow::Context;
use jetsched_shared::alert::AlertMessage;

use super::{Channel, with_retries};

pub(crate) struct WebhookChannel {
    client: reqwest::Client,
    url: reqwest::Url,
    attempts: u32,
    backoff: Duration,
}

impl WebhookChannel {
    pub(crate) fn new(
        url: &str,
        timeout: Duration,
        attempts: u32,
        backoff: Duration,
    ) -> anyhow::Result<WebhookChannel> {
        // reqwest is built without a bundled crypto provider: use ring, as async-nats does.
        // Installing fails harmlessly when a provider is already installed.
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
        let url = reqwest::Url::parse(url.trim()).with_context(|| format!("webhook URL {url:?}"))?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("jetsched-alerter/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .context("build webhook HTTP client")?;
        Ok(WebhookChannel { client, url, attempts, backoff })
    }
}

impl Channel for WebhookChannel {
    fn name(&self) -> String {
        // Host and port only: a webhook URL often carries a secret in its path.
        format!(
            "webhook:{}:{}",
            self.url.host_str().unwrap_or("?"),
            self.url.port_or_known_default().unwrap_or(0)
        )
    }

    async fn deliver(&self, message: &AlertMessage) -> anyhow::Result<()> {
        let host = self.url.host_str().unwrap_or("?").to_string();
        with_retries(self.attempts, self.backoff, || async {
            let response = self
                .client
                .post(self.url.clone())
                .json(message)
                .send()
                .await
                .with_context(|| format!("POST to webhook at {host}"))?;
            let status = response.status();
            anyhow::ensure!(status.is_success(), "webhook at {host} answered {status}");
            Ok(())
        })
        .await
    }
}
