//! Timer keys and the index from a key to its slab entry: a `Vec` for dense keys, a hash map
//! for any other.

use std::collections::HashMap;

/// "No entry": in the dense index, and in the wheel's slab links.
pub(super) const NIL: u32 = u32::MAX;

/// A timer key, and the index the wheel finds its entry with.
pub trait TimerKey: Clone + Eq {
    type Index: KeyIndex<Self>;
}

/// Key to slab index: the one lookup of insert, cancel, reschedule and every fired timer.
pub trait KeyIndex<K>: std::fmt::Debug {
    fn with_capacity(capacity: usize) -> Self;
    fn get(&self, key: &K) -> Option<u32>;
    /// Adds `key`, which has no index yet.
    fn insert(&mut self, key: K, idx: u32);
    fn remove(&mut self, key: &K) -> Option<u32>;
    /// Approximate heap bytes held.
    fn approx_memory_bytes(&self) -> usize;
}

/// A key that is a small index, such as the scheduler's task slots (reused when a task is
/// removed). A `Vec` indexed by key replaces the hash map: 4 bytes per key up to the largest
/// one, and no hashing. Its memory follows the largest key, so use it only for dense keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseKey(pub u32);

impl From<u32> for DenseKey {
    fn from(index: u32) -> Self {
        DenseKey(index)
    }
}

impl TimerKey for DenseKey {
    type Index = DenseIndex;
}

/// Any `u32` (sparse keys too), through a hash map.
impl TimerKey for u32 {
    type Index = HashMap<u32, u32>;
}

/// A `Vec` from key to slab index, `NIL` where a key has no timer.
#[derive(Debug)]
pub struct DenseIndex {
    slots: Vec<u32>,
}

impl KeyIndex<DenseKey> for DenseIndex {
    fn with_capacity(capacity: usize) -> Self {
        DenseIndex { slots: Vec::with_capacity(capacity) }
    }

    fn get(&self, key: &DenseKey) -> Option<u32> {
        self.slots.get(key.0 as usize).copied().filter(|&idx| idx != NIL)
    }

    fn insert(&mut self, key: DenseKey, idx: u32) {
        let at = key.0 as usize;
        if at >= self.slots.len() {
            self.slots.resize(at + 1, NIL);
        }
        debug_assert_eq!(self.slots[at], NIL, "{key:?} already has a timer");
        self.slots[at] = idx;
    }

    fn remove(&mut self, key: &DenseKey) -> Option<u32> {
        let slot = self.slots.get_mut(key.0 as usize).filter(|idx| **idx != NIL)?;
        Some(std::mem::replace(slot, NIL))
    }

    fn approx_memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u32>()
    }
}

impl<K: Clone + Eq + std::hash::Hash + std::fmt::Debug> KeyIndex<K> for HashMap<K, u32> {
    fn with_capacity(capacity: usize) -> Self {
        HashMap::with_capacity(capacity)
    }

    fn get(&self, key: &K) -> Option<u32> {
        HashMap::get(self, key).copied()
    }

    fn insert(&mut self, key: K, idx: u32) {
        HashMap::insert(self, key, idx);
    }

    fn remove(&mut self, key: &K) -> Option<u32> {
        HashMap::remove(self, key)
    }

    fn approx_memory_bytes(&self) -> usize {
        // hashbrown: one bucket of (K, u32) and one control byte per bucket, buckets a power of
        // two at most 7/8 full.
        let buckets = if self.capacity() == 0 { 0 } else { (self.capacity() * 8 / 7).next_power_of_two() };
        buckets * (std::mem::size_of::<(K, u32)>() + 1)
    }
}
