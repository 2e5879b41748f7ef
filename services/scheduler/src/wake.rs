//! When the loop wakes for the next fire: the timing wheel of every task's next fire, the sleep
//! until the wheel's earliest deadline on the injected clock, and the due list it hands back.
//!
//! One sleep for the whole wheel, re-planned only when the earliest deadline changes; never a
//! sleep per task, never a fixed-period poll.
//!
//! Fires leave the wheel up to [`LOOK_AHEAD_MS`] before they are due into a stage, in due
//! order, so a leader can build their dispatches ahead ([`Staged::prepared`]); they are handed
//! back only once due, and only if the task still has that fire next (a task changed, paused or
//! deleted meanwhile has another fire or none, and the staged one is dropped with whatever was
//! built for it).

use std::collections::VecDeque;

use futures::FutureExt;
use futures::future::{BoxFuture, Fuse};

use crate::clock::Clock;
use crate::pipeline::Prepared;
use crate::tasks::Tasks;
use crate::timer::{DenseKey, TimerWheel};

/// How long before its due time a fire leaves the wheel for the stage.
pub(crate) const LOOK_AHEAD_MS: u64 = 500;
/// At most this many staged fires (the earliest) are offered to be built ahead: the memory of
/// dispatches built ahead stays bounded in a burst larger than that.
pub(crate) const MAX_AHEAD: usize = 131_072;

/// A fire out of the wheel, waiting for its due time.
#[derive(Debug)]
pub(crate) struct Staged {
    /// Wheel time (nominal plus jitter) at which it fires.
    pub(crate) due_ms: u64,
    pub(crate) idx: u32,
    pub(crate) generation: u32,
    pub(crate) nominal_ms: i64,
    /// Its dispatch, if built ahead.
    pub(crate) prepared: Option<Box<Prepared>>,
}

/// The wheel, the stage and the one sleep.
pub(crate) struct Wake {
    wheel: TimerWheel<DenseKey>,
    sleep: Fuse<BoxFuture<'static, ()>>,
    /// The deadline `sleep` waits for (wheel ms), if armed.
    armed: Option<u64>,
    /// Reused buffers of entries leaving the wheel and of fires handed back.
    due: Vec<(DenseKey, u64)>,
    taken: Vec<Staged>,
    /// Fires out of the wheel, in due order.
    staged: VecDeque<Staged>,
    /// The staged fires before this position were offered to [`Wake::unprepared`].
    offered: usize,
}

impl Wake {
    /// A wheel starting at `now_ms` with room for `capacity` tasks.
    pub(crate) fn new(now_ms: i64, capacity: usize) -> Wake {
        Wake {
            wheel: TimerWheel::with_capacity(now_ms.max(0) as u64, capacity),
            sleep: Fuse::terminated(),
            armed: None,
            due: Vec::new(),
            taken: Vec::new(),
            staged: VecDeque::new(),
            offered: 0,
        }
    }

    /// Pending fires, in the wheel and staged.
    pub(crate) fn len(&self) -> usize {
        self.wheel.len() + self.staged.len()
    }

