//! One retry/backoff helper for every loop that retries: exponential delays, capped, with
//! optional jitter, and [`Backoff::retry_until`] / [`Backoff::retry_at_most`] for "try until it
//! works, or a deadline passes, or so many attempts failed".

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio::time::Instant;

/// Exponential delays: `initial`, `initial * multiplier`, ... capped at `max`, each spread
/// over `nominal * (1 ± jitter)` when a jitter is set. An iterator that never ends.
///
/// ```
/// # use std::time::Duration;
/// # use jetsched_shared::backoff::Backoff;
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
/// let delays: Vec<_> = backoff.by_ref().take(4).collect();
/// assert_eq!(delays, [100, 200, 350, 350].map(Duration::from_millis));
/// backoff.reset();
/// assert_eq!(backoff.next_delay(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
    /// The nominal delay the next call returns (before jitter).
    next: Duration,
    /// Delays handed out since the start or the last reset.
    given: u32,
    /// xorshift64 state for the jitter (never 0).
    rng: u64,
}

impl Backoff {
    /// Doubling delays from `initial`, capped at `max`, without jitter.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Backoff {
            initial,
            max,
            multiplier: 2.0,
            jitter: 0.0,
            next: initial.min(max),
            given: 0,
            rng: seed | 1,
        }
    }

    /// Grows the delay by `multiplier` (at least 1) after each one instead of doubling it.
    pub fn multiplier(mut self, multiplier: f64) -> Backoff {
        self.multiplier = if multiplier.is_finite() { multiplier.max(1.0) } else { 1.0 };
        self
    }

    /// Spreads each delay uniformly over `nominal * (1 - jitter) ..= nominal * (1 + jitter)`
    /// (`jitter` within 0..=1), so many clients retrying together do not stay in step. The cap
    /// applies to the nominal delay.
    pub fn jitter(mut self, jitter: f64) -> Backoff {
        self.jitter = if jitter.is_nan() { 0.0 } else { jitter.clamp(0.0, 1.0) };
        self
    }

    /// Seeds the jitter, for reproducible delays in tests.
    pub fn seed(mut self, seed: u64) -> Backoff {
        self.rng = seed | 1;
        self
    }

    /// The delay before the next attempt; the one after it is longer, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = Duration::try_from_secs_f64(nominal.as_secs_f64() * self.multiplier)
            .unwrap_or(self.max)
            .min(self.max);
        self.given = self.given.saturating_add(1);
        if self.jitter == 0.0 {
            return nominal;
        }
        let spread = nominal.as_secs_f64() * self.jitter;
        Duration::from_secs_f64((nominal.as_secs_f64() - spread + 2.0 * spread * self.unit()).max(0.0))
    }

    /// Starts again from the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
        self.given = 0;
    }

    /// Delays handed out since the start or the last reset.
    pub fn delays_given(&self) -> u32 {
        self.given
    }

    /// A number in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Runs `op` (given the attempt number, from 1) until it succeeds, sleeping the next delay
    /// between attempts. Gives up with the last error when `retryable` says the error is not
    /// worth another attempt, or when the next attempt would start after `deadline`.
    /// `retryable` sees each error with the attempt that failed and the delay before the next
    /// one (the place to log "retrying").
    pub async fn retry_until<T, E, Fut>(
        self,
        deadline: Instant,
        op: impl FnMut(u32) -> Fut,
        retryable: impl FnMut(&E, u32, Duration) -> bool,
    ) -> Result<T, GaveUp<E>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        self.retry(Limit::Deadline(deadline), op, retryable).await
    }

    /// The same bounded by a count instead of a deadline: at most `attempts` attempts (at
    /// least one). `retryable` sees only the errors another attempt follows.
    pub async fn retry_at_most<T, E, Fut>(
        self,
        attempts: u32,
        op: impl FnMut(u32) -> Fut,
        retryable: impl FnMut(&E, u32, Duration) -> bool,
    ) -> Result<T, GaveUp<E>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        self.retry(Limit::Attempts(attempts.max(1)), op, retryable).await
    }

    async fn retry<T, E, Fut>(
        mut self,
        limit: Limit,
        mut op: impl FnMut(u32) -> Fut,
        mut retryable: impl FnMut(&E, u32, Duration) -> bool,
    ) -> Result<T, GaveUp<E>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let error = match op(attempts).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let delay = self.next_delay();
            let spent = match limit {
                Limit::Deadline(deadline) => Instant::now() + delay > deadline,
                Limit::Attempts(most) => attempts >= most,
            };
            if spent || !retryable(&error, attempts, delay) {
                return Err(GaveUp { error, attempts, elapsed: started.elapsed() });
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// What ends a retried operation that keeps failing.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// No attempt starts after this instant.
    Deadline(Instant),
    /// No more than this many attempts.
    Attempts(u32),
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// The last error of a retried operation, with how many attempts were made and how long they
/// took.
#[derive(Debug)]
pub struct GaveUp<E> {
    pub error: E,
    pub attempts: u32,
    pub elapsed: Duration,
}

impl<E: std::fmt::Display> std::fmt::Display for GaveUp<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gave up after {} attempts in {:?}: {}", self.attempts, self.elapsed, self.error)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for GaveUp<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn delays_grow_by_the_multiplier_up_to_the_cap() {
        let cases: [(u64, u64, f64, &[u64]); 4] = [
            (100, 1_000, 2.0, &[100, 200, 400, 800, 1_000, 1_000]),
            (50, 2_000, 2.0, &[50, 100, 200, 400, 800, 1_600, 2_000]),
            (100, 1_000, 3.0, &[100, 300, 900, 1_000]),
            (500, 200, 2.0, &[200, 200]),
        ];
        for (initial, max, multiplier, expected) in cases {
            let backoff = Backoff::new(MS(initial), MS(max)).multiplier(multiplier);
            let delays: Vec<Duration> = backoff.take(expected.len()).collect();
            assert_eq!(delays, expected.iter().copied().map(MS).collect::<Vec<_>>(), "{initial} {max}");
        }
    }

    #[test]
    fn reset_starts_over_and_counts_again() {
        let mut backoff = Backoff::new(MS(10), MS(100));
        backoff.next_delay();
        backoff.next_delay();
        assert_eq!(backoff.delays_given(), 2);
        backoff.reset();
        assert_eq!((backoff.delays_given(), backoff.next_delay()), (0, MS(10)));
    }

    proptest! {
        #[test]
        fn jittered_delays_stay_within_their_bounds(
            initial in 1u64..10_000, max in 1u64..100_000, jitter in 0.0f64..=1.0, seed: u64,
        ) {
            let mut plain = Backoff::new(MS(initial), MS(max));
            let mut jittered = Backoff::new(MS(initial), MS(max)).jitter(jitter).seed(seed);
            for _ in 0..40 {
                let nominal = plain.next_delay().as_secs_f64();
                let delay = jittered.next_delay().as_secs_f64();
                prop_assert!(nominal <= max as f64 / 1000.0 + 1e-9);
                prop_assert!(delay >= nominal * (1.0 - jitter) - 1e-6, "{delay} < {nominal} - {jitter}");
                prop_assert!(delay <= nominal * (1.0 + jitter) + 1e-6, "{delay} > {nominal} + {jitter}");
            }
        }
    }

    #[test]
    fn jitter_spreads_the_delays() {
        let delays: std::collections::BTreeSet<Duration> =
            Backoff::new(MS(1_000), MS(1_000)).jitter(0.5).seed(7).take(20).collect();
        assert!(delays.len() > 10, "{delays:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_until_stops_at_success_at_a_fatal_error_or_at_the_deadline() {
        // Succeeds on the third attempt.
        let out: Result<u32, GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_until(
                Instant::now() + MS(1_000),
                |n| async move { if n < 3 { Err("no") } else { Ok(n) } },
                |_, _, _| true,
            )
            .await;
        assert_eq!(out.unwrap(), 3);

        // A fatal error ends at once.
        let out: Result<(), GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_until(Instant::now() + MS(1_000), |_| async { Err("fatal") }, |e, _, _| *e != "fatal")
            .await;
        assert_eq!(out.unwrap_err().attempts, 1);

        // 10 + 20 + 40 + 80 ms fit in 200 ms; the fifth wait (100 ms) would end after it.
        let started = Instant::now();
        let out: Result<(), GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_until(started + MS(200), |_| async { Err("down") }, |_, _, _| true)
            .await;
        let gave_up = out.unwrap_err();
        assert_eq!((gave_up.attempts, gave_up.error), (5, "down"));
        assert_eq!(started.elapsed(), MS(150));
        assert!(gave_up.to_string().starts_with("gave up after 5 attempts"), "{gave_up}");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_at_most_stops_at_success_at_a_fatal_error_or_after_the_attempts() {
        // Succeeds on the third of at most three attempts.
        let out: Result<u32, GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_at_most(3, |n| async move { if n < 3 { Err("no") } else { Ok(n) } }, |_, _, _| true)
            .await;
        assert_eq!(out.unwrap(), 3);

        // A fatal error ends at once.
        let out: Result<(), GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_at_most(5, |_| async { Err("fatal") }, |e, _, _| *e != "fatal")
            .await;
        assert_eq!(out.unwrap_err().attempts, 1);

        // Four attempts, three waits (10 + 20 + 40 ms); `retryable` sees only the errors
        // another attempt follows. Zero attempts means one.
        let started = Instant::now();
        let mut seen = Vec::new();
        let out: Result<(), GaveUp<&str>> = Backoff::new(MS(10), MS(100))
            .retry_at_most(
                4,
                |_| async { Err("down") },
                |_, tried, delay| {
                    seen.push((tried, delay));
                    true
                },
            )
            .await;
        let gave_up = out.unwrap_err();
        assert_eq!((gave_up.attempts, gave_up.error), (4, "down"));
        assert_eq!(seen, [(1, MS(10)), (2, MS(20)), (3, MS(40))]);
        assert_eq!(started.elapsed(), MS(70));
        let out: Result<(), GaveUp<&str>> =
            Backoff::new(MS(10), MS(100)).retry_at_most(0, |_| async { Err("down") }, |_, _, _| true).await;
        assert_eq!(out.unwrap_err().attempts, 1);
    }
}
