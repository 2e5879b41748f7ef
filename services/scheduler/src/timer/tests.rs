//! Tests of the timer wheel: edge cases and property tests against a sorted-map reference model.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

/// `String` keys (hash map index), for the test of non-`Copy` keys.
impl TimerKey for String {
    type Index = HashMap<String, u32>;
}

/// Checks the wheel's internal invariants (positions, links, bitmaps, exact earliest minimum).
fn check_invariants<K: TimerKey + std::fmt::Debug>(wheel: &TimerWheel<K>) {
    let mut seen = 0;
    for level in 0..LEVELS {
        for slot in 0..SLOTS {
            let s = &wheel.slots[level * SLOTS + slot];
            let bit = wheel.occupied[level] & (1 << slot) != 0;
            assert_eq!(bit, s.head != NIL, "bitmap of level {level} slot {slot}");
            let (mut prev, mut idx) = (NIL, s.head);
            let (mut min, mut count) = (u64::MAX, 0);
            while idx != NIL {
                let entry = wheel.entry(idx);
                assert_eq!(entry.prev, prev);
                assert_eq!(entry.loc, loc_of(level, slot));
                assert!(entry.due >= wheel.current);
                assert_eq!(wheel_position(wheel.current, entry.due), Some((level, slot)));
                assert_eq!(wheel.index.get(&entry.key), Some(idx));
                if entry.due < min {
                    (min, count) = (entry.due, 1);
                } else if entry.due == min {
                    count += 1;
                }
                seen += 1;
                prev = idx;
                idx = entry.next;
            }
            assert_eq!(s.tail, prev);
            if level > 0 && s.min_count > 0 {
                assert_eq!((s.min, s.min_count), (min, count), "slot minimum");
            }
        }
    }
    if let Some((level, slot, _)) = wheel.next_expiration()
        && level > 0
    {
        assert!(wheel.slots[level * SLOTS + slot].min_count > 0);
    }
    for (&(due, seq), &idx) in &wheel.overflow {
        let entry = wheel.entry(idx);
        assert_eq!(entry.due, due);
        assert_eq!(entry.loc.get(), OVERFLOW);
        assert_eq!((u64::from(entry.prev) << 32) | u64::from(entry.next), seq);
        assert!(due < wheel.current || top_block(due) > top_block(wheel.current));
        seen += 1;
    }
    assert_eq!(seen, wheel.len());
    assert_eq!(wheel.slab.iter().filter(|e| e.is_some()).count(), wheel.len());
}

fn fire(wheel: &mut TimerWheel<u32>, now: u64) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    wheel.advance(now, &mut out);
    check_invariants(wheel);
    out
}

#[test]
fn entry_is_compact() {
    assert_eq!(std::mem::size_of::<Option<Entry<u32>>>(), 24);
}

#[test]
fn level_boundaries_fire_exactly_at_due() {
    for start in [0, 1, 63, 1_000_037, 1_735_689_600_123, (5 << 36) - 3] {
        for k in 0..=7u32 {
            for d in [-1i64, 0, 1] {
                let ahead = (64u64.pow(k) as i64 + d).max(1) as u64;
                let due = start + ahead;
                let mut wheel = TimerWheel::new(start);
                wheel.insert(7u32, due);
                wheel.insert(8u32, due + 1);
                check_invariants(&wheel);
                assert_eq!(wheel.next_deadline(), Some(due), "start {start} ahead {ahead}");
                assert!(fire(&mut wheel, due - 1).is_empty());
                assert_eq!(wheel.next_deadline(), Some(due));
                assert_eq!(fire(&mut wheel, due), vec![(7, due)]);
                assert_eq!(wheel.next_deadline(), Some(due + 1));
                assert_eq!(fire(&mut wheel, due + 1), vec![(8, due + 1)]);
                assert!(wheel.is_empty());
                assert_eq!(wheel.next_deadline(), None);
            }
        }
    }
}

#[test]
fn far_future_overflow_is_exact_and_ordered() {
    let start = 1_735_689_600_000;
    let year = 365 * 24 * 3_600_000u64;
    let mut wheel = TimerWheel::new(start);
    wheel.insert(1u32, start + 10 * year + 5);
    wheel.insert(2, start + 3 * year);
    wheel.insert(3, start + 3 * year);
    wheel.insert(4, start + 1000);
    wheel.insert(5, start + 10 * year + 5);
    check_invariants(&wheel);
    assert!(!wheel.overflow.is_empty());
    assert_eq!(wheel.next_deadline(), Some(start + 1000));
    assert_eq!(fire(&mut wheel, start + 1000), vec![(4, start + 1000)]);
    assert_eq!(wheel.next_deadline(), Some(start + 3 * year));
    assert!(fire(&mut wheel, start + 3 * year - 1).is_empty());
    assert_eq!(wheel.next_deadline(), Some(start + 3 * year));
    assert_eq!(fire(&mut wheel, start + 3 * year), vec![(2, start + 3 * year), (3, start + 3 * year)]);
    assert_eq!(wheel.cancel(&1), Some(start + 10 * year + 5));
    assert_eq!(wheel.next_deadline(), Some(start + 10 * year + 5));
    assert_eq!(fire(&mut wheel, u64::MAX), vec![(5, start + 10 * year + 5)]);
    assert!(wheel.is_empty());
}

