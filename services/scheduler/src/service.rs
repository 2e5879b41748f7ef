//! `build` (all fallible I/O: connect, ensure the topology, open the tasks watch, bind the
//! admin port) and `Scheduler::run` (the dispatch loop, the lease task and the events task).
//!
//! The loop is one `select!` over a closed [`Event`]: shutdown first, then lease changes,
//! publish acks, the timing wheel's next deadline, task changes, the fire-state watch (followed
//! by every replica, so a new leader only waits for it to reach the stream's end), state flushes
//! and retries. No tokio task or sleep per registered task, no polling: the loop sleeps until
//! the next deadline (tokio's timer until 1 ms before, then a µs-precise thread sleep).
//!
//! Tasks with overlap `skip` or `buffer_one` pass a gate before publishing: the previous run's
//! record is read (or, for `buffer_one`, watched) in a future whose verdict comes back as
//! [`Event::Overlap`]; `allow` tasks never touch it (see `overlap.rs`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::kv::{self, Entry, Operation, WatcherError};
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self};
use bytes::Bytes;
use futures::future::{AbortHandle, Aborted, BoxFuture, Fuse, OptionFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use jetsched_shared::admin::{AdminServer, Readiness};
use jetsched_shared::events::{EventPublisher, EventPump};
use jetsched_shared::names::{Names, SYSTEM_NAMESPACE, task_key};
use jetsched_shared::service::{Base, Role};
use jetsched_shared::spec::OverlapPolicy;
use jetsched_shared::topology::Topology;
use jetsched_shared::wire::{Event as WireEvent, EventKind, FireState, Trigger, scheduled_execution_id};
use prometheus::Registry as MetricsRegistry;
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::catchup::{self, Limits, SkipReason};
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::discovery::{self, Change};
use crate::dispatch::{self, EventSink, Fire};
use crate::lease::{Lease, LeaseEvent, Timing};
use crate::metrics::Metrics;
use crate::overlap::{self, Arrival, Previous, Prior, Verdict};
use crate::state::{TaskInfo, Tasks, from_ms, now_ms};
use crate::timer::{DenseKey, TimerWheel};

/// How long shutdown waits for pending publish acks.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Catch-up fires are released in slices of this period (rate limit).
const CATCHUP_SLICE: Duration = Duration::from_millis(100);
/// Delay before a failed publish is retried (with the same message id).
const RETRY_DELAY: Duration = Duration::from_millis(250);
/// Largest pre-sized task table (from the bucket's message count).
const MAX_PRESIZE: usize = 10_000_000;
/// Longest a state write waits for a dispatch burst to drain.
const MAX_STATE_DELAY: Duration = Duration::from_secs(2);
/// Concurrent state writes of one flush.
const STATE_WRITE_WINDOW: usize = 256;
/// The tokio timer (1 ms resolution, rounds up) wakes the loop this much before a deadline;
/// a short `std::thread::sleep` (µs precision) on a blocking thread finishes the wait.
const TIMER_EARLY: Duration = Duration::from_millis(1);
/// How long a new leader waits for the warm fire-state watch to reach the stream's last
/// sequence before it re-reads the fire state from scratch.
const STATE_CATCHUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Delay before the fire-state watch (or its stream info) is read again after an error.
const STATE_RETRY_DELAY: Duration = Duration::from_millis(500);

/// A started scheduler, ready to run.
pub struct Scheduler {
    client: async_nats::Client,
    core: Core,
    admin: AdminServer,
    lease: Lease,
    lease_rx: mpsc::Receiver<LeaseEvent>,
    event_pump: EventPump,
    /// `jetsched-scheduler` micro service: lets `jetsched status` count live replicas.
    presence: async_nats::service::Service,
}

/// Connects, ensures the topology, opens the tasks watch and binds the admin listener.
/// Messages buffered per subscription (the tasks watch during a load), see `build`.
const WATCH_BUFFER: usize = 256 * 1024;

pub async fn build(config: Config) -> anyhow::Result<Scheduler> {
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role {
        name: "scheduler",
        default_admin: DEFAULT_ADMIN_ADDR,
        checks: &["tasks_loaded"],
        // The tasks watch of a large bucket arrives faster than specs are decoded: room for
        // a quarter million entries keeps the ordered consumer from dropping and restarting.
        subscription_capacity: WATCH_BUFFER,
    };
    let base = Base::start(role, &config.common, &config.nats, registry).await?;
    let Topology { tasks, leader, state, runs, .. } = base.ensure_topology(&config.topology).await?;
    let Base { names, instance, readiness, admin, client, js } = base;
    let (watch, messages) = discovery::open_tasks(&tasks).await?;
    let empty = messages == 0;
    // The bucket's message count bounds the number of tasks (history adds more): pre-size.
    let capacity = usize::try_from(messages).unwrap_or(usize::MAX).min(MAX_PRESIZE);

    let (lease_tx, lease_rx) = mpsc::channel(64);
    let lease = Lease {
        store: leader,
        key: names.leader_key().to_string(),
        instance: instance.clone(),
        timing: Timing { lease: config.topology.lease, margin: config.lease_margin },
        events: lease_tx,
        release: CancellationToken::new(),
    };
    let (sink, event_pump) = jetsched_shared::events::EventSink::new(
        EventPublisher::new(js.clone(), names.clone()),
        65_536,
        256,
        Some(metrics.events_dropped.clone()),
    );
    let events = EventSink::new(sink, metrics.events_dropped.clone());
    let window = config.publish_window.max(1);
    let catchup_slice =
        (u64::from(config.catchup_rate.max(1)) * CATCHUP_SLICE.as_millis() as u64 / 1000).max(1);
    let core = Core {
        names,
        instance,
        js,
        tasks_store: tasks,
        state_store: state,
        runs_store: runs,
        runs_ttl: config.topology.runs_ttl,
        gates: HashMap::new(),
        overlap: FuturesUnordered::new(),
        metrics,
        events,
        fire_events: config.fire_events,
        readiness,
        tasks: Tasks::with_capacity(capacity),
        wheel: TimerWheel::with_capacity(now_ms().max(0) as u64, capacity),
        watch: Some(watch),
        watch_retry_at: None,
        loaded: empty,
        load_started: Instant::now(),
        lease_open: true,
        lease: None,
        fenced: false,
        state: StateFollow::default(),
        state_load: None,
        ready: VecDeque::new(),
        catchup: VecDeque::new(),
        catchup_slice: u32::try_from(catchup_slice).unwrap_or(u32::MAX),
        catchup_budget: 0,
        catchup_refill_at: None,
        retry: Vec::new(),
        retry_at: None,
        inflight: FuturesUnordered::new(),
        dirty: Vec::new(),
        dirty_since: None,
        flush_at: None,
        flush_task: None,
        window,
        state_flush: config.state_flush,
        limits: Limits { threshold: config.misfire_threshold, max: config.catchup_max.max(1) },
        timer: precise_sleep_until(Instant::now()).fuse(),
        timer_due: None,
        due: Vec::new(),
    };
    if empty {
        core.mark_loaded();
    }
    let presence =
        jetsched_shared::presence::announce(&client, &core.names, "scheduler", &core.instance, []).await?;
    tracing::info!(admin = %admin.local_addr(), instance = %core.instance, "scheduler ready");
    Ok(Scheduler { client, core, admin, lease, lease_rx, event_pump, presence })
}

impl Scheduler {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Follows the tasks, campaigns for the lease and dispatches while leader, until `shutdown`;
    /// then waits for pending acks, writes the fire state, releases the lease and drains.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Scheduler { client, mut core, admin, lease, mut lease_rx, event_pump, presence } = self;
        let admin_task = tokio::spawn(admin.serve(shutdown.clone()));
        let events_task = tokio::spawn(event_pump.run());
        let release = lease.release.clone();
        let mut lease = Some(lease);
        let mut lease_task: Option<JoinHandle<()>> = None;

        core.run(&shutdown, &mut lease_rx, &mut lease, &mut lease_task).await;
        core.drain(&mut lease_rx).await;

        release.cancel();
        if let Some(task) = lease_task {
            // The lease task sends a final `Lost` after deleting its key; keep receiving so
            // it never blocks on a full channel.
            let drain = async { while lease_rx.recv().await.is_some() {} };
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { tokio::join!(task, drain) }).await;
        }
        if core.lease.is_some() {
            core.step_down("shutdown");
        }
        drop(core);
        if tokio::time::timeout(SHUTDOWN_GRACE, events_task).await.is_err() {
            tracing::warn!("events not all published before shutdown");
        }
        match admin_task.await {
            Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "admin server stopped"),
            Err(error) => tracing::warn!(%error, "admin server panicked"),
            Ok(Ok(())) => {}
        }
        if let Err(error) = presence.stop().await {
            tracing::warn!(%error, "stopping the presence service");
        }
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("scheduler stopped");
        Ok(())
    }
}

