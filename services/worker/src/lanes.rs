//! The lanes of one queue: one durable consumer per priority, and the loop that decides which
//! lane each free permit pulls from (the policy and the reserve of [`policy`]).
//!
//! A lane is known to have work when it holds a message or its last pull was filled. A lane
//! without known work keeps one long-poll pull of one message outstanding (a probe, renewed
//! at each expiry), so an empty lane costs one request per `--pull-expires` and an urgent run
//! is seen the moment it is stored. Free permits are handed out one at a time by the policy
//! among the lanes with work that the reserve allows; a lane given `n` permits runs the
//! message it holds and pulls the rest at once (no wait), sized to those permits. A message a
//! probe brought waits for a permit in the loop: it gets progress acks so its ack_wait never
//! runs out while more urgent lanes are served.
//!
//! While operators have paused the queue (its flag from [`crate::queues`]) the loop sends no
//! pull and hands out no permit: nothing starts. A message a probe sent before the pause
//! brings is held (with its progress acks) and starts after the resume.

pub(crate) mod policy;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{AckKind, Message, consumer::PullConsumer};
use futures::StreamExt;
use jetsched_shared::priority::Priority;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

pub(crate) use crate::slot::Frees;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::policy::{Policy, Reserve};
use crate::delivery::{Parts, process};
use crate::slot::Slot;

/// The lanes of a queue and how permits are shared among them.
pub(crate) struct LanePulls {
    pub(crate) queue: String,
    /// One consumer per priority, most urgent first.
    pub(crate) consumers: Vec<(Priority, PullConsumer)>,
    pub(crate) max_batch: usize,
    pub(crate) expires: Duration,
    pub(crate) policy: Policy,
    pub(crate) reserve: Reserve,
    /// How long a message may wait in the loop for a permit before it gets a progress ack.
    pub(crate) progress_interval: Duration,
    /// Set while operators have paused the queue.
    pub(crate) paused: watch::Receiver<bool>,
}

/// One lane's state in the loop.
struct Lane {
    priority: Priority,
    consumer: PullConsumer,
    /// Messages brought by a probe, waiting for a permit, with when they last got an ack.
    held: VecDeque<(Message, Instant)>,
    /// The last pull was filled: there may be more.
    hot: bool,
    probing: bool,
    /// A first pull (no wait) has answered: until every lane's has, no permit is handed out,
    /// so a worker starting on a backlog does not start low runs before seeing critical ones.
    known: bool,
    running: Arc<AtomicUsize>,
}

impl Lane {
    fn has_work(&self) -> bool {
        self.hot || !self.held.is_empty()
    }
}

/// What a probe brought: its lane, and a message, nothing (expired) or an error.
type ProbeResult = (usize, Result<Option<Message>, String>);

/// What the loop waits for.
enum Event {
    Shutdown,
    /// A run of some queue ended.
    Freed,
    Probe(Box<ProbeResult>),
    Permit(OwnedSemaphorePermit),
    /// A held message is due for a progress ack.
    Refresh,
    /// The queue was paused or resumed.
    Paused,
}

/// The longest wait for a no-wait pull's answer (the server's end of the batch).
const FETCH_BOUND: Duration = Duration::from_secs(2);

/// The wait before a failed probe is sent again.
const PROBE_RETRY: Duration = Duration::from_millis(500);

