//! What every replica follows: the tasks feed (decoded entries of the tasks watch, see
//! `discovery.rs`) until and after the initial load, and the fire-state watch once the tasks
//! are loaded, so a new leader starts from a warm state instead of reading the bucket.
//!
//! Each watch is re-opened after it ends or fails to open; the part keeps when. The tasks
//! watch is also re-opened when JetStream answers again after an outage, and after any error
//! it reports (a missed heartbeat: its consumer is gone): the client library re-creates a
//! watch's consumer on its own, but a re-creation request sent while JetStream did not answer
//! waits out its timeout (10 s), then a backoff (up to 10 s), and one under way is not started
//! over when JetStream comes back, so the watch could deliver nothing for tens of seconds after
//! an outage, without an error (a task stored meanwhile was not seen, so not fired). Both
//! watches are opened, and a new leader reads the fire-state stream's end, in tasks of their
//! own, each request bounded by a short timeout (doubled after each timeout in a row) and sent
//! again: a stream whose replicas are still electing a leader answers nothing, and the
//! client's own 10 s timeout held a new leader's first dispatch, or a replica's view of the
//! tasks, that long after a cluster restart. While leading, the replica is the only writer of
//! the fire state and ignores its own echoes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv::{self, Entry, WatcherError};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use crate::discovery::{self, Decoded, Feed, Watch};
use crate::specs::Specs;

/// Delay before the tasks watch is re-opened after it ended.
const FEED_RETRY: Duration = Duration::from_millis(500);
/// Delay before the tasks watch is re-opened after it failed to open.
const FEED_REOPEN_RETRY: Duration = Duration::from_secs(1);
/// Delay before the fire-state watch (or its stream info) is read again after an error.
pub(crate) const STATE_RETRY_DELAY: Duration = Duration::from_millis(500);
/// How long the first request of a watch's opening (or of a read of the fire-state stream's
/// info) may take before it is given up and sent again; each further timeout in a row
/// doubles it, up to [`REQUEST_TIMEOUT_MAX`]. A stream whose replicas are still electing
/// a leader answers nothing, and the client's own timeout (10 s) would hold a new leader's
/// wait that long after the stream is back.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest such a request is waited for (a large bucket takes the server a while to set
/// up a watch over).
const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(16);

/// A batch of fire-state entries (`None`: the watch ended).
pub(crate) type StateBatch = Option<Vec<Result<Entry, WatcherError>>>;
/// A batch of decoded task changes (`None`: the feed ended).
pub(crate) type TaskBatch = Option<Vec<Result<Decoded, WatcherError>>>;
/// A tasks feed opened (and how many messages the bucket held), or why not.
pub(crate) type Opened = Result<Result<(Feed, u64), Bounded>, JoinError>;
/// The fire-state watch opened (and how many messages the bucket held), or why not.
pub(crate) type StateOpened = Result<Result<(Watch, u64), Bounded>, JoinError>;
/// The fire-state stream's message count and last sequence, or why not.
pub(crate) type TargetRead = Result<Result<(u64, u64), Bounded>, JoinError>;

/// What one of the watches delivered.
pub(crate) enum Followed {
    Tasks(TaskBatch),
    State(StateBatch),
    /// JetStream answers again after an outage: re-open the tasks watch.
    JetStreamBack,
    /// A tasks feed being opened is open, or failed to open.
    Opened(Opened),
    /// The fire-state watch being opened is open, or failed to open; `term`: the term whose
    /// wait for the fire state it was opened in, if any.
    StateOpened {
        opened: Box<StateOpened>,
        term: Option<u64>,
    },
    /// The fire-state stream's end, read for the wait of `term`.
    StateTarget {
        read: TargetRead,
        term: Option<u64>,
    },
}

/// When the watches are re-opened (`None`: open, or not followed yet).
pub(crate) struct Retry {
    pub(crate) tasks: Option<Instant>,
    pub(crate) state: Option<Instant>,
}

/// The two watches and what the replica learnt from them.
pub(crate) struct Follow {
    feed: Option<Feed>,
    /// The tasks feed being opened, in a task of its own: a JetStream that does not answer
    /// (each request waits out its timeout) never stalls the loop.
    opening: Option<JoinHandle<Result<(Feed, u64), Bounded>>>,
    /// How long the next opening of the tasks watch may take (doubled after each timeout).
    feed_timeout: Duration,
    feed_retry_at: Option<Instant>,
    /// The initial load of the tasks bucket is complete.
    loaded: bool,
    load_started: Instant,
    state: Option<Watch>,
    state_retry_at: Option<Instant>,
    /// The fire-state watch being opened, in a task of its own (the term it is opened for).
    state_opening: Option<Request<(Watch, u64)>>,
    /// The fire-state stream's end being read for a new leader (the term it is read for).
    target_reading: Option<Request<(u64, u64)>>,
    /// How long the next fire-state request may take (doubled after each timeout in a row).
    state_timeout: Duration,
    /// Highest stream sequence (entry revision) the fire-state watch delivered.
    seen: u64,
    /// Fire states of keys not (yet) in the task table: last nominal fire (ms) and fire count.
    orphans: HashMap<Box<str>, (i64, u64)>,
    /// The table the tasks feed encodes spec JSON against (the task table's).
    specs: Arc<Specs>,
    /// Changes each time JetStream answers again after an outage.
    returns: watch::Receiver<u64>,
}