type Batch = Option<Vec<Result<Entry, WatcherError>>>;
type Acked = (Fire, Result<PublishAck, PublishError>);
/// Outcome of one state flush: per slot, whether its write was stored.
type Flushed = Vec<(u32, u32, bool)>;
/// A gated fire and the verdict on it (`Err`: the check was cancelled).
type Checked = (Fire, Result<anyhow::Result<Verdict>, Aborted>);

/// Everything the loop reacts to.
enum Event {
    Shutdown,
    Lease(Option<LeaseEvent>),
    Acked(Acked),
    Overlap(Checked),
    Timer,
    Tasks(Option<Vec<Result<discovery::Decoded, WatcherError>>>),
    State(Batch),
    Flushed(Result<Flushed, JoinError>),
    Flush,
    Retry,
    CatchupRefill,
    Rewatch,
    StateRewatch,
    StateLoadWake,
}

#[derive(Debug, Clone, Copy)]
struct LeaseView {
    term: u64,
    valid_until: Instant,
}

/// The fire-state watch every replica follows once its tasks are loaded (one ordered
/// `watch_with_history`), so a new leader starts from a warm state instead of reading the
/// bucket. While leading, the replica is the only writer and ignores its own echoes.
#[derive(Default)]
struct StateFollow {
    watch: Option<discovery::Watch>,
    retry_at: Option<Instant>,
    /// Highest stream sequence (entry revision) the watch delivered.
    seen: u64,
    /// States of keys not (yet) in the task table: last nominal fire (ms) and fire count.
    orphans: HashMap<Box<str>, (i64, u64)>,
}

/// A new leader waiting until the fire-state watch has caught up with the stream's last
/// sequence as read after the lease was acquired; then it plans the catch-up and dispatches.
struct StateLoad {
    /// The stream's last sequence at acquisition (`None`: not read yet).
    target: Option<u64>,
    /// The watch was opened after acquisition: an entry with `delta == 0` also ends the wait.
    fresh: bool,
    /// Retry reading the target (when `target` is `None`), else check the watch's progress.
    wake_at: Option<Instant>,
    /// `StateFollow::seen` at the last check: a watch that delivered nothing since is
    /// re-opened (an ordered consumer can stall while its stream moves between nodes).
    seen_at_check: u64,
    started: Instant,
}

/// Overlap bookkeeping of one gated task (overlap `skip` or `buffer_one`) while leader.
struct Gate {
    generation: u32,
    /// The latest scheduled fire this leader let through (nominal ms).
    last_ms: Option<i64>,
    /// The one fire being checked or buffered, and the handle cancelling its read or watch.
    waiting: Option<(i64, AbortHandle)>,
}

