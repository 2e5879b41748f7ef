//! The log channel: one structured log line per alert message, at a level matching its
//! severity.

use jetsched_shared::alert::{AlertMessage, Severity};

use super::Channel;

pub(crate) struct LogChannel;

impl Channel for LogChannel {
    fn name(&self) -> String {
        "log".to_string()
    }

    async fn deliver(&self, message: &AlertMessage) -> anyhow::Result<()> {
        let (severity, rule, alerts) = (message.severity.as_str(), &message.rule, message.alerts.len());
        match message.severity {
            Severity::Fatal | Severity::Critical => {
                tracing::error!(alert = %message.id, severity, rule = %rule, alerts, "{}", message.text)
            }
            Severity::Warning => {
                tracing::warn!(alert = %message.id, severity, rule = %rule, alerts, "{}", message.text)
            }
            Severity::Info => {
                tracing::info!(alert = %message.id, severity, rule = %rule, alerts, "{}", message.text)
            }
        }
        Ok(())
    }
}