impl Follow {
    /// Follows `feed` (opened with `specs`); `loaded` when the tasks bucket was empty when it
    /// was opened; `returns` changes each time JetStream answers again after an outage.
    pub(crate) fn new(feed: Feed, loaded: bool, specs: Arc<Specs>, returns: watch::Receiver<u64>) -> Follow {
        Follow {
            feed: Some(feed),
            opening: None,
            feed_timeout: REQUEST_TIMEOUT,
            feed_retry_at: None,
            loaded,
            load_started: Instant::now(),
            state: None,
            state_retry_at: None,
            state_opening: None,
            target_reading: None,
            state_timeout: REQUEST_TIMEOUT,
            seen: 0,
            orphans: HashMap::new(),
            specs,
            returns,
        }
    }

    pub(crate) fn loaded(&self) -> bool {
        self.loaded
    }

    /// Marks the initial load complete; returns how long it took the first time, else `None`.
    pub(crate) fn finish_load(&mut self) -> Option<Duration> {
        if self.loaded {
            return None;
        }
        self.loaded = true;
        Some(self.load_started.elapsed())
    }

    pub(crate) fn seen(&self) -> u64 {
        self.seen
    }

    /// The fire-state watch is open, or being opened.
    pub(crate) fn is_following_state(&self) -> bool {
        self.state.is_some() || self.state_opening.is_some()
    }

