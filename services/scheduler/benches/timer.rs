//! Timer wheel vs a lazy-deletion binary heap at 1M timers: insert, cancel, advance with re-insert.
//!
//! Three variants: `wheel` is the scheduler's (dense task-slot keys, `Vec` index), `wheel_hashed`
//! the same wheel with any `u32` key through a hash map, `heap` the baseline.
//!
//! `cargo bench -p jetsched-scheduler --bench timer` (about 3 minutes on 2 cores).

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group};
use jetsched_scheduler::timer::{DenseKey, TimerKey, TimerWheel};

const N: u32 = 1_000_000;
const CANCELS: usize = 100_000;
const START: u64 = 1_735_689_600_000;
const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// The timer API the structures offer, as the scheduler loop uses it.
trait Timers {
    type Key: Copy;
    /// The key of task `i` (keys `0..N`).
    fn key(i: u32) -> Self::Key;
    fn new(now: u64) -> Self;
    fn insert(&mut self, key: Self::Key, due: u64);
    fn cancel(&mut self, key: &Self::Key) -> Option<u64>;
    fn next_deadline(&self) -> Option<u64>;
    fn advance(&mut self, now: u64, out: &mut Vec<(Self::Key, u64)>);
    fn approx_memory_bytes(&self) -> usize;
}

impl<K: TimerKey + Copy + From<u32>> Timers for TimerWheel<K> {
    type Key = K;
    fn key(i: u32) -> K {
        K::from(i)
    }
    fn new(now: u64) -> Self {
        TimerWheel::new(now)
    }
    fn insert(&mut self, key: K, due: u64) {
        TimerWheel::insert(self, key, due);
    }
    fn cancel(&mut self, key: &K) -> Option<u64> {
        TimerWheel::cancel(self, key)
    }
    fn next_deadline(&self) -> Option<u64> {
        TimerWheel::next_deadline(self)
    }
    fn advance(&mut self, now: u64, out: &mut Vec<(K, u64)>) {
        TimerWheel::advance(self, now, out);
    }
    fn approx_memory_bytes(&self) -> usize {
        TimerWheel::approx_memory_bytes(self)
    }
}

/// Baseline: a min-heap of (due, seq, key) with lazy deletion; a key map holds each key's live
/// (due, seq). Stale heap tops are popped after every mutation so `next_deadline` is exact.
struct HeapTimers {
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    live: HashMap<u32, (u64, u64)>,
    seq: u64,
}

impl HeapTimers {
    fn is_live(&self, &(due, seq, key): &(u64, u64, u32)) -> bool {
        self.live.get(&key) == Some(&(due, seq))
    }

    fn pop_stale(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                break;
            }
            self.heap.pop();
        }
        // Rebuild when stale entries dominate.
        if self.heap.len() > 2 * self.live.len() + 1024 {
            let live = &self.live;
            self.heap.retain(|Reverse((due, seq, key))| live.get(key) == Some(&(*due, *seq)));
        }
    }
}

impl Timers for HeapTimers {
    type Key = u32;
    fn key(i: u32) -> u32 {
        i
    }
    fn new(_now: u64) -> Self {
        Self { heap: BinaryHeap::new(), live: HashMap::new(), seq: 0 }
    }
    fn insert(&mut self, key: u32, due: u64) {
        self.seq += 1;
        let replaced = match self.live.entry(key) {
            Entry::Occupied(mut e) => {
                e.insert((due, self.seq));
                true
            }
            Entry::Vacant(e) => {
                e.insert((due, self.seq));
                false
            }
        };
        self.heap.push(Reverse((due, self.seq, key)));
        if replaced {
            self.pop_stale();
        }
    }
    fn cancel(&mut self, key: &u32) -> Option<u64> {
        let (due, _) = self.live.remove(key)?;
        self.pop_stale();
        Some(due)
    }
    fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((due, _, _))| *due)
    }
    fn advance(&mut self, now: u64, out: &mut Vec<(u32, u64)>) {
        while let Some(&Reverse(top)) = self.heap.peek() {
            if top.0 > now {
                break;
            }
            self.heap.pop();
            if self.is_live(&top) {
                self.live.remove(&top.2);
                out.push((top.2, top.0));
            }
        }
        self.pop_stale();
    }
    fn approx_memory_bytes(&self) -> usize {
        let buckets = (self.live.capacity() * 8 / 7).next_power_of_two();
        self.heap.capacity() * size_of::<Reverse<(u64, u64, u32)>>()
            + buckets * (size_of::<(u32, (u64, u64))>() + 1)
    }
}

/// Deterministic pseudo-random stream (splitmix64).
fn random(seed: u64) -> impl Iterator<Item = u64> {
    let mut state = seed;
    std::iter::repeat_with(move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// Due times of keys `0..N`, uniform over `[START, START + span)`.
fn spread_dues(span: u64) -> Vec<u64> {
    random(span).take(N as usize).map(|r| START + r % span).collect()
}

fn filled<T: Timers>(dues: &[u64]) -> T {
    let mut timers = T::new(START);
    for (i, &due) in (0u32..).zip(dues) {
        timers.insert(T::key(i), due);
    }
    timers
}

/// The scheduler loop: sleep until the next deadline, fire, re-insert each at due + period.
fn run_until<T: Timers>(timers: &mut T, end: u64, period: u64) -> usize {
    let mut out = Vec::new();
    let mut fired = 0;
    while let Some(deadline) = timers.next_deadline() {
        if deadline > end {
            break;
        }
        timers.advance(deadline, &mut out);
        fired += out.len();
        for (key, due) in out.drain(..) {
            timers.insert(key, due + period);
        }
    }
    fired
}

/// Times `op` on a fresh state from `setup`, excluding setup and drop.
fn timed<S>(iters: u64, setup: impl Fn() -> S, op: impl Fn(&mut S)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut state = setup();
        let started = Instant::now();
        op(&mut state);
        total += started.elapsed();
        drop(black_box(state));
    }
    total
}

fn configure<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    group
}

