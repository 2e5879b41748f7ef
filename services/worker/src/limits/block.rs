//! A worker's block of one concurrency key, pure: the slots its record holds for this worker
//! (`recorded`, as the worker last wrote them), the slots its runs may use (`cap`, never more
//! than `recorded`) and the runs using them. Time is a parameter (microseconds since the
//! epoch).
//!
//! - A run takes a slot of the block without a write only while the block is open (the latest
//!   record of the key the worker knows has no run waiting and no more slots taken than the
//!   limit, [`super::rules::block_open`]), its lease runs and a slot is free.
//! - A run that ends gives its slot back to the block; once the block is closed, the slot
//!   leaves it (`cap` shrinks to the slots in use) and a write gives it back to the key.
//! - Slots none of its runs used for a whole [`IDLE_US`] leave the block the same way, so a
//!   worker whose demand fell holds no slot it does not use.
//!
//! `cap` grows only after a write that added slots to the record is stored, and the record
//! shrinks only by the slots `cap` has already let go: the slots the worker's runs may use are
//! never more than the record counts.

use chrono::{DateTime, Duration, Utc};
use jetsched_shared::wire::LimitRecord;

use super::rules::{self, Claim, Decision};

/// How long a free slot of a block may go unused before it is given back, and the window the
/// worker's demand is measured over (microseconds).
pub(crate) const IDLE_US: i64 = 100_000;

/// One key's block in this worker.
#[derive(Debug, Default, Clone)]
pub(crate) struct LocalBlock {
    /// The block's slots in the record, as this worker last stored it.
    pub(crate) recorded: u32,
    /// The slots its runs may use.
    pub(crate) cap: u32,
    /// The slots its runs use.
    pub(crate) used: u32,
    /// Whether the latest record of the key this worker knows lets runs take from the block.
    pub(crate) open: bool,
    /// The block's lease end as last stored (microseconds).
    pub(crate) lease_until: i64,
    /// When the block was last stored (microseconds).
    pub(crate) written_at: i64,
    /// Runs still running on slots of a block the record lost (its lease ran out).
    orphans: u32,
    /// A write of the block is queued or in flight.
    pub(crate) writing: bool,
    /// Slots, and runs given one, added to the block by the write being prepared.
    granting: u32,
    granted_runs: u32,
    /// The least free slots seen since `window_start`.
    least_free: u32,
    window_start: i64,
    /// Runs that arrived in the current demand window and the one before.
    demand_start: i64,
    this: u32,
    last: u32,
}

impl LocalBlock {
    /// A run of the key arrives at `now`: counted in the demand.
    pub(crate) fn arrive(&mut self, now: i64) {
        self.roll(now);
        self.this = self.this.saturating_add(1);
    }

    /// Moves the demand windows on to `now`.
    fn roll(&mut self, now: i64) {
        let elapsed = now - self.demand_start;
        if elapsed >= IDLE_US {
            self.last = if elapsed < 2 * IDLE_US { self.this } else { 0 };
            self.this = 0;
            self.demand_start = now;
        }
    }

    /// Slots wanted beyond the block's (those the write being prepared adds included) and a
    /// claiming run's own: the runs of the last window, at most `most` in all.
    pub(crate) fn want(&self, most: u32) -> u32 {
        self.this.max(self.last).min(most).saturating_sub(self.cap + self.granting + 1)
    }

    fn free(&self) -> u32 {
        self.cap.saturating_sub(self.used)
    }

    fn note_free(&mut self) {
        self.least_free = self.least_free.min(self.free());
    }

    /// A run takes a slot of the block at `now`, if it is open, its lease runs and one is free.
    pub(crate) fn take(&mut self, now: i64) -> bool {
        if !self.open || now > self.lease_until || self.used >= self.cap {
            return false;
        }
        self.used += 1;
        self.note_free();
        true
    }

    /// A run of the block ended: its slot goes back to the block, or leaves it when the block is
    /// closed. Returns whether a write is needed to give slots back.
    pub(crate) fn give(&mut self) -> bool {
        if self.orphans > 0 {
            self.orphans -= 1;
            return self.needs_write();
        }
        self.used = self.used.saturating_sub(1);
        if !self.open {
            self.cap = self.used;
        }
        self.note_free();
        self.needs_write()
    }

