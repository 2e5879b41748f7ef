//! Timer core: a hierarchical timing wheel with a sorted overflow map, holding every pending fire.
//!
//! Pure data structure: no I/O, no clock reads, no tokio. The caller passes `now` (Unix
//! milliseconds) to [`TimerWheel::advance`] and sleeps until [`TimerWheel::next_deadline`].
//!
//! # Semantics
//!
//! - One timer per key. Inserting an existing key reschedules it; a reschedule counts as a new
//!   insertion for ordering.
//! - Due times are exact `u64` milliseconds: an entry never fires before its due time and is
//!   reported with the due time it was given (cascading re-files entries by their exact due, so
//!   there is no rounding drift).
//! - `advance(now)` removes every timer with `due <= now`, in `(due, insertion)` order, and never
//!   one with `due > now`. A due time in the past (before the wheel's current time) fires on the
//!   next advance. Time going backwards (`now` below the wheel's current time) moves nothing; it
//!   only fires past-due entries that are `<= now`.
//!
//! # Design
//!
//! - Six levels of 64 slots: level `l` slots are `64^l` ms wide, so the wheel covers the aligned
//!   2^36 ms (~795 days) block holding the current time. An entry sits at the level of the
//!   highest 6-bit group in which its due differs from the current time (`due ^ current`), so
//!   level 0 slots hold exactly one millisecond each, and entries with equal due always share
//!   one slot list (which is why list order is insertion order within a due).
//! - Entries due in a later 2^36 block (one-shots years ahead) and entries inserted with a due in
//!   the past go to an overflow `BTreeMap<(due, seq), index>`: precise and sorted, used rarely.
//! - Entries live in a slab (`Vec` + free stack) with intrusive doubly linked slot lists, and a
//!   key index maps keys to slab indices ([`TimerKey::Index`]): a `Vec` for the scheduler's
//!   dense task-slot keys ([`DenseKey`]), a `HashMap` for any other key. Insert, cancel and
//!   reschedule are O(1) for wheel entries (O(log n) for overflow entries).
//! - Per-level `u64` occupancy bitmaps find the earliest occupied slot in O(levels). Each slot
//!   above level 0 keeps its exact minimum due and how many entries share it; the earliest slot's
//!   minimum is kept exact after every mutation (a rescan of that one slot only when all entries
//!   at its minimum were cancelled), so [`TimerWheel::next_deadline`] is O(levels) and exact.
//! - `advance` jumps from occupied slot to occupied slot (bitmaps), cascading higher-level slots
//!   as the current time enters them: amortised O(1) per timer (each entry cascades at most once
//!   per level).
//!
//! # Memory and speed
//!
//! A slab entry is 24 bytes for a 4-byte key; the dense index adds 4 bytes per key, a hash map
//! index 8 bytes plus one control byte per bucket and its growth slack.
//! [`TimerWheel::approx_memory_bytes`] at 1M timers: 29.4 bytes/timer with [`DenseKey`] (28.0
//! with [`TimerWheel::with_capacity`]), 44.0 with hashed `u32` keys, 77.6 for the heap baseline
//! below. Hashed keys other than `u32` are stored twice (slab and map), so a `String` key costs
//! its heap allocation twice.
//!
//! `cargo bench -p jetsched-scheduler --bench timer` (1M keys, release, a quiet 2-core machine,
//! 2026-11-29). The baseline is a lazy-deletion `BinaryHeap` + `HashMap` with the same
//! semantics. ns per timer:
//!
//! | operation at 1M timers                                           | dense | hashed | heap  |
//! |------------------------------------------------------------------|-------|--------|-------|
//! | insert 1M, dues over 1 hour                                      | 16    | 123    | 184   |
//! | insert 1M, dues over 1 day                                       | 16    | 128    | 184   |
//! | cancel 100k random keys                                          | 70    | 302    | 143   |
//! | advance a tenth of the period, re-insert at due + period, 1 h    | 305   | 609    | 1,431 |
//! | same, 1 day period                                               | 298   | 593    | 1,596 |
//! | steady 1,000 due per ms (1 s period), advance 1 ms at a time     | 55    | 182    | 810   |
//!
//! Advance figures are per fired timer and include `next_deadline`, the index removal and the
//! re-insert; at 1M timers they are dominated by cache misses (slab, index, list neighbours).
//! The dense index avoids the hashing and most of the index's cache misses (4 MB instead of
//! 16 MB); keys inserted in order also write it sequentially, hence the fast insert.

mod keys;

use std::collections::BTreeMap;
use std::num::NonZeroU16;

use self::keys::NIL;
pub use self::keys::{DenseIndex, DenseKey, KeyIndex, TimerKey};

