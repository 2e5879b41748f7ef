//! The rules of a concurrency key against a simple model: random arrivals, releases, lease
//! ends and limit overrides; and with workers taking blocks of slots ahead, each seeing the key
//! only through its own writes and a watch delivered when the test says.

use std::collections::HashMap;

use chrono::{Duration, TimeZone, Utc};
use proptest::prelude::*;

use super::*;
use crate::limits::block::LocalBlock;

fn claim<'a>(id: &'a str, seq: u64, priority: Priority, limit: u32) -> Claim<'a> {
    Claim {
        execution_id: id,
        seq,
        delivered: 1,
        worker: "w1",
        priority,
        namespace: "ns",
        task_id: "t",
        parked_subject: "parked",
        limit,
    }
}

fn lease() -> Duration {
    Duration::seconds(30)
}

#[test]
fn runs_take_free_slots_then_wait_in_arrival_order_within_priority() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let mut record = LimitRecord::default();
    assert_eq!(acquire(&mut record, &claim("a", 1, Priority::Normal, 2), now, lease()), Decision::Hold);
    assert_eq!(acquire(&mut record, &claim("b", 2, Priority::Normal, 2), now, lease()), Decision::Hold);
    assert_eq!(
        acquire(&mut record, &claim("c", 3, Priority::Low, 2), now, lease()),
        Decision::Wait { saturated: true }
    );
    assert_eq!(
        acquire(&mut record, &claim("d", 4, Priority::Critical, 2), now, lease()),
        Decision::Wait { saturated: false }
    );
    // A redelivery of a holder's message keeps its slot; another message of it is a copy.
    assert_eq!(acquire(&mut record, &claim("a", 1, Priority::Normal, 2), now, lease()), Decision::Hold);
    assert_eq!(acquire(&mut record, &claim("a", 9, Priority::Normal, 2), now, lease()), Decision::Copy);
    // A late delivery of another message frees nothing.
    assert!(!release(&mut record, "a", 9));
    assert!(release(&mut record, "a", 1));
    let handed = hand_over(&mut record, "w2", now, lease());
    assert_eq!(handed.iter().map(|w| w.execution_id.as_str()).collect::<Vec<_>>(), ["d"]);
    // The handed-over run takes its reserved slot when its message comes.
    assert_eq!(acquire(&mut record, &claim("d", 5, Priority::Critical, 2), now, lease()), Decision::Hold);
    assert_eq!(record.holders["d"].seq, Some(5));
    // A new low run does not pass the waiting low run `c`, even with a slot free.
    assert!(release(&mut record, "b", 2));
    assert_eq!(
        acquire(&mut record, &claim("e", 6, Priority::Low, 2), now, lease()),
        Decision::Wait { saturated: false }
    );
    // `c`'s own parked message coming back takes the free slot.
    assert_eq!(acquire(&mut record, &claim("c", 7, Priority::Low, 2), now, lease()), Decision::Hold);
    assert_eq!(record.waiters.len(), 1);
}

#[test]
fn an_expired_lease_frees_its_slot_and_renewal_keeps_it() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let mut record = LimitRecord::default();
    acquire(&mut record, &claim("a", 1, Priority::Normal, 1), now, lease());
    acquire(&mut record, &claim("b", 2, Priority::Normal, 1), now, lease());
    assert_eq!(next_due(&record, now), Some(now + lease()));
    let later = now + Duration::seconds(20);
    assert!(renew(&mut record, "a", 1, later, lease()));
    assert_eq!(next_due(&record, later), Some(later + lease()));
    assert!(hand_over(&mut record, "w", later, lease()).is_empty());
    let expired = later + lease() + Duration::milliseconds(1);
    assert!(!renew(&mut record, "a", 1, expired, lease()));
    let handed = hand_over(&mut record, "w", expired, lease());
    assert_eq!(handed.len(), 1);
    assert!(record.holders.contains_key("b") && !record.holders.contains_key("a"));
    assert!(!record.saturated);
    assert_eq!(next_due(&record, expired), None);
}

