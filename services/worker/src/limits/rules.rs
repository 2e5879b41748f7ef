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

use chrono::{DateTime, Duration, Utc};
use jetsched_shared::priority::Priority;
use jetsched_shared::wire::{Holder, LimitRecord, Waiter};

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
    execution_id: String,
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
    /// Another message of the same run holds the slot (a copy): this one is not run.
    Copy,
    /// It waits; `saturated`: this made the key saturated (told once).
    Wait { saturated: bool },
}

/// Drops the holders whose lease ran out before `now`; returns how many.
pub(crate) fn expire(record: &mut LimitRecord, now: DateTime<Utc>) -> usize {
    let before = record.holders.len();
    record.holders.retain(|_, holder| holder.lease_until >= now);
    before - record.holders.len()
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
    let free = record.in_use(now) < record.effective_limit() as usize;
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
    while record.in_use(now) < record.effective_limit() as usize {
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
    if record.in_use(now) < record.effective_limit() as usize {
        return Some(now);
    }
    record.holders.values().map(|h| h.lease_until).filter(|at| *at >= now).min()
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
