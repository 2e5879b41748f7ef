//! Scheduler metrics, registered on the registry passed in (no global registry).

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

#[derive(Clone)]
pub(crate) struct Metrics {
    /// `jetsched_scheduler_is_leader`: 1 while this replica holds the lease.
    pub(crate) is_leader: IntGauge,
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
        let is_leader = IntGauge::new("jetsched_scheduler_is_leader", "1 while this replica is the leader")?;
        let leader_changes = IntCounter::new(
            "jetsched_scheduler_leader_changes_total",
            "Leadership acquired or lost by this replica",
        )?;
        let dispatched = IntCounterVec::new(
            Opts::new("jetsched_fires_dispatched_total", "Fires stored in the dispatch stream, by trigger"),
            &["trigger"],
        )?;
        let duplicates = IntCounter::new(
            "jetsched_fires_duplicate_total",
            "Dispatch publishes absorbed by de-duplication (already dispatched)",
        )?;
        let skipped = IntCounterVec::new(
            Opts::new("jetsched_fires_skipped_total", "Fires skipped, by reason"),
            &["reason"],
        )?;
        let missed = IntCounter::new("jetsched_fires_missed_total", "Fires older than the catch-up window")?;
        let lag = HistogramVec::new(
            HistogramOpts::new("jetsched_fire_lag_seconds", "Dispatch ack time minus nominal fire time")
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    60.0,
                ]),
            &["trigger"],
        )?;
        let publish_errors =
            IntCounter::new("jetsched_dispatch_publish_errors_total", "Failed dispatch publishes (retried)")?;
        let publish_inflight =
            IntGauge::new("jetsched_dispatch_publish_inflight", "Dispatch publishes awaiting their ack")?;
        let tasks = IntGauge::new("jetsched_tasks_registered", "Tasks loaded from the tasks bucket")?;
        let invalid_specs = IntCounter::new(
            "jetsched_scheduler_invalid_specs_total",
            "Values of the tasks bucket that are not specs",
        )?;
        let timers = IntGauge::new("jetsched_scheduler_timers", "Pending fires in the timing wheel")?;
        let state_writes = IntCounterVec::new(
            Opts::new("jetsched_scheduler_state_writes_total", "Fire state writes, by outcome"),
            &["outcome"],
        )?;
        let load_seconds = Histogram::with_opts(
            HistogramOpts::new("jetsched_scheduler_load_seconds", "Initial load of the tasks bucket")
                .buckets(vec![0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
        )?;
        registry.register(Box::new(is_leader.clone()))?;
        registry.register(Box::new(leader_changes.clone()))?;
        registry.register(Box::new(dispatched.clone()))?;
        registry.register(Box::new(duplicates.clone()))?;
        registry.register(Box::new(skipped.clone()))?;
        registry.register(Box::new(missed.clone()))?;
        registry.register(Box::new(lag.clone()))?;
        registry.register(Box::new(publish_errors.clone()))?;
        registry.register(Box::new(publish_inflight.clone()))?;
        registry.register(Box::new(tasks.clone()))?;
        registry.register(Box::new(invalid_specs.clone()))?;
        registry.register(Box::new(timers.clone()))?;
        registry.register(Box::new(state_writes.clone()))?;
        let clock_offset = Gauge::new(
            "jetsched_scheduler_clock_offset_seconds",
            "Local clock minus the NATS server's (positive: the local clock is ahead)",
        )?;
        registry.register(Box::new(load_seconds.clone()))?;
        registry.register(Box::new(clock_offset.clone()))?;
        Ok(Metrics {
            is_leader,
            leader_changes,
            dispatched,
            duplicates,
            skipped,
            missed,
            lag,
            publish_errors,
            publish_inflight,
            tasks,
            invalid_specs,
            timers,
            state_writes,
            load_seconds,
            clock_offset,
        })
    }
}
