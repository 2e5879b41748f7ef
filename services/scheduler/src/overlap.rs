//! The overlap part: tasks with overlap `skip`, `buffer_one`, `cancel_other` or `replace` take
//! turns. A fire whose task's previous scheduled run may still be going is held while that
//! run's record is read (or, for `buffer_one`, watched; for `cancel_other` and `replace`, the
//! run cancelled as the policy says and then watched) in a future of its own; the loop gets the
//! decision back as an event. At most one fire per task waits: under `skip` and `buffer_one`
//! a further fire is skipped, under `cancel_other` and `replace` it takes the waiting fire's
//! place (the newest wins). `allow` tasks never come here.
//!
//! The rules and the reads are in `overlap/rules.rs`, the cancels of `cancel_other` and
//! `replace` in `overlap/room.rs`; this part keeps each gated task's turn.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::future::{AbortHandle, Aborted, BoxFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use jetsched_shared::spec::OverlapPolicy;

use crate::fire::Fire;

mod room;
mod rules;

pub(crate) use room::{Queued, Room};
pub(crate) use rules::{Decision, Previous, Prior, newest_wins};

/// A held fire and the decision on it (`Err`: the check was cancelled).
pub(crate) type Checked = (Fire, Result<anyhow::Result<Decision>, Aborted>);

/// What happens to a fire now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Publish it.
    Publish,
    /// Skip it (reason overlap): another fire of the task already waits.
    Skip,
    /// Hold it and check the previous run (its nominal ms, and how it is known) first.
    Check(i64, Previous),
}

/// The turn of one gated task while leader.
struct Turn {
    generation: u32,
    /// The latest scheduled fire this leader let through (nominal ms).
    last_ms: Option<i64>,
    /// The one fire being checked or buffered, and the handle cancelling its read or watch.
    waiting: Option<(Fire, AbortHandle)>,
}

/// Every gated task's turn and the checks under way.
#[derive(Default)]
pub(crate) struct Overlap {
    turns: HashMap<u32, Turn>,
    checks: FuturesUnordered<BoxFuture<'static, Checked>>,
    /// The waiting fire the last admitted one took the place of (`cancel_other`, `replace`).
    replaced: Option<Fire>,
}

impl Overlap {
    /// Whether `fire` of a task with `policy` may be published now; `done_ms` is the task's
    /// last handled fire as the fire state says.
    pub(crate) fn admit(&mut self, fire: Fire, policy: OverlapPolicy, done_ms: Option<i64>) -> Admission {
        if !rules::gated(policy) {
            return Admission::Publish;
        }
        let turn = self.turns.entry(fire.idx).or_insert(Turn {
            generation: fire.generation,
            last_ms: None,
            waiting: None,
        });
        if turn.generation != fire.generation {
            *turn = Turn { generation: fire.generation, last_ms: None, waiting: None };
        }
        // Let through already: a publish retry, or the decision's own re-queued fire.
        if turn.last_ms.is_some_and(|last| last >= fire.nominal_ms) {
            return Admission::Publish;
        }
        // The newest fire wins: the one waiting gives way (its check is dropped).
        if rules::newest_wins(policy)
            && let Some((waiting, check)) = turn.waiting.take()
        {
            check.abort();
            self.replaced = Some(waiting);
        }
        // The previous scheduled fire: the one this leader let through, else the fire state's.
        let prior = match turn.last_ms {
            Some(ms) => Some((ms, Previous::Dispatched)),
            None => done_ms.map(|ms| (ms, Previous::Inherited)),
        };
        match (rules::arrive(turn.waiting.is_some(), prior.is_some()), prior) {
            (rules::Arrival::Dispatch, _) | (rules::Arrival::Check, None) => {
                turn.last_ms = Some(fire.nominal_ms);
                Admission::Publish
            }
            (rules::Arrival::Skip, _) => Admission::Skip,
            (rules::Arrival::Check, Some((ms, previous))) => Admission::Check(ms, previous),
        }
    }