/// Bits of time per level: 64 slots per level.
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
/// Levels in the wheel: 6 × 6 bits cover an aligned 2^36 ms block.
const LEVELS: usize = 6;
const WHEEL_BITS: u32 = SLOT_BITS * LEVELS as u32;
/// `Entry::loc` for an entry in the overflow map (wheel locations are `level * 64 + slot + 1`).
const OVERFLOW: u16 = u16::MAX;

/// A set of timers keyed by `K`, each with an exact due time in milliseconds.
#[derive(Debug)]
pub struct TimerWheel<K: TimerKey> {
    /// The wheel's current time: every wheel entry has `due >= current`.
    current: u64,
    /// Slab of entries; `None` marks a free index (listed in `free`).
    slab: Vec<Option<Entry<K>>>,
    free: Vec<u32>,
    index: K::Index,
    /// `LEVELS * SLOTS` slot lists, level-major.
    slots: Vec<Slot>,
    /// Per level, bit `s` set when slot `s` is non-empty.
    occupied: [u64; LEVELS],
    /// Entries outside the wheel's block: due in the past or in a later 2^36 ms block.
    overflow: BTreeMap<(u64, u64), u32>,
    /// Insertion sequence for overflow ordering.
    seq: u64,
}

#[derive(Debug)]
struct Entry<K> {
    key: K,
    due: u64,
    /// Wheel: neighbours in the slot list. Overflow: the two halves of the sequence number.
    prev: u32,
    next: u32,
    /// `level * 64 + slot + 1`, or `OVERFLOW`.
    loc: NonZeroU16,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    head: u32,
    tail: u32,
    /// Levels above 0: the minimum due in the slot, exact when `min_count > 0`.
    min: u64,
    /// How many entries have due `min`; 0 means `min` is unknown (needs a rescan).
    min_count: u32,
}

const EMPTY_SLOT: Slot = Slot { head: NIL, tail: NIL, min: u64::MAX, min_count: 0 };

/// Where an entry with `due >= current` belongs: `Some((level, slot))`, or `None` for overflow.
fn wheel_position(current: u64, due: u64) -> Option<(usize, usize)> {
    let diff = due ^ current;
    if diff >> WHEEL_BITS != 0 {
        return None;
    }
    let level = if diff < SLOTS as u64 { 0 } else { ((63 - diff.leading_zeros()) / SLOT_BITS) as usize };
    let slot = ((due >> (SLOT_BITS as usize * level)) as usize) & (SLOTS - 1);
    Some((level, slot))
}

/// Start time of `slot` at `level` within the block of `current` one level up.
fn slot_start(current: u64, level: usize, slot: usize) -> u64 {
    let shift = SLOT_BITS as usize * level;
    let upper_mask = u64::MAX << (shift + SLOT_BITS as usize);
    (current & upper_mask) | ((slot as u64) << shift)
}

fn top_block(t: u64) -> u64 {
    t >> WHEEL_BITS
}

fn loc_of(level: usize, slot: usize) -> NonZeroU16 {
    NonZeroU16::new((level * SLOTS + slot + 1) as u16).expect("wheel location is non-zero")
}

fn overflow_loc() -> NonZeroU16 {
    NonZeroU16::new(OVERFLOW).expect("OVERFLOW is non-zero")
}