/// Runs `$bench::<T>(group, variant name, args...)` for every variant.
macro_rules! each_variant {
    ($bench:ident($group:expr $(, $arg:expr)*)) => {
        $bench::<TimerWheel<DenseKey>>($group, "wheel" $(, $arg)*);
        $bench::<TimerWheel<u32>>($group, "wheel_hashed" $(, $arg)*);
        $bench::<HeapTimers>($group, "heap" $(, $arg)*);
    };
}

fn bench_insert(c: &mut Criterion) {
    fn one<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, label: &str, dues: &[u64]) {
        group.bench_function(BenchmarkId::new(name, label), |b| {
            b.iter_custom(|iters| timed(iters, || (), |_| drop(black_box(filled::<T>(dues)))))
        });
    }
    let mut group = configure(c, "insert_1m");
    group.throughput(Throughput::Elements(u64::from(N)));
    for (label, span) in [("1h", HOUR), ("1d", DAY)] {
        let dues = spread_dues(span);
        each_variant!(one(&mut group, label, &dues));
    }
    group.finish();
}

fn bench_cancel(c: &mut Criterion) {
    fn one<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, dues: &[u64], picks: &[u32]) {
        let keys: Vec<T::Key> = picks.iter().map(|&i| T::key(i)).collect();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(
                    iters,
                    || filled::<T>(dues),
                    |t| {
                        for key in &keys {
                            black_box(t.cancel(key));
                        }
                    },
                )
            })
        });
    }
    let mut group = configure(c, "cancel_100k_of_1m");
    group.throughput(Throughput::Elements(CANCELS as u64));
    let dues = spread_dues(HOUR);
    let picks: Vec<u32> = random(7).take(CANCELS).map(|r| (r % u64::from(N)) as u32).collect();
    each_variant!(one(&mut group, &dues, &picks));
    group.finish();
}

fn bench_advance(c: &mut Criterion) {
    fn one<T: Timers>(
        group: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        label: &str,
        dues: &[u64],
        span: u64,
    ) {
        // A tenth of the period: about 100k fires, each re-inserted one period later.
        let end = START + span / 10;
        let fires = dues.iter().filter(|&&due| due <= end).count();
        group.throughput(Throughput::Elements(fires as u64));
        group.bench_function(BenchmarkId::new(name, label), |b| {
            b.iter_custom(|iters| {
                timed(iters, || filled::<T>(dues), |t| assert_eq!(run_until(t, end, span), fires))
            })
        });
    }
    let mut group = configure(c, "advance_window_periodic_1m");
    for (label, span) in [("1h", HOUR), ("1d", DAY)] {
        let dues = spread_dues(span);
        each_variant!(one(&mut group, label, &dues, span));
    }
    group.finish();
}

fn bench_steady(c: &mut Criterion) {
    // 1M timers with a 1 s period: 1,000 due every ms, advanced one ms at a time for 1 s.
    const PERIOD: u64 = 1_000;
    fn step_each_ms<T: Timers>(timers: &mut T) {
        let mut out = Vec::with_capacity(1_000);
        let mut fired = 0;
        for now in START + 1..=START + PERIOD {
            timers.advance(now, &mut out);
            fired += out.len();
            for (key, due) in out.drain(..) {
                timers.insert(key, due + PERIOD);
            }
        }
        assert_eq!(fired, N as usize);
    }
    fn one<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, dues: &[u64]) {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| timed(iters, || filled::<T>(dues), step_each_ms))
        });
    }
    let mut group = configure(c, "steady_1000_due_per_ms");
    group.throughput(Throughput::Elements(u64::from(N)));
    let dues: Vec<u64> = (0..u64::from(N)).map(|i| START + 1 + i % PERIOD).collect();
    each_variant!(one(&mut group, &dues));
    group.finish();
}

/// Bytes per timer at 1M timers (allocated capacity).
fn report_memory() {
    let dues = spread_dues(DAY);
    let per = |bytes: usize| bytes as f64 / f64::from(N);
    let mut presized = TimerWheel::with_capacity(START, N as usize);
    for (i, &due) in (0u32..).zip(&dues) {
        presized.insert(DenseKey(i), due);
    }
    println!(
        "memory at 1M timers, B/timer: wheel {:.1} (with_capacity {:.1}), wheel_hashed {:.1}, heap {:.1}",
        per(filled::<TimerWheel<DenseKey>>(&dues).approx_memory_bytes()),
        per(presized.approx_memory_bytes()),
        per(filled::<TimerWheel<u32>>(&dues).approx_memory_bytes()),
        per(filled::<HeapTimers>(&dues).approx_memory_bytes()),
    );
}

criterion_group!(benches, bench_insert, bench_cancel, bench_advance, bench_steady);

fn main() {
    report_memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
