//! The backfill driver: while this replica holds the lease, it follows the backfills bucket and
//! dispatches each running backfill in bounded batches, from the cursor stored in its progress
//! record ([`jetsched_shared::backfill::progress`]).
//!
//! A batch is written ahead (`pending`) with compare-and-set before its first dispatch and
//! committed once every dispatch is acknowledged, so a new leader after a crash plans the same
//! batch again: its dispatches carry the same derived ids (absorbed by the dispatch stream's
//! de-duplication, or recognised by the worker from the run record), nothing is missed and
//! nothing runs twice. Whether a time has a run is read from the run records, not from the
//! duplicate window, so times far older than the window are handled exactly once too.
//!
//! The driver is a task of its own beside the dispatch loop: the live schedule's fires never
//! wait for it. A batch is at most `--backfill-batch` times, at most `--backfill-in-flight` of
//! its publishes await their acknowledgement at once, and between batches the driver yields.
//! Its publishes and its reads of run records go over a connection of its own, so the live
//! fires' publishes never queue behind them on one socket. Every publish is fenced like the
//! loop's: none after the local lease deadline. While a backfill waits for its runs in flight
//! (`max_active`), it looks at their run records again after [`RUNS_RECHECK`]. Run records are
//! read in batches of latest values (one request per 256 execution ids).

use std::collections::{BTreeSet, HashMap};
use std::future::IntoFuture;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, kv};
use chrono::Utc;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use jetsched_shared::backfill::progress::{BackfillProgress, BackfillState, Batch};
use jetsched_shared::backfill::{BackfillOverlap, Decision};
use jetsched_shared::calendar::{Calendars, Fate, fate_of, schedule_zone};
use jetsched_shared::cas::{is_revision_mismatch, live};
use jetsched_shared::direct_batch::latest_values;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::events::EventSink;
use jetsched_shared::names::{self, Names};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{Event, EventKind, FireState, RunStatus};
use serde::Deserialize;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::calendars::CalendarView;
use crate::takeover::LeaseWatch;

/// How soon a backfill waiting for its runs in flight reads their records again.
pub(crate) const RUNS_RECHECK: Duration = Duration::from_millis(500);
/// The acknowledgement of one backfill publish.
type Stored = futures::future::BoxFuture<
    'static,
    Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
>;
/// How soon the driver tries again after NATS failed it.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// `backfill.progress` is told at most this often per backfill.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Compare-and-set rounds when committing a batch over a concurrent change (a cancel).
const COMMIT_ROUNDS: usize = 8;

/// What one step of a backfill came to.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A batch was dispatched (or the record changed meanwhile): step again soon.
    Progressed,
    /// Waiting for runs in flight, or for the lease: look again after a while.
    Waiting,
    /// Nothing left to do (ended, or gone).
    Ended,
}

/// The NATS handles and settings of the driver.
pub(crate) struct Driver {
    pub(crate) names: Names,
    pub(crate) js: jetstream::Context,
    pub(crate) tasks: kv::Store,
    pub(crate) runs: kv::Store,
    /// The scheduler's fire states: the live schedule's latest run, for an `overlap` other
    /// than `allow`.
    pub(crate) state: kv::Store,
    pub(crate) backfills: kv::Store,
    pub(crate) events: EventSink,
    pub(crate) lease: LeaseWatch,
    /// Every namespace's business calendars: a time they keep from running on its own is not
    /// dispatched.
    pub(crate) calendars: CalendarView,
    /// Nominal times per batch.
    pub(crate) batch: usize,
    /// Publishes awaiting their acknowledgement at once.
    pub(crate) in_flight: usize,
}

/// The run-record field a backfill reads.
#[derive(Deserialize)]
struct Status {
    status: RunStatus,
}

