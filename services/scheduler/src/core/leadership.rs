//! Leadership: acquiring the lease, waiting until the fire state is current, planning every
//! task's missed fires, renewals lifting the fence, and stepping down (each part cleared).

use jetsched_shared::names::SYSTEM_NAMESPACE;
use jetsched_shared::wire::{Event as WireEvent, EventKind};
use tokio::time::Instant;

use super::{Core, Report};
use crate::calendars::Fate;
use crate::catchup;
use crate::fire::Fire;
use crate::follow::{STATE_RETRY_DELAY, StateOpened, TargetRead};
use crate::lease::LeaseEvent;
use crate::takeover::Recheck;
use crate::tasks::{TaskInfo, from_ms};

impl Core {
    pub(super) async fn on_lease(&mut self, event: LeaseEvent) {
        match event {
            LeaseEvent::Acquired { term, valid_until } => {
                if self.takeover.holds() {
                    self.step_down("re-acquired");
                }
                self.takeover.acquired(term, valid_until, self.follow.seen());
                self.report.metrics.is_leader.set(1);
                self.report.metrics.leader_changes.inc();
                self.report.emit(WireEvent {
                    instance: Some(self.report.instance.clone()),
                    term: Some(term),
                    ..WireEvent::new(EventKind::LeaderAcquired, SYSTEM_NAMESPACE, "scheduler")
                });
                // The fire state is warm (followed while follower); wait until the watch has
                // caught up with what the previous leader wrote, then plan the catch-up.
                if !self.follow.is_following_state() {
                    self.open_state_watch();
                }
                self.read_state_target();
            }
            LeaseEvent::Renewed { valid_until } => {
                if self.takeover.renewed(valid_until, Instant::now()) {
                    tracing::info!(term = self.takeover.term(), "lease renewed; dispatch resumes");
                }
            }
            LeaseEvent::Lost { reason } => {
                if self.takeover.holds() {
                    self.step_down(&reason);
                }
            }
        }
    }

    /// Starts opening the fire-state watch (all keys, then updates). Opened during a leader's
    /// wait, it is fresh: its first entry with `delta == 0` means the state is current.
    pub(super) fn open_state_watch(&mut self) {
        let waiting = self.takeover.load().is_some();
        self.follow.open_state(&self.nats.state, self.takeover.term().filter(|_| waiting));
    }

    /// The fire-state watch is open (or failed to open, tried again after a pause). Opened in
    /// this term's wait, it is fresh; an empty bucket ends the wait at once.
    pub(super) fn on_state_opened(&mut self, opened: StateOpened, opened_for: Option<u64>) {
        let Some(messages) = self.follow.state_opened(opened) else { return };
        let term = self.takeover.term();
        let Some(load) = self.takeover.load() else { return };
        if opened_for.is_some() && opened_for == term {
            load.opened_fresh();
            if messages == 0 {
                self.finish_acquisition();
            }
        }
    }

    /// A new leader reads the state stream's last sequence (in a task of its own): the watch
    /// must reach it.
    fn read_state_target(&mut self) {
        let Some(term) = self.takeover.term() else { return };
        if self.takeover.load().is_some() {
            self.follow.read_state_target(&self.nats.state, term);
        }
    }

    /// The state stream's last sequence was read for the wait of `term`.
    pub(super) fn on_state_target(&mut self, read: TargetRead, read_for: Option<u64>) {
        let read = self.follow.target_read(read);
        let seen = self.follow.seen();
        if read_for.is_none() || self.takeover.term() != read_for {
            return; // read for an earlier term: its leadership is over
        }
        let Some(load) = self.takeover.load() else { return };
        match read {
            Ok((messages, last_sequence)) => {
                if load.target_read(messages, last_sequence, seen, Instant::now()) {
                    self.finish_acquisition();
                }
            }
            Err(error) => {
                tracing::warn!(error, "cannot read the fire-state stream info; retrying");
                load.retry_target(Instant::now(), STATE_RETRY_DELAY);
            }
        }
    }