#[test]
fn due_just_past_a_block_boundary_moves_into_the_wheel() {
    let boundary = 7 << 36;
    let mut wheel = TimerWheel::new(boundary - 2);
    wheel.insert(1u32, boundary + 1);
    wheel.insert(2, boundary - 1);
    wheel.insert(3, boundary);
    assert_eq!(wheel.next_deadline(), Some(boundary - 1));
    assert_eq!(fire(&mut wheel, boundary - 1), vec![(2, boundary - 1)]);
    assert_eq!(wheel.next_deadline(), Some(boundary));
    assert_eq!(fire(&mut wheel, boundary + 5), vec![(3, boundary), (1, boundary + 1)]);
}

#[test]
fn time_going_backwards_moves_nothing() {
    let mut wheel = TimerWheel::new(1_000);
    wheel.insert(1u32, 1_500);
    assert!(fire(&mut wheel, 1_200).is_empty());
    assert!(fire(&mut wheel, 900).is_empty());
    assert_eq!(wheel.current, 1_200);
    assert_eq!(wheel.next_deadline(), Some(1_500));
    // Past-due inserts are due at the next advance, but never fire after their `now`.
    wheel.insert(2, 800);
    wheel.insert(3, 1_100);
    assert_eq!(wheel.next_deadline(), Some(800));
    assert_eq!(fire(&mut wheel, 850), vec![(2, 800)]);
    assert_eq!(wheel.next_deadline(), Some(1_100));
    assert_eq!(fire(&mut wheel, 1_200), vec![(3, 1_100)]);
    assert_eq!(fire(&mut wheel, 1_500), vec![(1, 1_500)]);
}

#[test]
fn insert_in_the_past_fires_on_next_advance_in_due_order() {
    let mut wheel = TimerWheel::new(10_000);
    wheel.insert(1u32, 9_000);
    wheel.insert(2, 10_000);
    wheel.insert(3, 5);
    wheel.insert(4, 10_001);
    assert_eq!(wheel.next_deadline(), Some(5));
    assert_eq!(fire(&mut wheel, 10_000), vec![(3, 5), (1, 9_000), (2, 10_000)]);
    assert_eq!(wheel.next_deadline(), Some(10_001));
}

#[test]
fn reinserting_fired_keys_periodically() {
    let period = 1_000;
    let mut wheel = TimerWheel::new(0);
    for key in 0..100u32 {
        wheel.insert(key, u64::from(key) * 7 + 1);
    }
    let mut out = Vec::new();
    let mut fired = 0;
    while let Some(deadline) = wheel.next_deadline() {
        if deadline > 10 * period {
            break;
        }
        out.clear();
        wheel.advance(deadline, &mut out);
        check_invariants(&wheel);
        assert!(!out.is_empty());
        for (key, due) in out.drain(..) {
            assert_eq!(due, deadline);
            wheel.insert(key, due + period);
            fired += 1;
        }
    }
    assert_eq!(fired, 1_000);
    assert_eq!(wheel.len(), 100);
    // Re-inserting at the fire time itself (already current) is due at the next advance.
    let now = wheel.current;
    wheel.insert(5, now);
    assert_eq!(wheel.next_deadline(), Some(now));
    assert_eq!(fire(&mut wheel, now), vec![(5, now)]);
}

