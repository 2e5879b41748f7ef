//! Alert wire types: the message `jetsched-alerter` publishes on `<prefix>.alert.<severity>`
//! (kept in the alerts stream) and POSTs to webhooks (with a Slack-compatible `text`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::wire::millis;

/// How bad it is; also the last token of the alert subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
    Fatal,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
            Severity::Fatal => "fatal",
        }
    }
}

/// One alert: a rule that fired for one subject (a task, a queue, the scheduler, the DLQ).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// Rule name, e.g. `run_failed`, `queue_backlog`, `no_leader`.
    pub rule: String,
    pub severity: Severity,
    /// Namespace of the task, or `_system` for alerts about no task.
    pub namespace: String,
    /// Task id, or what the alert is about (`scheduler`, a queue name, `dlq`).
    pub task_id: String,
    /// When the condition was seen.
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
    /// One human line.
    pub summary: String,
    /// Occurrences suppressed by de-duplication since the previous alert of this rule and
    /// subject (reported here, in the next alert).
    #[serde(default)]
    pub repeats: u64,
    /// Rule-specific facts: execution id, error, queue depth, lag...
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
}

/// What the rate limit held back, reported in a summary message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suppressed {
    /// Alerts not sent, in total and by rule.
    pub total: u64,
    pub by_rule: BTreeMap<String, u64>,
    #[serde(with = "millis")]
    pub since: DateTime<Utc>,
    #[serde(with = "millis")]
    pub until: DateTime<Utc>,
}

/// One notification: a single alert, a group of alerts of one rule, or a rate-limit summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertMessage {
    /// Unique id (also the `Nats-Msg-Id` of the NATS copy).
    pub id: String,
    /// Human text; the field Slack incoming webhooks display.
    pub text: String,
    /// The highest severity of the alerts (the subject's last token).
    pub severity: Severity,
    /// The rule of every alert in the message, or `rate_limit_summary`.
    pub rule: String,
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
    /// The alerter instance that sent it.
    pub instance: String,
    pub alerts: Vec<Alert>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<Suppressed>,
}

/// Rule name of the rate limit's summary messages.
pub const RATE_LIMIT_SUMMARY: &str = "rate_limit_summary";
