//! The dispatch pipeline of a leader: fires waiting to be published (ordinary fires first,
//! catch-up fires rate-limited in slices), failed publishes waiting to be retried with the same
//! message id, and the bounded window of publishes awaiting their ack ([`Acks`]).
//!
//! The pipeline decides what is published next and when; publishing itself (and the lease
//! check before it) is the loop's.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::Subject;
use jetsched_shared::wire::Trigger;
use tokio::time::Instant;

use crate::acks::{Acked, Acks};
use crate::fire::Fire;

/// Catch-up fires are released in slices of this period (rate limit).
pub(crate) const CATCHUP_SLICE: Duration = Duration::from_millis(100);
/// Delay before a failed publish is retried (with the same message id).
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(250);

/// Queues, retries and the in-flight window.
pub(crate) struct Pipeline {
    /// Ordinary fires waiting for a publish slot.
    ready: VecDeque<Fire>,
    /// Catch-up fires, released at most `catchup_slice` per [`CATCHUP_SLICE`].
    catchup: VecDeque<Fire>,
    catchup_slice: u32,
    catchup_budget: u32,
    refill_at: Option<Instant>,
    retry: Vec<Fire>,
    retry_at: Option<Instant>,
    inflight: Acks,
    window: usize,
}

impl Pipeline {
    /// A pipeline of at most `window` publishes in flight, their acknowledgements arriving
    /// through `acks`, releasing at most `catchup_rate` catch-up fires per second (both at
    /// least 1: validated settings).
    pub(crate) fn new(window: usize, catchup_rate: u32, acks: Acks) -> Pipeline {
        let slice = u64::from(catchup_rate) * CATCHUP_SLICE.as_millis() as u64 / 1000;
        Pipeline {
            ready: VecDeque::new(),
            catchup: VecDeque::new(),
            // A rate below one per slice still releases one fire per slice.
            catchup_slice: u32::try_from(slice).unwrap_or(u32::MAX).max(1),
            catchup_budget: 0,
            refill_at: None,
            retry: Vec::new(),
            retry_at: None,
            inflight: acks,
            window,
        }
    }

    /// Queues a fire: catch-up fires behind the rate limit, others as ordinary fires.
    pub(crate) fn push(&mut self, fire: Fire) {
        match fire.trigger {
            Trigger::Catchup => self.catchup.push_back(fire),
            _ => self.ready.push_back(fire),
        }
    }

    /// Puts a fire back at the head of the ordinary queue (it was let through after a check,
    /// or the lease deadline held it back).
    pub(crate) fn push_front(&mut self, fire: Fire) {
        self.ready.push_front(fire);
    }

    /// A new catch-up begins: a full slice may be released at once.
    pub(crate) fn start_catchup(&mut self) {
        self.catchup_budget = self.catchup_slice;
    }

    /// The next fire to publish, if the window has room: ordinary fires first, then catch-up
    /// fires within the slice's budget.
    pub(crate) fn next(&mut self) -> Option<Fire> {
        if self.inflight.len() >= self.window {
            return None;
        }
        if let Some(fire) = self.ready.pop_front() {
            return Some(fire);
        }
        if self.catchup_budget > 0
            && let Some(fire) = self.catchup.pop_front()
        {
            self.catchup_budget -= 1;
            return Some(fire);
        }
        None
    }

    /// After a round of publishing: a catch-up that used up its slice resumes after the next.
    pub(crate) fn pace(&mut self, now: Instant) {
        if !self.catchup.is_empty() && self.catchup_budget == 0 && self.refill_at.is_none() {
            self.refill_at = Some(now + CATCHUP_SLICE);
        }
    }

    /// The slice is over: the next one's budget.
    pub(crate) fn refill(&mut self) {
        self.refill_at = None;
        self.catchup_budget = self.catchup_slice;
    }

    /// `fire` is about to be published at `now`: the number and reply subject of its publish,
    /// which is in flight from now on.
    pub(crate) fn reply_to(&mut self, fire: Fire, now: Instant) -> (u64, Subject) {
        self.inflight.reply_to(fire, now)
    }

    /// Publish `number` could not be sent: it leaves the window.
    pub(crate) fn unsent(&mut self, number: u64) {
        self.inflight.unsent(number);
    }

    /// A publish failed: the fire is published again (same message id) after [`RETRY_DELAY`].
    pub(crate) fn retry_later(&mut self, fire: Fire, now: Instant) {
        self.retry.push(fire);
        self.retry_at.get_or_insert(now + RETRY_DELAY);
    }

