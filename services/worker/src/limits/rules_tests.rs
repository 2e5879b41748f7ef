//! The rules of a concurrency key against a simple model: random arrivals, releases, lease
//! ends and limit overrides.

use chrono::{Duration, TimeZone, Utc};
use proptest::prelude::*;

use super::*;

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
                prop_assert!(record.in_use(now) <= record.effective_limit() as usize);
            }
            prop_assert_eq!(record.holders.len() + record.waiters.len() + done, next);
            prop_assert_eq!(record.saturated && record.waiters.is_empty(), false);
        }
    }
}
