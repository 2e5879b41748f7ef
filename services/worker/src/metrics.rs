//! Worker metrics, registered on the registry passed in (no global registry).

use jetsched_shared::metrics::{counter, counter_vec, gauge, gauge_vec, histogram_vec};
use prometheus::{HistogramVec, IntCounterVec, IntGauge, Registry};

#[derive(Clone)]
pub(crate) struct Metrics {
    /// `jetsched_worker_runs_total{queue, outcome, priority}`: attempts by verdict — `succeeded`,
    /// `retried`, `failed` (dead-lettered), `interrupted` (handed back at shutdown), and
    /// `duplicate` (a redelivery of a run that already succeeded, acked without running).
    pub(crate) runs: IntCounterVec,
    /// `jetsched_worker_run_duration_seconds{queue, executor}`.
    pub(crate) duration: HistogramVec,
    /// `jetsched_worker_retries_total{queue}`: retries scheduled with a delayed Nak.
    pub(crate) retries: IntCounterVec,
    /// `jetsched_worker_reruns_total{queue}`: runs executed again because the attempt before
    /// never reached a verdict (its worker died or stalled past ack_wait).
    pub(crate) reruns: IntCounterVec,
    /// `jetsched_worker_runs_in_flight`.
    pub(crate) in_flight: IntGauge,
    /// `jetsched_worker_dead_letters_total{source}`: `verdict`, `max_deliveries`, `undecodable`,
    /// `mismatched` (a dispatch whose subject and body name different runs).
    pub(crate) dead_letters: IntCounterVec,
    /// `jetsched_worker_dlq_rejected_total`: dead letters the DLQ stream refused (full).
    pub(crate) dlq_rejected: prometheus::IntCounter,
    /// `jetsched_dlq_depth`: messages in the DLQ stream, as last seen by this worker.
    pub(crate) dlq_depth: IntGauge,
    /// `jetsched_queue_depth{queue}`: dispatches waiting in the queue's lanes, as reported
    /// with their latest deliveries (no polling).
    pub(crate) queue_depth: prometheus::IntGaugeVec,
    /// `jetsched_lane_depth{queue, priority}`: dispatches waiting in one lane, as reported with
    /// its latest delivery (0 once a pull finds it empty).
    pub(crate) lane_depth: prometheus::IntGaugeVec,
    /// `jetsched_queue_paused{queue}`: 1 while operators have paused a queue this worker serves
    /// (it pulls nothing from it), 0 otherwise.
    pub(crate) queue_paused: prometheus::IntGaugeVec,
    /// `jetsched_worker_wait_seconds{queue, priority}`: from the dispatch being stored to its
    /// run starting here.
    pub(crate) wait: HistogramVec,
    /// `jetsched_worker_errors_total{what}`: NATS errors handled without a verdict (pull,
    /// ack, run record, advisory). Events given up are counted by the event publisher
    /// (`jetsched_events_failed_total`).
    pub(crate) errors: IntCounterVec,
    /// `jetsched_worker_breaker_state{key}`: 0 closed, 1 half open, 2 open, as this worker
    /// last saw the breaker (key = its key in the breakers bucket).
    pub(crate) breaker_state: prometheus::IntGaugeVec,
    /// `jetsched_worker_runs_short_circuited_total{key, action}`: deliveries an open breaker
    /// did not let through, `delay`ed or `skip`ped.
    pub(crate) short_circuited: IntCounterVec,
    /// `jetsched_limit_in_use{key}`: slots of a concurrency key held (`<namespace>.<key>`), as
    /// this worker last saw the limits bucket.
    pub(crate) limit_in_use: prometheus::IntGaugeVec,
    /// `jetsched_limit_reserved_ahead{key}`: slots of a concurrency key workers took ahead in
    /// blocks and did not use when they last wrote them (counted against the limit).
    pub(crate) limit_ahead: prometheus::IntGaugeVec,
    /// `jetsched_limit_concurrency_starts_total{how}`: runs given a concurrency slot by a write
    /// (`written`) or from the worker's block taken ahead (`block`).
    pub(crate) limit_starts: IntCounterVec,
    /// `jetsched_limit_waiting{key}`: runs waiting for a slot of a concurrency key.
    pub(crate) limit_waiting: prometheus::IntGaugeVec,
    /// `jetsched_limit_oldest_wait_timestamp_seconds{key}`: when the key's oldest waiting run
    /// first waited (Unix seconds; 0 when none waits).
    pub(crate) limit_oldest_wait: prometheus::IntGaugeVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> anyhow::Result<Metrics> {
        let r = registry;
        Ok(Metrics {
            runs: counter_vec(
                r,
                "jetsched_worker_runs_total",
                "Run attempts by queue and verdict",
                &["queue", "outcome", "priority"],
            )?,
            duration: histogram_vec(
                r,
                "jetsched_worker_run_duration_seconds",
                "Duration of run attempts",
                &[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0],
                &["queue", "executor"],
            )?,
            retries: counter_vec(r, "jetsched_worker_retries_total", "Retries scheduled", &["queue"])?,
            reruns: counter_vec(
                r,
                "jetsched_worker_reruns_total",
                "Runs executed again after their worker was lost",
                &["queue"],
            )?,
            in_flight: gauge(r, "jetsched_worker_runs_in_flight", "Runs executing now")?,
            dead_letters: counter_vec(
                r,
                "jetsched_worker_dead_letters_total",
                "Runs moved to the dead-letter stream",
                &["source"],
            )?,
            dlq_rejected: counter(
                r,
                "jetsched_worker_dlq_rejected_total",
                "Dead letters refused by the DLQ",
            )?,
            dlq_depth: gauge(r, "jetsched_dlq_depth", "Messages in the dead-letter stream")?,
            queue_depth: gauge_vec(
                r,
                "jetsched_queue_depth",
                "Dispatches waiting in the queue, as of the latest delivery",
                &["queue"],
            )?,
            lane_depth: gauge_vec(
                r,
                "jetsched_lane_depth",
                "Dispatches waiting in one lane of a queue, as of its latest delivery",
                &["queue", "priority"],
            )?,
            queue_paused: gauge_vec(
                r,
                "jetsched_queue_paused",
                "1 while operators have paused the queue: this worker pulls nothing from it",
                &["queue"],
            )?,
            wait: histogram_vec(
                r,
                "jetsched_worker_wait_seconds",
                "From dispatch to the start of the run",
                &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0],
                &["queue", "priority"],
            )?,
            errors: counter_vec(
                r,
                "jetsched_worker_errors_total",
                "NATS errors handled by the worker",
                &["what"],
            )?,
            breaker_state: gauge_vec(
                r,
                "jetsched_worker_breaker_state",
                "Circuit breaker state: 0 closed, 1 half open, 2 open",
                &["key"],
            )?,
            limit_in_use: gauge_vec(
                r,
                "jetsched_limit_in_use",
                "Slots of a concurrency key in use by runs, as this worker last saw them",
                &["key"],
            )?,
            limit_ahead: gauge_vec(
                r,
                "jetsched_limit_reserved_ahead",
                "Slots of a concurrency key workers took ahead in blocks and did not use, as this worker last saw them",
                &["key"],
            )?,
            limit_starts: counter_vec(
                r,
                "jetsched_limit_concurrency_starts_total",
                "Runs given a concurrency slot by a write (written) or from the worker's block taken ahead (block)",
                &["how"],
            )?,
            limit_waiting: gauge_vec(
                r,
                "jetsched_limit_waiting",
                "Runs waiting for a slot of a concurrency key",
                &["key"],
            )?,
            limit_oldest_wait: gauge_vec(
                r,
                "jetsched_limit_oldest_wait_timestamp_seconds",
                "When the oldest run waiting for a slot of a concurrency key first waited (0: none waits)",
                &["key"],
            )?,
            short_circuited: counter_vec(
                r,
                "jetsched_worker_runs_short_circuited_total",
                "Deliveries an open circuit breaker delayed or skipped",
                &["key", "action"],
            )?,
        })
    }
}
