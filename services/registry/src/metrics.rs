//! Registry metrics, registered on the registry passed in (no global registry).

use jetsched_shared::metrics::{counter_vec, histogram_vec};
use prometheus::{HistogramVec, IntCounterVec, Registry};

#[derive(Clone)]
pub(crate) struct Metrics {
    /// `jetsched_api_requests_total{endpoint, outcome}`; outcome is `ok` or an error code.
    pub(crate) requests: IntCounterVec,
    pub(crate) request_seconds: HistogramVec,
    /// `jetsched_intake_messages_total{outcome}`: applied, rejected, retried, deduplicated.
    pub(crate) intake: IntCounterVec,
    /// `jetsched_registry_pause_requests_total{outcome}`: paused, gone, invalid, retried.
    pub(crate) pause_requests: IntCounterVec,
    /// `jetsched_task_changes_total{kind}`: events emitted by the registry (task.registered, ...).
    pub(crate) changes: IntCounterVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> anyhow::Result<Metrics> {
        let r = registry;
        Ok(Metrics {
            requests: counter_vec(
                r,
                "jetsched_api_requests_total",
                "Task API requests by endpoint and outcome",
                &["endpoint", "outcome"],
            )?,
            request_seconds: histogram_vec(
                r,
                "jetsched_api_request_duration_seconds",
                "Task API request handling time",
                &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0],
                &["endpoint"],
            )?,
            intake: counter_vec(
                r,
                "jetsched_intake_messages_total",
                "Intake submissions by outcome",
                &["outcome"],
            )?,
            pause_requests: counter_vec(
                r,
                "jetsched_registry_pause_requests_total",
                "Workers' pause requests by outcome",
                &["outcome"],
            )?,
            changes: counter_vec(
                r,
                "jetsched_task_changes_total",
                "Changes written to the tasks bucket by kind",
                &["kind"],
            )?,
        })
    }
}