    /// JetStream's return first, then the next batch of either watch, the tasks first
    /// (pending while both are closed).
    pub(crate) async fn next(&mut self) -> Followed {
        let back = async {
            // Without a sender (the readiness probe gone), JetStream's return is never told.
            if self.returns.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let tasks = async {
            match self.feed.as_mut() {
                Some(feed) => feed.recv().await,
                None => std::future::pending().await,
            }
        };
        let state = async {
            match self.state.as_mut() {
                Some(watch) => watch.next().await,
                None => std::future::pending().await,
            }
        };
        let opened = async {
            match self.opening.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        let state_opened = async {
            match self.state_opening.as_mut() {
                Some(request) => ((&mut request.task).await, request.term),
                None => std::future::pending().await,
            }
        };
        let target = async {
            match self.target_reading.as_mut() {
                Some(request) => ((&mut request.task).await, request.term),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = back => Followed::JetStreamBack,
            (read, term) = target => Followed::StateTarget { read, term },
            (opened, term) = state_opened => Followed::StateOpened { opened: Box::new(opened), term },
            opened = opened => Followed::Opened(opened),
            batch = tasks => Followed::Tasks(batch),
            batch = state => Followed::State(batch),
        }
    }

    /// When each watch is re-opened.
    pub(crate) fn retry_at(&self) -> Retry {
        Retry { tasks: self.feed_retry_at, state: self.state_retry_at }
    }

    /// The tasks feed ended: re-open it after a pause.
    pub(crate) fn feed_ended(&mut self) {
        self.feed = None;
        self.feed_retry_at = Some(Instant::now() + FEED_RETRY);
    }

    /// Starts re-opening the tasks feed, dropping the current one and any being opened (an
    /// open under way may wait on a request JetStream will never answer); every task comes
    /// again through the fresh one. [`Follow::opened`] takes the outcome.
    pub(crate) fn reopen_feed(&mut self, tasks: &kv::Store) {
        self.feed = None;
        self.feed_retry_at = None;
        if let Some(task) = self.opening.take() {
            task.abort();
        }
        let (tasks, specs, limit) = (tasks.clone(), self.specs.clone(), self.feed_timeout);
        self.opening = Some(tokio::spawn(async move {
            bounded(limit, "open the tasks watch", discovery::open_tasks(&tasks, specs)).await
        }));
    }

    /// The tasks feed being opened is open (or failed: tried again later); true when the load
    /// is complete by that alone (an empty bucket).
    pub(crate) fn opened(&mut self, opened: Opened) -> bool {
        self.opening = None;
        match settle(&mut self.feed_timeout, opened) {
            Ok((feed, messages)) => {
                self.feed = Some(feed);
                messages == 0
            }
            Err(error) => {
                tracing::warn!(error, "cannot re-open the tasks watch");
                self.feed_retry_at = Some(Instant::now() + FEED_REOPEN_RETRY);
                false
            }
        }
    }

    /// Starts opening the fire-state watch (all keys, then updates) in a task of its own,
    /// dropping the current one and any being opened; `term`: the term whose wait for the fire
    /// state it is opened in, if any. [`Follow::state_opened`] takes the outcome.
    pub(crate) fn open_state(&mut self, state: &kv::Store, term: Option<u64>) {
        self.state = None;
        self.state_retry_at = None;
        if let Some(request) = self.state_opening.take() {
            request.task.abort();
        }
        let (state, limit) = (state.clone(), self.state_timeout);
        let task = tokio::spawn(async move {
            bounded(limit, "open the fire-state watch", discovery::open(&state)).await
        });
        self.state_opening = Some(Request { task, term });
    }

    /// The fire-state watch being opened is open: returns how many messages the bucket held
    /// (`None`: not opened, tried again after a pause).
    pub(crate) fn state_opened(&mut self, opened: StateOpened) -> Option<u64> {
        self.state_opening = None;
        match settle(&mut self.state_timeout, opened) {
            Ok((watch, messages)) => {
                self.state = Some(watch);
                Some(messages)
            }
            Err(error) => {
                tracing::warn!(error, "cannot watch the fire state; retrying");
                self.state_retry_at = Some(Instant::now() + STATE_RETRY_DELAY);
                None
            }
        }
    }

    /// Starts reading the fire-state stream's message count and last sequence for the wait of
    /// `term`, in a task of its own (replacing a read under way).
    pub(crate) fn read_state_target(&mut self, state: &kv::Store, term: u64) {
        if let Some(request) = self.target_reading.take() {
            request.task.abort();
        }
        let (mut stream, limit) = (state.stream.clone(), self.state_timeout);
        let task = tokio::spawn(async move {
            bounded(limit, "read the fire-state stream's info", async {
                let info = stream.info().await.context("read the fire-state stream info")?;
                Ok((info.state.messages, info.state.last_sequence))
            })
            .await
        });
        self.target_reading = Some(Request { task, term: Some(term) });
    }

    /// The fire-state stream's end was read (or not: the error).
    pub(crate) fn target_read(&mut self, read: TargetRead) -> Result<(u64, u64), String> {
        self.target_reading = None;
        settle(&mut self.state_timeout, read)
    }

    /// Whether the fire-state stream's end is being read.
    pub(crate) fn is_reading_target(&self) -> bool {
        self.target_reading.is_some()
    }

    /// Whether the fire-state watch is being opened.
    pub(crate) fn is_opening_state(&self) -> bool {
        self.state_opening.is_some()
    }

    /// JetStream answers again: the next requests get the first limit.
    pub(crate) fn reset_timeouts(&mut self) {
        self.state_timeout = REQUEST_TIMEOUT;
        self.feed_timeout = REQUEST_TIMEOUT;
    }

    /// A read of the fire-state stream's end under way (which may wait on a stream that did
    /// not answer) is dropped; returns the term it was read for.
    pub(crate) fn drop_target_read(&mut self) -> Option<u64> {
        self.target_reading.take().and_then(|request| {
            request.task.abort();
            request.term
        })
    }

    /// The fire-state watch ended: re-open it after a pause.
    pub(crate) fn state_ended(&mut self) {
        self.state = None;
        self.state_retry_at = Some(Instant::now() + STATE_RETRY_DELAY);
    }

    /// Drops the fire-state watch (to read the whole state again through a fresh one).
    pub(crate) fn close_state(&mut self) {
        self.state = None;
    }

    /// An entry of the fire-state watch was delivered.
    pub(crate) fn saw(&mut self, revision: u64) {
        self.seen = self.seen.max(revision);
    }

    /// Keeps the fire state of a key that is not (yet) a task.
    pub(crate) fn keep_orphan(&mut self, key: String, state: (i64, u64)) {
        self.orphans.insert(key.into_boxed_str(), state);
    }

    /// Forgets the fire state of a key that is not a task (deleted).
    pub(crate) fn forget_orphan(&mut self, key: &str) {
        if !self.orphans.is_empty() {
            self.orphans.remove(key);
        }
    }

    /// The fire state kept for a key that just became a task.
    pub(crate) fn adopt_orphan(&mut self, key: &str) -> Option<(i64, u64)> {
        match self.orphans.is_empty() {
            true => None,
            false => self.orphans.remove(key),
        }
    }
}

/// A fire-state request under way in a task of its own, for the wait of `term` (if any).
struct Request<T> {
    task: JoinHandle<Result<T, Bounded>>,
    term: Option<u64>,
}

/// Why a bounded request gave no answer.
pub(crate) enum Bounded {
    /// No answer within the limit.
    TimedOut(String),
    Failed(anyhow::Error),
}

/// The outcome of a bounded request's task: a timeout doubles the next one's `limit`, an
/// answer resets it.
fn settle<T>(limit: &mut Duration, done: Result<Result<T, Bounded>, JoinError>) -> Result<T, String> {
    match done {
        Ok(Ok(value)) => {
            *limit = REQUEST_TIMEOUT;
            Ok(value)
        }
        Ok(Err(Bounded::TimedOut(error))) => {
            *limit = (*limit * 2).min(REQUEST_TIMEOUT_MAX);
            Err(error)
        }
        Ok(Err(Bounded::Failed(error))) => Err(format!("{error:#}")),
        Err(error) => Err(error.to_string()),
    }
}

/// `request` (`what` it does), given up after `limit`.
async fn bounded<T>(
    limit: Duration,
    what: &str,
    request: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, Bounded> {
    match tokio::time::timeout(limit, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(Bounded::Failed(error)),
        Err(_) => Err(Bounded::TimedOut(format!("no answer within {} ms to {what}", limit.as_millis()))),
    }
}
