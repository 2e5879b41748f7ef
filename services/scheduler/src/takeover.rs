//! Leadership as the loop sees it: the lease task's campaign, the lease held (term and local
//! deadline, the fence before every publish), the wait of a new leader for the fire state to
//! be current, and the catch-up plan of each task once it is.
//!
//! The decisions are pure (what the wait does next, what a task catches up); the loop does the
//! reads they ask for and hands in their results.

use std::time::Duration;

use tokio::time::Instant;

use crate::catchup::{self, Limits};
use crate::lease::Campaign;
use crate::tasks::{TaskInfo, from_ms};

/// How long a new leader waits for the warm fire-state watch to reach the stream's last
/// sequence before it re-reads the fire state from scratch.
pub(crate) const STATE_CATCHUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The lease this replica holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) term: u64,
    /// The local deadline: nothing is published at or after it.
    pub(crate) valid_until: Instant,
}

/// The lease as other tasks of this replica follow it (the backfill driver): `None` while not
/// leader.
pub(crate) type LeaseWatch = tokio::sync::watch::Receiver<Option<Held>>;

/// A new leader waiting until the fire-state watch has caught up with the stream's last
/// sequence as read after the lease was acquired; then it plans the catch-up and dispatches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateLoad {
    /// The stream's last sequence at acquisition (`None`: not read yet).
    target: Option<u64>,
    /// The watch was opened after acquisition: an entry with `delta == 0` also ends the wait.
    fresh: bool,
    /// Retry reading the target (when `target` is `None`), else check the watch's progress.
    wake_at: Option<Instant>,
    /// `seen` at the last check: a watch that delivered nothing since is re-opened (an ordered
    /// consumer can stall while its stream moves between nodes).
    seen_at_check: u64,
    started: Instant,
}

/// What a waiting leader does when its wait times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// A fresh watch is still delivering (a large fire state): keep waiting.
    KeepWaiting,
    /// The warm watch did not reach the target: read the whole state through a fresh watch,
    /// then the target again.
    Reread,
    /// The target is not known yet: read it.
    ReadTarget,
}

impl StateLoad {
    fn new(seen: u64, now: Instant) -> StateLoad {
        StateLoad { target: None, fresh: false, wake_at: None, seen_at_check: seen, started: now }
    }

    /// The fire-state stream's last sequence was read (`messages == 0`: the stream is empty).
    /// Returns whether the state is current already.
    pub(crate) fn target_read(&mut self, messages: u64, last_sequence: u64, seen: u64, now: Instant) -> bool {
        if messages == 0 {
            return true;
        }
        self.target = Some(last_sequence);
        self.seen_at_check = seen;
        self.wake_at = Some(now + STATE_CATCHUP_TIMEOUT);
        seen >= last_sequence
    }

    /// The target could not be read: try again after `delay`.
    pub(crate) fn retry_target(&mut self, now: Instant, delay: Duration) {
        self.wake_at = Some(now + delay);
    }

    /// A fresh watch was opened: its first current entry also ends the wait.
    pub(crate) fn opened_fresh(&mut self) {
        self.fresh = true;
    }

    /// The wait timed out.
    pub(crate) fn recheck(&mut self, seen: u64, now: Instant) -> Recheck {
        self.wake_at = None;
        match self.target {
            Some(_) if self.fresh && seen > self.seen_at_check => {
                self.seen_at_check = seen;
                self.wake_at = Some(now + STATE_CATCHUP_TIMEOUT);
                Recheck::KeepWaiting
            }
            Some(_) => {
                self.target = None;
                Recheck::Reread
            }
            None => Recheck::ReadTarget,
        }
    }

    /// Whether the watch has caught up: it reached the target, or a fresh watch delivered its
    /// current entry (`current`).
    pub(crate) fn caught_up(&self, seen: u64, current: bool) -> bool {
        (self.fresh && current) || self.target.is_some_and(|target| seen >= target)
    }

    pub(crate) fn target(&self) -> Option<u64> {
        self.target
    }
}

/// The lease campaign, the lease held and a new leader's wait.
pub(crate) struct Takeover {
    campaign: Campaign,
    held: Option<Held>,
    /// Dispatch is paused because the local lease deadline passed.
    fenced: bool,
    load: Option<StateLoad>,
    limits: Limits,
    /// Tells the lease held to the tasks that publish under it.
    shared: tokio::sync::watch::Sender<Option<Held>>,
}

impl Takeover {
    pub(crate) fn new(campaign: Campaign, limits: Limits) -> Takeover {
        let (shared, _) = tokio::sync::watch::channel(None);
        Takeover { campaign, held: None, fenced: false, load: None, limits, shared }
    }

    /// Follows the lease held (term and local deadline).
    pub(crate) fn lease_watch(&self) -> LeaseWatch {
        self.shared.subscribe()
    }

    fn share(&self) {
        self.shared.send_replace(self.held);
    }