    /// JetStream answers again: fire-state requests under way are sent again (they may wait on
    /// a stream that did not answer), and a follower's or waiting leader's fire-state watch is
    /// opened afresh (the client's own recovery of it can lag for tens of seconds, like the
    /// tasks watch's).
    pub(super) fn refollow_state(&mut self) {
        let dropped_target = self.follow.drop_target_read();
        let following = self.follow.is_following_state();
        if following && (!self.takeover.leading() || self.follow.is_opening_state()) {
            self.open_state_watch();
        }
        if dropped_target.is_some() {
            self.read_state_target();
        }
    }

    pub(super) fn on_state_load_wake(&mut self) {
        let seen = self.follow.seen();
        let Some(load) = self.takeover.load() else { return };
        let target = load.target();
        match load.recheck(seen, Instant::now()) {
            Recheck::KeepWaiting => return,
            Recheck::Reread => {
                // The warm watch did not reach the target (e.g. the last message was removed
                // meanwhile): read the whole fire state again through a fresh watch.
                tracing::warn!(
                    target,
                    seen,
                    "the fire-state watch did not catch up; re-reading the fire state"
                );
                self.follow.close_state();
                self.open_state_watch();
            }
            Recheck::ReadTarget if self.follow.is_reading_target() => return,
            Recheck::ReadTarget => {}
        }
        self.read_state_target();
    }