#[test]
fn an_override_raises_the_limit_and_the_waiters_are_due_at_once() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let mut record = LimitRecord::default();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        acquire(&mut record, &claim(id, i as u64, Priority::Normal, 1), now, lease());
    }
    record.override_limit = Some(3);
    assert_eq!(next_due(&record, now), Some(now));
    assert_eq!(hand_over(&mut record, "w", now, lease()).len(), 2);
    assert_eq!(record.in_use(now), 3);
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(u8),
    Release(usize),
    Deliver(usize),
    Advance(u8),
    Override(Option<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4).prop_map(Op::Arrive),
        3 => any::<usize>().prop_map(Op::Release),
        3 => any::<usize>().prop_map(Op::Deliver),
        1 => (0u8..40).prop_map(Op::Advance),
        1 => proptest::option::of(1u8..4).prop_map(Op::Override),
    ]
}

proptest! {
    /// Whatever happens: no more holders than the limit in force; a run never takes a slot
    /// while a more urgent run, or an earlier one of its priority, waits; a freed slot goes to
    /// the most urgent, oldest waiter; every run that came is held, waiting or done.
    #[test]
    fn the_limit_holds_and_the_order_is_kept(ops in proptest::collection::vec(op(), 1..120)) {
        let start = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut now = start;
        let mut record = LimitRecord::default();
        let limit = 2;
        let ids: Vec<String> = (0..200).map(|i| format!("e{i}")).collect();
        let mut next = 0usize;
        let mut done = 0usize;
        let mut seq = 1000u64;
        for op in ops {
            let holders_before = record.holders.len();
            match op {
                Op::Arrive(p) => {
                    if next == ids.len() { continue; }
                    let priority = Priority::ALL[p as usize];
                    let blocked = record.waiters.iter().any(|w| w.priority <= priority);
                    let id = &ids[next];
                    next += 1;
                    seq += 1;
                    let decision = acquire(&mut record, &claim(id, seq, priority, limit), now, lease());
                    if blocked {
                        prop_assert_ne!(decision, Decision::Hold, "passed a waiter");
                    }
                }
                Op::Release(i) => {
                    let held: Vec<(String, Option<u64>)> =
                        record.holders.iter().filter(|(_, h)| h.seq.is_some()).map(|(id, h)| (id.clone(), h.seq)).collect();
                    if held.is_empty() { continue; }
                    let (id, seq) = &held[i % held.len()];
                    prop_assert!(release(&mut record, id, seq.unwrap()));
                    done += 1;
                    let before = record.waiters.clone();
                    let handed = hand_over(&mut record, "w", now, lease());
                    for waiter in &handed {
                        let position = before.iter().position(|w| w.execution_id == waiter.execution_id).unwrap();
                        let left_ahead = record.waiters.iter().any(|w| {
                            let p = before.iter().position(|b| b.execution_id == w.execution_id).unwrap();
                            w.priority < waiter.priority || (w.priority == waiter.priority && p < position)
                        });
                        prop_assert!(!left_ahead, "a freed slot skipped a waiter ahead");
                    }
                }
                Op::Deliver(i) => {
                    let reserved: Vec<String> =
                        record.holders.iter().filter(|(_, h)| h.seq.is_none()).map(|(id, _)| id.clone()).collect();
                    if reserved.is_empty() { continue; }
                    let id = reserved[i % reserved.len()].clone();
                    seq += 1;
                    let decision = acquire(&mut record, &claim(&id, seq, Priority::Normal, limit), now, lease());
                    prop_assert_eq!(decision, Decision::Hold);
                }
                Op::Advance(s) => {
                    now += Duration::seconds(i64::from(s));
                    let expired = expire(&mut record, now);
                    done += expired;
                    hand_over(&mut record, "w", now, lease());
                }
                Op::Override(o) => {
                    record.override_limit = o.map(u32::from);
                    hand_over(&mut record, "w", now, lease());
                }
            }
            // A slot is given only below the limit in force (a lowered override lets the
            // holders above it finish).
            if record.holders.len() > holders_before {
                prop_assert!(record.taken(now) <= record.effective_limit() as usize);
            }
            prop_assert_eq!(record.holders.len() + record.waiters.len() + done, next);
            prop_assert_eq!(record.saturated && record.waiters.is_empty(), false);
        }
    }
}