    pub(crate) fn campaign(&mut self) -> &mut Campaign {
        &mut self.campaign
    }

    /// The term held, if leader.
    pub(crate) fn term(&self) -> Option<u64> {
        self.held.map(|h| h.term)
    }

    /// Leader (the fire state perhaps still loading).
    pub(crate) fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// Leader with the fire state loaded: dispatching.
    pub(crate) fn leading(&self) -> bool {
        self.held.is_some() && self.load.is_none()
    }

    /// The lease was acquired: wait for the fire state (seen up to `seen` so far).
    pub(crate) fn acquired(&mut self, term: u64, valid_until: Instant, seen: u64) {
        self.held = Some(Held { term, valid_until });
        self.fenced = false;
        self.load = Some(StateLoad::new(seen, Instant::now()));
        self.share();
    }

    /// The lease was renewed until `valid_until`; true when that lifts the fence.
    pub(crate) fn renewed(&mut self, valid_until: Instant, now: Instant) -> bool {
        let Some(held) = &mut self.held else { return false };
        held.valid_until = valid_until;
        self.share();
        let lifted = self.fenced && now < valid_until;
        if lifted {
            self.fenced = false;
        }
        lifted
    }

    /// The term that may publish at `now`, or `None` once the local lease deadline passed
    /// (the fence: dispatch waits for a renewal or the loss of the lease). The first time the
    /// fence closes, `just_fenced` says so.
    pub(crate) fn publish_term(&mut self, now: Instant) -> Result<u64, bool> {
        let Some(held) = self.held else { return Err(false) };
        if now < held.valid_until {
            return Ok(held.term);
        }
        let just_fenced = !self.fenced;
        self.fenced = true;
        Err(just_fenced)
    }

    /// Whether a write guarded by the lease may still start at `now`, and until when.
    pub(crate) fn valid_until(&self, now: Instant) -> Option<Instant> {
        self.held.map(|h| h.valid_until).filter(|&until| now < until)
    }

    pub(crate) fn load(&mut self) -> Option<&mut StateLoad> {
        self.load.as_mut()
    }

    pub(crate) fn load_wake_at(&self) -> Option<Instant> {
        self.load.as_ref().and_then(|l| l.wake_at)
    }

    /// The fire state is current: the wait is over; returns how long it took.
    pub(crate) fn loaded(&mut self) -> Duration {
        self.load.take().map_or(Duration::ZERO, |load| load.started.elapsed())
    }

    /// Leadership lost: returns the term held.
    pub(crate) fn clear(&mut self) -> Option<u64> {
        self.fenced = false;
        self.load = None;
        let term = self.held.take().map(|h| h.term);
        self.share();
        term
    }

    /// The fires of a task between its last handled fire (or its registration) and `now_ms`,
    /// under its misfire policy, all before `before_ms` when given (a fire its calendars shift
    /// to a time still ahead, and every one after it, is the wheel's, not the catch-up's). A
    /// paused task catches up nothing.
    pub(crate) fn plan(
        &self,
        info: &TaskInfo,
        done_ms: Option<i64>,
        now_ms: i64,
        before_ms: Option<i64>,
    ) -> catchup::Plan {
        if info.paused {
            return catchup::Plan::default();
        }
        let floor = done_ms.unwrap_or(info.created_ms).max(info.created_ms);
        let mut bounds = info.bounds();
        if let Some(before) = before_ms {
            bounds.end_ms = bounds.end_ms.min(before);
        }
        catchup::plan(
            &info.schedule,
            bounds,
            info.misfire,
            Duration::from_millis(info.catchup_window_ms),
            from_ms(floor),
            from_ms(now_ms),
            self.limits,
        )
    }

    /// Where a task seen after the initial load starts firing: after its registration, but
    /// never more than the misfire threshold before `now_ms` (older ones are the catch-up's).
    pub(crate) fn first_cursor(&self, created_ms: i64, now_ms: i64) -> i64 {
        created_ms.max(now_ms - self.limits.threshold.as_millis() as i64)
    }
}

#[cfg(test)]
mod tests {
    use jetsched_shared::spec::TaskSpec;
    use jetsched_shared::wire::Trigger;

    use super::*;

    fn info(schedule: &str, misfire: &str, paused: bool, created_ms: i64) -> TaskInfo {
        let json = format!(
            r#"{{"id":"t","namespace":"ns","schedule":{schedule},"misfire":"{misfire}","paused":{paused},"executor":{{"kind":"nats","subject":"x"}}}}"#
        );
        let spec = TaskSpec::parse(json.as_bytes()).expect("spec");
        TaskInfo::new(spec, json.as_bytes(), 1, created_ms)
    }