    /// The latest known record opens or closes the block; a closed one keeps only the slots in
    /// use. Returns whether a write is needed to give slots back.
    pub(crate) fn judge(&mut self, open: bool) -> bool {
        self.open = open;
        if !open {
            self.cap = self.used;
            self.note_free();
        }
        self.needs_write()
    }

    /// Slots the record holds that the block has let go.
    pub(crate) fn surplus(&self) -> u32 {
        self.recorded.saturating_sub(self.cap)
    }

    /// Whether slots are to be given back and no write of the block is under way.
    pub(crate) fn needs_write(&self) -> bool {
        self.surplus() > 0 && !self.writing
    }

    /// A write is being prepared (again, after a lost race): no slot granted by it yet.
    pub(crate) fn round(&mut self) {
        self.granting = 0;
        self.granted_runs = 0;
    }

    /// The write being prepared adds `granted` slots to the block for a run, its own among them.
    pub(crate) fn grant(&mut self, granted: u32) {
        self.granting += granted;
        self.granted_runs += 1;
    }

    /// Decides, in the write being prepared, the claim of a run that may hold a slot of this
    /// block (a first delivery the key does not know): a slot granted to the block by a claim
    /// before it in the same write, else slots granted now ([`rules::grant_block`], sized by
    /// the demand, at most `most` in all). `None` when the claim is to be decided by
    /// [`rules::acquire`]. A decision `Block { granted: 0 }` changed nothing in the record.
    pub(crate) fn claim(
        &mut self,
        record: &mut LimitRecord,
        claim: &Claim<'_>,
        most: u32,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> Option<Decision> {
        let unknown = !record.holders.contains_key(claim.execution_id)
            && !record.waiters.iter().any(|w| w.execution_id == claim.execution_id);
        if record.waiters.is_empty() && unknown && self.take_granted() {
            return Some(Decision::Block { granted: 0 });
        }
        let want = self.want(most);
        let granted = rules::grant_block(record, claim, want, self.recorded, self.used, now, lease)?;
        self.grant(granted);
        Some(Decision::Block { granted })
    }

    /// A run whose claim is in the same write as a grant takes one of the slots granted beyond
    /// the claims before it, if one is left (they are not in `cap` yet, so no run took them).
    fn take_granted(&mut self) -> bool {
        if self.granting <= self.granted_runs {
            return false;
        }
        self.granted_runs += 1;
        true
    }

    /// The write is stored: the record holds `recorded` slots for this worker under a lease
    /// until `lease_until` (at `now`), and the runs it granted slots to use them.
    pub(crate) fn stored(&mut self, recorded: u32, lease_until: i64, now: i64) {
        self.cap = (self.cap + self.granting).min(recorded);
        self.used += self.granted_runs;
        self.round();
        self.recorded = recorded;
        if self.used > recorded {
            // The record lost slots its runs use (the block's lease ran out): they run on.
            self.orphans += self.used - recorded;
            self.used = recorded;
        }
        if !self.open {
            self.cap = self.cap.min(self.used);
        }
        self.note_free();
        if recorded == 0 {
            self.lease_until = 0;
        } else {
            self.lease_until = lease_until;
            self.written_at = now;
        }
    }

    /// The record holds no block of this worker any more (its lease ran out): its runs run on,
    /// none takes from it.
    pub(crate) fn lost(&mut self) {
        self.orphans += self.used;
        self.used = 0;
        self.recorded = 0;
        self.cap = 0;
        self.lease_until = 0;
    }

    /// Runs still running on slots of a block the record lost.
    #[cfg(test)]
    pub(crate) fn orphans(&self) -> u32 {
        self.orphans
    }

    /// Whether nothing is left to remember at `now`: no slot, no run, no write, no demand for
    /// two windows.
    pub(crate) fn forgotten(&self, now: i64) -> bool {
        self.recorded == 0
            && self.used == 0
            && self.orphans == 0
            && !self.writing
            && self.granting == 0
            && now - self.demand_start > 2 * IDLE_US
    }

    /// When the block needs its worker next, if it holds slots: now when slots are to be given
    /// back, else at the end of the idle window or a third of a lease after it was stored (to
    /// renew it), whichever comes first.
    pub(crate) fn due(&self, lease_us: i64) -> Option<i64> {
        if self.recorded == 0 || self.writing {
            return None;
        }
        if self.surplus() > 0 {
            return Some(0);
        }
        // Every window's end, free slots or not: a run that ends frees one with no call here.
        let renew = self.written_at + lease_us / 3;
        Some((self.window_start + IDLE_US).min(renew))
    }

    /// At `now`: slots free through a whole idle window leave the block, but for those the
    /// demand of the last windows still wants (at most `most`), and a new window starts.
    /// Returns whether a write is due: slots to give back, or the lease to renew.
    pub(crate) fn tick(&mut self, now: i64, lease_us: i64, most: u32) -> bool {
        if now >= self.window_start + IDLE_US {
            self.roll(now);
            let keep = self.this.max(self.last).min(most);
            let unused = self.least_free.min(self.free()).min(self.cap.saturating_sub(keep));
            self.cap -= unused;
            self.window_start = now;
            self.least_free = self.free();
        }
        self.surplus() > 0 || (self.recorded > 0 && now >= self.written_at + lease_us / 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: i64 = 30_000_000;

    fn block(recorded: u32) -> LocalBlock {
        let mut block = LocalBlock::default();
        block.judge(true);
        block.grant(recorded);
        block.stored(recorded, LEASE, 0);
        assert!(!block.give());
        block.least_free = recorded;
        block
    }

    #[test]
    fn runs_take_free_slots_of_an_open_block_only() {
        let mut b = block(2);
        assert!(b.take(1) && b.take(2));
        assert!(!b.take(3), "full");
        assert!(!b.give(), "open: the slot stays in the block");
        assert!(!b.take(LEASE + 1), "lease over");
        assert!(b.judge(false), "closed: the free slot leaves");
        assert_eq!((b.cap, b.used, b.surplus()), (1, 1, 1));
        assert!(!b.take(5), "closed");
        b.writing = true;
        assert!(!b.give(), "a write is under way");
        assert_eq!((b.cap, b.surplus()), (0, 2));
        b.writing = false;
        b.stored(0, 0, 5);
        assert_eq!((b.recorded, b.surplus(), b.due(LEASE)), (0, 0, None));
    }

    #[test]
    fn unused_slots_leave_after_an_idle_window_and_the_lease_is_renewed() {
        let mut b = block(4);
        assert!(b.take(10));
        assert!(b.take(20));
        assert!(!b.give());
        // 2 slots were never used during the window (least free 2).
        assert_eq!(b.due(LEASE), Some(IDLE_US));
        assert!(b.tick(IDLE_US, LEASE, 8));
        assert_eq!((b.cap, b.used, b.surplus()), (2, 1, 2));
        b.stored(2, LEASE + IDLE_US, IDLE_US);
        assert!(!b.tick(IDLE_US + 1, LEASE, 8));
        // The last free slot goes after the next window; then only the renewal is due.
        assert!(b.tick(2 * IDLE_US, LEASE, 8));
        b.stored(1, LEASE + 2 * IDLE_US, 2 * IDLE_US);
        assert_eq!(b.due(LEASE), Some(3 * IDLE_US));
        assert!(!b.tick(3 * IDLE_US, LEASE, 8), "nothing free, nothing to renew yet");
        assert!(b.tick(2 * IDLE_US + LEASE / 3, LEASE, 8), "renewal due");
    }

    #[test]
    fn slots_the_demand_still_wants_stay_in_the_block() {
        let mut b = block(6);
        for i in 0..4 {
            b.arrive(i);
        }
        assert!(b.take(10));
        // 5 free all window long, but 4 runs came in it: 2 leave, 4 stay.
        assert!(b.tick(IDLE_US, LEASE, 8));
        assert_eq!((b.cap, b.surplus()), (4, 2));
        b.stored(4, LEASE + IDLE_US, IDLE_US);
        // After a quiet window the demand is gone, and so are the free slots.
        assert!(b.tick(2 * IDLE_US, LEASE, 8));
        assert_eq!((b.cap, b.used), (1, 1));
    }

    #[test]
    fn a_grant_adds_slots_after_its_write_and_demand_sizes_it() {
        let mut b = LocalBlock::default();
        for i in 0..40 {
            b.arrive(i);
        }
        assert_eq!(b.want(32), 31, "at most 32 in all, the claiming run's among them");
        b.judge(true);
        b.grant(8);
        b.round();
        b.grant(8);
        b.stored(8, LEASE, 50);
        assert_eq!((b.cap, b.used), (8, 1), "counted once, after the write");
        assert_eq!(b.want(32), 23);
        b.arrive(IDLE_US * 3);
        assert_eq!(b.want(32), 0, "a quiet window forgets the demand");
    }
}