struct Core {
    names: Names,
    instance: String,
    js: jetstream::Context,
    tasks_store: kv::Store,
    state_store: kv::Store,
    runs_store: kv::Store,
    runs_ttl: Duration,
    /// Gated tasks by slot index; at most one check or watch each.
    gates: HashMap<u32, Gate>,
    overlap: FuturesUnordered<BoxFuture<'static, Checked>>,
    metrics: Metrics,
    events: EventSink,
    fire_events: bool,
    readiness: Readiness,
    tasks: Tasks,
    wheel: TimerWheel<DenseKey>,
    watch: Option<discovery::Feed>,
    watch_retry_at: Option<Instant>,
    loaded: bool,
    load_started: Instant,
    lease_open: bool,
    lease: Option<LeaseView>,
    /// Dispatch is paused because the local lease deadline passed.
    fenced: bool,
    state: StateFollow,
    state_load: Option<StateLoad>,
    /// Ordinary fires waiting for a publish slot.
    ready: VecDeque<Fire>,
    /// Catch-up fires, released at most `catchup_slice` per slice.
    catchup: VecDeque<Fire>,
    catchup_slice: u32,
    catchup_budget: u32,
    catchup_refill_at: Option<Instant>,
    retry: Vec<Fire>,
    retry_at: Option<Instant>,
    inflight: FuturesUnordered<BoxFuture<'static, Acked>>,
    dirty: Vec<(u32, u32)>,
    dirty_since: Option<Instant>,
    flush_at: Option<Instant>,
    flush_task: Option<JoinHandle<Flushed>>,
    window: usize,
    state_flush: Duration,
    limits: Limits,
    timer: Fuse<BoxFuture<'static, ()>>,
    timer_due: Option<u64>,
    due: Vec<(DenseKey, u64)>,
}