    fn plan_of(done_ms: Option<i64>, misfire: &str, paused: bool, now_ms: i64) -> (Vec<(i64, Trigger)>, u64) {
        let takeover =
            Takeover::new(Campaign::detached(), Limits { threshold: Duration::from_secs(2), max: 100 });
        let plan = takeover.plan(&info(r#"{"every":"1s"}"#, misfire, paused, 10_000), done_ms, now_ms, None);
        (plan.dispatch, plan.skipped.len() as u64 + plan.skipped_more)
    }

    /// (last handled fire, misfire policy, paused, now, dispatches, skipped).
    type Case = (Option<i64>, &'static str, bool, i64, &'static [(i64, Trigger)], u64);

    #[test]
    fn the_catch_up_starts_after_the_last_handled_fire_or_the_registration() {
        use Trigger::{Catchup, Schedule};
        // (last handled fire, misfire policy, paused, now) -> (dispatches, skipped)
        let cases: [Case; 6] = [
            (Some(14_000), "fire_all", false, 15_000, &[(15_000, Schedule)], 0),
            (None, "fire_all", false, 12_000, &[(11_000, Schedule), (12_000, Schedule)], 0),
            // A fire state older than the registration (a re-created task) counts from it.
            (Some(1_000), "fire_all", false, 12_000, &[(11_000, Schedule), (12_000, Schedule)], 0),
            (
                Some(10_000),
                "fire_all",
                false,
                14_000,
                &[(11_000, Catchup), (12_000, Schedule), (13_000, Schedule), (14_000, Schedule)],
                0,
            ),
            (
                Some(10_000),
                "skip",
                false,
                14_000,
                &[(12_000, Schedule), (13_000, Schedule), (14_000, Schedule)],
                1,
            ),
            (Some(10_000), "fire_all", true, 14_000, &[], 0),
        ];
        for (done, misfire, paused, now, dispatch, skipped) in cases {
            assert_eq!(
                plan_of(done, misfire, paused, now),
                (dispatch.to_vec(), skipped),
                "done {done:?}, {misfire}, paused {paused}, now {now}"
            );
        }
    }

    #[test]
    fn a_task_seen_after_the_load_starts_at_most_the_threshold_back() {
        let takeover =
            Takeover::new(Campaign::detached(), Limits { threshold: Duration::from_secs(10), max: 100 });
        for (created, now, cursor) in
            [(95_000, 100_000, 95_000), (50_000, 100_000, 90_000), (100_500, 100_000, 100_500)]
        {
            assert_eq!(takeover.first_cursor(created, now), cursor, "created {created}, now {now}");
        }
    }

    #[test]
    fn a_new_leader_waits_until_the_watch_reaches_the_stream_end() {
        let now = Instant::now();
        // (messages, last sequence, seen) -> current at once
        for (messages, last, seen, current) in
            [(0, 0, 0, true), (5, 9, 9, true), (5, 9, 12, true), (5, 9, 8, false)]
        {
            let mut load = StateLoad::new(0, now);
            assert_eq!(load.target_read(messages, last, seen, now), current, "{messages} {last} {seen}");
        }
        let mut load = StateLoad::new(3, now);
        assert!(!load.target_read(5, 9, 3, now));
        assert!(!load.caught_up(8, true), "a warm watch's current entry is not the target");
        assert!(load.caught_up(9, false));
        // Timed out without progress: read everything again through a fresh watch.
        assert_eq!(load.recheck(3, now), Recheck::Reread);
        assert_eq!((load.target(), load.wake_at), (None, None));
        load.opened_fresh();
        assert!(load.caught_up(4, true), "a fresh watch's current entry ends the wait");
        assert_eq!(load.recheck(4, now), Recheck::ReadTarget);
        assert!(!load.target_read(5, 20, 10, now));
        // A fresh watch still delivering keeps the wait going.
        assert_eq!(load.recheck(11, now), Recheck::KeepWaiting);
        assert_eq!(load.wake_at, Some(now + STATE_CATCHUP_TIMEOUT));
        assert_eq!(load.recheck(11, now), Recheck::Reread);
    }

    #[test]
    fn the_fence_closes_at_the_local_deadline_and_a_renewal_lifts_it() {
        let now = Instant::now();
        let mut takeover =
            Takeover::new(Campaign::detached(), Limits { threshold: Duration::from_secs(10), max: 100 });
        assert_eq!(takeover.publish_term(now), Err(false), "not leader");
        takeover.acquired(7, now + Duration::from_secs(1), 0);
        assert!(takeover.holds() && !takeover.leading(), "waiting for the fire state");
        takeover.loaded();
        assert!(takeover.leading());
        assert_eq!(takeover.publish_term(now), Ok(7));
        let late = now + Duration::from_secs(1);
        assert_eq!(takeover.publish_term(late), Err(true));
        assert_eq!(takeover.publish_term(late), Err(false), "reported once");
        assert_eq!(takeover.valid_until(late), None);
        assert!(takeover.renewed(late + Duration::from_secs(1), late));
        assert_eq!(takeover.publish_term(late), Ok(7));
        assert_eq!(takeover.clear(), Some(7));
        assert!(!takeover.holds());
    }
}