/// One worker of the block model: its block, the latest record it knows and the revision of it,
/// and its runs holding slots of its block.
struct Worker {
    name: &'static str,
    block: LocalBlock,
    seen: LimitRecord,
    seen_rev: u64,
    running: Vec<String>,
}

/// The key as stored, and the revision each waiter was written at.
struct Key {
    record: LimitRecord,
    rev: u64,
    waiter_rev: HashMap<String, u64>,
}

const WORKERS: [&str; 3] = ["wa", "wb", "wc"];
const MOST: u32 = 8;

fn us(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// A write by `w` is stored: it knows the record it wrote (the newest), and its block follows.
fn committed(key: &mut Key, worker: &mut Worker, now: DateTime<Utc>) {
    key.rev += 1;
    worker.seen = key.record.clone();
    worker.seen_rev = key.rev;
    worker.block.judge(block_open(&key.record, worker.name, now));
    let (slots, until) = key
        .record
        .blocks
        .get(worker.name)
        .filter(|b| b.lease_until >= now)
        .map_or((0, 0), |b| (b.slots, us(b.lease_until)));
    worker.block.stored(slots, until, us(now));
}

/// The worker's write of its block: gives back the slots it let go, renews it, hands over.
fn give_back(key: &mut Key, worker: &mut Worker, now: DateTime<Utc>) {
    worker.block.writing = true;
    worker.block.round();
    let (surplus, used) = (worker.block.surplus(), worker.block.used);
    let mut record = key.record.clone();
    let kept = write_block(&mut record, worker.name, surplus, used, now, lease());
    let handed = hand_over(&mut record, worker.name, now, lease());
    worker.block.writing = false;
    if kept || !handed.is_empty() {
        key.record = record;
        committed(key, worker, now);
    }
    if !kept {
        worker.block.lost();
    }
}

#[derive(Debug, Clone)]
enum BlockOp {
    /// A run of a priority arrives on a worker, and `.2` more with it if it asks with a write.
    Arrive(usize, u8, u8),
    End(usize),
    Release(usize),
    Deliver(usize),
    Watch(usize),
    Tick(usize),
    Advance(u16),
    Override(Option<u8>),
}

fn block_op() -> impl Strategy<Value = BlockOp> {
    prop_oneof![
        6 => (0..WORKERS.len(), 0u8..4, 0u8..4).prop_map(|(w, p, n)| BlockOp::Arrive(w, p, n)),
        4 => any::<usize>().prop_map(BlockOp::End),
        2 => any::<usize>().prop_map(BlockOp::Release),
        2 => any::<usize>().prop_map(BlockOp::Deliver),
        3 => (0..WORKERS.len()).prop_map(BlockOp::Watch),
        2 => (0..WORKERS.len()).prop_map(BlockOp::Tick),
        2 => (0u16..15_000).prop_map(BlockOp::Advance),
        1 => proptest::option::of(1u8..10).prop_map(BlockOp::Override),
    ]
}

proptest! {
    /// Workers taking blocks ahead, seeing the key late: the slots counted in the record never
    /// exceed the limit in force when they grow; the slots a worker's runs may use and use are
    /// never more than its block holds in the record; a run taking a slot with a write never
    /// passes a waiter ahead of it, and a run taking one from its block passes only a waiter
    /// written after the latest state of the key its worker saw; a worker that saw a waiter
    /// holds in its block only the slots its runs use; every run is held, waiting or done.
    #[test]
    fn blocks_keep_the_limit_and_pass_only_waiters_their_worker_has_not_seen(
        ops in proptest::collection::vec(block_op(), 1..200),
        limit in 1u32..12,
    ) {
        let mut now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut key = Key { record: LimitRecord::default(), rev: 0, waiter_rev: HashMap::new() };
        let mut workers: Vec<Worker> = WORKERS
            .iter()
            .map(|name| Worker {
                name,
                block: LocalBlock::default(),
                seen: LimitRecord::default(),
                seen_rev: 0,
                running: Vec::new(),
            })
            .collect();
        let ids: Vec<String> = (0..300).map(|i| format!("e{i}")).collect();
        let (mut next, mut done, mut seq) = (0usize, 0usize, 1000u64);
        for op in ops {
            let taken_before = key.record.taken(now);
            // Each worker's runs on slots of a lost block, and its block's lease before the op.
            let held_before: Vec<(u32, Option<DateTime<Utc>>)> = workers
                .iter()
                .map(|w| (w.block.orphans(), key.record.blocks.get(w.name).map(|b| b.lease_until)))
                .collect();
            match op {
                BlockOp::Arrive(w, p, together) => {
                    if next == ids.len() { continue; }
                    let priority = Priority::ALL[p as usize];
                    let id = ids[next].clone();
                    next += 1;
                    seq += 1;
                    let blockers: Vec<String> = key
                        .record
                        .waiters
                        .iter()
                        .filter(|w| w.priority <= priority)
                        .map(|w| w.execution_id.clone())
                        .collect();
                    let worker = &mut workers[w];
                    worker.block.arrive(us(now));
                    if worker.block.take(us(now)) {
                        for blocker in &blockers {
                            prop_assert!(
                                key.waiter_rev[blocker] > worker.seen_rev,
                                "a run from a block passed a waiter its worker had seen"
                            );
                        }
                        worker.running.push(id);
                        continue;
                    }
                    // It asks with a write, with the runs that arrive while it is being prepared
                    // (a group commit: one write decides them in arrival order).
                    worker.block.round();
                    let mut record = key.record.clone();
                    let mut decided = Vec::new();
                    for n in 0..=usize::from(together) {
                        let id = if n == 0 {
                            id.clone()
                        } else if next < ids.len() {
                            next += 1;
                            worker.block.arrive(us(now));
                            ids[next - 1].clone()
                        } else {
                            break;
                        };
                        seq += 1;
                        let blocked = record.waiters.iter().any(|w| w.priority <= priority);
                        let mut c = claim(&id, seq, priority, limit);
                        c.worker = worker.name;
                        let decision = match worker.block.claim(&mut record, &c, MOST, now, lease()) {
                            Some(decision) => decision,
                            None => acquire(&mut record, &c, now, lease()),
                        };
                        if blocked {
                            prop_assert!(matches!(decision, Decision::Wait { .. }), "a write passed a waiter");
                        }
                        decided.push((id, decision));
                    }
                    if record != key.record {
                        key.record = record;
                        committed(&mut key, worker, now);
                    } else {
                        worker.block.round();
                    }
                    for (id, decision) in decided {
                        match decision {
                            Decision::Block { .. } => worker.running.push(id),
                            Decision::Wait { .. } => {
                                key.waiter_rev.insert(id, key.rev);
                            }
                            Decision::Hold | Decision::Copy => {}
                        }
                    }
                }
                BlockOp::End(i) => {
                    let running: Vec<(usize, usize)> = workers
                        .iter()
                        .enumerate()
                        .flat_map(|(w, worker)| (0..worker.running.len()).map(move |r| (w, r)))
                        .collect();
                    if running.is_empty() { continue; }
                    let (w, r) = running[i % running.len()];
                    let worker = &mut workers[w];
                    worker.running.swap_remove(r);
                    done += 1;
                    if worker.block.give() {
                        give_back(&mut key, worker, now);
                    }
                }
                BlockOp::Release(i) => {
                    let held: Vec<(String, u64)> = key
                        .record
                        .holders
                        .iter()
                        .filter_map(|(id, h)| h.seq.map(|s| (id.clone(), s)))
                        .collect();
                    if held.is_empty() { continue; }
                    let (id, s) = &held[i % held.len()];
                    prop_assert!(release(&mut key.record, id, *s));
                    done += 1;
                    hand_over(&mut key.record, "wa", now, lease());
                    committed(&mut key, &mut workers[0], now);
                }
                BlockOp::Deliver(i) => {
                    let reserved: Vec<String> = key
                        .record
                        .holders
                        .iter()
                        .filter(|(_, h)| h.seq.is_none())
                        .map(|(id, _)| id.clone())
                        .collect();
                    if reserved.is_empty() { continue; }
                    let id = reserved[i % reserved.len()].clone();
                    seq += 1;
                    let decision = acquire(&mut key.record, &claim(&id, seq, Priority::Normal, limit), now, lease());
                    prop_assert_eq!(decision, Decision::Hold);
                    committed(&mut key, &mut workers[1], now);
                }
                BlockOp::Watch(w) => {
                    let worker = &mut workers[w];
                    worker.seen = key.record.clone();
                    worker.seen_rev = key.rev;
                    if worker.block.judge(block_open(&key.record, worker.name, now)) {
                        give_back(&mut key, worker, now);
                    }
                    let worker = &workers[w];
                    if !key.record.waiters.is_empty() {
                        let slots = key.record.blocks.get(worker.name).filter(|b| b.lease_until >= now).map_or(0, |b| b.slots);
                        prop_assert!(slots <= worker.block.used, "a worker that saw a waiter kept free slots");
                    }
                }
                BlockOp::Tick(w) => {
                    let lease_us = lease().num_microseconds().unwrap();
                    let worker = &mut workers[w];
                    if !worker.block.writing && worker.block.tick(us(now), lease_us, MOST) {
                        give_back(&mut key, worker, now);
                    }
                }
                BlockOp::Advance(ms) => {
                    now += Duration::milliseconds(i64::from(ms));
                    let held_before: usize = key.record.holders.len();
                    expire(&mut key.record, now);
                    done += held_before - key.record.holders.len();
                    hand_over(&mut key.record, "wc", now, lease());
                    committed(&mut key, &mut workers[2], now);
                }
                BlockOp::Override(o) => {
                    // An operator's write: no worker sees it before its watch does.
                    key.record.override_limit = o.map(u32::from);
                    key.rev += 1;
                }
            }
            if key.record.taken(now) > taken_before {
                prop_assert!(key.record.taken(now) <= key.record.effective_limit() as usize, "over the limit");
            }
            for (worker, (orphans, lease_until)) in workers.iter().zip(held_before) {
                // Runs lose their block's slots only when its lease ran out.
                if worker.block.orphans() > orphans {
                    let held = lease_until.is_some_and(|until| until >= now);
                    prop_assert!(!held, "a block's runs lost slots the record held for them");
                }
                let slots = key.record.blocks.get(worker.name).filter(|b| b.lease_until >= now).map_or(0, |b| b.slots);
                if worker.block.recorded > 0 && slots > 0 {
                    prop_assert!(worker.block.cap <= slots && worker.block.used <= slots, "a block uses more than it holds");
                }
                prop_assert!(worker.block.used <= worker.block.cap, "a block's runs use more than it lets them");
            }
            let running: usize = workers.iter().map(|w| w.running.len()).sum();
            prop_assert_eq!(key.record.holders.len() + key.record.waiters.len() + running + done, next);
            prop_assert_eq!(key.record.saturated && key.record.waiters.is_empty(), false);
        }
    }
}
