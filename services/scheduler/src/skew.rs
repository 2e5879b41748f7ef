//! The clock guard: every replica, leader or not, measures its clock's offset from the NATS
//! server's (local minus server) with a heartbeat key of its own in the leader bucket: the
//! server stamps the stored message, and the local clock read before and after the write
//! brackets that stamp (the midpoint is the estimate, the round trip its error bar). A few
//! recent samples are kept; those with a round trip far above the best are outliers, and the
//! median of the rest is the offset.
//!
//! The offset corrects the scheduler's wall clock ([`ServerClock`]: fires are timed on the
//! server's clock), is exported as `jetsched_scheduler_clock_offset_seconds`, and past
//! `--max-clock-skew` makes the replica wait one extra lease before campaigning, log, and
//! publish a `scheduler.clock_skew` event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use jetsched_shared::events::EventSink;
use jetsched_shared::names::SYSTEM_NAMESPACE;
use jetsched_shared::wire::{Event as WireEvent, EventKind};
use prometheus::Gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SharedClock};

/// Heartbeat period.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);
/// Samples kept.
const WINDOW: usize = 8;
/// A sample whose round trip exceeds twice the best one's plus this is an outlier.
const RTT_SLACK_US: i64 = 1_000;
/// Offsets smaller than this are within the measurement's own error: not applied.
const DEAD_BAND_US: i64 = 1_000;
/// Samples taken at start-up before the scheduler's clock is first corrected.
const FIRST_SAMPLES: usize = 3;

/// One measurement (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) offset_us: i64,
    pub(crate) rtt_us: i64,
}

/// The recent samples and the offset they give (pure).
#[derive(Debug, Default)]
pub(crate) struct Estimate {
    samples: VecDeque<Sample>,
}

impl Estimate {
    pub(crate) fn add(&mut self, sample: Sample) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The median offset of the samples whose round trip is near the best; `None` without any.
    pub(crate) fn offset_us(&self) -> Option<i64> {
        let best = self.samples.iter().map(|s| s.rtt_us).min()?;
        let bound = best.saturating_mul(2).saturating_add(RTT_SLACK_US);
        let mut kept: Vec<i64> =
            self.samples.iter().filter(|s| s.rtt_us <= bound).map(|s| s.offset_us).collect();
        kept.sort_unstable();
        Some(kept[kept.len() / 2])
    }
}

/// The offset as the rest of the scheduler reads it (cheap to clone).
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    skewed: Arc<AtomicBool>,
    measured: watch::Receiver<bool>,
}

impl Guard {
    /// A guard that never measures (a test clock): nothing to correct, never skewed.
    pub(crate) fn off() -> Guard {
        let (_, measured) = watch::channel(true);
        Guard { skewed: Arc::default(), measured }
    }

    /// The offset is past the maximum skew.
    pub(crate) fn skewed(&self) -> bool {
        self.skewed.load(Ordering::Relaxed)
    }

    /// Waits (at most `within`) for the first measurement.
    pub(crate) async fn measured(&self, within: Duration) {
        let mut measured = self.measured.clone();
        let _ = tokio::time::timeout(within, measured.wait_for(|&m| m)).await;
    }
}

/// The local clock corrected by the measured offset: the server's time.
#[derive(Debug)]
pub(crate) struct ServerClock {
    local: SharedClock,
    offset_us: Arc<AtomicI64>,
}

impl Clock for ServerClock {
    fn now_us(&self) -> i64 {
        self.local.now_us() - self.offset_us.load(Ordering::Relaxed)
    }

    fn sleep_until(&self, deadline_us: i64) -> BoxFuture<'static, ()> {
        // A sleeper that wakes before the corrected deadline (the offset moved) is re-armed
        // by its owner, which re-reads the clock.
        self.local.sleep_until(deadline_us.saturating_add(self.offset_us.load(Ordering::Relaxed))).boxed()
    }
}

/// The measuring side: heartbeat, estimate, metric, event.
pub(crate) struct Meter {
    store: kv::Store,
    key: String,
    instance: String,
    local: SharedClock,
    max_skew_us: i64,
    estimate: Estimate,
    offset_us: Arc<AtomicI64>,
    skewed: Arc<AtomicBool>,
    measured: watch::Sender<bool>,
    gauge: Gauge,
}

impl Meter {
    /// A meter writing `key` of the leader bucket with the `local` clock.
    pub(crate) fn new(
        store: kv::Store,
        key: String,
        instance: String,
        local: SharedClock,
        max_skew: Duration,
        gauge: Gauge,
    ) -> (Meter, Guard) {
        let (measured, seen) = watch::channel(false);
        let offset_us = Arc::new(AtomicI64::new(0));
        let skewed = Arc::new(AtomicBool::new(false));
        let guard = Guard { skewed: skewed.clone(), measured: seen };
        let max_skew_us = i64::try_from(max_skew.as_micros()).unwrap_or(i64::MAX);
        let meter = Meter {
            store,
            key,
            instance,
            local,
            max_skew_us,
            estimate: Estimate::default(),
            offset_us,
            skewed,
            measured,
            gauge,
        };
        (meter, guard)
    }