    /// The retry delay is over: failed fires go first, in their order.
    pub(crate) fn retry_now(&mut self) {
        self.retry_at = None;
        for fire in self.retry.drain(..).rev() {
            self.ready.push_front(fire);
        }
    }

    /// Dispatch goes first: while a burst is queued or the window is half full, fire-state
    /// writes wait.
    pub(crate) fn busy(&self) -> bool {
        !self.ready.is_empty() || self.inflight.len() >= self.window / 2
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// The next acknowledged or timed-out publish (pending while none is in flight).
    pub(crate) async fn next_ack(&mut self) -> Acked {
        self.inflight.next().await
    }

    /// An acknowledged publish already arrived, if any: never waits. During a burst the acks
    /// come back in runs, and taking a whole run before the next round of publishing saves a
    /// pass of the loop per ack. (Polling here does not lose a wake-up: the loop polls
    /// [`Pipeline::next_ack`] again before it sleeps.)
    pub(crate) fn ready_ack(&mut self) -> Option<Acked> {
        self.inflight.ready()
    }

    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    pub(crate) fn refill_at(&self) -> Option<Instant> {
        self.refill_at
    }

    /// Stops queuing: drops every queued and retried fire (the in-flight ones stay).
    pub(crate) fn drop_queued(&mut self) {
        self.ready.clear();
        self.catchup.clear();
        self.retry.clear();
        self.retry_at = None;
        self.refill_at = None;
    }

    /// Leadership lost: everything goes, including the acks awaited.
    pub(crate) fn clear(&mut self) {
        self.drop_queued();
        self.inflight.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    fn fire(nominal_ms: i64, trigger: Trigger) -> Fire {
        Fire { idx: 0, generation: 1, nominal_ms, trigger }
    }

    /// A pipeline whose acknowledgements never come.
    fn unanswered(window: usize, catchup_rate: u32) -> Pipeline {
        let acks = Acks::new("_INBOX.test", futures::stream::pending().boxed());
        Pipeline::new(window, catchup_rate, acks)
    }

    fn occupy(pipeline: &mut Pipeline, n: usize) {
        for ms in 0..n {
            pipeline.reply_to(fire(-(ms as i64), Trigger::Schedule), Instant::now());
        }
    }

    fn drain(pipeline: &mut Pipeline) -> Vec<i64> {
        std::iter::from_fn(|| pipeline.next()).map(|f| f.nominal_ms).collect()
    }

    type Queued = (i64, Trigger);

    #[test]
    fn ordinary_fires_go_first_and_catch_up_fires_wait_for_their_budget() {
        // (queued fires, budget started, expected order of release)
        let cases: [(&[Queued], bool, &[i64]); 4] = [
            (&[(1, Trigger::Schedule), (2, Trigger::Schedule)], false, &[1, 2]),
            (&[(1, Trigger::Catchup), (2, Trigger::Schedule)], false, &[2]),
            (&[(1, Trigger::Catchup), (2, Trigger::Schedule)], true, &[2, 1]),
            (&[(1, Trigger::Catchup), (2, Trigger::Catchup), (3, Trigger::Catchup)], true, &[1, 2]),
        ];
        for (queued, started, expected) in cases {
            // 20 per second: 2 per slice.
            let mut pipeline = unanswered(16, 20);
            for &(ms, trigger) in queued {
                pipeline.push(fire(ms, trigger));
            }
            if started {
                pipeline.start_catchup();
            }
            assert_eq!(drain(&mut pipeline), expected, "{queued:?} started={started}");
        }
    }

    #[test]
    fn a_used_up_slice_is_refilled_after_the_slice_period() {
        let mut pipeline = unanswered(16, 10); // one per slice
        for ms in 1..=3 {
            pipeline.push(fire(ms, Trigger::Catchup));
        }
        pipeline.start_catchup();
        assert_eq!(drain(&mut pipeline), [1]);
        let now = Instant::now();
        pipeline.pace(now);
        assert_eq!(pipeline.refill_at(), Some(now + CATCHUP_SLICE));
        pipeline.pace(now + CATCHUP_SLICE); // already armed: unchanged
        assert_eq!(pipeline.refill_at(), Some(now + CATCHUP_SLICE));
        pipeline.refill();
        assert_eq!((drain(&mut pipeline), pipeline.refill_at()), (vec![2], None));
        // A rate below one per slice still releases one per slice.
        let mut slow = unanswered(16, 1);
        slow.push(fire(1, Trigger::Catchup));
        slow.start_catchup();
        assert_eq!(drain(&mut slow), [1]);
    }

    #[test]
    fn the_window_bounds_publishes_in_flight() {
        // (window, in flight, queued ordinary fires, released)
        for (window, inflight, queued, released) in [(4, 0, 6, 4), (4, 3, 6, 1), (4, 4, 6, 0), (1, 0, 1, 1)] {
            let mut pipeline = unanswered(window, 100);
            occupy(&mut pipeline, inflight);
            for ms in 0..queued {
                pipeline.push(fire(ms, Trigger::Schedule));
            }
            let mut n = 0;
            while let Some(fire) = pipeline.next() {
                n += 1;
                pipeline.reply_to(fire, Instant::now());
                assert_eq!(fire.nominal_ms, n - 1);
            }
            assert_eq!(n, released, "window {window}, {inflight} in flight");
        }
    }

    #[test]
    fn failed_publishes_are_retried_first_in_their_order_after_the_delay() {
        let mut pipeline = unanswered(16, 100);
        pipeline.push(fire(10, Trigger::Schedule));
        let now = Instant::now();
        pipeline.retry_later(fire(1, Trigger::Schedule), now);
        pipeline.retry_later(fire(2, Trigger::Catchup), now + Duration::from_millis(5));
        assert_eq!(pipeline.retry_at(), Some(now + RETRY_DELAY), "the first failure sets the delay");
        assert_eq!(drain(&mut pipeline), [10]);
        pipeline.retry_now();
        assert_eq!((drain(&mut pipeline), pipeline.retry_at()), (vec![1, 2], None));
    }

    #[test]
    fn busy_while_a_burst_is_queued_or_the_window_half_full() {
        for (window, inflight, queued, busy) in
            [(8, 0, 0, false), (8, 3, 0, false), (8, 4, 0, true), (8, 0, 1, true)]
        {
            let mut pipeline = unanswered(window, 100);
            occupy(&mut pipeline, inflight);
            for ms in 0..queued {
                pipeline.push(fire(ms, Trigger::Schedule));
            }
            assert_eq!(pipeline.busy(), busy, "window {window}, {inflight} in flight, {queued} queued");
        }
    }

    #[test]
    fn acks_already_arrived_are_taken_without_waiting() {
        let (replies, receiver) = futures::channel::mpsc::unbounded();
        let acks = Acks::new("_INBOX.test", receiver.boxed());
        let mut pipeline = Pipeline::new(8, 100, acks);
        assert!(pipeline.ready_ack().is_none(), "nothing in flight");
        let now = Instant::now();
        let subjects: Vec<Subject> =
            [1, 2, 3].into_iter().map(|ms| pipeline.reply_to(fire(ms, Trigger::Schedule), now).1).collect();
        for (subject, payload) in [(&subjects[2], r#"{"stream":"D","seq":1}"#), (&subjects[0], "{}")] {
            replies.unbounded_send(crate::acks::answer_on(subject, None, payload)).unwrap();
        }
        let taken: Vec<(i64, bool)> = std::iter::from_fn(|| pipeline.ready_ack())
            .map(|(f, result)| (f.nominal_ms, result.is_ok()))
            .collect();
        assert_eq!(taken, [(3, true), (1, false)]);
        assert_eq!(pipeline.inflight(), 1, "the unanswered publish stays in flight");
        let (number, _) = pipeline.reply_to(fire(4, Trigger::Schedule), now);
        pipeline.unsent(number);
        assert_eq!(pipeline.inflight(), 1, "a publish not sent leaves the window");
    }

    #[test]
    fn clearing_drops_queues_retries_and_the_window() {
        let mut pipeline = unanswered(8, 100);
        occupy(&mut pipeline, 2);
        pipeline.push(fire(1, Trigger::Schedule));
        pipeline.push(fire(2, Trigger::Catchup));
        pipeline.retry_later(fire(3, Trigger::Schedule), Instant::now());
        pipeline.drop_queued();
        assert_eq!((pipeline.inflight(), pipeline.retry_at()), (2, None));
        pipeline.start_catchup();
        assert_eq!(drain(&mut pipeline), Vec::<i64>::new());
        pipeline.clear();
        assert_eq!(pipeline.inflight(), 0);
    }
}
