//! What every delivery of a worker uses ([`Parts`]): the stores, executors, breakers and
//! settings `build` made once, which the lane loops ([`crate::lanes`]) lend to each delivery.

use std::sync::Arc;

use async_nats::jetstream;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::wire::DispatchDecoder;
use tokio_util::sync::CancellationToken;

use crate::breaker::Breakers;
use crate::cancels::Cancels;
use crate::config::RunEvents;
use crate::dlq::DeadLetters;
use crate::executor::Executors;
use crate::limits::Limits;
use crate::message::Answers;
use crate::metrics::Metrics;
use crate::pauses::Pauses;
use crate::rate::Rates;
use crate::runs::{Recording, RunStore};

/// The parts a delivery uses, built once per worker.
pub(crate) struct Parts {
    /// This worker's instance id (in run records, events and dead letters).
    pub(crate) worker: String,
    pub(crate) names: Names,
    /// Publishes the runs their breaker delays.
    pub(crate) js: jetstream::Context,
    /// Reads dispatch bodies, each task's spec text parsed once.
    pub(crate) dispatches: DispatchDecoder,
    /// Answers dispatch messages and keeps them while a delivery works.
    pub(crate) answers: Answers,
    pub(crate) runs: RunStore,
    pub(crate) recording: Recording,
    pub(crate) breakers: Arc<Breakers>,
    /// Rate limits per key, shared with every worker through their bucket.
    pub(crate) rates: Arc<Rates>,
    /// The tasks paused now: their scheduled runs not started yet are skipped.
    pub(crate) pauses: Arc<Pauses>,
    /// The runs cancelled on request, and the attempts running here (fired on a cancel).
    pub(crate) cancels: Arc<Cancels>,
    /// Concurrency limits: slots taken, waited for, freed and handed over.
    pub(crate) limits: Arc<Limits>,
    pub(crate) executors: Executors,
    pub(crate) dlq: DeadLetters,
    pub(crate) events: EventPublisher,
    /// Which run events are told (`--run-events`).
    pub(crate) run_events: RunEvents,
    pub(crate) metrics: Metrics,
    /// Cancelled when the shutdown grace period is over: in-flight attempts stop and are
    /// handed back.
    pub(crate) hard_stop: CancellationToken,
}
