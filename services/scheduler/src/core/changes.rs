//! What the watches deliver: task changes (put, remove, invalid) into the task table and the
//! wheel, and other leaders' fire state into the table (or kept for tasks not seen yet).

use async_nats::jetstream::kv::{self, Operation};
use jetsched_shared::wire::FireState;

use super::Core;
use crate::discovery::Change;
use crate::follow::{Opened, StateBatch, TaskBatch};

impl Core {
    pub(super) fn on_tasks(&mut self, batch: TaskBatch) {
        let Some(entries) = batch else {
            tracing::warn!("tasks watch ended; re-opening");
            self.follow.feed_ended();
            return;
        };
        for entry in entries {
            match entry {
                Ok(entry) => {
                    self.apply(entry.change);
                    if entry.delta == 0
                        && let Some(took) = self.follow.finish_load()
                    {
                        self.loaded(took);
                    }
                }
                Err(error) => {
                    // The client would re-create the watch's consumer itself, but slowly (see
                    // `follow.rs`): a fresh watch delivers every task again, the rest of this
                    // batch included.
                    tracing::warn!(%error, "tasks watch error; re-opening it");
                    self.follow.feed_ended();
                    break;
                }
            }
        }
        self.report.metrics.tasks.set(self.tasks.len() as i64);
    }

    /// JetStream answers again after an outage: the tasks watch is opened anew rather than left
    /// to the client's own recovery, which can lag by tens of seconds (see `follow.rs`). The
    /// tasks come again, last value per key: those known at their revision are passed over.
    /// The fire-state requests and watch are treated alike (see `refollow_state`).
    pub(super) fn rewatch(&mut self) {
        tracing::info!("JetStream answers again: re-opening the tasks watch");
        self.follow.reset_timeouts();
        self.follow.reopen_feed(&self.nats.tasks);
        self.refollow_state();
    }

    /// A tasks feed being opened is open (or failed, tried again later).
    pub(super) fn on_opened(&mut self, opened: Opened) {
        if self.follow.opened(opened)
            && let Some(took) = self.follow.finish_load()
        {
            self.loaded(took);
        }
    }

    /// Every task stored when the watch opened has been read (none, for an empty bucket).
    fn loaded(&mut self, took: std::time::Duration) {
        self.mark_loaded();
        self.report.metrics.load_seconds.observe(took.as_secs_f64());
        tracing::info!(tasks = self.tasks.len(), elapsed_ms = took.as_millis() as u64, "tasks loaded");
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Put(mut info) => {
                self.calendars.refit(&mut info);
                let hash = match self.tasks.find(info.key()) {
                    Ok(idx) => {
                        let Some(slot) = self.tasks.get_mut(idx) else { return };
                        if slot.info.revision >= info.revision {
                            return; // re-delivered after a re-opened watch
                        }
                        slot.info = info;
                        self.wake.schedule_next(&mut self.tasks, idx, &self.calendars);
                        return;
                    }
                    Err(hash) => hash,
                };
                // Fires start after the registration; during the initial load, after now
                // (the fire state decides what a new leader catches up).
                let now = self.time.now_ms();
                let loaded = self.follow.loaded();
                let cursor = if loaded { self.takeover.first_cursor(info.created_ms, now) } else { now };
                let orphan = self.follow.adopt_orphan(info.key());
                // A one-shot registered after its time (the registry admits it within its
                // catch-up window; e.g. an intake applied late) begins before that time:
                // while leading, its misfire policy decides now, as after a failover.
                let late = info.created_ms < cursor && loaded && self.takeover.leading();
                self.report.partitions.added(&info);
                let idx = self.tasks.insert_hashed(info, cursor, hash);
                if let Some((done, fires)) = orphan
                    && let Some(slot) = self.tasks.get_mut(idx)
                {
                    slot.done_ms = Some(done);
                    slot.fires = fires;
                }
                if late {
                    self.catch_up_task(idx, now);
                } else {
                    self.wake.schedule_next(&mut self.tasks, idx, &self.calendars);
                }
            }
            Change::Remove { key } => self.remove(&key),
            Change::Invalid { key, error } => {
                self.report.metrics.invalid_specs.inc();
                tracing::warn!(task = %key, %error, "tasks bucket holds an invalid spec; ignoring the task");
                self.remove(&key);
            }
        }
    }

    /// A calendar changed: every task of its namespace naming a calendar is planned again from
    /// its cursor, so the edit applies to its next fires.
    pub(super) fn on_calendar(&mut self, entry: &kv::Entry) {
        let Some(namespace) = self.calendars.apply(entry) else { return };
        let affected = self
            .tasks
            .indices_where(|slot| !slot.info.calendars().is_empty() && slot.info.namespace() == namespace);
        for &idx in &affected {
            if let Some(slot) = self.tasks.get_mut(idx) {
                self.calendars.refit(&mut slot.info);
            }
            self.wake.schedule_next(&mut self.tasks, idx, &self.calendars);
        }
        tracing::info!(calendar = %entry.key, tasks = affected.len(), "calendar changed; tasks planned again");
    }

    fn remove(&mut self, key: &str) {
        if let Some((idx, slot)) = self.tasks.remove(key) {
            self.report.partitions.removed(&slot.info);
            self.wake.cancel(idx);
            self.overlap.remove(idx);
        }
    }

    pub(super) fn on_state(&mut self, batch: StateBatch) {
        let Some(entries) = batch else {
            tracing::warn!("fire-state watch ended; re-opening");
            self.follow.state_ended();
            return;
        };
        // The leader is the only writer: its own echoes are older than what it holds.
        let apply = !self.takeover.leading();
        let mut current = false;
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::warn!(%error, "state watch error");
                    continue;
                }
            };
            self.follow.saw(entry.revision);
            current |= entry.delta == 0;
            if !apply {
                if entry.operation != Operation::Put {
                    self.follow.forget_orphan(&entry.key);
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
                    Some(state) => self.follow.keep_orphan(entry.key, state),
                    None => self.follow.forget_orphan(&entry.key),
                },
            }
        }
        let seen = self.follow.seen();
        if self.takeover.load().is_some_and(|load| load.caught_up(seen, current)) {
            self.finish_acquisition();
        }
    }
}
