//! The scheduler's wall clock, injected through [`crate::build_with_clock`]: what time it is
//! (Unix µs) and a sleep until a wall-clock instant. [`SystemClock`] is the real clock with a
//! µs-precise sleep; [`ManualClock`] stands still until a test sets or advances it.
//!
//! Only the wall clock (nominal fire times, lag, catch-up) comes from here; lease deadlines and
//! internal pacing (flushes, retries) use tokio's monotonic time, which the NATS server's
//! lease expiry also runs on.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

/// A wall clock.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Now, in Unix microseconds.
    fn now_us(&self) -> i64;

    /// Resolves once [`Clock::now_us`] has reached `deadline_us`, never before.
    fn sleep_until(&self, deadline_us: i64) -> BoxFuture<'static, ()>;

    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> i64 {
        self.now_us().div_euclid(1000)
    }
}

/// The clock a scheduler runs on (cheap to clone).
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The tokio timer (1 ms resolution, rounds up) wakes this much before a deadline; a short
/// `std::thread::sleep` (µs precision) on a blocking thread finishes the wait.
const TIMER_EARLY: Duration = Duration::from_millis(1);

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        chrono::Utc::now().timestamp_micros()
    }

    fn sleep_until(&self, deadline_us: i64) -> BoxFuture<'static, ()> {
        let wait = u64::try_from(deadline_us.saturating_sub(self.now_us())).unwrap_or(0);
        precise_sleep_until(Instant::now() + Duration::from_micros(wait))
    }
}

/// Sleeps until `deadline` with microsecond precision, never returning before it: the tokio
/// timer until [`TIMER_EARLY`] before, then a `std::thread::sleep` of the rest on a blocking
/// thread (dropping the future abandons that sleep, which ends by itself within a millisecond).
fn precise_sleep_until(deadline: Instant) -> BoxFuture<'static, ()> {
    async move {
        if let Some(early) = deadline.checked_sub(TIMER_EARLY)
            && early > Instant::now()
        {
            sleep_until(early).await;
        }
        let deadline = deadline.into_std();
        if deadline > std::time::Instant::now() {
            let rest =
                move || std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
            if tokio::task::spawn_blocking(rest).await.is_err() {
                // Cancelled (runtime shutting down): the tokio timer still never fires early.
                sleep_until(deadline.into()).await;
            }
        }
    }
    .boxed()
}

/// A clock that moves only when told to (tests): clones share one time, and sleepers wake
/// as soon as it reaches their deadline.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now_us: Arc<watch::Sender<i64>>,
}

impl ManualClock {
    /// A clock standing at `now_us` (Unix µs).
    pub fn at(now_us: i64) -> ManualClock {
        ManualClock { now_us: Arc::new(watch::Sender::new(now_us)) }
    }

    /// A clock standing at the current system time, rounded down to the second.
    pub fn starting_now() -> ManualClock {
        ManualClock::at(SystemClock.now_us().div_euclid(1_000_000) * 1_000_000)
    }

    /// Moves the clock to `now_us`; time never goes back (an earlier value is ignored).
    pub fn set(&self, now_us: i64) {
        self.now_us.send_if_modified(|current| {
            let later = now_us > *current;
            if later {
                *current = now_us;
            }
            later
        });
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        self.set(self.now_us().saturating_add(by));
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        *self.now_us.borrow()
    }

    fn sleep_until(&self, deadline_us: i64) -> BoxFuture<'static, ()> {
        let mut now = self.now_us.subscribe();
        async move {
            // The sender lives as long as any clone of the clock; if all are gone, never wake.
            if now.wait_for(|&now| now >= deadline_us).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_sleepers_when_it_reaches_their_deadline() {
        let clock = ManualClock::at(1_000_000);
        assert_eq!((clock.now_us(), clock.now_ms()), (1_000_000, 1_000));
        let mut sleep = clock.sleep_until(1_500_000);
        assert!((&mut sleep).now_or_never().is_none());
        clock.advance(Duration::from_millis(499));
        assert!((&mut sleep).now_or_never().is_none());
        clock.set(0); // never backwards
        assert_eq!(clock.now_us(), 1_499_000);
        clock.clone().advance(Duration::from_millis(1));
        assert!(sleep.now_or_never().is_some());
        assert!(clock.sleep_until(1_000_000).now_or_never().is_some(), "a past deadline is due");
    }

    #[tokio::test]
    async fn the_system_clock_never_wakes_early() {
        let clock = SystemClock;
        let deadline = clock.now_us() + 3_000;
        clock.sleep_until(deadline).await;
        assert!(clock.now_us() >= deadline);
        assert!(clock.now_ms() > 1_600_000_000_000);
    }
}
