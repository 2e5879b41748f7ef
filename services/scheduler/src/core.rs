//! The scheduler's loop: one `select!` over a closed [`Event`] (shutdown first, then lease
//! changes, publish acks, overlap decisions, the wheel's next deadline, task changes, the
//! fire-state watch, state writes, the parts' timers and calendar changes), and `Core`, which holds the parts
//! and moves fires between them.
//!
//! Each part owns its state and its rules: [`Wake`] (wheel and sleep), [`Tasks`] (the task
//! table), [`Follow`] (tasks feed and fire-state watch), [`Takeover`] (lease, state load,
//! catch-up plan), [`Pipeline`] (queues and publish window), [`Overlap`] (overlap turns) and
//! [`Flush`] (coalesced fire state). Handlers live in `core/`: `changes` (what the watches
//! deliver), `leadership` (acquiring, resuming, stepping down) and `fires` (due fires to
//! acknowledged dispatches, fire-state writes).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use jetsched_shared::admin::Readiness;
use jetsched_shared::events::EventSink;
use jetsched_shared::names::Names;
use jetsched_shared::wire::Event as WireEvent;
use tokio::task::JoinError;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::acks::Acked;
use crate::calendars::{CalendarBook, CalendarFeed};
use crate::clock::SharedClock;
use crate::flush::{Flush, Flushed};
use crate::follow::{Follow, Followed};
use crate::lease::LeaseEvent;
use crate::metrics::Metrics;
use crate::overlap::{Checked, Overlap};
use crate::partitions::Partitions;
use crate::pipeline::Pipeline;
use crate::takeover::Takeover;
use crate::tasks::Tasks;
use crate::wake::Wake;

mod changes;
mod fires;
mod leadership;

/// How long shutdown waits for pending publish acks.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The NATS handles the loop hands to its parts.
pub(crate) struct Nats {
    pub(crate) names: Names,
    /// Dispatches are core publishes whose acknowledgements come back on the pipeline's
    /// subscription.
    pub(crate) client: async_nats::Client,
    pub(crate) tasks: kv::Store,
    pub(crate) state: kv::Store,
    /// Shared with the overlap checks in flight (a store's clone copies its stream's info).
    pub(crate) runs: Arc<kv::Store>,
    /// The runs bucket's TTL (an older run record may be gone for that reason alone).
    pub(crate) runs_ttl: Duration,
    /// Cancel markers: `cancel_other` and `replace` cancel the previous run through them.
    pub(crate) cancels: kv::Store,
    /// The dispatch stream: `cancel_other` and `replace` look for a queued run in it.
    pub(crate) dispatches: async_nats::jetstream::stream::Stream<()>,
}

/// What the loop reports through.
pub(crate) struct Report {
    pub(crate) metrics: Metrics,
    /// Tasks and fires per partition.
    pub(crate) partitions: Partitions,
    pub(crate) events: EventSink,
    pub(crate) instance: String,
    /// Publish a `fire.dispatched` event per fire.
    pub(crate) fire_events: bool,
    pub(crate) readiness: Readiness,
}

impl Report {
    /// Queues an event without waiting; one that finds the queue full is dropped and counted
    /// (`jetsched_events_failed_total`) by the shared sink.
    pub(crate) fn emit(&self, event: WireEvent) {
        let _queued = self.events.try_emit(event);
    }
}

/// The wall clock, read once per loop wake-up.
pub(crate) struct Time {
    clock: SharedClock,
    now_ms: i64,
}

impl Time {
    pub(crate) fn new(clock: SharedClock) -> Time {
        let now_ms = clock.now_ms();
        Time { clock, now_ms }
    }

    /// Reads the clock.
    fn tick(&mut self) -> i64 {
        self.now_ms = self.clock.now_ms();
        self.now_ms
    }

    /// The time read at the last wake-up (Unix ms).
    pub(crate) fn now_ms(&self) -> i64 {
        self.now_ms
    }
}

/// Everything the loop reacts to.
enum Event {
    Shutdown,
    Lease(Option<LeaseEvent>),
    Acked(Acked),
    Overlap(Checked),
    Wake,
    Followed(Followed),
    Written(Result<Flushed, JoinError>),
    Flush,
    Retry,
    CatchupRefill,
    Refollow,
    StateRefollow,
    StateLoadWake,
    Calendar(kv::Entry),
}