#[test]
fn many_timers_at_the_same_ms_fire_in_insertion_order() {
    let due = 1_735_689_600_000 + 3_600_000;
    let mut wheel = TimerWheel::new(1_735_689_600_000);
    let keys: Vec<u32> = (0..10_000u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    for &key in &keys {
        wheel.insert(key, due);
    }
    // Rescheduling to the same due counts as a new insertion: it moves to the end.
    assert!(wheel.reschedule(&keys[0], due));
    wheel.insert(keys[1], due);
    assert_eq!(wheel.cancel(&keys[2]), Some(due));
    let mut expected: Vec<(u32, u64)> = keys[3..].iter().map(|&k| (k, due)).collect();
    expected.push((keys[0], due));
    expected.push((keys[1], due));
    assert_eq!(wheel.next_deadline(), Some(due));
    assert!(fire(&mut wheel, due - 1).is_empty());
    assert_eq!(fire(&mut wheel, due), expected);
}

#[test]
fn cancelling_the_earliest_in_a_high_slot_keeps_next_deadline_exact() {
    let start = 0;
    let mut wheel = TimerWheel::new(start);
    // All in one level-3 slot (262,144 ms wide), distinct dues.
    for i in 0..50u32 {
        wheel.insert(i, 300_000 + u64::from(50 - i) * 100);
    }
    for i in (0..50u32).rev() {
        assert_eq!(wheel.next_deadline(), Some(300_000 + u64::from(50 - i) * 100));
        assert_eq!(wheel.cancel(&i), Some(300_000 + u64::from(50 - i) * 100));
        check_invariants(&wheel);
    }
    assert_eq!(wheel.next_deadline(), None);
}

#[test]
fn reschedule_and_cancel_of_absent_keys() {
    let mut wheel = TimerWheel::<String>::new(0);
    assert!(!wheel.reschedule(&"a".to_owned(), 5));
    assert_eq!(wheel.cancel(&"a".to_owned()), None);
    wheel.insert("a".to_owned(), 5);
    assert!(wheel.reschedule(&"a".to_owned(), 3));
    assert_eq!(wheel.due_of(&"a".to_owned()), Some(3));
    assert_eq!(wheel.len(), 1);
    let mut out = Vec::new();
    wheel.advance(10, &mut out);
    assert_eq!(out, vec![("a".to_owned(), 3)]);
    assert_eq!(wheel.due_of(&"a".to_owned()), None);
}

#[test]
fn memory_per_timer_is_small() {
    let n = 200_000u32;
    let due = |key: u32| u64::from(key.wrapping_mul(2_654_435_761)) % 86_400_000;
    let mut dense = TimerWheel::with_capacity(0, n as usize);
    let mut hashed = TimerWheel::with_capacity(0, n as usize);
    for key in 0..n {
        dense.insert(DenseKey(key), due(key));
        hashed.insert(key, due(key));
    }
    let per_timer = |bytes: usize| bytes as f64 / f64::from(n);
    let (dense, hashed) = (per_timer(dense.approx_memory_bytes()), per_timer(hashed.approx_memory_bytes()));
    assert!(dense < 32.0, "{dense} bytes per timer with dense keys");
    assert!(hashed < 64.0, "{hashed} bytes per timer with hashed keys");
}

/// Reference model: a sorted map of (due, seq) plus a key map.
#[derive(Default)]
struct Model {
    by_due: BTreeMap<(u64, u64), u32>,
    keys: HashMap<u32, (u64, u64)>,
    seq: u64,
}

impl Model {
    fn insert(&mut self, key: u32, due: u64) {
        self.cancel(key);
        self.seq += 1;
        self.by_due.insert((due, self.seq), key);
        self.keys.insert(key, (due, self.seq));
    }

    fn cancel(&mut self, key: u32) -> Option<u64> {
        let (due, seq) = self.keys.remove(&key)?;
        self.by_due.remove(&(due, seq));
        Some(due)
    }

    fn advance(&mut self, now: u64) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        while let Some((&(due, seq), &key)) = self.by_due.first_key_value() {
            if due > now {
                break;
            }
            self.by_due.remove(&(due, seq));
            self.keys.remove(&key);
            out.push((key, due));
        }
        out
    }

    fn next_deadline(&self) -> Option<u64> {
        self.by_due.first_key_value().map(|(&(due, _), _)| due)
    }
}

/// A due time relative to the test's clock.
#[derive(Debug, Clone)]
enum Due {
    Near(i64),
    Boundary(u32, i64),
    Medium(u64),
    Far(u64),
    NextBlock(i64),
}

