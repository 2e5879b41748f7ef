//! What every delivery shares: the handles, stores and settings the lane loops
//! ([`crate::lanes`]) pass to [`crate::delivery::process`] for each run.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::wire::DispatchDecoder;
use tokio_util::sync::CancellationToken;

use crate::breaker::Breakers;
use crate::config::{RunEvents, RunRecords};
use crate::dlq::DeadLetters;
use crate::executor::Executors;
use crate::metrics::Metrics;
use crate::runs::RunStore;

/// Everything a delivery needs, shared by the pull loops and run tasks.
pub(crate) struct Shared {
    pub(crate) names: Names,
    pub(crate) js: jetstream::Context,
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) worker: String,
    pub(crate) runs: RunStore,
    pub(crate) dlq: DeadLetters,
    pub(crate) events: EventPublisher,
    pub(crate) executors: Executors,
    /// Reads dispatch bodies, each task's spec text parsed once.
    pub(crate) dispatches: DispatchDecoder,
    pub(crate) metrics: Metrics,
    pub(crate) progress_interval: Duration,
    pub(crate) dlq_retry_delay: Duration,
    pub(crate) run_events: RunEvents,
    pub(crate) run_records: RunRecords,
    /// Under deferred run records, how long an attempt runs before its record is written.
    pub(crate) running_after: Duration,
    /// Cancelled when the shutdown grace period is over: in-flight attempts stop and are
    /// handed back.
    pub(crate) hard_stop: CancellationToken,
}
