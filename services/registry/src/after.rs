//! Dependencies between tasks: a child (a task with `after`) runs when its parents' runs of
//! one nominal time end as its rule says, exactly once per nominal time.
//!
//! The parents' verdicts are their run records: a worker writes a run's final record before it
//! acknowledges the run, so a durable consumer of the runs bucket's stream (shared by every
//! registry replica, created once the first child exists, delivering only records written
//! after it) hears of every verdict at least once. A verdict is merged into the child's wait
//! for its nominal time (`JETSCHED_WAITS[<ns>.<id>.<ms>]`, compare-and-set), and when the rule
//! holds the child is dispatched with an execution id derived from the child and the nominal
//! time and a message id derived from that, then the wait is marked dispatched. A replica that
//! dies anywhere on the way leaves the record unacknowledged: redelivered, it is merged again
//! (no change), and the dispatch is sent again, stored once by the dispatch stream's
//! de-duplication and, past its window, recognised by the worker through the run's record.
//!
//! A wait that does not end at once gets its deadline (`within`) as a server-scheduled message;
//! when it comes, a wait still waiting ends `expired` with an `after.expired` event.

mod deadlines;
mod fires;
mod graph;
mod reads;
mod rule;

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::{self as consumer, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::{self, kv};
use chrono::Utc;
use futures::StreamExt;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::events::{EventPublisher, EventSink};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{Event, EventKind, ParentRun, RunRecord, Trigger, Wait, WaitState};
use tokio_util::sync::CancellationToken;

use self::graph::CatchUp;
pub(crate) use self::graph::{Child, Graph};
use self::rule::{Arrival, Decision, concerns, decide_held, is_verdict, merge_arrival, new_wait};
use crate::pull::{self, Verdict};

/// Verdicts pulled at a time.
const BATCH: usize = 64;
/// Children of one verdict handled at once.
const CHILDREN_AT_ONCE: usize = 32;
/// Compare-and-set attempts on one wait before the verdict is handed back for later.
const CAS_ATTEMPTS: usize = 20;

/// The dependency engine of one registry replica.
#[derive(Clone)]
pub(crate) struct After {
    js: jetstream::Context,
    names: Names,
    graph: Graph,
    waits: kv::Store,
    /// Run records: the status of a child's last run.
    runs: kv::Store,
    /// Backfills: a parent's backfilled runs chain unless their backfill says not to.
    backfills: kv::Store,
    events: EventSink,
    publisher: EventPublisher,
}

/// A wait read with its revision (0: not stored yet).
struct Held {
    wait: Wait,
    revision: u64,
}

/// The buckets the engine reads and writes besides the tasks.
pub(crate) struct Buckets {
    pub(crate) waits: kv::Store,
    pub(crate) runs: kv::Store,
    pub(crate) backfills: kv::Store,
}

impl After {
    /// The engine of `graph` (filled by the tasks bucket's feed).
    pub(crate) fn new(
        js: jetstream::Context,
        names: Names,
        Buckets { waits, runs, backfills }: Buckets,
        events: EventSink,
        publisher: EventPublisher,
        graph: Graph,
    ) -> After {
        After { js, names, graph, waits, runs, backfills, events, publisher }
    }

    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The durable consumer of verdicts: created (idempotently) when a child is stored, so
    /// every parent's run that ends after the child's `put` answered is heard of. It starts
    /// at a fixed sequence, the stream's next one when it is created (not `DeliverPolicy::New`:
    /// a consumer a restarted server recovers without its state would start anew at the
    /// stream's end then, past verdicts not handled yet; from a fixed start it handles some
    /// again, which changes nothing).
    pub(crate) async fn ensure_verdicts_consumer(&self) -> anyhow::Result<PullConsumer> {
        if let Some(consumer) = self.existing_verdicts_consumer().await {
            return Ok(consumer);
        }
        let runs = self.names.runs_bucket();
        let stream = Names::kv_stream(&runs);
        let mut handle =
            self.js.get_stream(&stream).await.with_context(|| format!("open stream {stream}"))?;
        let next =
            handle.info().await.with_context(|| format!("read stream {stream}"))?.state.last_sequence + 1;
        handle
            .get_or_create_consumer(
                self.names.after_verdicts_consumer(),
                consumer::pull::Config {
                    durable_name: Some(self.names.after_verdicts_consumer().to_string()),
                    description: Some("jetsched registry: parents' verdicts for tasks with after".into()),
                    filter_subject: Names::kv_subject(&runs, ">"),
                    deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: next },
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: pull::ACK_WAIT,
                    max_ack_pending: 1000,
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("ensure consumer {} on {stream}", self.names.after_verdicts_consumer()))
    }

    /// Once the graph is loaded and a child exists, consumes verdicts, deadlines and held fires
    /// until `shutdown`.
    pub(crate) async fn run(self, tasks: kv::Store, shutdown: CancellationToken) {
        // No verdict is taken before every child stored is known.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.graph.loaded() => {}
        }
        // A consumer left by an earlier start is taken up at once; otherwise the first child.
        let verdicts = loop {
            let existing = self.existing_verdicts_consumer().await;
            if existing.is_some() || self.graph.has_children() {
                match existing {
                    Some(consumer) => break consumer,
                    None => match self.ensure_verdicts_consumer().await {
                        Ok(consumer) => break consumer,
                        Err(error) => tracing::warn!(error = format!("{error:#}"), "verdicts consumer"),
                    },
                }
            }
            // Without children, until the first appears (or another replica made the consumer);
            // with children (the consumer could not be made), again shortly.
            let waiting = !self.graph.has_children();
            let pause = if waiting { Duration::from_secs(30) } else { Duration::from_secs(1) };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.graph.children_appeared(), if waiting => {}
                _ = tokio::time::sleep(pause) => {}
            }
        };
        let (deadlines, fires) = loop {
            let made = async {
                Ok::<_, anyhow::Error>((self.deadlines_consumer().await?, self.fires_consumer().await?))
            };
            match made.await {
                Ok(consumers) => break consumers,
                Err(error) => {
                    tracing::warn!(error = format!("{error:#}"), "deadlines and held fires consumers")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        };
        tracing::info!("dependencies: consuming parents' verdicts");
        let fires =
            pull::run(fires, "held fire", BATCH, Fires(self.clone(), tasks.clone()), shutdown.clone());
        let verdicts = pull::run(
            verdicts,
            "parent verdict",
            BATCH,
            Verdicts(self.clone(), CatchUp::new(tasks, self.runs.clone())),
            shutdown.clone(),
        );
        let deadlines = pull::run(deadlines, "wait deadline", 8, Deadlines(self.clone()), shutdown.clone());
        let (verdicts, deadlines, fires) = tokio::join!(verdicts, deadlines, fires);
        for (what, ended) in [("verdicts", verdicts), ("deadlines", deadlines), ("held fires", fires)] {
            if let Err(error) = ended {
                tracing::warn!(error = format!("{error:#}"), "{what} consumer stopped");
            }
        }
    }

    async fn existing_verdicts_consumer(&self) -> Option<PullConsumer> {
        let stream = Names::kv_stream(&self.names.runs_bucket());
        let handle = self.js.get_stream_no_info(&stream).await.ok()?;
        handle.get_consumer(self.names.after_verdicts_consumer()).await.ok()
    }

    async fn deadlines_consumer(&self) -> anyhow::Result<PullConsumer> {
        pull::consumer(
            &self.js,
            &self.names.after_stream(),
            self.names.after_deadlines_consumer(),
            "jetsched registry: deadlines of children's waits",
            self.names.after_due_wildcard(),
        )
        .await
    }

    async fn fires_consumer(&self) -> anyhow::Result<PullConsumer> {
        pull::consumer(
            &self.js,
            &self.names.after_stream(),
            self.names.after_fires_consumer(),
            "jetsched registry: fires of tasks with after and a schedule",
            self.names.after_fire_wildcard(),
        )
        .await
    }

    /// A parent's run record: every child it may start hears of it. `Err`: try again later.
    async fn verdict(&self, record: &RunRecord, redelivered: bool) -> anyhow::Result<()> {
        if !is_verdict(record.status) {
            return Ok(());
        }
        let mut children = self.graph.children_of(&graph::parent_key(&record.namespace, &record.task_id));
        children.retain(|child| concerns(&child.spec, record.nominal_time));
        if children.is_empty() {
            return Ok(());
        }
        if record.trigger == Trigger::Backfill
            && self.unchained(&record.namespace, &record.task_id, record.nominal_time).await?
        {
            tracing::debug!(execution = %record.execution_id, "a backfilled run that does not chain");
            return Ok(());
        }
        let run = ParentRun {
            task: format!("{}/{}", record.namespace, record.task_id),
            execution_id: record.execution_id.clone(),
            status: record.status,
            finished: record.finished,
            result: record.result.clone(),
            result_omitted: false,
        };
        let nominal_ms = record.nominal_time.timestamp_millis();
        let offers = futures::stream::iter(children)
            .map(|child| {
                let run = Arrival::Verdict(run.clone());
                async move { self.offer(&child, nominal_ms, run, redelivered).await }
            })
            .buffer_unordered(CHILDREN_AT_ONCE);
        let results: Vec<anyhow::Result<()>> = offers.collect().await;
        results.into_iter().collect()
    }

    /// Merges a parent's run (or the child's own fire) into `child`'s wait for `nominal_ms`
    /// and acts on what the wait says: dispatch, keep waiting (with its deadline), or end.
    async fn offer(
        &self,
        child: &Child,
        nominal_ms: i64,
        arrival: Arrival,
        redelivered: bool,
    ) -> anyhow::Result<()> {
        let spec = &child.spec;
        let Some(after) = &spec.after else { return Ok(()) };
        let held = spec.holds_fires_for_parents();
        let key = Names::wait_key(&spec.namespace, &spec.id, nominal_ms);
        for _ in 0..CAS_ATTEMPTS {
            let Held { mut wait, revision } = match self.read(&key).await? {
                Some(held) => held,
                None => Held {
                    wait: new_wait(&spec.namespace, &spec.id, from_ms(nominal_ms), after, Utc::now(), held),
                    revision: 0,
                },
            };
            let over = matches!(wait.state, WaitState::Dispatched | WaitState::Expired | WaitState::Paused);
            if over {
                // A held fire that comes after its wait gave up (or was paused) does not run.
                if matches!(arrival, Arrival::Fire(_)) && wait.state != WaitState::Dispatched {
                    self.tell_fire_skipped(&wait).await?;
                }
                return Ok(());
            }
            let before = wait.state;
            let changed = merge_arrival(&mut wait, after, arrival.clone());
            let fire_came = changed && matches!(arrival, Arrival::Fire(_));
            if fire_came {
                // A child with a schedule waits `within` from its fire.
                wait.deadline = Utc::now()
                    + chrono::Duration::from_std(after.within).unwrap_or(chrono::Duration::days(7));
            }
            // Its waits begun by verdicts alone have no deadline: its fire may never come for
            // that time (bounds, a calendar), and no fire of it was missed then.
            let timed = !held || wait.fired.is_some();
            let decision = decide_held(&wait, after, held);
            if decision == Decision::Met {
                // Dispatched before the wait says so: a redelivery dispatches again (stored
                // once), a wait marked dispatched is never dispatched again.
                if spec.paused {
                    return self
                        .end(&key, wait, revision, WaitState::Paused, Some("the task is paused"))
                        .await;
                }
                if changed || revision == 0 {
                    // The verdict is kept first, so a wait written by another replica meanwhile
                    // is merged again rather than overwritten.
                    match self.write(&key, &wait, revision).await? {
                        Some(revision) => {
                            self.dispatch(child, &wait, nominal_ms).await?;
                            return self.end(&key, wait, revision, WaitState::Dispatched, None).await;
                        }
                        None => continue,
                    }
                }
                self.dispatch(child, &wait, nominal_ms).await?;
                return self.end(&key, wait, revision, WaitState::Dispatched, None).await;
            }
            let (state, reason) = match &decision {
                Decision::NotMet(reason) => (WaitState::NotMet, Some(reason.clone())),
                _ => (WaitState::Waiting, None),
            };
            if !changed && revision > 0 && wait.state == state {
                if state == WaitState::Waiting && redelivered && timed {
                    self.schedule_deadline(&wait, nominal_ms).await?;
                }
                return Ok(());
            }
            wait.state = state;
            wait.reason = reason;
            wait.ended = (state != WaitState::Waiting).then(Utc::now);
            match self.write(&key, &wait, revision).await? {
                Some(_) => {
                    // A wait begun now, or back on course after `not_met`, gets its deadline
                    // (a redelivery publishes it again: its replica may have died before).
                    let begun = revision == 0 || before != WaitState::Waiting || fire_came;
                    if state == WaitState::Waiting && timed && (begun || redelivered) {
                        self.schedule_deadline(&wait, nominal_ms).await?;
                    }
                    if state == WaitState::NotMet {
                        tracing::debug!(wait = %key, reason = wait.reason.as_deref().unwrap_or(""), "rule not met");
                        if wait.fired.is_some() {
                            self.tell_fire_skipped(&wait).await?;
                        }
                    }
                    return Ok(());
                }
                None => continue,
            }
        }
        anyhow::bail!("wait {key} is being changed concurrently")
    }

    /// Dispatches `child`'s run for `nominal_ms` with the parents' runs of `wait`.
    async fn dispatch(&self, child: &Child, wait: &Wait, nominal_ms: i64) -> anyhow::Result<()> {
        let spec: &TaskSpec = &child.spec;
        let parents: Vec<ParentRun> = spec
            .after
            .iter()
            .flat_map(|after| &after.tasks)
            .filter_map(|parent| wait.parents.get(&parent.to_string()).cloned())
            .collect();
        let origin = match wait.fired {
            Some(trigger) => Origin::Held { nominal_ms, trigger, parents: &parents },
            None => Origin::After { nominal_ms, parents: &parents },
        };
        let built = dispatch::build(
            &self.names,
            Target::of(spec, child.revision),
            origin,
            SpecBody::Json(&child.json),
        )
        .context("build the child's dispatch")?;
        let ack = self
            .js
            .send_publish(built.subject.clone(), built.message)
            .await
            .with_context(|| format!("publish the dispatch of {}", built.execution_id))?;
        let stored = ack.await.with_context(|| format!("store the dispatch of {}", built.execution_id))?;
        tracing::info!(
            task = %format!("{}/{}", spec.namespace, spec.id),
            execution = %built.execution_id,
            duplicate = stored.duplicate,
            "dispatched after its parents"
        );
        Ok(())
    }

    /// Ends a wait in `state` (when it is still the one read).
    async fn end(
        &self,
        key: &str,
        mut wait: Wait,
        revision: u64,
        state: WaitState,
        reason: Option<&str>,
    ) -> anyhow::Result<()> {
        wait.state = state;
        wait.reason = reason.map(str::to_string);
        wait.ended = Some(Utc::now());
        if self.write(key, &wait, revision).await?.is_none() {
            // Written meanwhile (a parent's later verdict, another replica that ended it):
            // what it says stands; the dispatch, if any, is stored once either way.
            tracing::debug!(wait = %key, "wait changed while ending it");
        }
        if state == WaitState::Paused {
            self.events
                .emit(Event {
                    execution_id: Some(wait.execution_id.clone()),
                    nominal_time: Some(wait.nominal_time),
                    trigger: Some(Trigger::After),
                    reason: Some("paused".to_string()),
                    ..Event::new(EventKind::FireSkipped, &wait.namespace, &wait.task_id)
                })
                .await;
        }
        Ok(())
    }
}

fn from_ms(ms: i64) -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or(chrono::DateTime::UNIX_EPOCH)
}