/// Pulls and starts the runs of every lane of one queue until `shutdown`.
pub(crate) async fn run_lanes(
    parts: Arc<Parts>,
    pulls: LanePulls,
    permits: Arc<Semaphore>,
    frees: Frees,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let LanePulls {
        queue,
        consumers,
        max_batch,
        expires,
        mut policy,
        reserve,
        progress_interval,
        mut paused,
    } = pulls;
    let queue: Arc<str> = Arc::from(queue.as_str());
    let mut lanes: Vec<Lane> = consumers
        .into_iter()
        .map(|(priority, consumer)| Lane {
            priority,
            consumer,
            held: VecDeque::new(),
            hot: false,
            probing: false,
            known: false,
            running: Arc::new(AtomicUsize::new(0)),
        })
        .collect();
    let mut probes: JoinSet<ProbeResult> = JoinSet::new();
    let mut freed = frees.subscribe();
    let starter = Starter {
        parts: parts.clone(),
        queue: queue.clone(),
        tracker,
        frees: frees.clone(),
        permits: permits.clone(),
    };
    loop {
        let stopped = *paused.borrow_and_update();
        for (index, lane) in lanes.iter_mut().enumerate() {
            if !stopped && !lane.has_work() && !lane.probing {
                lane.probing = true;
                let wait = lane.known.then_some(expires);
                probes.spawn(probe(index, lane.consumer.clone(), wait, Duration::ZERO));
            }
        }
        let running = running_of(&lanes);
        let free = permits.available_permits();
        let wanted = !stopped
            && lanes.iter().all(|lane| lane.known)
            && lanes
                .iter()
                .any(|lane| lane.has_work() && reserve.allows(lane.priority, running, free.max(1)));
        let refresh_at = lanes.iter().flat_map(|lane| lane.held.iter().map(|(_, at)| *at)).min();
        let event = tokio::select! {
            biased;
            _ = shutdown.cancelled() => Event::Shutdown,
            Ok(()) = paused.changed() => Event::Paused,
            Ok(()) = freed.changed() => Event::Freed,
            Some(Ok(result)) = probes.join_next() => Event::Probe(Box::new(result)),
            Ok(permit) = permits.clone().acquire_owned(), if wanted => Event::Permit(permit),
            () = tokio::time::sleep_until(refresh_at.unwrap_or_else(Instant::now) + progress_interval),
                if refresh_at.is_some() => Event::Refresh,
        };
        match event {
            Event::Shutdown => break,
            Event::Freed | Event::Paused => {}
            Event::Probe(probed) => {
                let (index, result) = *probed;
                let lane = &mut lanes[index];
                lane.probing = false;
                lane.known |= result.is_ok();
                match result {
                    Ok(Some(message)) => {
                        starter.depth(lane.priority, &message);
                        lane.held.push_back((message, Instant::now()));
                        lane.hot = true;
                    }
                    Ok(None) => starter.empty(lane.priority),
                    Err(error) => {
                        parts.metrics.errors.with_label_values(&["pull"]).inc();
                        tracing::warn!(%error, queue = %queue, priority = %lane.priority, "lane pull failed");
                        lane.probing = true;
                        let wait = lane.known.then_some(expires);
                        probes.spawn(probe(index, lane.consumer.clone(), wait, PROBE_RETRY));
                    }
                }
            }
            Event::Permit(first) => {
                let mut held = vec![first];
                while held.len() < max_batch {
                    match permits.clone().try_acquire_owned() {
                        Ok(permit) => held.push(permit),
                        Err(_) => break,
                    }
                }
                let grants = grant(&lanes, &mut policy, reserve, permits.available_permits(), held.len());
                for (index, count) in grants.into_iter().enumerate() {
                    if count > 0 {
                        let taken: Vec<_> = held.drain(..count).collect();
                        starter.fill(&mut lanes[index], taken).await;
                    }
                }
                // Permits no lane could use go back.
                drop(held);
            }
            Event::Refresh => {
                let due = Instant::now() - progress_interval;
                for lane in &mut lanes {
                    for (message, at) in lane.held.iter_mut().filter(|(_, at)| *at <= due) {
                        if let Err(error) = message.ack_with(AckKind::Progress).await {
                            tracing::warn!(%error, "progress ack of a waiting run");
                        }
                        *at = Instant::now();
                    }
                }
            }
        }
    }
    // Hand back what waits here and what the probes still bring (bounded by their expiry).
    for lane in &mut lanes {
        for (message, _) in lane.held.drain(..) {
            hand_back(message).await;
        }
    }
    while let Some(result) = probes.join_next().await {
        if let Ok((_, Ok(Some(message)))) = result {
            hand_back(message).await;
        }
    }
}

/// How many of `count` permits each lane gets: one at a time by the policy, among the lanes
/// with work the reserve allows (a lane that is not hot gets no more than it holds).
fn grant(
    lanes: &[Lane],
    policy: &mut Policy,
    reserve: Reserve,
    free_after: usize,
    count: usize,
) -> [usize; 4] {
    let mut running = running_of(lanes);
    let mut grants = [0usize; 4];
    for given in 0..count {
        // Permits still free: the ones held for this pass and not given yet, and the rest.
        let free = free_after + (count - given);
        let mut ready = [false; 4];
        for (index, lane) in lanes.iter().enumerate() {
            let room = lane.hot || grants[index] < lane.held.len();
            ready[index] = room && reserve.allows(lane.priority, running, free);
        }
        let Some(priority) = policy.pick(ready) else { break };
        let index = lanes.iter().position(|lane| lane.priority == priority).unwrap_or(0);
        grants[index] += 1;
        running[priority.index()] += 1;
    }
    grants
}

/// Runs of each priority now (indexed by [`Priority::index`]).
fn running_of(lanes: &[Lane]) -> [usize; 4] {
    let mut running = [0; 4];
    for lane in lanes {
        running[lane.priority.index()] = lane.running.load(Ordering::Acquire);
    }
    running
}

/// A pull of one message on a lane without known work, after `delay`: a long poll that
/// expires after `wait`, or without waiting (`None`: the first look at a lane).
async fn probe(index: usize, consumer: PullConsumer, wait: Option<Duration>, delay: Duration) -> ProbeResult {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let batch = match wait {
        Some(expires) => consumer.batch().max_messages(1).expires(expires).messages().await,
        None => consumer.fetch().max_messages(1).messages().await,
    };
    let bound = wait.map_or(FETCH_BOUND, |expires| expires + FETCH_BOUND);
    let mut batch = match batch {
        Ok(batch) => batch,
        Err(error) => return (index, Err(error.to_string())),
    };
    match tokio::time::timeout(bound, batch.next()).await {
        Ok(Some(Ok(message))) => (index, Ok(Some(message))),
        Ok(Some(Err(error))) => (index, Err(error.to_string())),
        Ok(None) => (index, Ok(None)),
        Err(_) => (index, Err("pull unanswered".to_string())),
    }
}

