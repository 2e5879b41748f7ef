//! Which lane a free permit of a queue goes to: the policy (weighted or strict) and the reserve.
//! Pure logic: the lane loop tells it which lanes have work and what is running.

use jetsched_shared::priority::{PerPriority, Priority};

use crate::config::PolicyKind;

/// The policy of one queue, with the round-robin credit of each lane.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    kind: PolicyKind,
    weights: PerPriority,
    credit: [i64; 4],
}

impl Policy {
    pub(crate) fn new(kind: PolicyKind, weights: PerPriority) -> Policy {
        Policy { kind, weights, credit: [0; 4] }
    }

    /// The lane the next permit goes to among the `ready` ones (indexed by
    /// [`Priority::index`]), or `None` when none is ready.
    pub(crate) fn pick(&mut self, ready: [bool; 4]) -> Option<Priority> {
        let ready_lanes = || Priority::ALL.into_iter().filter(|p| ready[p.index()]);
        match self.kind {
            PolicyKind::Strict => ready_lanes().next(),
            PolicyKind::Weighted => {
                let weight = |p: Priority| i64::try_from(self.weights.get(p).max(1)).unwrap_or(i64::MAX);
                let total: i64 = ready_lanes().map(weight).sum();
                for priority in Priority::ALL {
                    if ready[priority.index()] {
                        self.credit[priority.index()] += weight(priority);
                    } else {
                        // A lane without work gathers no credit for later.
                        self.credit[priority.index()] = 0;
                    }
                }
                // Ties go to the most urgent lane (`max_by_key` keeps the last maximum).
                let chosen = ready_lanes().rev().max_by_key(|p| self.credit[p.index()])?;
                self.credit[chosen.index()] -= total;
                Some(chosen)
            }
        }
    }
}

/// Permits kept for runs of a priority or a more urgent one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reserve(pub(crate) PerPriority);

impl Reserve {
    /// Whether a run of `priority` may take one of the `free` permits while `running` runs of
    /// each priority hold others: the part of the reserve of more urgent priorities their own
    /// runs do not use stays free.
    pub(crate) fn allows(&self, priority: Priority, running: [usize; 4], free: usize) -> bool {
        let held_back: usize = Priority::ALL
            .into_iter()
            .filter(|q| *q < priority)
            .map(|q| self.0.get(q).saturating_sub(running[q.index()]))
            .sum();
        free > held_back
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const WEIGHTS: PerPriority = PerPriority([8, 4, 2, 1]);

    #[test]
    fn strict_takes_the_most_urgent_lane_with_work() {
        let mut policy = Policy::new(PolicyKind::Strict, WEIGHTS);
        assert_eq!(policy.pick([false, false, false, false]), None);
        assert_eq!(policy.pick([false, true, true, true]), Some(Priority::High));
        assert_eq!(policy.pick([true, false, false, true]), Some(Priority::Critical));
        assert_eq!(policy.pick([false, false, false, true]), Some(Priority::Low));
    }

    #[test]
    fn weighted_follows_the_weights_in_every_cycle() {
        let mut policy = Policy::new(PolicyKind::Weighted, WEIGHTS);
        let mut counts = [0; 4];
        for _ in 0..15 {
            counts[policy.pick([true; 4]).unwrap().index()] += 1;
        }
        assert_eq!(counts, [8, 4, 2, 1]);
    }

    #[test]
    fn the_reserve_keeps_permits_for_urgent_runs() {
        let reserve = Reserve(PerPriority([2, 1, 0, 0]));
        // 3 free permits, nothing running: low may take only what is not reserved (0 here).
        assert!(!reserve.allows(Priority::Low, [0; 4], 3));
        assert!(reserve.allows(Priority::Low, [0; 4], 4));
        assert!(reserve.allows(Priority::High, [0; 4], 3));
        assert!(!reserve.allows(Priority::High, [0; 4], 2));
        assert!(reserve.allows(Priority::Critical, [0; 4], 1));
        // Critical runs use their reserve: it no longer holds permits back.
        assert!(reserve.allows(Priority::Low, [2, 1, 0, 0], 1));
        assert!(!reserve.allows(Priority::Critical, [0; 4], 0));
    }

    proptest! {
        /// With every lane busy, each lane's share of the starts is its weight's share within
        /// ±20%, for any weights.
        #[test]
        fn weighted_shares_match_the_weights(weights in proptest::array::uniform4(1usize..20), rounds in 1usize..20) {
            let weights = PerPriority(weights);
            let mut policy = Policy::new(PolicyKind::Weighted, weights);
            let picks = weights.total() * rounds;
            let mut counts = [0usize; 4];
            for _ in 0..picks {
                counts[policy.pick([true; 4]).unwrap().index()] += 1;
            }
            for priority in Priority::ALL {
                let expected = (weights.get(priority) * rounds) as f64;
                let got = counts[priority.index()] as f64;
                prop_assert!((got - expected).abs() <= expected * 0.2, "{priority}: {got} vs {expected}");
            }
        }

        /// Whatever lanes come and go, a lane with work is picked at least once in every run of
        /// `sum of weights` picks (no starvation), and the policy only picks lanes with work.
        #[test]
        fn weighted_never_starves_a_lane_with_work(
            weights in proptest::array::uniform4(1usize..10),
            readiness in proptest::collection::vec(proptest::array::uniform4(any::<bool>()), 1..200),
        ) {
            let weights = PerPriority(weights);
            let mut policy = Policy::new(PolicyKind::Weighted, weights);
            let window = weights.total();
            // Picks since each lane was last picked while it kept work all along.
            let mut waiting = [0usize; 4];
            for ready in readiness {
                let Some(chosen) = policy.pick(ready) else {
                    prop_assert!(ready.iter().all(|r| !r));
                    continue;
                };
                prop_assert!(ready[chosen.index()]);
                for priority in Priority::ALL {
                    let i = priority.index();
                    waiting[i] = if !ready[i] || priority == chosen { 0 } else { waiting[i] + 1 };
                    prop_assert!(waiting[i] < window, "{priority} waited {} picks", waiting[i]);
                }
            }
        }

        /// Strict never picks a lane while a more urgent one has work.
        #[test]
        fn strict_never_passes_over_an_urgent_lane(ready in proptest::array::uniform4(any::<bool>())) {
            let mut policy = Policy::new(PolicyKind::Strict, WEIGHTS);
            let expected = Priority::ALL.into_iter().find(|p| ready[p.index()]);
            prop_assert_eq!(policy.pick(ready), expected);
        }
    }
}