/// The verdicts consumer's handler: one run record at a time, each once the graph holds every
/// child stored before it.
struct Verdicts(After, CatchUp);

impl pull::Handler for Verdicts {
    async fn handle(&mut self, message: &jetstream::Message) -> Verdict {
        // Delete and purge markers of the runs bucket carry no record.
        if message.payload.is_empty() {
            return Verdict::Done;
        }
        let Ok(record) = serde_json::from_slice::<RunRecord>(&message.payload) else {
            tracing::warn!(subject = %message.subject, "a run record that does not decode; ignored");
            return Verdict::Done;
        };
        if !is_verdict(record.status) {
            return Verdict::Done;
        }
        let (sequence, behind) = message.info().map_or((0, 1), |info| (info.stream_sequence, info.pending));
        if let Err(error) = self.1.before(&self.0.graph, sequence, behind).await {
            tracing::warn!(error = format!("{error:#}"), execution = %record.execution_id, "verdict not handled; later");
            return Verdict::Retry;
        }
        let redelivered = message.info().is_ok_and(|info| info.delivered > 1);
        match self.0.verdict(&record, redelivered).await {
            Ok(()) => Verdict::Done,
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), execution = %record.execution_id, "verdict not handled; later");
                Verdict::Retry
            }
        }
    }
}