    /// Sleeps until the earliest staged fire is due or the wheel's earliest deadline is within
    /// the look-ahead (re-planned only when that changed). A wake-up that still finds the clock
    /// before it fires nothing and re-arms.
    pub(crate) fn arm(&mut self, clock: &dyn Clock) {
        let stage_at = self.wheel.next_deadline().map(|due| due.saturating_sub(LOOK_AHEAD_MS));
        let next = match (self.staged.front().map(|s| s.due_ms), stage_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if next == self.armed {
            return;
        }
        self.armed = next;
        self.sleep = match next {
            Some(due_ms) => clock.sleep_until(i64::try_from(due_ms).unwrap_or(i64::MAX / 1000) * 1000).fuse(),
            None => Fuse::terminated(),
        };
    }

    /// Resolves when the armed deadline is reached (pending while nothing is armed).
    pub(crate) async fn wait(&mut self) {
        if self.armed.is_none() {
            return std::future::pending().await;
        }
        (&mut self.sleep).await;
        self.armed = None;
    }

    /// Stages the wheel's fires due within the look-ahead of `now_ms`, then takes every staged
    /// fire due at `now_ms` that is still its task's next fire (the others are dropped); hand
    /// the list back with [`Wake::recycle`].
    pub(crate) fn take_due(&mut self, now_ms: i64, tasks: &mut Tasks) -> Vec<Staged> {
        let now = now_ms.max(0) as u64;
        self.stage(now.saturating_add(LOOK_AHEAD_MS), tasks);
        let mut taken = std::mem::take(&mut self.taken);
        while self.staged.front().is_some_and(|s| s.due_ms <= now) {
            let Some(staged) = self.staged.pop_front() else { break };
            self.offered = self.offered.saturating_sub(1);
            // Taking it clears the task's next fire: the same fire staged twice (a task paused
            // and resumed within the look-ahead is staged again) is handed back once.
            let Some(slot) = tasks.get_mut(staged.idx) else { continue };
            if slot.generation == staged.generation && slot.next_ms == Some(staged.nominal_ms) {
                slot.next_ms = None;
                taken.push(staged);
            }
        }
        taken
    }

    /// Moves the wheel's entries due by `until` to the stage, each with its task's next fire.
    fn stage(&mut self, until: u64, tasks: &mut Tasks) {
        let mut due = std::mem::take(&mut self.due);
        self.wheel.advance(until, &mut due);
        // Past-due entries (inserted behind the wheel's time) may come before staged ones.
        let in_order = match (self.staged.back(), due.first()) {
            (Some(last), Some(&(_, first))) => first >= last.due_ms,
            _ => true,
        };
        for &(DenseKey(idx), due_ms) in &due {
            let Some(slot) = tasks.get_mut(idx) else { continue };
            let Some(nominal_ms) = slot.next_ms else { continue };
            let generation = slot.generation;
            self.staged.push_back(Staged { due_ms, idx, generation, nominal_ms, prepared: None });
        }
        if !in_order {
            // Stable: insertion order within a due time is kept.
            self.staged.make_contiguous().sort_by_key(|s| s.due_ms);
            self.offered = 0;
        }
        due.clear();
        self.due = due;
    }

    /// Up to `max` staged fires not yet offered, in due order, to build their dispatches.
    pub(crate) fn unprepared(&mut self, max: usize) -> impl Iterator<Item = &mut Staged> {
        let end = self.staged.len().min(MAX_AHEAD);
        let from = self.offered.min(end);
        let to = from.saturating_add(max).min(end);
        self.offered = to;
        self.staged.range_mut(from..to).filter(|s| s.prepared.is_none())
    }

    /// Whether staged fires wait to be offered to [`Wake::unprepared`].
    pub(crate) fn preparing(&self) -> bool {
        self.offered < self.staged.len().min(MAX_AHEAD)
    }

    pub(crate) fn recycle(&mut self, mut taken: Vec<Staged>) {
        taken.clear();
        self.taken = taken;
    }

    /// Puts the next fire of slot `idx` (after its cursor) in the wheel, or takes it out when
    /// there is none (paused, a one-shot done).
    pub(crate) fn schedule_next(&mut self, tasks: &mut Tasks, idx: u32) {
        let Some(slot) = tasks.get_mut(idx) else { return };
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

    /// A task went away.
    pub(crate) fn cancel(&mut self, idx: u32) {
        self.wheel.cancel(&DenseKey(idx));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use jetsched_shared::spec::TaskSpec;

    use super::*;
    use crate::clock::ManualClock;
    use crate::tasks::TaskInfo;

    fn info(id: &str, every: &str) -> TaskInfo {
        let json = format!(
            r#"{{"id":"{id}","namespace":"ns","schedule":{{"every":"{every}"}},"executor":{{"kind":"nats","subject":"x"}}}}"#
        );
        let spec = TaskSpec::parse(json.as_bytes()).expect("spec");
        TaskInfo::new(spec, json.as_bytes(), 1, 0)
    }

    /// Tasks every `every` (created at 0), in the wheel from `clock`'s time on.
    fn wheel_of(clock: &ManualClock, tasks: &[(&str, &str)]) -> (Tasks, Wake) {
        let mut table = Tasks::default();
        let mut wake = Wake::new(clock.now_ms(), 4);
        for &(id, every) in tasks {
            let idx = table.insert(info(id, every), clock.now_ms());
            wake.schedule_next(&mut table, idx);
        }
        (table, wake)
    }

    fn fired(due: &[Staged]) -> Vec<(u32, u32, i64)> {
        due.iter().map(|s| (s.idx, s.generation, s.nominal_ms)).collect()
    }

    #[tokio::test]
    async fn the_wake_follows_the_earliest_fire_on_the_injected_clock() {
        let clock = ManualClock::at(10_000_000); // 10 s
        let (mut tasks, mut wake) = wheel_of(&clock, &[("a", "2s"), ("b", "5s")]);
        assert_eq!(wake.len(), 2);
        wake.arm(&clock);
        assert!(wake.wait().now_or_never().is_none(), "nothing within the look-ahead before 11.5 s");
        clock.advance(Duration::from_millis(1499));
        assert!(wake.wait().now_or_never().is_none());
        clock.advance(Duration::from_millis(1));
        assert!(wake.wait().now_or_never().is_some(), "the fire at 12 s is within the look-ahead");
        assert!(wake.take_due(clock.now_ms(), &mut tasks).is_empty(), "staged, not due yet");
        assert_eq!(wake.len(), 2, "staged fires count as pending");
        wake.arm(&clock);
        clock.advance(Duration::from_millis(499));
        assert!(wake.wait().now_or_never().is_none(), "never before the due time");
        assert!(wake.take_due(clock.now_ms(), &mut tasks).is_empty());
        clock.advance(Duration::from_millis(1));
        assert!(wake.wait().now_or_never().is_some());
        let due = wake.take_due(clock.now_ms(), &mut tasks);
        let a_generation = due[0].generation;
        assert_eq!(fired(&due), [(0, a_generation, 12_000)]);
        wake.recycle(due);
        assert_eq!(wake.len(), 1, "re-inserted by the loop, not by the wake");
        wake.cancel(1);
        wake.arm(&clock);
        assert!(wake.wait().now_or_never().is_none(), "an empty wheel never wakes");
    }

    #[test]
    fn a_staged_fire_is_handed_back_only_while_it_is_its_tasks_next_fire() {
        let clock = ManualClock::at(10_000_000);
        let ids = [("a", "2s"), ("b", "2s"), ("c", "2s"), ("d", "2s"), ("e", "2s")];
        let (mut tasks, mut wake) = wheel_of(&clock, &ids);
        clock.advance(Duration::from_millis(1_600)); // 11.6 s: all five staged
        assert!(wake.take_due(clock.now_ms(), &mut tasks).is_empty());
        let generation =
            |tasks: &mut Tasks, idx: u32| tasks.get_mut(idx).map(|s| s.generation).expect("slot");
        // a stays. b moved on to its next fire (as after a change of schedule). c paused: no
        // next fire. d deleted. e deleted and its slot reused by a task firing at 12 s too.
        let slot = tasks.get_mut(1).expect("b");
        slot.cursor_ms = 12_000;
        wake.schedule_next(&mut tasks, 1);
        tasks.get_mut(2).expect("c").next_ms = None;
        wake.cancel(2);
        for (idx, key) in [(3, "ns.d"), (4, "ns.e")] {
            assert_eq!(tasks.remove(key).map(|(i, _)| i), Some(idx));
            wake.cancel(idx);
        }
        let reused = tasks.insert(info("f", "2s"), clock.now_ms());
        wake.schedule_next(&mut tasks, reused);
        let (a, f) = (generation(&mut tasks, 0), generation(&mut tasks, reused));
        clock.advance(Duration::from_millis(400)); // 12 s
        let due = wake.take_due(clock.now_ms(), &mut tasks);
        assert_eq!(fired(&due), [(0, a, 12_000), (reused, f, 12_000)]);
        wake.recycle(due);
        assert_eq!(wake.len(), 1, "b's fire at 14 s (a and f are re-inserted by the loop)");
    }

    #[test]
    fn a_fire_staged_again_after_a_pause_and_resume_is_handed_back_once() {
        let clock = ManualClock::at(10_000_000);
        let (mut tasks, mut wake) = wheel_of(&clock, &[("a", "2s")]);
        clock.advance(Duration::from_millis(1_600)); // 11.6 s: the fire at 12 s staged
        assert!(wake.take_due(clock.now_ms(), &mut tasks).is_empty());
        // Paused, then resumed with the same next fire: it goes back into the wheel and is
        // staged a second time.
        tasks.get_mut(0).expect("a").next_ms = None;
        wake.cancel(0);
        wake.schedule_next(&mut tasks, 0);
        assert_eq!(tasks.get_mut(0).and_then(|s| s.next_ms), Some(12_000));
        clock.advance(Duration::from_millis(400)); // 12 s
        let due = wake.take_due(clock.now_ms(), &mut tasks);
        assert_eq!(due.iter().map(|s| s.nominal_ms).collect::<Vec<_>>(), [12_000], "once");
        wake.recycle(due);
    }

    #[test]
    fn staged_fires_are_offered_once_each_to_be_built_ahead() {
        let clock = ManualClock::at(10_000_000);
        let (mut tasks, mut wake) = wheel_of(&clock, &[("a", "2s"), ("b", "2s"), ("c", "2s"), ("d", "7s")]);
        assert!(!wake.preparing(), "nothing staged");
        clock.advance(Duration::from_millis(1_600));
        assert!(wake.take_due(clock.now_ms(), &mut tasks).is_empty());
        assert!(wake.preparing());
        let first: Vec<u32> = wake.unprepared(2).map(|s| s.idx).collect();
        assert_eq!(first, [0, 1]);
        let rest: Vec<u32> = wake.unprepared(2).map(|s| s.idx).collect();
        assert_eq!(rest, [2]);
        assert!(!wake.preparing(), "every staged fire offered");
        assert_eq!(wake.unprepared(2).count(), 0);
        clock.advance(Duration::from_millis(2_000)); // 13.6 s: the fires at 12 s handed back
        let due = wake.take_due(clock.now_ms(), &mut tasks);
        assert_eq!(due.len(), 3);
        wake.recycle(due);
        assert_eq!(
            wake.unprepared(8).map(|s| s.idx).collect::<Vec<_>>(),
            [3],
            "d's fire at 14 s, staged since"
        );
    }
}
