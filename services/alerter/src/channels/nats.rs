//! The NATS channel: the message as JSON on `<prefix>.alert.<severity>`, stored by the alerts
//! stream (publish acknowledged; `Nats-Msg-Id` = message id, so a retry is not stored twice).

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, message::PublishMessage};
use jetsched_shared::alert::AlertMessage;
use jetsched_shared::names::Names;

use super::{Channel, with_retries};

pub(crate) struct NatsChannel {
    js: jetstream::Context,
    names: Names,
}

impl NatsChannel {
    pub(crate) fn new(js: jetstream::Context, names: Names) -> NatsChannel {
        NatsChannel { js, names }
    }
}

impl Channel for NatsChannel {
    fn name(&self) -> String {
        "nats".to_string()
    }

    async fn deliver(&self, message: &AlertMessage) -> anyhow::Result<()> {
        let subject = self.names.alert_subject(message.severity.as_str());
        let body = serde_json::to_vec(message).context("encode alert")?;
        with_retries(5, Duration::from_millis(200), || {
            let publish =
                PublishMessage::build().payload(body.clone().into()).message_id(message.id.as_str());
            let subject = subject.clone();
            async move {
                self.js
                    .send_publish(subject.clone(), publish)
                    .await
                    .with_context(|| format!("publish alert on {subject}"))?
                    .await
                    .with_context(|| format!("store alert from {subject}"))?;
                Ok(())
            }
        })
        .await
    }
}
