//! Alerter metrics, registered on the registry passed in (no global registry).

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

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
        let raised = IntCounterVec::new(
            Opts::new("jetsched_alerts_raised_total", "Rule firings before de-duplication"),
            &["rule"],
        )?;
        let sent = IntCounterVec::new(
            Opts::new("jetsched_alerts_sent_total", "Alert messages delivered, by rule and channel"),
            &["rule", "channel"],
        )?;
        let suppressed = IntCounterVec::new(
            Opts::new("jetsched_alerts_suppressed_total", "Alerts not sent, by rule and reason"),
            &["rule", "reason"],
        )?;
        let channel_failures = IntCounterVec::new(
            Opts::new("jetsched_alert_channel_failures_total", "Alert messages a channel gave up on"),
            &["channel"],
        )?;
        let channel_dropped = IntCounterVec::new(
            Opts::new("jetsched_alert_channel_dropped_total", "Alert messages dropped: channel queue full"),
            &["channel"],
        )?;
        let events = IntCounterVec::new(
            Opts::new("jetsched_alerter_events_total", "Events consumed by the alerter, by kind"),
            &["kind"],
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new("jetsched_queue_depth", "Pending dispatches of each queue's consumer"),
            &["queue"],
        )?;
        let dlq_depth = IntGauge::new("jetsched_dlq_depth", "Messages in the dead-letter stream")?;
        let dlq_bytes = IntGauge::new("jetsched_dlq_bytes", "Bytes in the dead-letter stream")?;
        let dlq_max_bytes =
            IntGauge::new("jetsched_dlq_max_bytes", "Byte limit of the dead-letter stream (-1: unlimited)")?;
        let leader_present =
            IntGauge::new("jetsched_leader_present", "1 while a scheduler holds the leader lease")?;
        let errors = IntCounterVec::new(
            Opts::new("jetsched_alerter_errors_total", "NATS errors handled by the alerter"),
            &["what"],
        )?;
        registry.register(Box::new(raised.clone()))?;
        registry.register(Box::new(sent.clone()))?;
        registry.register(Box::new(suppressed.clone()))?;
        registry.register(Box::new(channel_failures.clone()))?;
        registry.register(Box::new(channel_dropped.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(dlq_depth.clone()))?;
        registry.register(Box::new(dlq_bytes.clone()))?;
        registry.register(Box::new(dlq_max_bytes.clone()))?;
        registry.register(Box::new(leader_present.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        Ok(Metrics {
            raised,
            sent,
            suppressed,
            channel_failures,
            channel_dropped,
            events,
            queue_depth,
            dlq_depth,
            dlq_bytes,
            dlq_max_bytes,
            leader_present,
            errors,
        })
    }
}