impl Driver {
    /// Dispatches running backfills while leader, until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut running = BTreeSet::new();
        let mut told: HashMap<String, Instant> = HashMap::new();
        let mut watch: Option<kv::Watch> = None;
        loop {
            if self.lease.borrow().is_none() {
                watch = None;
                running.clear();
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    changed = self.lease.changed() => if changed.is_err() { return },
                }
                continue;
            }
            let Some(entries) = watch.as_mut() else {
                match self.backfills.watch_with_history(">").await {
                    Ok(opened) => watch = Some(opened),
                    Err(error) => {
                        tracing::warn!(%error, "cannot follow the backfills bucket; retrying");
                        sleep(RETRY_DELAY).await;
                    }
                }
                continue;
            };
            // Whatever the watch holds already: no wait.
            while let Some(Some(entry)) = futures::FutureExt::now_or_never(entries.next()) {
                note(&mut running, entry);
            }
            let (mut progressed, mut waiting) = (false, false);
            for key in running.clone() {
                if shutdown.is_cancelled() {
                    return;
                }
                match self.step(&key, &mut told).await {
                    Ok(Step::Progressed) => progressed = true,
                    Ok(Step::Waiting) => waiting = true,
                    Ok(Step::Ended) => {
                        running.remove(&key);
                        told.remove(&key);
                    }
                    Err(error) => {
                        tracing::warn!(error = format!("{error:#}"), backfill = %key, "backfill step failed; retrying");
                        waiting = true;
                    }
                }
            }
            if progressed {
                // Between batches, the rest of the process (the live schedule's fires) goes first.
                tokio::task::yield_now().await;
                continue;
            }
            let recheck = waiting.then_some(RUNS_RECHECK);
            let closed = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                changed = self.lease.changed() => if changed.is_err() { return } else { false },
                entry = entries.next() => match entry {
                    Some(entry) => { note(&mut running, entry); false }
                    None => true,
                },
                () = sleep_opt(recheck) => false,
            };
            if closed {
                watch = None;
            }
        }
    }

    /// One batch of backfill `key`, if it has one to dispatch.
    async fn step(&self, key: &str, told: &mut HashMap<String, Instant>) -> anyhow::Result<Step> {
        let Some((mut progress, revision)) = self.read(key).await? else { return Ok(Step::Ended) };
        if progress.state != BackfillState::Running && progress.pending.is_none() {
            return Ok(Step::Ended);
        }
        let Some((spec, spec_json, spec_revision)) = self.spec(&progress).await? else {
            // The task is gone: nothing more can run for it.
            progress.commit(Utc::now());
            progress.cancel(Utc::now());
            if self.write(key, &progress, revision).await?.is_some() {
                tracing::warn!(backfill = %key, "the task was deleted; backfill cancelled");
                self.tell(EventKind::BackfillCancelled, &progress, Some("task deleted"));
            }
            return Ok(Step::Progressed);
        };
        let mut in_flight = 0;
        let before = progress.active.len();
        if progress.pending.is_none() && !progress.active.is_empty() {
            let ended = self.statuses(progress.active.clone()).await?;
            in_flight =
                progress.settle(|id| ended.get(id).is_some_and(|s| s.is_some_and(RunStatus::is_final)));
        }
        let times = progress.upcoming(&spec.schedule, self.batch);
        let ids: Vec<String> = times
            .iter()
            .map(|t| {
                jetsched_shared::backfill::ids(
                    &progress.namespace,
                    &progress.task_id,
                    t.at.timestamp_millis(),
                    None,
                )
                .1
            })
            .collect();
        let statuses = self.statuses(ids.clone()).await?;
        let by_time: HashMap<i64, RunStatus> = times
            .iter()
            .zip(&ids)
            .filter_map(|(t, id)| statuses.get(id).copied().flatten().map(|s| (t.at.timestamp_millis(), s)))
            .collect();
        let book = self.calendars.borrow().clone();
        let none = Calendars::default();
        let calendars = book.get(&progress.namespace).unwrap_or(&none);
        let zone = schedule_zone(&spec.schedule);
        let left_out =
            |at| !matches!(fate_of(&spec.schedule, zone, &spec.calendars, calendars, at), Fate::Runs { .. });
        let live_going = progress.pending.is_none()
            && progress.request.overlap != BackfillOverlap::Allow
            && self.live_going(&progress).await?;
        let batch = progress.plan(
            &spec.schedule,
            |at| by_time.get(&at.timestamp_millis()).copied(),
            left_out,
            in_flight,
            live_going,
            self.batch,
        );
        if batch.items.is_empty() && progress.pending.is_none() {
            // Every slot is taken by a run in flight.
            if progress.active.len() != before {
                self.write(key, &progress, revision).await?;
            }
            return Ok(Step::Waiting);
        }
        progress.begin(&batch);
        let Some(revision) = self.write(key, &progress, revision).await? else {
            return Ok(Step::Progressed); // changed meanwhile (cancelled?): read it again
        };
        if !self.dispatch(&progress, &batch, &spec, &spec_json, spec_revision).await? {
            return Ok(Step::Waiting); // fenced: the pending batch is dispatched again later
        }
        let committed = self.commit(key, progress, revision).await?;
        self.report(&committed, told);
        Ok(Step::Progressed)
    }

    /// Publishes the batch's dispatches (skips aside), every ack awaited; `false` when the
    /// lease deadline stopped it.
    async fn dispatch(
        &self,
        progress: &BackfillProgress,
        batch: &Batch,
        spec: &TaskSpec,
        spec_json: &[u8],
        revision: u64,
    ) -> anyhow::Result<bool> {
        let target = Target::of(spec, revision);
        let mut acks: FuturesUnordered<Stored> = FuturesUnordered::new();
        for planned in batch.items.iter().filter(|p| p.decision.starts_run()) {
            // At most `in_flight` ahead of the live schedule's fires in the stream.
            while acks.len() >= self.in_flight {
                if let Some(stored) = acks.next().await {
                    stored.context("a backfill dispatch was not stored")?;
                }
            }
            let Some(held) = *self.lease.borrow() else { return Ok(false) };
            if Instant::now() >= held.valid_until {
                return Ok(false);
            }
            let rerun_by = (planned.decision == Decision::Rerun).then_some(progress.id.as_str());
            let origin = Origin::Backfill {
                nominal_ms: planned.time.at.timestamp_millis(),
                term: held.term,
                rerun_by,
            };
            let message = dispatch::build(&self.names, target, origin, SpecBody::Json(spec_json))
                .context("encode a backfill dispatch")?;
            let ack = self
                .js
                .send_publish(message.subject, message.message)
                .await
                .context("publish a backfill dispatch")?;
            acks.push(Box::pin(ack.into_future()));
        }
        while let Some(stored) = acks.next().await {
            stored.context("a backfill dispatch was not stored")?;
        }
        Ok(true)
    }

    /// Commits the pending batch; over a concurrent change (a cancel), into the record as it is
    /// now. Returns the record as stored.
    async fn commit(
        &self,
        key: &str,
        mut progress: BackfillProgress,
        mut revision: u64,
    ) -> anyhow::Result<BackfillProgress> {
        for _ in 0..COMMIT_ROUNDS {
            progress.commit(Utc::now());
            if self.write(key, &progress, revision).await?.is_some() {
                return Ok(progress);
            }
            let Some((fresh, fresh_revision)) = self.read(key).await? else { return Ok(progress) };
            (progress, revision) = (fresh, fresh_revision);
        }
        anyhow::bail!("backfill {key} kept changing while its batch was committed")
    }

    /// Events after a committed batch: `backfill.finished` at the end, `backfill.progress` at
    /// most every [`PROGRESS_EVERY`].
    fn report(&self, progress: &BackfillProgress, told: &mut HashMap<String, Instant>) {
        if progress.state == BackfillState::Finished {
            self.tell(EventKind::BackfillFinished, progress, None);
            return;
        }
        let now = Instant::now();
        let due = told.get(&progress.id).is_none_or(|last| now.duration_since(*last) >= PROGRESS_EVERY);
        if due && progress.state == BackfillState::Running {
            told.insert(progress.id.clone(), now);
            self.tell(EventKind::BackfillProgress, progress, None);
        }
    }

    fn tell(&self, kind: EventKind, progress: &BackfillProgress, reason: Option<&str>) {
        let term = self.lease.borrow().map(|held| held.term);
        let event = Event {
            backfill: Some(progress.summary()),
            reason: reason.map(str::to_string),
            term,
            ..Event::new(kind, &progress.namespace, &progress.task_id)
        };
        let _queued = self.events.try_emit(event);
    }

    async fn read(&self, key: &str) -> anyhow::Result<Option<(BackfillProgress, u64)>> {
        let Some(entry) = live(self.backfills.entry(key).await.context("read a backfill")?) else {
            return Ok(None);
        };
        match serde_json::from_slice(&entry.value) {
            Ok(progress) => Ok(Some((progress, entry.revision))),
            Err(error) => {
                tracing::error!(%error, backfill = %key, "unreadable backfill record; left alone");
                Ok(None)
            }
        }
    }

    /// Writes `progress` over `revision`: the new revision, or `None` when it changed meanwhile.
    async fn write(
        &self,
        key: &str,
        progress: &BackfillProgress,
        revision: u64,
    ) -> anyhow::Result<Option<u64>> {
        let bytes = serde_json::to_vec(progress).context("encode a backfill")?;
        match self.backfills.update(key, bytes.into(), revision).await {
            Ok(revision) => Ok(Some(revision)),
            Err(error) if is_revision_mismatch(&error) => Ok(None),
            Err(error) => Err(error).context("write a backfill"),
        }
    }

    /// The task's spec, its stored JSON and its revision; `None` once the task is deleted.
    async fn spec(
        &self,
        progress: &BackfillProgress,
    ) -> anyhow::Result<Option<(TaskSpec, bytes::Bytes, u64)>> {
        let key = names::task_key(&progress.namespace, &progress.task_id);
        let Some(entry) = live(self.tasks.entry(key).await.context("read the task")?) else {
            return Ok(None);
        };
        let spec =
            TaskSpec::parse(&entry.value).map_err(|errors| anyhow::anyhow!("stored spec: {errors:?}"))?;
        Ok(Some((spec, entry.value, entry.revision)))
    }

    /// Whether the live schedule's latest run of the backfill's task is going: its execution
    /// id as the scheduler's fire state last stored it, and its run record not final (a run
    /// still queued has no record yet and is not seen).
    async fn live_going(&self, progress: &BackfillProgress) -> anyhow::Result<bool> {
        let key = names::task_key(&progress.namespace, &progress.task_id);
        let Some(value) = self.state.get(&key).await.context("read the task's fire state")? else {
            return Ok(false);
        };
        let Some(execution_id) =
            serde_json::from_slice::<FireState>(&value).ok().and_then(|fire| fire.last_execution_id)
        else {
            return Ok(false);
        };
        let statuses = self.statuses(vec![execution_id]).await?;
        Ok(statuses.into_values().flatten().any(|status| !status.is_final()))
    }

    /// The run status of each execution id (`None`: no record), read in batches of latest
    /// values (one request per 256 ids).
    async fn statuses(&self, ids: Vec<String>) -> anyhow::Result<HashMap<String, Option<RunStatus>>> {
        let found =
            latest_values(&self.js.client(), &self.runs.name, &ids).await.context("read run records")?;
        Ok(ids
            .into_iter()
            .map(|id| {
                let status = found.get(&id).and_then(|bytes| serde_json::from_slice::<Status>(bytes).ok());
                (id, status.map(|s| s.status))
            })
            .collect())
    }
}

/// Keeps the set of backfills with work left up to date from one watched entry.
fn note(running: &mut BTreeSet<String>, entry: Result<kv::Entry, kv::WatcherError>) {
    let entry = match entry {
        Ok(entry) => entry,
        Err(error) => {
            tracing::warn!(%error, "backfills watch");
            return;
        }
    };
    let open = entry.operation == kv::Operation::Put
        && serde_json::from_slice::<BackfillProgress>(&entry.value)
            .is_ok_and(|p| p.state == BackfillState::Running || p.pending.is_some());
    if open {
        running.insert(entry.key);
    } else {
        running.remove(&entry.key);
    }
}

async fn sleep_opt(after: Option<Duration>) {
    match after {
        Some(after) => sleep(after).await,
        None => std::future::pending().await,
    }
}