impl Due {
    fn resolve(&self, clock: u64) -> u64 {
        let offset = |base: u64, d: i64| base.saturating_add_signed(d);
        match *self {
            Due::Near(d) => offset(clock, d),
            Due::Boundary(k, d) => offset(clock.saturating_add(64u64.pow(k)), d),
            Due::Medium(m) => clock.saturating_add(m),
            Due::Far(m) => clock.saturating_add(m),
            Due::NextBlock(d) => offset(((clock >> WHEEL_BITS) + 1) << WHEEL_BITS, d),
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Forward(u64),
    Back(u64),
    ToNextDeadline,
    JustBeforeNextDeadline,
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u32, Due),
    Reschedule(u32, Due),
    Cancel(u32),
    Advance(Step),
}

const KEYS: u32 = 48;

fn due_strategy() -> impl Strategy<Value = Due> {
    prop_oneof![
        4 => (-100i64..300).prop_map(Due::Near),
        2 => (1u32..=6, -2i64..=2).prop_map(|(k, d)| Due::Boundary(k, d)),
        3 => (0u64..1 << 24).prop_map(Due::Medium),
        1 => (0u64..1 << 40).prop_map(Due::Far),
        1 => (-3i64..3).prop_map(Due::NextBlock),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..100).prop_map(Step::Forward),
        2 => (0u64..1 << 20).prop_map(Step::Forward),
        1 => (0u64..1 << 40).prop_map(Step::Forward),
        1 => (0u64..1_000).prop_map(Step::Back),
        3 => Just(Step::ToNextDeadline),
        2 => Just(Step::JustBeforeNextDeadline),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS, due_strategy()).prop_map(|(k, d)| Op::Insert(k, d)),
        2 => (0..KEYS, due_strategy()).prop_map(|(k, d)| Op::Reschedule(k, d)),
        2 => (0..KEYS).prop_map(Op::Cancel),
        5 => step_strategy().prop_map(Op::Advance),
    ]
}

fn start_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        0u64..1 << 32,
        (1_700_000_000_000u64..1_900_000_000_000),
        (1u64..1 << 20, 0u64..200).prop_map(|(block, back)| (block << WHEEL_BITS) - back),
        (0u64..1 << 20).prop_map(|back| u64::MAX - (1 << 41) - back),
    ]
}

/// Runs `ops` on a wheel with keys `K` and on the reference model, comparing after every step.
fn check_against_model<K: TimerKey + std::fmt::Debug>(
    start: u64,
    ops: Vec<Op>,
    key_of: impl Fn(u32) -> K,
) -> Result<(), TestCaseError> {
    let mut wheel = TimerWheel::<K>::new(start);
    let mut model = Model::default();
    let mut clock = start;
    let mut out = Vec::new();
    let expect = |model_out: Vec<(u32, u64)>| -> Vec<(K, u64)> {
        model_out.into_iter().map(|(k, due)| (key_of(k), due)).collect()
    };
    for op in ops {
        match op {
            Op::Insert(key, due) => {
                let due = due.resolve(clock);
                wheel.insert(key_of(key), due);
                model.insert(key, due);
            }
            Op::Reschedule(key, due) => {
                let due = due.resolve(clock);
                let present = model.keys.contains_key(&key);
                if present {
                    model.insert(key, due);
                }
                prop_assert_eq!(wheel.reschedule(&key_of(key), due), present);
            }
            Op::Cancel(key) => {
                prop_assert_eq!(wheel.cancel(&key_of(key)), model.cancel(key));
            }
            Op::Advance(step) => {
                let now = match step {
                    Step::Forward(d) => clock.saturating_add(d),
                    Step::Back(d) => clock.saturating_sub(d),
                    Step::ToNextDeadline => model.next_deadline().unwrap_or(clock),
                    Step::JustBeforeNextDeadline => {
                        model.next_deadline().map_or(clock, |d| d.saturating_sub(1))
                    }
                };
                clock = now;
                out.clear();
                wheel.advance(now, &mut out);
                let expected = expect(model.advance(now));
                prop_assert!(out.iter().all(|&(_, due)| due <= now));
                prop_assert_eq!(&out, &expected);
            }
        }
        check_invariants(&wheel);
        prop_assert_eq!(wheel.len(), model.keys.len());
        prop_assert_eq!(wheel.is_empty(), model.keys.is_empty());
        prop_assert_eq!(wheel.next_deadline(), model.next_deadline());
        for key in 0..KEYS {
            prop_assert_eq!(wheel.due_of(&key_of(key)), model.keys.get(&key).map(|&(due, _)| due));
        }
    }
    // Nothing lost: everything left fires by the end of time, in order.
    out.clear();
    wheel.advance(u64::MAX, &mut out);
    prop_assert_eq!(out, expect(model.advance(u64::MAX)));
    prop_assert!(wheel.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The scheduler's configuration: dense keys in a `Vec` index.
    #[test]
    fn wheel_with_dense_keys_matches_reference_model(
        start in start_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..200),
    ) {
        check_against_model(start, ops, DenseKey)?;
    }

    /// Any key through a hash map index (sparse keys spread over the whole `u32` range).
    #[test]
    fn wheel_with_hashed_keys_matches_reference_model(
        start in start_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..200),
    ) {
        check_against_model(start, ops, |k: u32| k.wrapping_mul(2_654_435_761))?;
    }
}