/// The loop's owner: the parts and what they share.
pub(crate) struct Core {
    pub(crate) nats: Nats,
    pub(crate) report: Report,
    pub(crate) time: Time,
    pub(crate) tasks: Tasks,
    pub(crate) wake: Wake,
    pub(crate) follow: Follow,
    pub(crate) takeover: Takeover,
    pub(crate) pipeline: Pipeline,
    pub(crate) overlap: Overlap,
    pub(crate) flush: Flush,
    /// Every namespace's business calendars, and the watch that keeps them current.
    pub(crate) calendars: CalendarBook,
    pub(crate) calendar_feed: CalendarFeed,
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Core {
    /// Follows the tasks, campaigns once they are loaded, and dispatches while leader, until
    /// `shutdown`.
    pub(crate) async fn run(&mut self, shutdown: &CancellationToken) {
        loop {
            if self.follow.loaded() && self.takeover.campaign().start() {
                self.open_state_watch();
            }
            self.pump().await;
            self.wake.arm(self.time.clock.as_ref());
            self.report.metrics.timers.set(self.wake.len() as i64);
            let flush_at = self.flush.flush_at();
            let (retry_at, refill_at) = (self.pipeline.retry_at(), self.pipeline.refill_at());
            let refollow_at = self.follow.retry_at();
            let load_wake_at = self.takeover.load_wake_at();
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Event::Shutdown,
                event = self.takeover.campaign().next() => Event::Lease(event),
                acked = self.pipeline.next_ack() => Event::Acked(acked),
                checked = self.overlap.next() => Event::Overlap(checked),
                () = self.wake.wait() => Event::Wake,
                followed = self.follow.next() => Event::Followed(followed),
                written = self.flush.written() => Event::Written(written),
                _ = sleep_opt(flush_at) => Event::Flush,
                _ = sleep_opt(retry_at) => Event::Retry,
                _ = sleep_opt(refill_at) => Event::CatchupRefill,
                _ = sleep_opt(refollow_at.tasks) => Event::Refollow,
                _ = sleep_opt(refollow_at.state) => Event::StateRefollow,
                _ = sleep_opt(load_wake_at) => Event::StateLoadWake,
                entry = self.calendar_feed.next() => Event::Calendar(entry),
            };
            self.time.tick();
            match event {
                Event::Shutdown => return,
                Event::Lease(Some(event)) => self.on_lease(event).await,
                Event::Lease(None) => {
                    tracing::error!("the lease task ended; this replica no longer campaigns");
                    if self.takeover.holds() {
                        self.step_down("lease task ended");
                    }
                }
                Event::Acked(acked) => self.on_ack(acked),
                Event::Overlap(checked) => self.on_decided(checked),
                Event::Wake => self.on_wake(),
                Event::Followed(Followed::Tasks(batch)) => self.on_tasks(batch),
                Event::Followed(Followed::State(batch)) => self.on_state(batch),
                Event::Followed(Followed::JetStreamBack) => self.rewatch(),
                Event::Followed(Followed::Opened(opened)) => self.on_opened(opened),
                Event::Followed(Followed::StateOpened { opened, term }) => {
                    self.on_state_opened(*opened, term)
                }
                Event::Followed(Followed::StateTarget { read, term }) => self.on_state_target(read, term),
                Event::Written(result) => self.on_written(result),
                Event::Flush => self.flush(false),
                Event::Retry => self.pipeline.retry_now(),
                Event::CatchupRefill => self.pipeline.refill(),
                Event::Refollow => self.follow.reopen_feed(&self.nats.tasks),
                Event::StateRefollow => self.open_state_watch(),
                Event::StateLoadWake => self.on_state_load_wake(),
                Event::Calendar(entry) => self.on_calendar(&entry),
            }
        }
    }

    /// After the loop: waits (bounded) for pending acks, writes the fire state, then releases
    /// the lease (a leader deletes its key so a follower takes over at once).
    pub(crate) async fn drain(&mut self) {
        self.pipeline.drop_queued();
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while self.pipeline.inflight() > 0 {
            let event = tokio::select! {
                biased;
                event = self.takeover.campaign().next() => Event::Lease(event),
                acked = self.pipeline.next_ack() => Event::Acked(acked),
                _ = sleep_until(deadline) => {
                    tracing::warn!(pending = self.pipeline.inflight(), "publish acks still pending at shutdown");
                    break;
                }
            };
            self.time.tick();
            match event {
                Event::Lease(Some(event)) => self.on_lease(event).await,
                Event::Acked(acked) => self.on_ack(acked),
                _ => break,
            }
        }
        if let Some(result) = self.flush.finish().await {
            self.on_written(result);
        }
        if self.takeover.leading() && self.flush.is_dirty() {
            self.flush(true);
            if let Some(result) = self.flush.finish().await {
                self.on_written(result);
            }
        }
        self.takeover.campaign().stop(SHUTDOWN_GRACE).await;
        if self.takeover.holds() {
            self.step_down("shutdown");
        }
    }

    fn mark_loaded(&self) {
        self.report.readiness.set("tasks_loaded", true);
    }
}