    /// The fire state is loaded: plan every task's missed fires, then dispatch.
    pub(super) fn finish_acquisition(&mut self) {
        let state_wait_ms = self.takeover.loaded().as_millis() as u64;
        let now = self.time.now_ms();
        let started = Instant::now();
        let (mut dispatch, mut skipped, mut missed) = (0usize, 0u64, 0u64);
        let indices: Vec<u32> = self.tasks.iter_mut().map(|(idx, _)| idx).collect();
        for idx in indices {
            let (d, s, m) = self.catch_up_task(idx, now);
            dispatch += d;
            skipped += s;
            missed += m;
        }
        self.pipeline.start_catchup();
        self.report.metrics.resumed.set(1);
        tracing::info!(
            term = self.takeover.term().unwrap_or_default(),
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
    pub(super) fn catch_up_task(&mut self, idx: u32, now: i64) -> (usize, u64, u64) {
        let Some(slot) = self.tasks.get_mut(idx) else { return (0, 0, 0) };
        // A fire whose nominal time has passed but which its calendars shift to a time still
        // ahead is not late, however old its nominal time: the wheel keeps it (and the fires
        // after it) for its time, whatever the catch-up window says.
        let floor = slot.done_ms.unwrap_or(slot.info.created_ms).max(slot.info.created_ms);
        let shifted_ahead = self.calendars.first_shifted_ahead(&slot.info, floor, now);
        let mut plan = self.takeover.plan(&slot.info, slot.done_ms, now, shifted_ahead);
        // Missed fires follow the calendars as they would have on time: one they refuse is
        // skipped, one shifted onto a fire made already runs once, as that fire, and one
        // shifted to a time still ahead stays in the wheel for it (dispatched then, with every
        // later fire after it).
        let mut refused = Vec::new();
        let mut ahead = None;
        let mut previous = slot.done_ms.unwrap_or(slot.info.created_ms);
        plan.dispatch.retain(|&(nominal, _)| {
            if ahead.is_some() {
                return false;
            }
            let fate = self.calendars.fate(&slot.info, previous, nominal);
            previous = nominal;
            match fate {
                Fate::Skip(refusal) => refused.push((nominal, Some(refusal), None)),
                Fate::Merged { floor_ms, refusal } => refused.push((nominal, refusal, Some(floor_ms))),
                Fate::Due { due_ms, .. } if due_ms > now => ahead = Some(nominal),
                Fate::Due { .. } => return true,
            }
            false
        });
        let ahead = ahead.or(shifted_ahead);
        if let Some(ahead) = ahead {
            let before = plan.dispatch.iter().map(|&(ms, _)| ms);
            let before = before.chain(refused.iter().map(|&(ms, ..)| ms));
            let before = before.chain(plan.skipped.iter().map(|&(ms, _)| ms).filter(|&ms| ms < ahead));
            plan.last = before.max();
        }
        report_plan(&self.report, self.takeover.term(), &slot.info, &plan);
        let counts = (plan.dispatch.len(), plan.skipped.len() as u64 + plan.skipped_more, plan.missed);
        let generation = slot.generation;
        // A last fire skipped or missed completes the task here; a dispatched one on its ack.
        // (A fire the calendars refused completes it when reported.)
        let last_not_dispatched = plan.last.filter(|last| {
            plan.dispatch.last().is_none_or(|&(ms, _)| ms != *last)
                && !refused.iter().any(|(ms, ..)| ms == last)
        });
        slot.cursor_ms = ahead.map_or(now, |ahead| ahead - 1);
        if plan.dispatch.is_empty() {
            if let Some(last) = plan.last {
                slot.done_ms = Some(slot.done_ms.map_or(last, |d| d.max(last)));
                self.flush.mark(&mut self.tasks, idx, Instant::now());
            }
        } else {
            // Every examined fire counts as done once the dispatches are acknowledged.
            slot.pending_ms = plan.last;
            slot.inflight += plan.dispatch.len() as u32;
            for &(nominal, trigger) in &plan.dispatch {
                self.pipeline.push(Fire { idx, generation, nominal_ms: nominal, trigger });
            }
        }
        for (nominal, refusal, merged_at) in refused {
            self.skip_by_calendar(idx, nominal, refusal.as_ref(), merged_at);
        }
        if let Some(last) = last_not_dispatched {
            self.completed_if_last(idx, generation, last);
        }
        self.wake.schedule_next(&mut self.tasks, idx, &self.calendars);
        counts
    }

    /// Leadership is lost (or given up): every part drops what only a leader keeps.
    pub(super) fn step_down(&mut self, reason: &str) {
        let term = self.takeover.clear();
        tracing::warn!(reason, term = term.unwrap_or_default(), "leadership lost");
        self.pipeline.clear();
        self.overlap.clear();
        self.flush.clear(&mut self.tasks);
        self.tasks.forget_dispatches();
        let metrics = &self.report.metrics;
        metrics.publish_inflight.set(0);
        metrics.is_leader.set(0);
        metrics.resumed.set(0);
        metrics.leader_changes.inc();
        self.report.emit(WireEvent {
            instance: Some(self.report.instance.clone()),
            term,
            reason: Some(reason.to_string()),
            ..WireEvent::new(EventKind::LeaderLost, SYSTEM_NAMESPACE, "scheduler")
        });
    }
}

/// Metrics and events of one task's catch-up: each skipped fire (up to the maximum), the count
/// of further skips, and the missed fires.
fn report_plan(report: &Report, term: Option<u64>, info: &TaskInfo, plan: &catchup::Plan) {
    if plan.skipped.is_empty() && plan.skipped_more == 0 && plan.missed == 0 {
        return;
    }
    let event = |kind: EventKind, reason: String, nominal: Option<i64>| WireEvent {
        nominal_time: nominal.map(from_ms),
        reason: Some(reason),
        instance: Some(report.instance.clone()),
        term,
        ..WireEvent::new(kind, info.namespace(), info.task_id())
    };
    let metrics = &report.metrics;
    for &(nominal, reason) in &plan.skipped {
        metrics.skipped.with_label_values(&[reason.as_str()]).inc();
        crate::spans::skipped(info.namespace(), info.task_id(), nominal, reason.as_str(), term);
        report.emit(event(EventKind::FireSkipped, reason.as_str().to_string(), Some(nominal)));
    }
    if plan.skipped_more > 0 {
        let reason = plan.skipped.first().map(|(_, r)| r.as_str()).unwrap_or("misfire");
        metrics.skipped.with_label_values(&[reason]).inc_by(plan.skipped_more);
        report.emit(event(
            EventKind::FireSkipped,
            format!("{reason}: {} more skipped fires not listed", plan.skipped_more),
            None,
        ));
    }
    if plan.missed > 0 {
        metrics.missed.inc_by(plan.missed);
        report.emit(event(
            EventKind::FireMissed,
            format!("{} fires older than the catch-up window or beyond the catch-up maximum", plan.missed),
            None,
        ));
    }
}
