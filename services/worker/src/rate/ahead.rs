//! Starts a worker reserves ahead for a busy key, pure: beside a write it needs anyway, a worker
//! reserves as many more starts as its runs of the key took in the last [`HORIZON_US`] (at most
//! [`MOST`], and only starts that begin at once: never more than the key's burst has left), then
//! hands them to the next runs without a write. One compare-and-set thus serves a worker's runs
//! of the next ~100 ms instead of one round trip's worth, and workers sharing a key conflict
//! that much less.
//!
//! Every start of a block is a GCRA reservation made at its write, so the stored TAT counts it:
//! the sum of all workers' reservations never exceeds what the limit allows. An unused start is
//! not given back, it expires [`HORIZON_US`] after its write: giving it back would move the TAT
//! down, and the rules rely on a TAT that never goes down (a decision from a stale state that
//! writes nothing is never wrong). The cost is starts lost when demand falls, only on a key with
//! burst to spare. A run given a start of a block starts at most [`HORIZON_US`] after the start
//! was reserved.

use super::gcra::Gcra;

/// How long a block's starts last, and the window its size is measured over (microseconds).
pub(crate) const HORIZON_US: i64 = 100_000;

/// The most starts one block reserves.
pub(crate) const MOST: u32 = 1_000;

/// One key's demand in this worker and the starts it reserved ahead.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    block: Option<Block>,
    /// Runs that arrived in the current window, and in the one before it.
    window_start: i64,
    this: u32,
    last: u32,
}

/// Starts reserved by one write, for runs of one limit's settings.
#[derive(Debug)]
struct Block {
    gcra: Gcra,
    left: u32,
    reserved_at: i64,
}

impl Ahead {
    /// A run of the key arrives at `now`: counted in the demand.
    pub(crate) fn arrive(&mut self, now: i64) {
        let elapsed = now - self.window_start;
        if elapsed >= HORIZON_US {
            self.last = if elapsed < 2 * HORIZON_US { self.this } else { 0 };
            self.this = 0;
            self.window_start = now;
        }
        self.this = self.this.saturating_add(1);
    }

    /// A start of the block for a run of `gcra` at `now` (the time it was reserved), if one is
    /// left and has not expired.
    pub(crate) fn take(&mut self, gcra: Gcra, now: i64) -> Option<i64> {
        let block = self.block.as_mut()?;
        if block.gcra != gcra || block.left == 0 || now - block.reserved_at > HORIZON_US {
            return None;
        }
        block.left -= 1;
        Some(block.reserved_at)
    }

    /// How many starts to reserve ahead beside a write deciding `runs` runs: the runs expected
    /// in the next window besides them.
    pub(crate) fn wanted(&self, runs: usize) -> u32 {
        let expected = self.this.max(self.last);
        expected.saturating_sub(u32::try_from(runs).unwrap_or(u32::MAX)).min(MOST)
    }

    /// The starts a write reserved ahead at `at` (the block before them expires unused).
    pub(crate) fn fill(&mut self, gcra: Gcra, left: u32, at: i64) {
        self.block = (left > 0).then_some(Block { gcra, left, reserved_at: at });
    }

    /// Forgets the block (the key's state is no longer known).
    pub(crate) fn drop_block(&mut self) {
        self.block = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_sized_by_the_last_window_and_its_starts_expire() {
        let gcra = Gcra::new(10, 1_000);
        let mut ahead = Ahead::default();
        for i in 0..50 {
            ahead.arrive(1_000_000 + i);
        }
        // 50 runs this window: a write for 2 reserves 48 more.
        assert_eq!(ahead.wanted(2), 48);
        ahead.fill(gcra, 48, 1_000_100);
        assert_eq!(ahead.take(Gcra::new(20, 1_000), 1_000_200), None, "other settings");
        assert_eq!(ahead.take(gcra, 1_000_200), Some(1_000_100));
        assert_eq!(ahead.take(gcra, 1_000_100 + HORIZON_US + 1), None, "expired");
        // The next window remembers the last one's demand; a quiet one forgets it.
        ahead.arrive(1_000_000 + HORIZON_US);
        assert_eq!(ahead.wanted(0), 50);
        ahead.arrive(1_000_000 + 4 * HORIZON_US);
        assert_eq!(ahead.wanted(0), 1);
        assert_eq!(Ahead::default().wanted(5), 0);
    }

    #[test]
    fn a_block_hands_out_no_more_than_it_reserved() {
        let gcra = Gcra::new(10, 1_000);
        let mut ahead = Ahead::default();
        ahead.fill(gcra, 3, 0);
        let taken = (0..10).filter_map(|_| ahead.take(gcra, 5)).count();
        assert_eq!(taken, 3);
        ahead.fill(gcra, 0, 10);
        assert_eq!(ahead.take(gcra, 10), None);
    }
}