impl<K: TimerKey> TimerWheel<K> {
    /// An empty wheel whose current time is `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::with_capacity(now_ms, 0)
    }

    /// An empty wheel with room for `capacity` timers before reallocating.
    pub fn with_capacity(now_ms: u64, capacity: usize) -> Self {
        Self {
            current: now_ms,
            slab: Vec::with_capacity(capacity),
            free: Vec::new(),
            index: K::Index::with_capacity(capacity),
            slots: vec![EMPTY_SLOT; LEVELS * SLOTS],
            occupied: [0; LEVELS],
            overflow: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Sets the timer of `key` to `due_ms`, replacing any timer it had. A due time at or before
    /// the wheel's current time fires on the next advance.
    pub fn insert(&mut self, key: K, due_ms: u64) {
        if let Some(idx) = self.index.get(&key) {
            self.move_entry(idx, due_ms);
            return;
        }
        let entry = Entry { key: key.clone(), due: due_ms, prev: NIL, next: NIL, loc: overflow_loc() };
        let idx = match self.free.pop() {
            Some(idx) => {
                self.slab[idx as usize] = Some(entry);
                idx
            }
            None => {
                let idx = u32::try_from(self.slab.len())
                    .ok()
                    .filter(|&i| i != NIL)
                    .expect("TimerWheel holds at most u32::MAX - 1 timers");
                self.slab.push(Some(entry));
                idx
            }
        };
        self.index.insert(key, idx);
        // A new entry never makes the earliest slot's minimum inexact: no `fix_earliest`.
        self.place(idx, due_ms);
    }

    /// Moves the timer of `key` to `due_ms`; `false` if `key` has no timer.
    pub fn reschedule(&mut self, key: &K, due_ms: u64) -> bool {
        match self.index.get(key) {
            Some(idx) => {
                self.move_entry(idx, due_ms);
                true
            }
            None => false,
        }
    }

    /// Removes the timer of `key`, returning its due time.
    pub fn cancel(&mut self, key: &K) -> Option<u64> {
        let idx = self.index.remove(key)?;
        self.unlink(idx);
        let entry = self.release(idx);
        self.fix_earliest();
        Some(entry.due)
    }

    /// The due time of `key`'s timer.
    pub fn due_of(&self, key: &K) -> Option<u64> {
        self.index.get(key).map(|idx| self.entry(idx).due)
    }

    /// The exact earliest due time of any pending timer (possibly in the past).
    pub fn next_deadline(&self) -> Option<u64> {
        let overflow = self.overflow.first_key_value().map(|(&(due, _), _)| due);
        if let Some(due) = overflow
            && due < self.current
        {
            return Some(due);
        }
        self.wheel_min().or(overflow)
    }

    /// Removes every timer with `due <= now_ms` and appends it to `out` in `(due, insertion)`
    /// order. The wheel's current time becomes `now_ms` unless that would move it backwards.
    pub fn advance(&mut self, now_ms: u64, out: &mut Vec<(K, u64)>) {
        // Past-due overflow entries are earlier than anything in the wheel.
        while let Some((&(due, _), &idx)) = self.overflow.first_key_value() {
            if due >= self.current || due > now_ms {
                break;
            }
            self.overflow.pop_first();
            self.fire(idx, out);
        }
        if now_ms < self.current {
            return;
        }
        loop {
            while let Some((level, slot, start)) = self.next_expiration() {
                if start > now_ms {
                    break;
                }
                self.current = start;
                if level == 0 {
                    self.fire_slot(slot, out);
                } else {
                    self.cascade(level, slot);
                }
            }
            // Nothing left in the wheel is due by `now_ms`.
            if top_block(now_ms) == top_block(self.current) {
                self.current = now_ms;
                break;
            }
            // Crossing into a later 2^36 ms block: the wheel's own block is exhausted, so it is
            // empty, and the next entries come from the overflow map.
            debug_assert!(self.occupied.iter().all(|&bits| bits == 0));
            match self.overflow.first_key_value() {
                Some((&(due, _), _)) if top_block(due) <= top_block(now_ms) => {
                    self.current = due & !((1u64 << WHEEL_BITS) - 1);
                    self.pull_overflow();
                }
                _ => {
                    self.current = now_ms;
                    self.pull_overflow();
                    break;
                }
            }
        }
        self.fix_earliest();
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate heap bytes held (slab, free stack, key index, slots, overflow), not counting
    /// memory owned by the keys themselves. For a gauge and the benchmark.
    pub fn approx_memory_bytes(&self) -> usize {
        use std::mem::size_of;
        let slab = self.slab.capacity() * size_of::<Option<Entry<K>>>();
        let free = self.free.capacity() * size_of::<u32>();
        let index = self.index.approx_memory_bytes();
        let slots = self.slots.capacity() * size_of::<Slot>();
        // B-tree leaves hold up to 11 entries; count about two thirds full.
        let overflow = self.overflow.len() * (size_of::<(u64, u64)>() + size_of::<u32>()) * 3 / 2;
        slab + free + index + slots + overflow
    }

    fn entry(&self, idx: u32) -> &Entry<K> {
        self.slab[idx as usize].as_ref().expect("live slab index")
    }

    fn entry_mut(&mut self, idx: u32) -> &mut Entry<K> {
        self.slab[idx as usize].as_mut().expect("live slab index")
    }

    /// Frees slab index `idx` (already unlinked and out of `index`).
    fn release(&mut self, idx: u32) -> Entry<K> {
        let entry = self.slab[idx as usize].take().expect("live slab index");
        self.free.push(idx);
        entry
    }

    fn move_entry(&mut self, idx: u32, due: u64) {
        self.unlink(idx);
        self.entry_mut(idx).due = due;
        self.place(idx, due);
        self.fix_earliest();
    }

    /// Files an unlinked entry by its due time: wheel slot or overflow.
    fn place(&mut self, idx: u32, due: u64) {
        let position = if due < self.current { None } else { wheel_position(self.current, due) };
        let Some((level, slot)) = position else {
            let seq = self.seq;
            self.seq += 1;
            let entry = self.entry_mut(idx);
            entry.loc = overflow_loc();
            entry.prev = (seq >> 32) as u32;
            entry.next = seq as u32;
            self.overflow.insert((due, seq), idx);
            return;
        };
        let s = level * SLOTS + slot;
        let tail = self.slots[s].tail;
        {
            let entry = self.entry_mut(idx);
            entry.loc = loc_of(level, slot);
            entry.prev = tail;
            entry.next = NIL;
        }
        if tail == NIL {
            self.slots[s] = Slot { head: idx, tail: idx, min: due, min_count: 1 };
            self.occupied[level] |= 1 << slot;
            return;
        }
        self.entry_mut(tail).next = idx;
        let slot = &mut self.slots[s];
        slot.tail = idx;
        if level > 0 && slot.min_count > 0 {
            if due < slot.min {
                slot.min = due;
                slot.min_count = 1;
            } else if due == slot.min {
                slot.min_count += 1;
            }
        }
    }

    /// Takes a linked entry out of its slot list or the overflow map; the slab entry stays.
    fn unlink(&mut self, idx: u32) {
        let entry = self.entry(idx);
        let (loc, due, prev, next) = (entry.loc.get(), entry.due, entry.prev, entry.next);
        if loc == OVERFLOW {
            let seq = (u64::from(prev) << 32) | u64::from(next);
            self.overflow.remove(&(due, seq));
            return;
        }
        let s = usize::from(loc - 1);
        if prev == NIL {
            self.slots[s].head = next;
        } else {
            self.entry_mut(prev).next = next;
        }
        if next == NIL {
            self.slots[s].tail = prev;
        } else {
            self.entry_mut(next).prev = prev;
        }
        let slot = &mut self.slots[s];
        if slot.head == NIL {
            *slot = EMPTY_SLOT;
            self.occupied[s / SLOTS] &= !(1 << (s % SLOTS));
        } else if slot.min_count > 0 && due == slot.min {
            slot.min_count -= 1;
        }
    }

    fn fire(&mut self, idx: u32, out: &mut Vec<(K, u64)>) {
        let entry = self.release(idx);
        self.index.remove(&entry.key);
        out.push((entry.key, entry.due));
    }

    /// Fires a whole level-0 slot (every entry has due == `self.current`).
    fn fire_slot(&mut self, slot: usize, out: &mut Vec<(K, u64)>) {
        let mut idx = self.take_slot(0, slot);
        while idx != NIL {
            let next = self.entry(idx).next;
            debug_assert_eq!(self.entry(idx).due, self.current);
            self.fire(idx, out);
            idx = next;
        }
    }

    /// Re-files every entry of a higher-level slot the current time has just entered.
    fn cascade(&mut self, level: usize, slot: usize) {
        let mut idx = self.take_slot(level, slot);
        while idx != NIL {
            let entry = self.entry(idx);
            let (next, due) = (entry.next, entry.due);
            self.place(idx, due);
            idx = next;
        }
    }

    /// Empties a slot, returning the head of its list (still linked through `next`).
    fn take_slot(&mut self, level: usize, slot: usize) -> u32 {
        let s = level * SLOTS + slot;
        let head = self.slots[s].head;
        self.slots[s] = EMPTY_SLOT;
        self.occupied[level] &= !(1 << slot);
        head
    }

    /// Moves overflow entries in the current 2^36 ms block into the wheel, in (due, seq) order.
    fn pull_overflow(&mut self) {
        while let Some((&(due, _), &idx)) = self.overflow.first_key_value() {
            if top_block(due) != top_block(self.current) {
                break;
            }
            debug_assert!(due >= self.current);
            self.overflow.pop_first();
            self.place(idx, due);
        }
    }

    /// Earliest occupied wheel slot: `(level, slot, start time)`. Entries in a lower level are
    /// always due before entries in a higher one, and within a level occupied slots are never
    /// behind the current time's slot, so the lowest set bit of the lowest non-empty level wins.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        let level = self.occupied.iter().position(|&bits| bits != 0)?;
        let slot = self.occupied[level].trailing_zeros() as usize;
        Some((level, slot, slot_start(self.current, level, slot)))
    }

    fn wheel_min(&self) -> Option<u64> {
        let (level, slot, start) = self.next_expiration()?;
        if level == 0 {
            return Some(start);
        }
        let slot = &self.slots[level * SLOTS + slot];
        debug_assert!(slot.min_count > 0, "earliest slot minimum must be exact");
        Some(slot.min)
    }

    /// Keeps the earliest slot's minimum exact, rescanning it if its minimum entries were removed.
    fn fix_earliest(&mut self) {
        let Some((level, slot, _)) = self.next_expiration() else {
            return;
        };
        let s = level * SLOTS + slot;
        if level == 0 || self.slots[s].min_count > 0 {
            return;
        }
        let (mut min, mut count) = (u64::MAX, 0);
        let mut idx = self.slots[s].head;
        while idx != NIL {
            let entry = self.entry(idx);
            if entry.due < min {
                (min, count) = (entry.due, 1);
            } else if entry.due == min {
                count += 1;
            }
            idx = entry.next;
        }
        self.slots[s].min = min;
        self.slots[s].min_count = count;
    }
}

#[cfg(test)]
mod tests;
