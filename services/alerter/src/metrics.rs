//! Alerter metrics, registered on the registry passed in (no global registry).

use jetsched_shared::metrics::{counter_vec, gauge, gauge_vec};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

#[derive(Clone)]
pub(crate) struct Metrics {
    /// `jetsched_alerts_raised_total{rule}`: rule firings before de-duplication.
    pub(crate) raised: IntCounterVec,
    /// `jetsched_alerts_sent_total{rule, channel}`: messages delivered by a channel.
    pub(crate) sent: IntCounterVec,
    /// `jetsched_alerts_suppressed_total{rule, reason}`: `dedup` or `rate_limit`.
    pub(crate) suppressed: IntCounterVec,
    /// `jetsched_alert_channel_failures_total{channel}`: messages a channel gave up on.
    pub(crate) channel_failures: IntCounterVec,
    /// `jetsched_alert_channel_dropped_total{channel}`: messages dropped because the channel's
    /// queue was full.
    pub(crate) channel_dropped: IntCounterVec,
    /// `jetsched_alerter_events_total{kind}`: events consumed.
    pub(crate) events: IntCounterVec,
    /// `jetsched_queue_depth{queue}`: pending dispatches of each queue's consumer.
    pub(crate) queue_depth: IntGaugeVec,
    /// `jetsched_dlq_depth`: messages in the dead-letter stream.
    pub(crate) dlq_depth: IntGauge,
    /// `jetsched_dlq_bytes` and `jetsched_dlq_max_bytes` (-1: unlimited): how full it is.
    pub(crate) dlq_bytes: IntGauge,
    pub(crate) dlq_max_bytes: IntGauge,
    /// `jetsched_leader_present`: 1 while the lease key holds a leader.
    pub(crate) leader_present: IntGauge,
    /// `jetsched_alerter_errors_total{what}`: NATS errors handled without stopping.
    pub(crate) errors: IntCounterVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> anyhow::Result<Metrics> {
        let r = registry;
        Ok(Metrics {
            raised: counter_vec(
                r,
                "jetsched_alerts_raised_total",
                "Rule firings before de-duplication",
                &["rule"],
            )?,
            sent: counter_vec(
                r,
                "jetsched_alerts_sent_total",
                "Alert messages delivered, by rule and channel",
                &["rule", "channel"],
            )?,
            suppressed: counter_vec(
                r,
                "jetsched_alerts_suppressed_total",
                "Alerts not sent, by rule and reason",
                &["rule", "reason"],
            )?,
            channel_failures: counter_vec(
                r,
                "jetsched_alert_channel_failures_total",
                "Alert messages a channel gave up on",
                &["channel"],
            )?,
            channel_dropped: counter_vec(
                r,
                "jetsched_alert_channel_dropped_total",
                "Alert messages dropped: channel queue full",
                &["channel"],
            )?,
            events: counter_vec(
                r,
                "jetsched_alerter_events_total",
                "Events consumed by the alerter, by kind",
                &["kind"],
            )?,
            queue_depth: gauge_vec(
                r,
                "jetsched_queue_depth",
                "Pending dispatches of each queue's consumer",
                &["queue"],
            )?,
            dlq_depth: gauge(r, "jetsched_dlq_depth", "Messages in the dead-letter stream")?,
            dlq_bytes: gauge(r, "jetsched_dlq_bytes", "Bytes in the dead-letter stream")?,
            dlq_max_bytes: gauge(
                r,
                "jetsched_dlq_max_bytes",
                "Byte limit of the dead-letter stream (-1: unlimited)",
            )?,
            leader_present: gauge(
                r,
                "jetsched_leader_present",
                "1 while a scheduler holds the leader lease",
            )?,
            errors: counter_vec(
                r,
                "jetsched_alerter_errors_total",
                "NATS errors handled by the alerter",
                &["what"],
            )?,
        })
    }
}
