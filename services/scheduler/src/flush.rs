//! Coalesced fire-state writes: a task whose fires are handled is marked dirty once; every
//! flush period the dirty states are written together, in a task of their own, unless a
//! dispatch burst is under way (dispatch first, for at most [`MAX_STATE_DELAY`]).
//!
//! A fire state says "handled up to here": it is written only after the events of the fires
//! it covers are stored (the caller hands in a barrier), and never once the lease may be gone.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt;
use jetsched_shared::events::Barrier;
use jetsched_shared::names::task_key;
use jetsched_shared::wire::{FireState, scheduled_execution_id};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use crate::tasks::{Tasks, from_ms};

/// Longest a state write waits for a dispatch burst to drain. A 100k burst takes 1-2 s on two
/// cores; its 100k state writes started inside it stretch it by as much again. A state written
/// late only means a new leader publishes those fires again, and the dispatch stream's
/// duplicate window (10 minutes by default) stores them once.
pub(crate) const MAX_STATE_DELAY: Duration = Duration::from_secs(10);
/// Concurrent state writes of one flush.
const STATE_WRITE_WINDOW: usize = 256;

/// Outcome of one flush: per slot (index, generation), whether its write was stored.
pub(crate) type Flushed = Vec<(u32, u32, bool)>;

/// What a flush does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing is dirty.
    Idle,
    /// Try again after the flush period (a write is running, or dispatch goes first).
    Later,
    /// Write the dirty states.
    Write,
}

/// The dirty fire states and the write under way.
pub(crate) struct Flush {
    /// Dirty slots (index, generation), each once.
    dirty: Vec<(u32, u32)>,
    /// When the oldest dirty state became dirty.
    dirty_since: Option<Instant>,
    flush_at: Option<Instant>,
    task: Option<JoinHandle<Flushed>>,
    period: Duration,
}

impl Flush {
    /// Writes every `period` at most.
    pub(crate) fn new(period: Duration) -> Flush {
        Flush { dirty: Vec::new(), dirty_since: None, flush_at: None, task: None, period }
    }

    /// Slot `idx`'s fire state changed: write it with the next flush.
    pub(crate) fn mark(&mut self, tasks: &mut Tasks, idx: u32, now: Instant) {
        let Some(slot) = tasks.get_mut(idx) else { return };
        if slot.dirty {
            return;
        }
        slot.dirty = true;
        if self.dirty.is_empty() {
            self.dirty_since = Some(now);
        }
        self.dirty.push((idx, slot.generation));
        self.flush_at.get_or_insert(now + self.period);
    }

    pub(crate) fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub(crate) fn flush_at(&self) -> Option<Instant> {
        self.flush_at
    }

    /// Whether to write now: `busy` = dispatch is under way, `force` = write regardless
    /// (shutdown).
    pub(crate) fn step(&mut self, busy: bool, force: bool, now: Instant) -> Step {
        self.flush_at = None;
        if self.dirty.is_empty() {
            return Step::Idle;
        }
        let overdue = self.dirty_since.is_some_and(|since| now.duration_since(since) >= MAX_STATE_DELAY);
        if self.task.is_some() || (busy && !overdue && !force) {
            self.flush_at = Some(now + self.period);
            return Step::Later;
        }
        self.dirty_since = None;
        Step::Write
    }