    /// The waiting fire the last admitted fire took the place of, once: it is not dispatched.
    pub(crate) fn take_replaced(&mut self) -> Option<Fire> {
        self.replaced.take()
    }

    /// Holds `fire` (after [`Admission::Check`]) while the previous run is read from `runs`
    /// (`skip`), or watched until it ends (`buffer_one`).
    pub(crate) fn check(&mut self, fire: Fire, policy: OverlapPolicy, prior: Prior, runs: Arc<kv::Store>) {
        let check = match policy {
            OverlapPolicy::BufferOne => {
                rules::wait_idle(runs, prior).map(|r| r.map(|()| Decision::Dispatch)).boxed()
            }
            _ => rules::is_going(runs, prior).map(move |r| r.map(|g| rules::decision(policy, g))).boxed(),
        };
        self.hold(fire, check);
    }

    /// Holds `fire` (after [`Admission::Check`], `cancel_other` or `replace`) while the previous
    /// run is cancelled as the policy says and until it has ended ([`Room::make`]).
    pub(crate) fn make_room(&mut self, fire: Fire, room: Room) {
        self.hold(fire, room.make().map(|r| r.map(|()| Decision::Dispatch)).boxed());
    }

    fn hold(&mut self, fire: Fire, check: BoxFuture<'static, anyhow::Result<Decision>>) {
        let (check, handle) = futures::future::abortable(check);
        if let Some(turn) = self.turns.get_mut(&fire.idx) {
            turn.waiting = Some((fire, handle));
        }
        self.checks.push(check.map(move |result| (fire, result)).boxed());
    }

    /// The decision on a held fire; `None` when it no longer matters (the task went away or
    /// changed, or leadership was lost meanwhile). A read that failed lets the fire through.
    pub(crate) fn decided(&mut self, (fire, result): Checked) -> Option<Decision> {
        let result = result.ok()?; // cancelled: the task went away
        let turn = self.turns.get_mut(&fire.idx)?;
        if turn.generation != fire.generation
            || turn.waiting.as_ref().map(|w| w.0.nominal_ms) != Some(fire.nominal_ms)
        {
            return None;
        }
        turn.waiting = None;
        let decision = result.unwrap_or_else(|error| {
            tracing::warn!(
                error = format!("{error:#}"),
                nominal = fire.nominal_ms,
                "cannot read the previous run; dispatching"
            );
            Decision::Dispatch
        });
        if decision == Decision::Dispatch {
            turn.last_ms = Some(fire.nominal_ms);
        }
        Some(decision)
    }

    /// The next decided check (pending while none is under way).
    pub(crate) async fn next(&mut self) -> Checked {
        match self.checks.next().await {
            Some(checked) => checked,
            None => std::future::pending().await,
        }
    }

    /// A task went away: its held fire is dropped.
    pub(crate) fn remove(&mut self, idx: u32) {
        if let Some(Turn { waiting: Some((_, check)), .. }) = self.turns.remove(&idx) {
            check.abort();
        }
    }

    /// Leadership lost: held fires are dropped with their checks; the next leader re-evaluates.
    pub(crate) fn clear(&mut self) {
        self.turns.clear();
        self.checks = FuturesUnordered::new();
        self.replaced = None;
    }
}

