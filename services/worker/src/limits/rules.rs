//! The pure rules of a concurrency key ([`LimitRecord`]): who takes a slot, who waits, who gets
//! a freed slot, and when a lease has run out. No I/O and no clock: `now` is a parameter, and
//! every function changes the record the caller then writes with compare-and-set.
//!
//! - A run takes a slot when fewer than the limit are held (leases running) and no run of the
//!   same or a more urgent priority waits ahead of it: arrival order within a priority, and a
//!   critical waiter is never passed by a lower run.
//! - A freed slot goes to the most urgent waiter, the oldest first; it is reserved for it
//!   (`seq` absent) until its message is delivered, under a lease like any holder.
//! - A holder whose lease ran out holds nothing: it is dropped and its slot handed over.
//! - While no run waits, a worker's write may take a block of free slots ahead for its next
//!   runs of the key ([`grant_block`]): at most half the slots left free after its run's, so
//!   other workers are not starved. A block's slots count against the limit, used or not; it
//!   is shrunk, renewed or given back by its worker ([`write_block`]) and, like a holder,
//!   holds nothing once its lease ran out.

use chrono::{DateTime, Duration, Utc};
use jetsched_shared::priority::Priority;
use jetsched_shared::wire::{Holder, LimitRecord, SlotBlock, Waiter};

/// A delivery asking for a slot.
#[derive(Debug, Clone)]
pub(crate) struct Claim<'a> {
    pub(crate) execution_id: &'a str,
    /// The dispatch message's stream sequence and delivery count.
    pub(crate) seq: u64,
    pub(crate) delivered: u64,
    pub(crate) worker: &'a str,
    pub(crate) priority: Priority,
    pub(crate) namespace: &'a str,
    pub(crate) task_id: &'a str,
    /// Where the run is parked if it waits.
    pub(crate) parked_subject: &'a str,
    /// The limit its spec declares.
    pub(crate) limit: u32,
}

impl Claim<'_> {
    /// The claim with its own copies of the texts, to be applied later (a group commit).
    pub(crate) fn owned(&self) -> OwnedClaim {
        OwnedClaim {
            execution_id: self.execution_id.to_string(),
            seq: self.seq,
            delivered: self.delivered,
            worker: self.worker.to_string(),
            priority: self.priority,
            namespace: self.namespace.to_string(),
            task_id: self.task_id.to_string(),
            parked_subject: self.parked_subject.to_string(),
            limit: self.limit,
        }
    }
}

/// A [`Claim`] owning its texts.
#[derive(Debug, Clone)]
pub(crate) struct OwnedClaim {
    pub(crate) execution_id: String,
    seq: u64,
    delivered: u64,
    worker: String,
    priority: Priority,
    namespace: String,
    task_id: String,
    parked_subject: String,
    limit: u32,
}

impl OwnedClaim {
    pub(crate) fn as_claim(&self) -> Claim<'_> {
        Claim {
            execution_id: &self.execution_id,
            seq: self.seq,
            delivered: self.delivered,
            worker: &self.worker,
            priority: self.priority,
            namespace: &self.namespace,
            task_id: &self.task_id,
            parked_subject: &self.parked_subject,
            limit: self.limit,
        }
    }
}

/// What the record says to a delivery asking for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It holds a slot now (taken, handed over to it, or held by an earlier delivery of the
    /// same message).
    Hold,
    /// It holds a slot of its worker's block: `granted` slots were added to the block by this
    /// write, its own among them.
    Block { granted: u32 },
    /// Another message of the same run holds the slot (a copy): this one is not run.
    Copy,
    /// It waits; `saturated`: this made the key saturated (told once).
    Wait { saturated: bool },
}

/// Drops the holders and blocks whose lease ran out before `now`; returns how many slots
/// they held.
pub(crate) fn expire(record: &mut LimitRecord, now: DateTime<Utc>) -> usize {
    let before = record.holders.len();
    record.holders.retain(|_, holder| holder.lease_until >= now);
    let mut freed = before - record.holders.len();
    record.blocks.retain(|_, block| {
        let running = block.lease_until >= now;
        if !running {
            freed += block.slots as usize;
        }
        running
    });
    freed
}

