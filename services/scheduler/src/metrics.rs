//! Scheduler metrics, registered on the registry passed in (no global registry).

use jetsched_shared::metrics::{counter, counter_vec, float_gauge, gauge, histogram, histogram_vec};
use prometheus::{Gauge, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};

#[derive(Clone)]
pub(crate) struct Metrics {
    /// `jetsched_scheduler_is_leader`: 1 while this replica holds the lease.
    pub(crate) is_leader: IntGauge,
    /// `jetsched_scheduler_resumed`: 1 once this leader has loaded the fire state and planned
    /// the catch-up (it dispatches); 0 while it follows or is still loading.
    pub(crate) resumed: IntGauge,
    pub(crate) leader_changes: IntCounter,
    /// `jetsched_fires_dispatched_total{trigger}`: stored in the dispatch stream (first time).
    pub(crate) dispatched: IntCounterVec,
    /// Publishes absorbed by the stream's de-duplication (already dispatched by a predecessor).
    pub(crate) duplicates: IntCounter,
    /// `jetsched_fires_skipped_total{reason}`.
    pub(crate) skipped: IntCounterVec,
    /// Fires older than the catch-up window (or beyond the catch-up maximum).
    pub(crate) missed: IntCounter,
    /// `jetsched_fire_lag_seconds{trigger}`: publish ack time minus nominal time.
    pub(crate) lag: HistogramVec,
    pub(crate) publish_errors: IntCounter,
    pub(crate) publish_inflight: IntGauge,
    pub(crate) tasks: IntGauge,
    pub(crate) invalid_specs: IntCounter,
    pub(crate) timers: IntGauge,
    pub(crate) state_writes: IntCounterVec,
    pub(crate) load_seconds: Histogram,
    /// `jetsched_scheduler_clock_offset_seconds`: local clock minus the server's.
    pub(crate) clock_offset: Gauge,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> anyhow::Result<Metrics> {
        let r = registry;
        Ok(Metrics {
            is_leader: gauge(r, "jetsched_scheduler_is_leader", "1 while this replica is the leader")?,
            resumed: gauge(
                r,
                "jetsched_scheduler_resumed",
                "1 once this leader has loaded the fire state and planned the catch-up",
            )?,
            leader_changes: counter(
                r,
                "jetsched_scheduler_leader_changes_total",
                "Leadership acquired or lost by this replica",
            )?,
            dispatched: counter_vec(
                r,
                "jetsched_fires_dispatched_total",
                "Fires stored in the dispatch stream, by trigger",
                &["trigger"],
            )?,
            duplicates: counter(
                r,
                "jetsched_fires_duplicate_total",
                "Dispatch publishes absorbed by de-duplication (already dispatched)",
            )?,
            skipped: counter_vec(r, "jetsched_fires_skipped_total", "Fires skipped, by reason", &["reason"])?,
            missed: counter(r, "jetsched_fires_missed_total", "Fires older than the catch-up window")?,
            lag: histogram_vec(
                r,
                "jetsched_fire_lag_seconds",
                "Dispatch ack time minus nominal fire time",
                &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0],
                &["trigger"],
            )?,
            publish_errors: counter(
                r,
                "jetsched_dispatch_publish_errors_total",
                "Failed dispatch publishes (retried)",
            )?,
            publish_inflight: gauge(
                r,
                "jetsched_dispatch_publish_inflight",
                "Dispatch publishes awaiting their ack",
            )?,
            tasks: gauge(r, "jetsched_tasks_registered", "Tasks loaded from the tasks bucket")?,
            invalid_specs: counter(
                r,
                "jetsched_scheduler_invalid_specs_total",
                "Values of the tasks bucket that are not specs",
            )?,
            timers: gauge(r, "jetsched_scheduler_timers", "Pending fires in the timing wheel")?,
            state_writes: counter_vec(
                r,
                "jetsched_scheduler_state_writes_total",
                "Fire state writes, by outcome",
                &["outcome"],
            )?,
            load_seconds: histogram(
                r,
                "jetsched_scheduler_load_seconds",
                "Initial load of the tasks bucket",
                &[0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            )?,
            clock_offset: float_gauge(
                r,
                "jetsched_scheduler_clock_offset_seconds",
                "Local clock minus the NATS server's (positive: the local clock is ahead)",
            )?,
        })
    }
}