/// The age of a previous fire at `now_ms` (zero if it lies ahead).
pub(crate) fn age(prior_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_ms - prior_ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use jetsched_shared::wire::Trigger;

    use super::*;

    fn fire(nominal_ms: i64, generation: u32) -> Fire {
        Fire { idx: 3, generation, nominal_ms, trigger: Trigger::Schedule }
    }

    /// Holds `fire` as `check` would, with a check that never ends.
    fn hold(overlap: &mut Overlap, fire: Fire) {
        let (check, handle) = futures::future::abortable(std::future::pending::<anyhow::Result<Decision>>());
        overlap.turns.get_mut(&fire.idx).expect("turn").waiting = Some((fire, handle));
        overlap.checks.push(check.map(move |result| (fire, result)).boxed());
    }

    /// (fire nominal, generation, fire-state done) -> admission.
    type Step = (i64, u32, Option<i64>, Admission);

    #[test]
    fn fires_take_turns() {
        use Admission::*;
        // Steps: (fire nominal, generation, fire-state done, hold it if checked) -> admission.
        let cases: [(&str, OverlapPolicy, &[Step]); 5] = [
            (
                "allow is never gated",
                OverlapPolicy::Allow,
                &[(1000, 1, Some(0), Publish), (2000, 1, None, Publish)],
            ),
            (
                "the first fire of a leader without fire state goes, the next is checked",
                OverlapPolicy::Skip,
                &[(1000, 1, None, Publish), (2000, 1, None, Check(1000, Previous::Dispatched))],
            ),
            (
                "a fire-state fire is checked as inherited; one waiting fire skips the next",
                OverlapPolicy::BufferOne,
                &[(1000, 1, Some(0), Check(0, Previous::Inherited)), (2000, 1, Some(0), Skip)],
            ),
            (
                "a retried publish of a fire let through goes again",
                OverlapPolicy::Skip,
                &[(1000, 1, None, Publish), (1000, 1, None, Publish)],
            ),
            (
                "a new generation (the task re-created) starts over",
                OverlapPolicy::Skip,
                &[(1000, 1, Some(0), Check(0, Previous::Inherited)), (2000, 2, None, Publish)],
            ),
        ];
        for (what, policy, steps) in cases {
            let mut overlap = Overlap::default();
            for &(nominal, generation, done, expected) in steps {
                let fire = fire(nominal, generation);
                let admission = overlap.admit(fire, policy, done);
                assert_eq!(admission, expected, "{what}: fire {nominal}");
                if let Check(..) = admission {
                    hold(&mut overlap, fire);
                }
            }
        }
    }

    #[test]
    fn a_decision_applies_only_to_the_fire_still_held() {
        let mut overlap = Overlap::default();
        assert_eq!(
            overlap.admit(fire(1000, 1), OverlapPolicy::Skip, Some(0)),
            Admission::Check(0, Previous::Inherited)
        );
        hold(&mut overlap, fire(1000, 1));
        // A stale decision (another nominal, or cancelled) changes nothing.
        assert_eq!(overlap.decided((fire(5000, 1), Ok(Ok(Decision::Dispatch)))), None);
        assert_eq!(overlap.decided((fire(1000, 1), Err(Aborted))), None);
        // A failed read lets the fire through and makes it the previous fire.
        let failed = Ok(Err(anyhow::anyhow!("no server")));
        assert_eq!(overlap.decided((fire(1000, 1), failed)), Some(Decision::Dispatch));
        assert_eq!(overlap.admit(fire(1000, 1), OverlapPolicy::Skip, Some(0)), Admission::Publish);
        assert_eq!(
            overlap.admit(fire(2000, 1), OverlapPolicy::Skip, Some(0)),
            Admission::Check(1000, Previous::Dispatched)
        );
        hold(&mut overlap, fire(2000, 1));
        assert_eq!(overlap.decided((fire(2000, 1), Ok(Ok(Decision::Skip)))), Some(Decision::Skip));
        assert_eq!(
            overlap.admit(fire(3000, 1), OverlapPolicy::Skip, Some(0)),
            Admission::Check(1000, Previous::Dispatched),
            "a skipped fire is not the previous run"
        );
        overlap.remove(3);
        overlap.clear();
        assert_eq!(overlap.admit(fire(4000, 1), OverlapPolicy::Skip, None), Admission::Publish);
    }

    #[test]
    fn under_cancel_other_and_replace_the_newest_fire_takes_the_waiting_ones_place() {
        for policy in [OverlapPolicy::CancelOther, OverlapPolicy::Replace] {
            let mut overlap = Overlap::default();
            assert_eq!(overlap.admit(fire(1000, 1), policy, None), Admission::Publish);
            assert_eq!(overlap.take_replaced(), None);
            let checked = Admission::Check(1000, Previous::Dispatched);
            assert_eq!(overlap.admit(fire(2000, 1), policy, None), checked, "{policy:?}");
            hold(&mut overlap, fire(2000, 1));
            // The third fire waits instead of the second, checked against the same run.
            assert_eq!(overlap.admit(fire(3000, 1), policy, None), checked, "{policy:?}");
            assert_eq!(overlap.take_replaced(), Some(fire(2000, 1)), "{policy:?}");
            assert_eq!(overlap.take_replaced(), None, "told once");
            hold(&mut overlap, fire(3000, 1));
            // The replaced fire's decision, should it come, changes nothing.
            assert_eq!(overlap.decided((fire(2000, 1), Ok(Ok(Decision::Dispatch)))), None);
            assert_eq!(
                overlap.decided((fire(3000, 1), Ok(Ok(Decision::Dispatch)))),
                Some(Decision::Dispatch)
            );
            assert_eq!(
                overlap.admit(fire(4000, 1), policy, None),
                Admission::Check(3000, Previous::Dispatched),
                "the newest fire is the previous run now"
            );
        }
        // Under buffer_one the waiting fire stays, the new one is skipped.
        let mut overlap = Overlap::default();
        overlap.admit(fire(1000, 1), OverlapPolicy::BufferOne, None);
        overlap.admit(fire(2000, 1), OverlapPolicy::BufferOne, None);
        hold(&mut overlap, fire(2000, 1));
        assert_eq!(overlap.admit(fire(3000, 1), OverlapPolicy::BufferOne, None), Admission::Skip);
        assert_eq!(overlap.take_replaced(), None);
    }

    proptest::proptest! {
        /// Against a model, under `cancel_other` and `replace`: whatever the order of fires
        /// and decisions, each fire is published once, replaced, or the one waiting; at most
        /// one waits; a new fire is checked against the last fire published; nothing is skipped.
        #[test]
        fn the_newest_fire_waits_and_every_fire_is_published_or_replaced_once(
            steps in proptest::collection::vec(proptest::bool::ANY, 1..60),
            replace in proptest::bool::ANY,
        ) {
            let policy = if replace { OverlapPolicy::Replace } else { OverlapPolicy::CancelOther };
            let mut overlap = Overlap::default();
            let (mut published, mut replaced, mut waiting) = (Vec::new(), Vec::new(), None::<i64>);
            let mut next = 1000;
            for fires in steps {
                if fires {
                    let nominal = next;
                    next += 1000;
                    let admission = overlap.admit(fire(nominal, 1), policy, None);
                    let gave_way = overlap.take_replaced().map(|f| f.nominal_ms);
                    proptest::prop_assert_eq!(gave_way, waiting.take());
                    replaced.extend(gave_way);
                    match admission {
                        Admission::Publish => {
                            proptest::prop_assert!(published.is_empty(), "only the first fire goes unchecked");
                            published.push(nominal);
                        }
                        Admission::Check(prior, Previous::Dispatched) => {
                            proptest::prop_assert_eq!(Some(&prior), published.last());
                            hold(&mut overlap, fire(nominal, 1));
                            waiting = Some(nominal);
                        }
                        other => proptest::prop_assert!(false, "{other:?}"),
                    }
                } else if let Some(nominal) = waiting.take() {
                    let decided = overlap.decided((fire(nominal, 1), Ok(Ok(Decision::Dispatch))));
                    proptest::prop_assert_eq!(decided, Some(Decision::Dispatch));
                    // The loop queues it again; it goes through as the fire let through.
                    proptest::prop_assert_eq!(overlap.admit(fire(nominal, 1), policy, None), Admission::Publish);
                    published.push(nominal);
                }
            }
            let mut all: Vec<i64> = published.iter().chain(&replaced).chain(waiting.iter()).copied().collect();
            all.sort_unstable();
            let expected: Vec<i64> = (1..next / 1000).map(|n| n * 1000).collect();
            proptest::prop_assert_eq!(all, expected, "each fire once");
            proptest::prop_assert!(published.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn the_age_of_a_previous_fire_is_never_negative() {
        assert_eq!(age(1000, 3500), Duration::from_millis(2500));
        assert_eq!(age(5000, 3500), Duration::ZERO);
    }
}