/// The deadlines consumer's handler.
struct Deadlines(After);

impl pull::Handler for Deadlines {
    async fn handle(&mut self, message: &jetstream::Message) -> Verdict {
        match self.0.deadline(&message.subject).await {
            Ok(()) => Verdict::Done,
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), subject = %message.subject, "deadline not handled; later");
                Verdict::Retry
            }
        }
    }
}

/// The held fires' consumer's handler, each once the graph holds every spec stored before it.
struct Fires(After, kv::Store);

impl pull::Handler for Fires {
    async fn handle(&mut self, message: &jetstream::Message) -> Verdict {
        let Ok(fire) = serde_json::from_slice::<jetsched_shared::wire::Dispatch<serde::de::IgnoredAny>>(
            &message.payload,
        ) else {
            tracing::warn!(subject = %message.subject, "a held fire that does not decode; ignored");
            return Verdict::Done;
        };
        let redelivered = message.info().is_ok_and(|info| info.delivered > 1);
        let handled = match self.0.graph.caught_up(&self.1).await {
            Ok(()) => self.0.fire(&fire, redelivered).await,
            Err(error) => Err(error),
        };
        match handled {
            Ok(()) => Verdict::Done,
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), execution = %fire.execution_id, "held fire not handled; later");
                Verdict::Retry
            }
        }
    }
}