    /// The scheduler's clock: the local one corrected by this meter's offset.
    pub(crate) fn server_clock(&self) -> SharedClock {
        Arc::new(ServerClock { local: self.local.clone(), offset_us: self.offset_us.clone() })
    }

    /// A few samples in a row, so the scheduler's clock is corrected before its loop starts
    /// (a failure is logged; the heartbeat keeps trying).
    pub(crate) async fn first(&mut self, events: &EventSink) {
        for _ in 0..FIRST_SAMPLES {
            if let Err(error) = self.measure(events).await {
                tracing::warn!(error = format!("{error:#}"), "cannot measure the clock offset yet");
                return;
            }
        }
    }

    /// Measures every [`HEARTBEAT`] until `shutdown`.
    pub(crate) async fn run(mut self, events: EventSink, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(error) = self.measure(&events).await {
                        tracing::debug!(error = format!("{error:#}"), "clock offset sample failed");
                    }
                }
            }
        }
    }

    async fn measure(&mut self, events: &EventSink) -> anyhow::Result<()> {
        let sample = self.sample().await?;
        self.estimate.add(sample);
        let Some(offset) = self.estimate.offset_us() else { return Ok(()) };
        self.gauge.set(offset as f64 / 1e6);
        self.offset_us.store(if offset.abs() < DEAD_BAND_US { 0 } else { offset }, Ordering::Relaxed);
        let skewed = offset.abs() > self.max_skew_us;
        if skewed != self.skewed.swap(skewed, Ordering::Relaxed) {
            let seconds = offset as f64 / 1e6;
            if skewed {
                tracing::warn!(
                    offset_seconds = seconds,
                    "the local clock is off the server's by more than --max-clock-skew: fires follow the server's clock, and this replica campaigns one lease later"
                );
                let _ = events.try_emit(WireEvent {
                    instance: Some(self.instance.clone()),
                    reason: Some(format!("local clock minus server clock: {seconds:+.3} s")),
                    ..WireEvent::new(EventKind::SchedulerClockSkew, SYSTEM_NAMESPACE, "scheduler")
                });
            } else {
                tracing::info!(offset_seconds = seconds, "the local clock is back within --max-clock-skew");
            }
        }
        self.measured.send_replace(true);
        Ok(())
    }

    async fn sample(&self) -> anyhow::Result<Sample> {
        let before = self.local.now_us();
        let revision = self
            .store
            .put(&self.key, Bytes::from(before.to_string()))
            .await
            .context("write the clock heartbeat")?;
        let after = self.local.now_us();
        let entry = self.store.entry(&self.key).await.context("read the clock heartbeat")?;
        let entry =
            entry.filter(|e| e.revision == revision).context("the heartbeat read is not the one written")?;
        let server_us = i64::try_from(entry.created.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX);
        Ok(Sample { offset_us: (before + after) / 2 - server_us, rtt_us: after - before })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(samples: &[(i64, i64)]) -> Option<i64> {
        let mut estimate = Estimate::default();
        for &(offset_us, rtt_us) in samples {
            estimate.add(Sample { offset_us, rtt_us });
        }
        estimate.offset_us()
    }

    #[test]
    fn the_offset_is_the_median_of_the_samples_with_a_short_round_trip() {
        assert_eq!(estimate(&[]), None);
        assert_eq!(estimate(&[(5_000_000, 400)]), Some(5_000_000));
        // A slow round trip (its midpoint is far off) is left out.
        assert_eq!(estimate(&[(100, 300), (200, 500), (90_000, 80_000), (150, 400)]), Some(150));
        // Only the last WINDOW samples count.
        let mut samples = vec![(-5_000_000, 300); WINDOW];
        samples.extend([(0, 300); WINDOW]);
        assert_eq!(estimate(&samples), Some(0));
    }

    #[tokio::test]
    async fn the_server_clock_is_the_local_clock_minus_the_offset() {
        let local = crate::clock::ManualClock::at(10_000_000);
        let offset_us = Arc::new(AtomicI64::new(5_000_000));
        let clock = ServerClock { local: Arc::new(local.clone()), offset_us };
        assert_eq!(clock.now_us(), 5_000_000);
        let mut sleep = clock.sleep_until(6_000_000);
        assert!((&mut sleep).now_or_never().is_none());
        local.set(11_000_000);
        assert!(sleep.now_or_never().is_some(), "wakes when the server's clock reaches it");
    }
}