    /// Writes the dirty states to `store` once `events` are stored, unless `valid_until` (the
    /// lease's local deadline) has passed by then (the slots stay dirty while leader).
    pub(crate) fn write(
        &mut self,
        tasks: &mut Tasks,
        store: &kv::Store,
        events: Barrier,
        valid_until: Instant,
    ) {
        let mut batch = Vec::with_capacity(self.dirty.len());
        for (idx, generation) in std::mem::take(&mut self.dirty) {
            let Some(slot) = tasks.get_live(idx, generation) else { continue };
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
                Err(error) => tracing::error!(%error, task = %info.key(), "cannot encode fire state"),
            }
        }
        let store = store.clone();
        self.task = Some(tokio::spawn(async move {
            events.wait().await;
            if Instant::now() >= valid_until {
                return batch.into_iter().map(|(_, _, idx, generation)| (idx, generation, false)).collect();
            }
            // Each write borrows the one store: a clone would copy its stream's info per key.
            let store = &store;
            futures::stream::iter(batch)
                .map(|(key, body, idx, generation)| async move {
                    let stored = match store.put(&key, body).await {
                        Ok(_) => true,
                        Err(error) => {
                            tracing::debug!(%error, task = %key, "fire state not written");
                            false
                        }
                    };
                    (idx, generation, stored)
                })
                .buffer_unordered(STATE_WRITE_WINDOW)
                .collect::<Vec<_>>()
                .await
        }));
    }

    /// The running write's outcome (pending while none runs).
    pub(crate) async fn written(&mut self) -> Result<Flushed, JoinError> {
        match self.task.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    }

    /// Waits for the running write, if any.
    pub(crate) async fn finish(&mut self) -> Option<Result<Flushed, JoinError>> {
        let task = self.task.take()?;
        Some(task.await)
    }

    /// A write ended: returns (stored, failed slots). Called with the outcome of
    /// [`Flush::written`] or [`Flush::finish`].
    pub(crate) fn ended(&mut self, result: Result<Flushed, JoinError>) -> (u64, Vec<(u32, u32)>) {
        self.task = None;
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(error) => {
                tracing::error!(%error, "state flush task failed");
                return (0, Vec::new());
            }
        };
        let failed: Vec<(u32, u32)> = outcomes
            .iter()
            .filter(|(_, _, stored)| !stored)
            .map(|&(idx, generation, _)| (idx, generation))
            .collect();
        ((outcomes.len() - failed.len()) as u64, failed)
    }

    /// Leadership lost: nothing stays dirty (a running write ends by itself).
    pub(crate) fn clear(&mut self, tasks: &mut Tasks) {
        for (idx, generation) in self.dirty.drain(..) {
            if let Some(slot) = tasks.get_live(idx, generation) {
                slot.dirty = false;
            }
        }
        self.dirty_since = None;
        self.flush_at = None;
    }
}

#[cfg(test)]
mod tests {
    use jetsched_shared::spec::TaskSpec;

    use super::*;
    use crate::tasks::TaskInfo;

    fn tasks(n: usize) -> Tasks {
        let mut tasks = Tasks::default();
        for i in 0..n {
            let json = format!(
                r#"{{"id":"t{i}","namespace":"ns","schedule":{{"every":"1s"}},"executor":{{"kind":"nats","subject":"x"}}}}"#
            );
            let spec = TaskSpec::parse(json.as_bytes()).expect("spec");
            tasks.insert(TaskInfo::new(spec, json.as_bytes(), 1, 0), 0);
        }
        tasks
    }

    #[test]
    fn a_slot_is_marked_once_and_the_first_mark_sets_the_flush_time() {
        let (mut tasks, mut flush, now) = (tasks(2), Flush::new(Duration::from_millis(50)), Instant::now());
        flush.mark(&mut tasks, 0, now);
        flush.mark(&mut tasks, 0, now + Duration::from_millis(10));
        flush.mark(&mut tasks, 1, now + Duration::from_millis(20));
        flush.mark(&mut tasks, 9, now); // no such slot
        assert_eq!(flush.dirty, [(0, 1), (1, 2)]);
        assert_eq!(flush.flush_at(), Some(now + Duration::from_millis(50)));
        flush.clear(&mut tasks);
        assert!(!flush.is_dirty() && tasks.iter_mut().all(|(_, s)| !s.dirty));
        assert_eq!(flush.flush_at(), None);
    }

    #[test]
    fn writes_wait_for_dispatch_bursts_but_not_forever() {
        let period = Duration::from_millis(50);
        let late = MAX_STATE_DELAY + Duration::from_millis(1);
        // (dirty, busy, force, time since the first mark) -> step
        let cases = [
            (false, false, false, Duration::ZERO, Step::Idle),
            (false, true, true, late, Step::Idle),
            (true, false, false, Duration::ZERO, Step::Write),
            (true, true, false, Duration::from_millis(100), Step::Later),
            (true, true, false, late, Step::Write),
            (true, true, true, Duration::ZERO, Step::Write),
        ];
        for (dirty, busy, force, after, expected) in cases {
            let (mut tasks, mut flush, now) = (tasks(1), Flush::new(period), Instant::now());
            if dirty {
                flush.mark(&mut tasks, 0, now);
            }
            let step = flush.step(busy, force, now + after);
            assert_eq!(step, expected, "dirty {dirty}, busy {busy}, force {force}, after {after:?}");
            let retry = (step == Step::Later).then_some(now + after + period);
            assert_eq!(flush.flush_at(), retry);
        }
    }

    #[test]
    fn a_write_reports_its_failures() {
        let mut flush = Flush::new(Duration::from_millis(50));
        let (stored, failed) = flush.ended(Ok(vec![(0, 1, true), (1, 2, false), (2, 3, true)]));
        assert_eq!((stored, failed), (2, vec![(1, 2)]));
    }
}