/// Whether a worker's runs may take slots from its block without a write, judged on the
/// latest record of the key the worker knows: no run waits, no more slots are taken than the
/// limit in force (an operator may have lowered it), and its block's lease runs.
pub(crate) fn block_open(record: &LimitRecord, worker: &str, now: DateTime<Utc>) -> bool {
    record.waiters.is_empty()
        && record.taken(now) <= record.effective_limit() as usize
        && record.blocks.get(worker).is_some_and(|b| b.lease_until >= now)
}

/// A claim of a run that may take its slot in its worker's block (a first delivery, not a run
/// the key knows): when no run waits and a slot is free, the run's slot and up to `want` more
/// (at most half of those left free then) are added to the block of `claim.worker`, whose
/// lease is renewed. `recorded`: the block's slots as its worker last wrote them (a block the
/// record lost meanwhile grants nothing: its worker learns it first). Returns the slots added,
/// or `None` (nothing changed) when the claim is to be decided by [`acquire`]. A worker with no
/// block gets one only when at least one slot more than its run's is granted.
pub(crate) fn grant_block(
    record: &mut LimitRecord,
    claim: &Claim<'_>,
    want: u32,
    recorded: u32,
    used: u32,
    now: DateTime<Utc>,
    lease: Duration,
) -> Option<u32> {
    let known = record.holders.contains_key(claim.execution_id)
        || record.waiters.iter().any(|w| w.execution_id == claim.execution_id);
    if known || !record.waiters.is_empty() {
        return None;
    }
    let limit = claim.limit;
    let mut probe = record.clone();
    probe.limit = limit;
    expire(&mut probe, now);
    let base = probe.blocks.get(claim.worker).map_or(0, |b| b.slots);
    if base < recorded {
        return None;
    }
    let free = (probe.effective_limit() as usize).saturating_sub(probe.taken(now));
    if free == 0 {
        return None;
    }
    let extra = (want as usize).min((free - 1) / 2) as u32;
    if extra == 0 && base == 0 {
        return None;
    }
    *record = probe;
    let granted = 1 + extra;
    record.blocks.insert(
        claim.worker.to_string(),
        SlotBlock { slots: base + granted, used: used + 1, lease_until: now + lease },
    );
    Some(granted)
}

/// A worker's write of its own block: gives back `surplus` slots (those its runs stopped
/// using since it last wrote the block), renews the lease and notes `used`; a block of no
/// slots is removed. Returns false, changing nothing, when the record holds no block of
/// `worker` with its lease running (it ran out: the slots are free already).
pub(crate) fn write_block(
    record: &mut LimitRecord,
    worker: &str,
    surplus: u32,
    used: u32,
    now: DateTime<Utc>,
    lease: Duration,
) -> bool {
    let Some(block) = record.blocks.get_mut(worker).filter(|b| b.lease_until >= now) else {
        return false;
    };
    block.slots = block.slots.saturating_sub(surplus);
    block.used = used.min(block.slots);
    block.lease_until = now + lease;
    if block.slots == 0 {
        record.blocks.remove(worker);
    }
    true
}