/// Sleeps until `deadline` with microsecond precision, never returning before it: the tokio
/// timer until [`TIMER_EARLY`] before, then a `std::thread::sleep` of the rest on a blocking
/// thread (dropping the future abandons that sleep, which ends by itself within a millisecond).
fn precise_sleep_until(deadline: Instant) -> BoxFuture<'static, ()> {
    async move {
        if let Some(early) = deadline.checked_sub(TIMER_EARLY)
            && early > Instant::now()
        {
            sleep_until(early).await;
        }
        let deadline = deadline.into_std();
        if deadline > std::time::Instant::now() {
            let rest =
                move || std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
            if tokio::task::spawn_blocking(rest).await.is_err() {
                // Cancelled (runtime shutting down): the tokio timer still never fires early.
                sleep_until(deadline.into()).await;
            }
        }
    }
    .boxed()
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_decoded(
    feed: Option<&mut discovery::Feed>,
) -> Option<Vec<Result<discovery::Decoded, WatcherError>>> {
    match feed {
        Some(feed) => feed.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_batch(watch: Option<&mut discovery::Watch>) -> Batch {
    match watch {
        Some(watch) => watch.next().await,
        None => std::future::pending().await,
    }
}

impl Core {
    async fn run(
        &mut self,
        shutdown: &CancellationToken,
        lease_rx: &mut mpsc::Receiver<LeaseEvent>,
        lease: &mut Option<Lease>,
        lease_task: &mut Option<JoinHandle<()>>,
    ) {
        loop {
            if self.loaded
                && lease_task.is_none()
                && let Some(lease) = lease.take()
            {
                *lease_task = Some(tokio::spawn(lease.run()));
                self.open_state_watch().await;
            }
            self.pump().await;
            self.arm_timer();
            let state_load_wake = self.state_load.as_ref().and_then(|s| s.wake_at);
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Event::Shutdown,
                event = lease_rx.recv(), if self.lease_open => Event::Lease(event),
                Some(acked) = self.inflight.next(), if !self.inflight.is_empty() => Event::Acked(acked),
                Some(checked) = self.overlap.next(), if !self.overlap.is_empty() => Event::Overlap(checked),
                () = &mut self.timer, if self.timer_due.is_some() => Event::Timer,
                batch = next_decoded(self.watch.as_mut()) => Event::Tasks(batch),
                batch = next_batch(self.state.watch.as_mut()) => Event::State(batch),
                Some(flushed) = OptionFuture::from(self.flush_task.as_mut()), if self.flush_task.is_some() => Event::Flushed(flushed),
                _ = sleep_opt(self.flush_at) => Event::Flush,
                _ = sleep_opt(self.retry_at) => Event::Retry,
                _ = sleep_opt(self.catchup_refill_at) => Event::CatchupRefill,
                _ = sleep_opt(self.watch_retry_at) => Event::Rewatch,
                _ = sleep_opt(self.state.retry_at) => Event::StateRewatch,
                _ = sleep_opt(state_load_wake) => Event::StateLoadWake,
            };
            match event {
                Event::Shutdown => return,
                Event::Lease(Some(event)) => self.on_lease(event).await,
                Event::Lease(None) => {
                    // The lease task ended (it only does on release, or if it panicked).
                    self.lease_open = false;
                    tracing::error!("the lease task ended; this replica no longer campaigns");
                    if self.lease.is_some() {
                        self.step_down("lease task ended");
                    }
                }
                Event::Acked(acked) => self.on_ack(acked),
                Event::Overlap(checked) => self.on_overlap(checked),
                Event::Timer => self.on_timer(),
                Event::Tasks(batch) => self.on_tasks(batch),
                Event::State(batch) => self.on_state(batch),
                Event::Flushed(result) => self.on_flushed(result),
                Event::Flush => self.flush(false),
                Event::Retry => {
                    self.retry_at = None;
                    for fire in self.retry.drain(..).rev() {
                        self.ready.push_front(fire);
                    }
                }
                Event::CatchupRefill => {
                    self.catchup_refill_at = None;
                    self.catchup_budget = self.catchup_slice;
                }
                Event::Rewatch => self.rewatch().await,
                Event::StateRewatch => self.open_state_watch().await,
                Event::StateLoadWake => self.on_state_load_wake().await,
            }
        }
    }

    /// After the loop: waits (bounded) for pending acks, then writes the fire state.
    async fn drain(&mut self, lease_rx: &mut mpsc::Receiver<LeaseEvent>) {
        self.ready.clear();
        self.catchup.clear();
        self.retry.clear();
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while !self.inflight.is_empty() {
            tokio::select! {
                biased;
                event = lease_rx.recv() => match event {
                    Some(event) => self.on_lease(event).await,
                    None => break,
                },
                Some(acked) = self.inflight.next() => self.on_ack(acked),
                _ = sleep_until(deadline) => {
                    tracing::warn!(pending = self.inflight.len(), "publish acks still pending at shutdown");
                    break;
                }
            }
        }
        if let Some(task) = self.flush_task.take() {
            let result = task.await;
            self.on_flushed(result);
        }
        if self.leading() && !self.dirty.is_empty() {
            self.flush(true);
            if let Some(task) = self.flush_task.take() {
                let result = task.await;
                self.on_flushed(result);
            }
        }
    }

    fn mark_loaded(&self) {
        self.readiness.set("tasks_loaded", true);
    }

    /// Leader with the fire state loaded: dispatching.
    fn leading(&self) -> bool {
        self.lease.is_some() && self.state_load.is_none()
    }

    // ---- timing ------------------------------------------------------------------------

    fn arm_timer(&mut self) {
        let next = self.wheel.next_deadline();
        self.metrics.timers.set(self.wheel.len() as i64);
        if next == self.timer_due {
            return;
        }
        self.timer_due = next;
        if let Some(due) = next {
            // Microsecond arithmetic against the wall clock the wheel runs on; the wake-up is
            // precise to tens of µs (see `precise_sleep_until`). A wake-up that still finds the
            // wall clock before `due` fires nothing and re-arms.
            let now_us = chrono::Utc::now().timestamp_micros().max(0) as u64;
            let wait = (due * 1000).saturating_sub(now_us);
            self.timer = precise_sleep_until(Instant::now() + Duration::from_micros(wait)).fuse();
        }
    }

    fn on_timer(&mut self) {
        self.timer_due = None;
        let now = now_ms().max(0) as u64;
        let mut due = std::mem::take(&mut self.due);
        self.wheel.advance(now, &mut due);
        let leading = self.leading();
        for &(DenseKey(idx), _) in &due {
            let Some(slot) = self.tasks.get_mut(idx) else { continue };
            let Some(nominal) = slot.next_ms.take() else { continue };
            slot.cursor_ms = nominal;
            if leading {
                slot.inflight += 1;
                self.ready.push_back(Fire {
                    idx,
                    generation: slot.generation,
                    nominal_ms: nominal,
                    trigger: Trigger::Schedule,
                });
            }
            self.schedule_next(idx);
        }
        due.clear();
        self.due = due;
    }

    /// Puts the next fire of slot `idx` (after its cursor) in the wheel, or none.
    fn schedule_next(&mut self, idx: u32) {
        let Some(slot) = self.tasks.get_mut(idx) else { return };
        slot.next_ms = slot.info.next_nominal(slot.cursor_ms);
        match slot.next_ms {
            Some(nominal) => {
                let random = match slot.info.jitter_random_ms {
                    0 => 0,
                    max => rand::random_range(0..=max),
                };
                self.wheel.insert(DenseKey(idx), slot.info.wheel_due(nominal, random));
            }
            None => {
                self.wheel.cancel(&DenseKey(idx));
            }
        }
    }

    // ---- discovery ---------------------------------------------------------------------

    fn on_tasks(&mut self, batch: Option<Vec<Result<discovery::Decoded, WatcherError>>>) {
        let Some(entries) = batch else {
            tracing::warn!("tasks watch ended; re-opening");
            self.watch = None;
            self.watch_retry_at = Some(Instant::now() + Duration::from_millis(500));
            return;
        };
        for entry in entries {
            match entry {
                Ok(entry) => {
                    self.apply(entry.change);
                    if !self.loaded && entry.delta == 0 {
                        self.loaded = true;
                        self.mark_loaded();
                        self.metrics.load_seconds.observe(self.load_started.elapsed().as_secs_f64());
                        tracing::info!(
                            tasks = self.tasks.len(),
                            elapsed_ms = self.load_started.elapsed().as_millis() as u64,
                            "tasks loaded"
                        );
                    }
                }
                Err(error) => tracing::warn!(%error, "tasks watch error"),
            }
        }
        self.metrics.tasks.set(self.tasks.len() as i64);
    }

    async fn rewatch(&mut self) {
        self.watch_retry_at = None;
        match discovery::open_tasks(&self.tasks_store).await {
            Ok((watch, messages)) => {
                self.watch = Some(watch);
                if messages == 0 && !self.loaded {
                    self.loaded = true;
                    self.mark_loaded();
                }
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot re-open the tasks watch");
                self.watch_retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Put(info) => {
                if let Some(idx) = self.tasks.lookup(&info.key) {
                    let Some(slot) = self.tasks.get_mut(idx) else { return };
                    if slot.info.revision >= info.revision {
                        return; // re-delivered after a re-opened watch
                    }
                    slot.info = *info;
                    self.schedule_next(idx);
                } else {
                    // Fires start after the registration; during the initial load, after now
                    // (the fire state decides what a new leader catches up).
                    let now = now_ms();
                    let cursor = if self.loaded {
                        info.created_ms.max(now - self.limits.threshold.as_millis() as i64)
                    } else {
                        now
                    };
                    let orphan = match self.state.orphans.is_empty() {
                        true => None,
                        false => self.state.orphans.remove(&*info.key),
                    };
                    // A one-shot registered after its time (the registry admits it within its
                    // catch-up window; e.g. an intake applied late) begins before that time:
                    // while leading, its misfire policy decides now, as after a failover.
                    let late = info.created_ms < cursor && self.loaded && self.leading();
                    let idx = self.tasks.insert(*info, cursor);
                    if let Some((done, fires)) = orphan
                        && let Some(slot) = self.tasks.get_mut(idx)
                    {
                        slot.done_ms = Some(done);
                        slot.fires = fires;
                    }
                    if late {
                        self.catch_up_task(idx, now);
                    } else {
                        self.schedule_next(idx);
                    }
                }
            }
            Change::Remove { key } => self.remove(&key),
            Change::Invalid { key, error } => {
                self.metrics.invalid_specs.inc();
                tracing::warn!(task = %key, %error, "tasks bucket holds an invalid spec; ignoring the task");
                self.remove(&key);
            }
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((idx, _)) = self.tasks.remove(key) {
            self.wheel.cancel(&DenseKey(idx));
            if let Some(Gate { waiting: Some((_, check)), .. }) = self.gates.remove(&idx) {
                check.abort();
            }
        }
    }

    // ---- leadership --------------------------------------------------------------------

    async fn on_lease(&mut self, event: LeaseEvent) {
        match event {
            LeaseEvent::Acquired { term, valid_until } => {
                if self.lease.is_some() {
                    self.step_down("re-acquired");
                }
                self.lease = Some(LeaseView { term, valid_until });
                self.metrics.is_leader.set(1);
                self.metrics.leader_changes.inc();
                self.events.emit(WireEvent {
                    instance: Some(self.instance.clone()),
                    term: Some(term),
                    ..WireEvent::new(EventKind::LeaderAcquired, SYSTEM_NAMESPACE, "scheduler")
                });
                // The fire state is warm (followed while follower); wait until the watch has
                // caught up with what the previous leader wrote, then plan the catch-up.
                self.state_load = Some(StateLoad {
                    target: None,
                    fresh: false,
                    wake_at: None,
                    seen_at_check: self.state.seen,
                    started: Instant::now(),
                });
                if self.state.watch.is_none() {
                    self.open_state_watch().await;
                }
                self.read_state_target().await;
            }
            LeaseEvent::Renewed { valid_until } => {
                if let Some(lease) = &mut self.lease {
                    lease.valid_until = valid_until;
                    if self.fenced && Instant::now() < valid_until {
                        self.fenced = false;
                        tracing::info!(term = lease.term, "lease renewed; dispatch resumes");
                    }
                }
            }
            LeaseEvent::Lost { reason } => {
                if self.lease.is_some() {
                    self.step_down(&reason);
                }
            }
        }
    }

    /// Opens the fire-state watch (all keys, then updates). Opened during a leader's wait, it
    /// is fresh: its first entry with `delta == 0` means the state is current.
    async fn open_state_watch(&mut self) {
        self.state.retry_at = None;
        match discovery::open(&self.state_store).await {
            Ok((watch, messages)) => {
                self.state.watch = Some(watch);
                if let Some(load) = &mut self.state_load {
                    load.fresh = true;
                    if messages == 0 {
                        self.finish_acquisition();
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot watch the fire state; retrying");
                self.state.retry_at = Some(Instant::now() + STATE_RETRY_DELAY);
            }
        }
    }

    /// A new leader reads the state stream's last sequence: the watch must reach it.
    async fn read_state_target(&mut self) {
        if self.state_load.is_none() {
            return;
        }
        let mut stream = self.state_store.stream.clone();
        let info = stream.info().await;
        let Some(load) = &mut self.state_load else { return };
        match info {
            Ok(info) if info.state.messages == 0 => self.finish_acquisition(),
            Ok(info) => {
                load.target = Some(info.state.last_sequence);
                load.seen_at_check = self.state.seen;
                load.wake_at = Some(Instant::now() + STATE_CATCHUP_TIMEOUT);
                if self.state.seen >= info.state.last_sequence {
                    self.finish_acquisition();
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the fire-state stream info; retrying");
                load.wake_at = Some(Instant::now() + STATE_RETRY_DELAY);
            }
        }
    }

    async fn on_state_load_wake(&mut self) {
        let Some(load) = &mut self.state_load else { return };
        load.wake_at = None;
        if load.target.is_some() && load.fresh && self.state.seen > load.seen_at_check {
            // A fresh watch still delivering (a large fire state): keep waiting.
            load.seen_at_check = self.state.seen;
            load.wake_at = Some(Instant::now() + STATE_CATCHUP_TIMEOUT);
            return;
        }
        if load.target.is_some() {
            // The warm watch did not reach the target (e.g. the last message was removed
            // meanwhile): read the whole fire state again through a fresh watch.
            tracing::warn!(
                target = load.target,
                seen = self.state.seen,
                "the fire-state watch did not catch up; re-reading the fire state"
            );
            load.target = None;
            self.state.watch = None;
            self.open_state_watch().await;
        }
        self.read_state_target().await;
    }

    fn on_state(&mut self, batch: Batch) {
        let Some(entries) = batch else {
            tracing::warn!("fire-state watch ended; re-opening");
            self.state.watch = None;
            self.state.retry_at = Some(Instant::now() + STATE_RETRY_DELAY);
            return;
        };
        // The leader is the only writer: its own echoes are older than what it holds.
        let apply = !self.leading();
        let mut current = false;
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::warn!(%error, "state watch error");
                    continue;
                }
            };
            self.state.seen = self.state.seen.max(entry.revision);
            current |= entry.delta == 0;
            if !apply {
                if entry.operation != Operation::Put && !self.state.orphans.is_empty() {
                    self.state.orphans.remove(entry.key.as_str());
                }
                continue;
            }
            let state = match entry.operation {
                Operation::Put => match serde_json::from_slice::<FireState>(&entry.value) {
                    Ok(state) => Some((state.last_nominal_fire.timestamp_millis(), state.fires)),
                    Err(error) => {
                        tracing::warn!(task = %entry.key, %error, "unreadable fire state; ignored");
                        continue;
                    }
                },
                Operation::Delete | Operation::Purge => None,
            };
            match self.tasks.lookup(&entry.key).and_then(|idx| self.tasks.get_mut(idx)) {
                Some(slot) => {
                    slot.done_ms = state.map(|(done, _)| done);
                    slot.fires = state.map_or(0, |(_, fires)| fires);
                }
                None => match state {
                    Some(state) => {
                        self.state.orphans.insert(entry.key.into_boxed_str(), state);
                    }
                    None => {
                        self.state.orphans.remove(entry.key.as_str());
                    }
                },
            }
        }
        if let Some(load) = &self.state_load
            && ((load.fresh && current) || load.target.is_some_and(|target| self.state.seen >= target))
        {
            self.finish_acquisition();
        }
    }

    /// The fire state is loaded: plan every task's missed fires, then dispatch.
    fn finish_acquisition(&mut self) {
        let state_wait_ms =
            self.state_load.take().map_or(0, |load| load.started.elapsed().as_millis() as u64);
        let now = now_ms();
        let started = std::time::Instant::now();
        let (mut dispatch, mut skipped, mut missed) = (0usize, 0u64, 0u64);
        let indices: Vec<u32> = self.tasks.iter_mut().map(|(idx, _)| idx).collect();
        for idx in indices {
            let (d, s, m) = self.catch_up_task(idx, now);
            dispatch += d;
            skipped += s;
            missed += m;
        }
        self.catchup_budget = self.catchup_slice;
        tracing::info!(
            term = self.lease.map(|l| l.term).unwrap_or_default(),
            tasks = self.tasks.len(),
            dispatch,
            skipped,
            missed,
            state_wait_ms,
            plan_ms = started.elapsed().as_millis() as u64,
            "leader resumed from the fire state"
        );
    }

    /// Plans the fires of slot `idx` between its last handled fire (or its origin) and `now`
    /// under its misfire policy, queues the dispatches, reports skips and misses, and moves
    /// its cursor to `now`. Returns (dispatched, skipped, missed).
    fn catch_up_task(&mut self, idx: u32, now: i64) -> (usize, u64, u64) {
        let Some(slot) = self.tasks.get_mut(idx) else { return (0, 0, 0) };
        let info = &slot.info;
        let floor = slot.done_ms.unwrap_or(info.created_ms).max(info.created_ms);
        let plan = if info.paused {
            catchup::Plan::default()
        } else {
            catchup::plan(
                &info.schedule,
                info.misfire,
                info.catchup_window,
                from_ms(floor),
                from_ms(now),
                self.limits,
            )
        };
        let term = self.lease.map(|l| l.term);
        report_plan(&self.metrics, &self.events, &self.instance, term, info, &plan);
        let counts = (plan.dispatch.len(), plan.skipped.len() as u64 + plan.skipped_more, plan.missed);
        let generation = slot.generation;
        if plan.dispatch.is_empty() {
            if let Some(last) = plan.last {
                slot.done_ms = Some(slot.done_ms.map_or(last, |d| d.max(last)));
                self.mark_dirty_slot(idx);
            }
        } else {
            // Every examined fire counts as done once the dispatches are acknowledged.
            slot.pending_ms = plan.last;
            for &(nominal, trigger) in &plan.dispatch {
                slot.inflight += 1;
                let fire = Fire { idx, generation, nominal_ms: nominal, trigger };
                match trigger {
                    Trigger::Catchup => self.catchup.push_back(fire),
                    _ => self.ready.push_back(fire),
                }
            }
        }
        if let Some(slot) = self.tasks.get_mut(idx) {
            slot.cursor_ms = now;
        }
        self.schedule_next(idx);
        counts
    }

    fn step_down(&mut self, reason: &str) {
        let term = self.lease.take().map(|l| l.term);
        self.fenced = false;
        tracing::warn!(reason, term = term.unwrap_or_default(), "leadership lost");
        self.state_load = None;
        self.ready.clear();
        self.catchup.clear();
        self.retry.clear();
        self.retry_at = None;
        self.catchup_refill_at = None;
        self.inflight = FuturesUnordered::new();
        // Buffered fires are dropped with their watches; the next leader re-evaluates.
        self.gates.clear();
        self.overlap = FuturesUnordered::new();
        self.metrics.publish_inflight.set(0);
        self.dirty.clear();
        self.dirty_since = None;
        self.flush_at = None;
        for (_, slot) in self.tasks.iter_mut() {
            slot.inflight = 0;
            slot.pending_ms = None;
            slot.dirty = false;
        }
        self.metrics.is_leader.set(0);
        self.metrics.leader_changes.inc();
        self.events.emit(WireEvent {
            instance: Some(self.instance.clone()),
            term,
            reason: Some(reason.to_string()),
            ..WireEvent::new(EventKind::LeaderLost, SYSTEM_NAMESPACE, "scheduler")
        });
    }

    // ---- dispatch ----------------------------------------------------------------------

    /// Publishes queued fires while the window has room and the lease is valid.
    async fn pump(&mut self) {
        if !self.leading() {
            return;
        }
        while self.inflight.len() < self.window {
            let fire = if let Some(fire) = self.ready.pop_front() {
                fire
            } else if self.catchup_budget > 0
                && let Some(fire) = self.catchup.pop_front()
            {
                self.catchup_budget -= 1;
                fire
            } else {
                break;
            };
            // Fencing: never publish once the lease may have lapsed. The fire waits for the
            // lease task's verdict: a late `Renewed` resumes, `Lost` steps down.
            let Some(lease) = self.lease else { return };
            if Instant::now() >= lease.valid_until {
                self.ready.push_front(fire);
                if !self.fenced {
                    self.fenced = true;
                    tracing::warn!(term = lease.term, "lease deadline passed; dispatch paused until renewed");
                }
                break;
            }
            if !self.admit(fire) {
                continue;
            }
            let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { continue };
            let message = match dispatch::message(&self.names, &slot.info, &fire, lease.term) {
                Ok(message) => message,
                Err(error) => {
                    tracing::error!(%error, task = %slot.info.key, "cannot encode dispatch; fire dropped");
                    slot.inflight = slot.inflight.saturating_sub(1);
                    continue;
                }
            };
            match self.js.send_publish(message.subject, message.publish).await {
                Ok(ack) => self.inflight.push(async move { (fire, ack.await) }.boxed()),
                Err(error) => {
                    self.metrics.publish_errors.inc();
                    tracing::warn!(%error, task = %slot.info.key, nominal = fire.nominal_ms, "publish failed; retrying");
                    self.retry.push(fire);
                    self.retry_at.get_or_insert(Instant::now() + RETRY_DELAY);
                }
            }
        }
        if !self.catchup.is_empty() && self.catchup_budget == 0 && self.catchup_refill_at.is_none() {
            self.catchup_refill_at = Some(Instant::now() + CATCHUP_SLICE);
        }
        self.metrics.publish_inflight.set(self.inflight.len() as i64);
    }

    fn on_ack(&mut self, (fire, result): Acked) {
        self.metrics.publish_inflight.set(self.inflight.len() as i64);
        let ack = match result {
            Ok(ack) => ack,
            Err(error) => {
                self.metrics.publish_errors.inc();
                if self.lease.is_some() {
                    tracing::warn!(%error, nominal = fire.nominal_ms, "dispatch not acknowledged; retrying");
                    self.retry.push(fire);
                    self.retry_at.get_or_insert(Instant::now() + RETRY_DELAY);
                }
                return;
            }
        };
        let now = now_ms();
        let trigger = fire.trigger.as_str();
        self.metrics.lag.with_label_values(&[trigger]).observe((now - fire.nominal_ms) as f64 / 1000.0);
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        if ack.duplicate {
            self.metrics.duplicates.inc();
        } else {
            self.metrics.dispatched.with_label_values(&[trigger]).inc();
            slot.fires += 1;
            if self.fire_events {
                let info = &slot.info;
                self.events.emit(WireEvent {
                    execution_id: Some(scheduled_execution_id(
                        info.namespace(),
                        info.task_id(),
                        fire.nominal_ms,
                    )),
                    nominal_time: Some(from_ms(fire.nominal_ms)),
                    trigger: Some(fire.trigger),
                    instance: Some(self.instance.clone()),
                    term: self.lease.map(|l| l.term),
                    ..WireEvent::new(EventKind::FireDispatched, info.namespace(), info.task_id())
                });
            }
        }
        self.settle(&fire);
    }

    /// A queued fire is handled (stored or skipped): once none of the task's is pending, the
    /// fire state advances past the latest.
    fn settle(&mut self, fire: &Fire) {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        slot.inflight = slot.inflight.saturating_sub(1);
        slot.pending_ms = Some(slot.pending_ms.map_or(fire.nominal_ms, |p| p.max(fire.nominal_ms)));
        if slot.inflight == 0 {
            let pending = slot.pending_ms.take();
            slot.done_ms = slot.done_ms.max(pending);
            self.mark_dirty_slot(fire.idx);
        }
    }

    // ---- overlap -----------------------------------------------------------------------

    /// Whether `fire` may be published now. A fire of a gated task whose previous scheduled
    /// run may still be going is held for a check (its verdict comes back as
    /// [`Event::Overlap`]), or skipped when another fire of the task already waits.
    fn admit(&mut self, fire: Fire) -> bool {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return true };
        let policy = slot.info.overlap;
        if !overlap::gated(policy) {
            return true;
        }
        let gate = self.gates.entry(fire.idx).or_insert(Gate {
            generation: fire.generation,
            last_ms: None,
            waiting: None,
        });
        if gate.generation != fire.generation {
            *gate = Gate { generation: fire.generation, last_ms: None, waiting: None };
        }
        // Let through already: a publish retry, or the verdict's own re-queued fire.
        if gate.last_ms.is_some_and(|last| last >= fire.nominal_ms) {
            return true;
        }
        // The previous scheduled fire: the one this leader let through, else the fire state's.
        let prior = match gate.last_ms {
            Some(ms) => Some((ms, Previous::Dispatched)),
            None => slot.done_ms.map(|ms| (ms, Previous::Inherited)),
        };
        match (overlap::arrive(gate.waiting.is_some(), prior.is_some()), prior) {
            (Arrival::Dispatch, _) | (Arrival::Check, None) => {
                gate.last_ms = Some(fire.nominal_ms);
                true
            }
            (Arrival::Skip, _) => {
                self.skip_overlapping(&fire);
                false
            }
            (Arrival::Check, Some((ms, previous))) => {
                let prior = Prior {
                    execution_id: scheduled_execution_id(slot.info.namespace(), slot.info.task_id(), ms),
                    previous,
                    age: Duration::from_millis(u64::try_from(now_ms() - ms).unwrap_or(0)),
                    ttl: self.runs_ttl,
                };
                let runs = self.runs_store.clone();
                let check = match policy {
                    OverlapPolicy::BufferOne => {
                        overlap::wait_idle(runs, prior).map(|r| r.map(|()| Verdict::Dispatch)).boxed()
                    }
                    _ => overlap::is_going(runs, prior)
                        .map(move |r| r.map(|g| overlap::verdict(policy, g)))
                        .boxed(),
                };
                let (check, handle) = futures::future::abortable(check);
                gate.waiting = Some((fire.nominal_ms, handle));
                self.overlap.push(check.map(move |result| (fire, result)).boxed());
                false
            }
        }
    }

    fn on_overlap(&mut self, (fire, result): Checked) {
        let Ok(result) = result else { return }; // cancelled: the task went away
        let Some(gate) = self.gates.get_mut(&fire.idx) else { return };
        if gate.generation != fire.generation || gate.waiting.as_ref().map(|w| w.0) != Some(fire.nominal_ms) {
            return;
        }
        gate.waiting = None;
        let verdict = result.unwrap_or_else(|error| {
            tracing::warn!(
                error = format!("{error:#}"),
                nominal = fire.nominal_ms,
                "cannot read the previous run; dispatching"
            );
            Verdict::Dispatch
        });
        match verdict {
            Verdict::Dispatch => {
                gate.last_ms = Some(fire.nominal_ms);
                self.ready.push_front(fire);
            }
            Verdict::Skip => self.skip_overlapping(&fire),
        }
    }

    /// `fire.skipped` (reason overlap) and the fire state advances past the fire.
    fn skip_overlapping(&mut self, fire: &Fire) {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        let reason = SkipReason::Overlap.as_str();
        self.metrics.skipped.with_label_values(&[reason]).inc();
        let info = &slot.info;
        self.events.emit(WireEvent {
            nominal_time: Some(from_ms(fire.nominal_ms)),
            trigger: Some(fire.trigger),
            reason: Some(reason.to_string()),
            instance: Some(self.instance.clone()),
            term: self.lease.map(|l| l.term),
            ..WireEvent::new(EventKind::FireSkipped, info.namespace(), info.task_id())
        });
        self.settle(fire);
    }

    // ---- fire state --------------------------------------------------------------------

    fn mark_dirty_slot(&mut self, idx: u32) {
        let Some(slot) = self.tasks.get_mut(idx) else { return };
        if slot.dirty {
            return;
        }
        slot.dirty = true;
        if self.dirty.is_empty() {
            self.dirty_since = Some(Instant::now());
        }
        self.dirty.push((idx, slot.generation));
        self.flush_at.get_or_insert(Instant::now() + self.state_flush);
    }

    /// Writes the dirty fire states (coalesced since the last flush), in a task of its own.
    fn flush(&mut self, force: bool) {
        self.flush_at = None;
        if self.dirty.is_empty() {
            return;
        }
        // Dispatch first: while a burst is being published, state writes wait (up to
        // MAX_STATE_DELAY; de-duplication covers a failover meanwhile).
        let busy = !self.ready.is_empty() || self.inflight.len() >= self.window / 2;
        let overdue = self.dirty_since.is_some_and(|since| since.elapsed() >= MAX_STATE_DELAY);
        if self.flush_task.is_some() || (busy && !overdue && !force) {
            self.flush_at = Some(Instant::now() + self.state_flush);
            return;
        }
        self.dirty_since = None;
        let Some(lease) = self.lease else { return };
        if Instant::now() >= lease.valid_until {
            return;
        }
        let mut batch = Vec::with_capacity(self.dirty.len());
        for (idx, generation) in std::mem::take(&mut self.dirty) {
            let Some(slot) = self.tasks.get_live(idx, generation) else { continue };
            slot.dirty = false;
            let Some(done) = slot.done_ms else { continue };
            let info = &slot.info;
            let state = FireState {
                last_nominal_fire: from_ms(done),
                next_fire: slot.next_ms.map(from_ms),
                fires: slot.fires,
                last_execution_id: Some(scheduled_execution_id(info.namespace(), info.task_id(), done)),
                revision: info.revision,
            };
            match serde_json::to_vec(&state) {
                Ok(body) => batch.push((
                    task_key(info.namespace(), info.task_id()),
                    Bytes::from(body),
                    idx,
                    generation,
                )),
                Err(error) => tracing::error!(%error, task = %info.key, "cannot encode fire state"),
            }
        }
        let store = self.state_store.clone();
        // A fire state says "handled up to here": it is written only after the events of the
        // fires it covers (skipped, missed) are stored, so a leader dying in between leaves
        // them to its successor instead of skipping them silently.
        let events = self.events.barrier();
        let valid_until = lease.valid_until;
        self.flush_task = Some(tokio::spawn(async move {
            events.wait().await;
            if Instant::now() >= valid_until {
                // The lease may be gone: write nothing (the slots stay dirty while leader).
                return batch.into_iter().map(|(_, _, idx, generation)| (idx, generation, false)).collect();
            }
            futures::stream::iter(batch)
                .map(|(key, body, idx, generation)| {
                    let store = store.clone();
                    async move {
                        let stored = match store.put(&key, body).await {
                            Ok(_) => true,
                            Err(error) => {
                                tracing::debug!(%error, task = %key, "fire state not written");
                                false
                            }
                        };
                        (idx, generation, stored)
                    }
                })
                .buffer_unordered(STATE_WRITE_WINDOW)
                .collect::<Vec<_>>()
                .await
        }));
    }

    fn on_flushed(&mut self, result: Result<Flushed, JoinError>) {
        self.flush_task = None;
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(error) => {
                tracing::error!(%error, "state flush task failed");
                return;
            }
        };
        let failed: Vec<(u32, u32)> = outcomes
            .iter()
            .filter(|(_, _, stored)| !stored)
            .map(|&(idx, generation, _)| (idx, generation))
            .collect();
        self.metrics
            .state_writes
            .with_label_values(&["stored"])
            .inc_by((outcomes.len() - failed.len()) as u64);
        self.metrics.state_writes.with_label_values(&["failed"]).inc_by(failed.len() as u64);
        if self.lease.is_some() {
            for (idx, generation) in failed {
                if self.tasks.get_live(idx, generation).is_some() {
                    self.mark_dirty_slot(idx);
                }
            }
        }
    }
}

/// Metrics and events of one task's catch-up: each skipped fire (up to the maximum), the count
/// of further skips, and the missed fires.
fn report_plan(
    metrics: &Metrics,
    events: &EventSink,
    instance: &str,
    term: Option<u64>,
    info: &TaskInfo,
    plan: &catchup::Plan,
) {
    if plan.skipped.is_empty() && plan.skipped_more == 0 && plan.missed == 0 {
        return;
    }
    let event = |kind: EventKind, reason: String, nominal: Option<i64>| WireEvent {
        nominal_time: nominal.map(from_ms),
        reason: Some(reason),
        instance: Some(instance.to_string()),
        term,
        ..WireEvent::new(kind, info.namespace(), info.task_id())
    };
    for &(nominal, reason) in &plan.skipped {
        metrics.skipped.with_label_values(&[reason.as_str()]).inc();
        events.emit(event(EventKind::FireSkipped, reason.as_str().to_string(), Some(nominal)));
    }
    if plan.skipped_more > 0 {
        let reason = plan.skipped.first().map(|(_, r)| r.as_str()).unwrap_or("misfire");
        metrics.skipped.with_label_values(&[reason]).inc_by(plan.skipped_more);
        events.emit(event(
            EventKind::FireSkipped,
            format!("{reason}: {} more skipped fires not listed", plan.skipped_more),
            None,
        ));
    }
    if plan.missed > 0 {
        metrics.missed.inc_by(plan.missed);
        events.emit(event(
            EventKind::FireMissed,
            format!("{} fires older than the catch-up window or beyond the catch-up maximum", plan.missed),
            None,
        ));
    }
}