async fn hand_back(message: Message) {
    if let Err(error) = message.ack_with(AckKind::Nak(None)).await {
        tracing::warn!(%error, "hand back a run at shutdown");
    }
}

/// Starts runs on the tracker and keeps the lane metrics.
struct Starter {
    parts: Arc<Parts>,
    queue: Arc<str>,
    tracker: TaskTracker,
    frees: Frees,
    /// The worker's permits (a run waiting for its start gives its own back and takes one again).
    permits: Arc<Semaphore>,
}

impl Starter {
    /// Uses `permits` on `lane`: the messages it holds first, then one pull (no wait) for the
    /// rest. A pull that comes back short means the lane is drained.
    async fn fill(&self, lane: &mut Lane, mut permits: Vec<OwnedSemaphorePermit>) {
        while let Some(permit) = permits.pop() {
            let Some((message, _)) = lane.held.pop_front() else {
                permits.push(permit);
                break;
            };
            self.start(lane, message, permit);
        }
        if permits.is_empty() || !lane.hot {
            return;
        }
        let asked = permits.len();
        let batch = match lane.consumer.fetch().max_messages(asked).messages().await {
            Ok(batch) => batch,
            Err(error) => {
                self.parts.metrics.errors.with_label_values(&["pull"]).inc();
                tracing::warn!(%error, queue = %self.queue, priority = %lane.priority, "lane pull failed");
                lane.hot = false;
                return;
            }
        };
        let mut batch = std::pin::pin!(batch);
        let mut got = 0;
        // A no-wait pull has no expiry, so a lost end-of-batch status would hold this loop (and
        // every lane of the queue) forever: the wait is bounded; what comes later is redelivered.
        let deadline = Instant::now() + FETCH_BOUND;
        while let Ok(Some(message)) = tokio::time::timeout_at(deadline, batch.next()).await {
            match message {
                Ok(message) => {
                    got += 1;
                    match permits.pop() {
                        Some(permit) => {
                            self.depth(lane.priority, &message);
                            self.start(lane, message, permit);
                        }
                        // The server never sends more than asked; keep it for the next permit.
                        None => lane.held.push_back((message, Instant::now())),
                    }
                }
                Err(error) => {
                    self.parts.metrics.errors.with_label_values(&["pull"]).inc();
                    tracing::warn!(%error, queue = %self.queue, priority = %lane.priority, "lane pull stream error");
                }
            }
        }
        if got < asked {
            lane.hot = false;
            if got == 0 {
                self.empty(lane.priority);
            }
        }
    }

    fn start(&self, lane: &Lane, message: Message, permit: OwnedSemaphorePermit) {
        let arrived = std::time::Instant::now();
        let priority = lane.priority.as_str();
        if let Ok(info) = message.info() {
            let waited = (async_nats::datetime::now() - info.published).as_seconds_f64().max(0.0);
            self.parts.metrics.wait.with_label_values(&[&self.queue, priority]).observe(waited);
        }
        let mut slot = Slot::new(permit, self.permits.clone(), lane.running.clone(), self.frees.clone());
        let parts = self.parts.clone();
        let queue = self.queue.clone();
        self.tracker.spawn(async move {
            // Boxed: a delivery's state machine is kilobytes, and an unboxed one was
            // copied several times per spawn (half of the 11% of a worker's CPU spent in memmove).
            Box::pin(process(&parts, &queue, message, arrived, &mut slot)).await;
        });
    }

    /// The lane's depth as the server reported it with a delivery (no polling).
    fn depth(&self, priority: Priority, message: &Message) {
        if let Ok(info) = message.info() {
            let pending = i64::try_from(info.pending).unwrap_or(i64::MAX);
            self.parts.metrics.lane_depth.with_label_values(&[&self.queue, priority.as_str()]).set(pending);
            self.queue_depth();
        }
    }

    /// A lane found empty.
    fn empty(&self, priority: Priority) {
        self.parts.metrics.lane_depth.with_label_values(&[&self.queue, priority.as_str()]).set(0);
        self.queue_depth();
    }

    /// `jetsched_queue_depth{queue}`: the sum of its lanes.
    fn queue_depth(&self) {
        let total: i64 = Priority::ALL
            .iter()
            .map(|p| self.parts.metrics.lane_depth.with_label_values(&[&self.queue, p.as_str()]).get())
            .sum();
        self.parts.metrics.queue_depth.with_label_values(&[&self.queue]).set(total);
    }
}