/// Decides a claim and changes the record accordingly.
pub(crate) fn acquire(
    record: &mut LimitRecord,
    claim: &Claim<'_>,
    now: DateTime<Utc>,
    lease: Duration,
) -> Decision {
    record.limit = claim.limit;
    expire(record, now);
    let holder = |seq| Holder {
        worker: claim.worker.to_string(),
        lease_until: now + lease,
        seq: Some(seq),
        delivered: claim.delivered,
        namespace: claim.namespace.to_string(),
        task_id: claim.task_id.to_string(),
    };
    if let Some(held) = record.holders.get_mut(claim.execution_id) {
        return match held.seq {
            Some(seq) if seq != claim.seq => Decision::Copy,
            _ => {
                *held = holder(claim.seq);
                Decision::Hold
            }
        };
    }
    let position = record.waiters.iter().position(|w| w.execution_id == claim.execution_id);
    // Who is ahead: every waiter more urgent, and those of its priority that came before it.
    let ahead = record.waiters.iter().enumerate().any(|(index, w)| {
        w.execution_id != claim.execution_id
            && (w.priority < claim.priority
                || (w.priority == claim.priority && position.is_none_or(|p| index < p)))
    });
    let free = record.taken(now) < record.effective_limit() as usize;
    if free && !ahead {
        if let Some(position) = position {
            record.waiters.remove(position);
        }
        record.holders.insert(claim.execution_id.to_string(), holder(claim.seq));
        if record.waiters.is_empty() {
            record.saturated = false;
        }
        return Decision::Hold;
    }
    match position {
        Some(position) => record.waiters[position].subject = claim.parked_subject.to_string(),
        None => record.waiters.push(Waiter {
            execution_id: claim.execution_id.to_string(),
            priority: claim.priority,
            since: now,
            subject: claim.parked_subject.to_string(),
            namespace: claim.namespace.to_string(),
            task_id: claim.task_id.to_string(),
        }),
    }
    let saturated = !record.saturated;
    record.saturated = true;
    Decision::Wait { saturated }
}

/// Frees the slot of `execution_id` if the message `seq` holds it (a late delivery of an
/// earlier attempt frees nothing a later one holds); returns whether it did.
pub(crate) fn release(record: &mut LimitRecord, execution_id: &str, seq: u64) -> bool {
    let ours = record.holders.get(execution_id).is_some_and(|h| h.seq.is_none_or(|s| s == seq));
    if ours {
        record.holders.remove(execution_id);
    }
    ours
}

/// Renews the lease of `execution_id` held by message `seq`; false when it holds no slot any
/// more (its lease ran out and the slot went to another run).
pub(crate) fn renew(
    record: &mut LimitRecord,
    execution_id: &str,
    seq: u64,
    now: DateTime<Utc>,
    lease: Duration,
) -> bool {
    match record.holders.get_mut(execution_id) {
        Some(holder) if holder.seq == Some(seq) && holder.lease_until >= now => {
            holder.lease_until = now + lease;
            true
        }
        _ => false,
    }
}

/// Hands free slots over to waiters, most urgent first, oldest first within a priority; each
/// slot is reserved for its waiter under a lease. Returns the waiters handed a slot.
pub(crate) fn hand_over(
    record: &mut LimitRecord,
    worker: &str,
    now: DateTime<Utc>,
    lease: Duration,
) -> Vec<Waiter> {
    expire(record, now);
    let mut handed = Vec::new();
    while record.taken(now) < record.effective_limit() as usize {
        let Some(index) = next_waiter(&record.waiters) else { break };
        let waiter = record.waiters.remove(index);
        record.holders.insert(
            waiter.execution_id.clone(),
            Holder {
                worker: worker.to_string(),
                lease_until: now + lease,
                seq: None,
                delivered: 0,
                namespace: waiter.namespace.clone(),
                task_id: waiter.task_id.clone(),
            },
        );
        handed.push(waiter);
    }
    if record.waiters.is_empty() {
        record.saturated = false;
    }
    handed
}

/// The index of the waiter a freed slot goes to: the most urgent, the first to come among them.
fn next_waiter(waiters: &[Waiter]) -> Option<usize> {
    waiters.iter().enumerate().min_by_key(|(index, w)| (w.priority, *index)).map(|(index, _)| index)
}

/// When this key next needs a hand-over by someone other than a releasing run: now when a slot
/// is free and runs wait (an override raised the limit, a hand-over found no parked run),
/// else the earliest lease end while runs wait; never without waiters.
pub(crate) fn next_due(record: &LimitRecord, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if record.waiters.is_empty() {
        return None;
    }
    if record.taken(now) < record.effective_limit() as usize {
        return Some(now);
    }
    let holders = record.holders.values().map(|h| h.lease_until);
    holders.chain(record.blocks.values().map(|b| b.lease_until)).filter(|at| *at >= now).min()
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
