//! The rate limit's rules, pure: the generic cell rate algorithm (GCRA) as a schedule. A key's
//! state is its theoretical arrival time (TAT, microseconds since the epoch); a run arriving at
//! `now` starts at `max(now, TAT - τ)` and moves the TAT to `max(TAT, now) + T`, with the
//! emission interval `T = period / limit` and the tolerance `τ = T × (burst - 1)`. So in any
//! window of length `d` at most `burst + d / T` runs start, and a run is never refused a start:
//! it is given the earliest one the limit allows. A skipped run (`on_limit: skip`) is one whose
//! start would be later than `now`; it does not move the TAT.

use jetsched_shared::spec::OnLimit;

/// The limit of one key, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// `T`: the emission interval.
    pub(crate) interval: i64,
    /// `τ`: how far ahead of the TAT a run may start.
    pub(crate) tolerance: i64,
}

/// The state of a key as stored: its TAT, and since when it is throttled (the episode a
/// `limit.throttled` event was told for), if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyState {
    pub(crate) tat: i64,
    pub(crate) throttled_since: Option<i64>,
}

/// What the limit says of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Start at this time (now, or later: then the run waits for it).
    Start(i64),
    /// Skipped: it could not start now (`on_limit: skip`).
    Skip,
}

/// The decisions on a batch of runs arriving together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) decisions: Vec<Decision>,
    /// The state after the batch.
    pub(crate) state: KeyState,
    /// Whether the state changed (a write is needed).
    pub(crate) changed: bool,
    /// This batch began a throttling episode (tell it once).
    pub(crate) episode: bool,
}

impl Gcra {
    pub(crate) fn new(interval: i64, burst: u32) -> Gcra {
        let interval = interval.max(1);
        Gcra { interval, tolerance: interval.saturating_mul(i64::from(burst.max(1)) - 1) }
    }

    /// The start of a run arriving at `now`, and the TAT after it.
    pub(crate) fn reserve(&self, tat: i64, now: i64) -> (i64, i64) {
        let start = now.max(tat.saturating_sub(self.tolerance));
        (start, tat.max(now).saturating_add(self.interval))
    }

    /// Decides on runs arriving at `now`, in order (`on_limit` each). A throttling episode
    /// begins with the first run that cannot start at once after the key had drained (its TAT
    /// not after `now`) or had never throttled.
    pub(crate) fn decide(&self, state: KeyState, now: i64, runs: &[OnLimit]) -> Batch {
        let drained = state.tat <= now;
        let mut tat = state.tat;
        let mut throttled = false;
        let mut decisions = Vec::with_capacity(runs.len());
        for on_limit in runs {
            let (start, next) = self.reserve(tat, now);
            if start <= now || *on_limit == OnLimit::Delay {
                tat = next;
                decisions.push(Decision::Start(start));
            } else {
                decisions.push(Decision::Skip);
            }
            throttled |= start > now;
        }
        let episode = throttled && (state.throttled_since.is_none() || drained);
        let throttled_since = if episode { Some(now) } else { state.throttled_since };
        let next = KeyState { tat, throttled_since };
        Batch { decisions, changed: next != state, state: next, episode }
    }

    /// Up to `most` more starts reserved at `now` after `state`, each only while it would start
    /// at once (the key has that much burst left), so a block reserved ahead never delays a run
    /// nor begins a throttling episode. How many, and the state after them.
    pub(crate) fn ahead(&self, state: KeyState, now: i64, most: u32) -> (u32, KeyState) {
        let (mut tat, mut reserved) = (state.tat, 0);
        while reserved < most {
            let (start, next) = self.reserve(tat, now);
            if start > now {
                break;
            }
            (tat, reserved) = (next, reserved + 1);
        }
        (reserved, KeyState { tat, ..state })
    }
}

#[cfg(test)]
mod tests;
