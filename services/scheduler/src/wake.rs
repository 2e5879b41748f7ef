//! When the loop wakes for the next fire: the timing wheel of every task's next fire, the sleep
//! until the wheel's earliest deadline on the injected clock, and the due list it hands back.
//!
//! One sleep for the whole wheel, re-planned only when the earliest deadline changes; never a
//! sleep per task, never a fixed-period poll.

use futures::FutureExt;
use futures::future::{BoxFuture, Fuse};

use crate::calendars::{CalendarBook, Fate};
use crate::clock::Clock;
use crate::tasks::Tasks;
use crate::timer::{DenseKey, TimerWheel};

/// The wheel and its one sleep.
pub(crate) struct Wake {
    wheel: TimerWheel<DenseKey>,
    sleep: Fuse<BoxFuture<'static, ()>>,
    /// The deadline `sleep` waits for (wheel ms), if armed.
    armed: Option<u64>,
    /// Reused buffer of due entries.
    due: Vec<(DenseKey, u64)>,
}

impl Wake {
    /// A wheel starting at `now_ms` with room for `capacity` tasks.
    pub(crate) fn new(now_ms: i64, capacity: usize) -> Wake {
        Wake {
            wheel: TimerWheel::with_capacity(now_ms.max(0) as u64, capacity),
            sleep: Fuse::terminated(),
            armed: None,
            due: Vec::new(),
        }
    }

    /// Pending fires in the wheel.
    pub(crate) fn len(&self) -> usize {
        self.wheel.len()
    }

    /// Sleeps until the wheel's earliest deadline (re-planned only when it changed). A wake-up
    /// that still finds the clock before the deadline fires nothing and re-arms.
    pub(crate) fn arm(&mut self, clock: &dyn Clock) {
        let next = self.wheel.next_deadline();
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

    /// Takes every entry due at `now_ms`, as slot indices; hand the list back with
    /// [`Wake::recycle`].
    pub(crate) fn take_due(&mut self, now_ms: i64) -> Vec<(DenseKey, u64)> {
        let mut due = std::mem::take(&mut self.due);
        self.wheel.advance(now_ms.max(0) as u64, &mut due);
        due
    }

    pub(crate) fn recycle(&mut self, mut due: Vec<(DenseKey, u64)>) {
        due.clear();
        self.due = due;
    }

    /// Puts the next fire of slot `idx` (after its cursor) in the wheel, or takes it out when
    /// there is none (paused, a one-shot done). A fire its calendars shift is due on the day
    /// they shift it to; one they skip or merge, at its nominal time (to be reported then).
    pub(crate) fn schedule_next(&mut self, tasks: &mut Tasks, idx: u32, calendars: &CalendarBook) {
        let Some(slot) = tasks.get_mut(idx) else { return };
        slot.next_ms = slot.info.next_nominal(slot.cursor_ms);
        match slot.next_ms {
            Some(nominal) => {
                let due = match calendars.fate(&slot.info, slot.cursor_ms, nominal) {
                    Fate::Due { due_ms, .. } => due_ms,
                    Fate::Skip(_) | Fate::Merged { .. } => nominal,
                };
                let random = match slot.info.jitter_random_ms {
                    0 => 0,
                    max => rand::random_range(0..=max),
                };
                self.wheel.insert(DenseKey(idx), slot.info.wheel_due(due, random));
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

    #[tokio::test]
    async fn the_wake_follows_the_earliest_fire_on_the_injected_clock() {
        let clock = ManualClock::at(10_000_000); // 10 s
        let mut tasks = Tasks::default();
        let mut wake = Wake::new(clock.now_ms(), 4);
        for (id, every) in [("a", "2s"), ("b", "5s")] {
            let json = format!(
                r#"{{"id":"{id}","namespace":"ns","schedule":{{"every":"{every}"}},"executor":{{"kind":"nats","subject":"x"}}}}"#
            );
            let spec = TaskSpec::parse(json.as_bytes()).expect("spec");
            let idx = tasks.insert(TaskInfo::new(spec, json.as_bytes(), 1, 0), clock.now_ms());
            wake.schedule_next(&mut tasks, idx, &CalendarBook::default());
        }
        assert_eq!(wake.len(), 2);
        wake.arm(&clock);
        assert!(wake.wait().now_or_never().is_none(), "nothing due before 12 s");
        clock.advance(Duration::from_millis(1999));
        assert!(wake.wait().now_or_never().is_none());
        assert!(wake.take_due(clock.now_ms()).is_empty());
        clock.advance(Duration::from_millis(1));
        assert!(wake.wait().now_or_never().is_some());
        let due = wake.take_due(clock.now_ms());
        assert_eq!(due.iter().map(|&(DenseKey(idx), at)| (idx, at)).collect::<Vec<_>>(), [(0, 12_000)]);
        wake.recycle(due);
        assert_eq!(wake.len(), 1, "re-inserted by the loop, not by the wake");
        wake.cancel(1);
        wake.arm(&clock);
        assert!(wake.wait().now_or_never().is_none(), "an empty wheel never wakes");
    }
}
