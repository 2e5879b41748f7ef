//! Timer wheel vs a lazy-deletion binary heap at 1M timers: insert, cancel, advance with re-insert.
//!
//! `cargo bench -p jetsched-scheduler --bench timer` (about 2 minutes on 2 cores).

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group};
use jetsched_scheduler::timer::TimerWheel;

const N: u32 = 1_000_000;
const CANCELS: usize = 100_000;
const START: u64 = 1_735_689_600_000;
const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// The timer API both structures offer, as the scheduler loop uses it.
trait Timers {
    fn new(now: u64) -> Self;
    fn insert(&mut self, key: u32, due: u64);
    fn cancel(&mut self, key: &u32) -> Option<u64>;
    fn next_deadline(&self) -> Option<u64>;
    fn advance(&mut self, now: u64, out: &mut Vec<(u32, u64)>);
}

impl Timers for TimerWheel<u32> {
    fn new(now: u64) -> Self {
        TimerWheel::new(now)
    }
    fn insert(&mut self, key: u32, due: u64) {
        TimerWheel::insert(self, key, due);
    }
    fn cancel(&mut self, key: &u32) -> Option<u64> {
        TimerWheel::cancel(self, key)
    }
    fn next_deadline(&self) -> Option<u64> {
        TimerWheel::next_deadline(self)
    }
    fn advance(&mut self, now: u64, out: &mut Vec<(u32, u64)>) {
        TimerWheel::advance(self, now, out);
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

    fn approx_memory_bytes(&self) -> usize {
        let buckets = (self.live.capacity() * 8 / 7).next_power_of_two();
        self.heap.capacity() * size_of::<Reverse<(u64, u64, u32)>>()
            + buckets * (size_of::<(u32, (u64, u64))>() + 1)
    }
}

impl Timers for HeapTimers {
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
    for (key, &due) in (0u32..).zip(dues) {
        timers.insert(key, due);
    }
    timers
}

/// The scheduler loop: sleep until the next deadline, fire, re-insert each at due + period.
fn run_until<T: Timers>(timers: &mut T, end: u64, period: u64, out: &mut Vec<(u32, u64)>) -> usize {
    let mut fired = 0;
    while let Some(deadline) = timers.next_deadline() {
        if deadline > end {
            break;
        }
        timers.advance(deadline, out);
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

fn bench_insert(c: &mut Criterion) {
    let mut group = configure(c, "insert_1m");
    group.throughput(Throughput::Elements(u64::from(N)));
    for (label, span) in [("1h", HOUR), ("1d", DAY)] {
        let dues = spread_dues(span);
        group.bench_function(BenchmarkId::new("wheel", label), |b| {
            b.iter_custom(|iters| timed(iters, || (), |_| drop(black_box(filled::<TimerWheel<u32>>(&dues)))))
        });
        group.bench_function(BenchmarkId::new("heap", label), |b| {
            b.iter_custom(|iters| timed(iters, || (), |_| drop(black_box(filled::<HeapTimers>(&dues)))))
        });
    }
    group.finish();
}

fn bench_cancel(c: &mut Criterion) {
    let mut group = configure(c, "cancel_100k_of_1m");
    group.throughput(Throughput::Elements(CANCELS as u64));
    let dues = spread_dues(HOUR);
    let keys: Vec<u32> = random(7).take(CANCELS).map(|r| (r % u64::from(N)) as u32).collect();
    fn cancel_all<T: Timers>(timers: &mut T, keys: &[u32]) {
        for key in keys {
            black_box(timers.cancel(key));
        }
    }
    group.bench_function("wheel", |b| {
        b.iter_custom(|iters| timed(iters, || filled::<TimerWheel<u32>>(&dues), |t| cancel_all(t, &keys)))
    });
    group.bench_function("heap", |b| {
        b.iter_custom(|iters| timed(iters, || filled::<HeapTimers>(&dues), |t| cancel_all(t, &keys)))
    });
    group.finish();
}

fn bench_advance(c: &mut Criterion) {
    let mut group = configure(c, "advance_window_periodic_1m");
    for (label, span) in [("1h", HOUR), ("1d", DAY)] {
        let dues = spread_dues(span);
        // A tenth of the period: about 100k fires, each re-inserted one period later.
        let end = START + span / 10;
        let fires = dues.iter().filter(|&&due| due <= end).count();
        group.throughput(Throughput::Elements(fires as u64));
        group.bench_function(BenchmarkId::new("wheel", label), |b| {
            b.iter_custom(|iters| {
                timed(
                    iters,
                    || filled::<TimerWheel<u32>>(&dues),
                    |t| {
                        assert_eq!(run_until(t, end, span, &mut Vec::new()), fires);
                    },
                )
            })
        });
        group.bench_function(BenchmarkId::new("heap", label), |b| {
            b.iter_custom(|iters| {
                timed(
                    iters,
                    || filled::<HeapTimers>(&dues),
                    |t| {
                        assert_eq!(run_until(t, end, span, &mut Vec::new()), fires);
                    },
                )
            })
        });
    }
    group.finish();
}

fn bench_steady(c: &mut Criterion) {
    // 1M timers with a 1 s period: 1,000 due every ms, advanced one ms at a time for 1 s.
    let mut group = configure(c, "steady_1000_due_per_ms");
    group.throughput(Throughput::Elements(u64::from(N)));
    const PERIOD: u64 = 1_000;
    let dues: Vec<u64> = (0..u64::from(N)).map(|i| START + 1 + i % PERIOD).collect();
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
    group.bench_function("wheel", |b| {
        b.iter_custom(|iters| timed(iters, || filled::<TimerWheel<u32>>(&dues), step_each_ms))
    });
    group.bench_function("heap", |b| {
        b.iter_custom(|iters| timed(iters, || filled::<HeapTimers>(&dues), step_each_ms))
    });
    group.finish();
}

/// Bytes per timer at 1M timers (allocated capacity, keys are `u32`).
fn report_memory() {
    let dues = spread_dues(DAY);
    let wheel = filled::<TimerWheel<u32>>(&dues);
    let mut presized = TimerWheel::with_capacity(START, N as usize);
    for (key, &due) in (0u32..).zip(&dues) {
        presized.insert(key, due);
    }
    let heap = filled::<HeapTimers>(&dues);
    let per = |bytes: usize| bytes as f64 / f64::from(N);
    println!(
        "memory at 1M timers: wheel {:.1} B/timer (with_capacity {:.1}), heap {:.1} B/timer",
        per(wheel.approx_memory_bytes()),
        per(presized.approx_memory_bytes()),
        per(heap.approx_memory_bytes()),
    );
}

criterion_group!(benches, bench_insert, bench_cancel, bench_advance, bench_steady);

fn main() {
    report_memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
