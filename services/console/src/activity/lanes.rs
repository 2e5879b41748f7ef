//! Per queue and lane (priority), the last hour in one-minute buckets: runs finished, the wait
//! of each run (its `fire.dispatched` to its first `run.started`) and its duration, each kept as
//! a small log-scaled histogram, so p50 and p99 come out without keeping every sample. Bounded:
//! 60 buckets per lane, and the dispatches waiting for their start at most [`MAX_WAITING`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// Minutes kept per lane.
pub(crate) const MINUTES: usize = 60;
/// Dispatches remembered until their run starts (the oldest are forgotten first).
const MAX_WAITING: usize = 100_000;
/// Histogram buckets per power of two (each bucket about 19% wide).
const STEPS: f64 = 4.0;
/// Buckets: from 1 ms to about 2^24 ms (4.7 hours); longer lands in the last.
const BUCKETS: usize = 97;

/// Milliseconds in log-scaled buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Histogram {
    counts: [u32; BUCKETS],
    total: u32,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { counts: [0; BUCKETS], total: 0 }
    }
}

impl Histogram {
    fn bucket(ms: u64) -> usize {
        if ms == 0 {
            return 0;
        }
        let at = ((ms as f64).log2() * STEPS).floor() as usize + 1;
        at.min(BUCKETS - 1)
    }

    /// The upper bound of a bucket, in milliseconds.
    fn upper(bucket: usize) -> u64 {
        if bucket == 0 { 0 } else { (2f64.powf(bucket as f64 / STEPS)).ceil() as u64 }
    }

    pub(crate) fn add(&mut self, ms: u64) {
        self.counts[Self::bucket(ms)] += 1;
        self.total += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    pub(crate) fn count(&self) -> u32 {
        self.total
    }

    /// The `q` quantile (0..=1) in milliseconds (a bucket's upper bound), `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((f64::from(self.total) * q).ceil() as u32).max(1);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Self::upper(bucket));
            }
        }
        Some(Self::upper(BUCKETS - 1))
    }
}

/// One minute of one lane.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LaneMinute {
    /// Runs finished in the minute.
    pub(crate) runs: u32,
    pub(crate) wait: Histogram,
    pub(crate) duration: Histogram,
}

/// One lane's minutes, by minute since the epoch; at most [`MINUTES`] of them.
#[derive(Debug, Default)]
struct Series {
    minutes: VecDeque<(i64, LaneMinute)>,
}

impl Series {
    fn at(&mut self, time: DateTime<Utc>) -> Option<&mut LaneMinute> {
        let minute = time.timestamp().div_euclid(60);
        let newest = self.minutes.back().map(|(m, _)| *m);
        match newest {
            Some(newest) if minute < newest - MINUTES as i64 + 1 => return None,
            Some(newest) if minute <= newest => {
                let at = self.minutes.iter().position(|(m, _)| *m >= minute);
                return match at {
                    Some(at) if self.minutes[at].0 == minute => Some(&mut self.minutes[at].1),
                    Some(at) => {
                        self.minutes.insert(at, (minute, LaneMinute::default()));
                        Some(&mut self.minutes[at].1)
                    }
                    None => None,
                };
            }
            _ => {}
        }
        self.minutes.push_back((minute, LaneMinute::default()));
        while self.minutes.front().is_some_and(|(m, _)| *m < minute - MINUTES as i64 + 1) {
            self.minutes.pop_front();
        }
        self.minutes.back_mut().map(|(_, stats)| stats)
    }
}

/// A lane: its queue and priority.
pub(crate) type Lane = (Arc<str>, &'static str);

/// Every lane's last hour, and the dispatches whose runs have not started yet.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    lanes: BTreeMap<Lane, Series>,
    dispatched: HashMap<Box<str>, DateTime<Utc>>,
    order: VecDeque<Box<str>>,
}

impl Lanes {
    /// A run was dispatched at `time`.
    pub(crate) fn dispatched(&mut self, execution: &str, time: DateTime<Utc>) {
        if self.dispatched.insert(execution.into(), time).is_none() {
            self.order.push_back(execution.into());
        }
        while self.order.len() > MAX_WAITING {
            if let Some(oldest) = self.order.pop_front() {
                self.dispatched.remove(&oldest);
            }
        }
    }

    /// A run of `lane` started at `time`: its wait counts when its dispatch was seen.
    pub(crate) fn started(&mut self, lane: Lane, execution: &str, time: DateTime<Utc>) {
        let Some(dispatched) = self.dispatched.remove(execution) else { return };
        let wait = (time - dispatched).num_milliseconds().max(0) as u64;
        if let Some(minute) = self.lanes.entry(lane).or_default().at(time) {
            minute.wait.add(wait);
        }
    }

    /// A run of `lane` finished at `time` after `duration_ms` (when known).
    pub(crate) fn finished(&mut self, lane: Lane, time: DateTime<Utc>, duration_ms: Option<u64>) {
        if let Some(minute) = self.lanes.entry(lane).or_default().at(time) {
            minute.runs += 1;
            if let Some(ms) = duration_ms {
                minute.duration.add(ms);
            }
        }
    }

    /// Each lane's last [`MINUTES`] minutes before `now`, oldest first (empty minutes
    /// included), lanes by queue then priority.
    pub(crate) fn last_hour(&self, now: DateTime<Utc>) -> Vec<(Lane, Vec<LaneMinute>)> {
        let end = now.timestamp().div_euclid(60);
        self.lanes
            .iter()
            .map(|(lane, series)| {
                let mut minutes = vec![LaneMinute::default(); MINUTES];
                for (minute, stats) in &series.minutes {
                    let age = end - minute;
                    if (0..MINUTES as i64).contains(&age) {
                        minutes[MINUTES - 1 - age as usize] = stats.clone();
                    }
                }
                (lane.clone(), minutes)
            })
            .collect()
    }
}

/// The whole hour of `minutes` as one histogram of `pick`.
pub(crate) fn over_hour(minutes: &[LaneMinute], pick: impl Fn(&LaneMinute) -> &Histogram) -> Histogram {
    let mut all = Histogram::default();
    for minute in minutes {
        all.merge(pick(minute));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_within_a_bucket() {
        let mut histogram = Histogram::default();
        assert_eq!(histogram.quantile(0.5), None);
        for ms in 1..=1000 {
            histogram.add(ms);
        }
        let p50 = histogram.quantile(0.5).unwrap();
        let p99 = histogram.quantile(0.99).unwrap();
        assert!((500..=600).contains(&p50), "p50 {p50}");
        assert!((990..=1180).contains(&p99), "p99 {p99}");
        histogram.add(0);
        histogram.add(u64::MAX);
        assert_eq!(histogram.count(), 1002);
    }

    #[test]
    fn lanes_keep_an_hour_of_minutes_and_waits_from_dispatch_to_start() {
        let t0 = DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z").unwrap().to_utc();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let lane: Lane = (Arc::from("default"), "high");
        let mut lanes = Lanes::default();
        lanes.dispatched("a", at(0));
        lanes.started(lane.clone(), "a", at(2));
        lanes.finished(lane.clone(), at(3), Some(250));
        // A start without a seen dispatch counts no wait; a retry's second start neither.
        lanes.started(lane.clone(), "b", at(4));
        lanes.started(lane.clone(), "a", at(5));
        lanes.finished(lane.clone(), at(65), Some(40));
        let hour = lanes.last_hour(at(70));
        let minutes = &hour[0].1;
        assert_eq!(minutes.len(), MINUTES);
        assert_eq!((minutes[58].runs, minutes[59].runs), (1, 1));
        let wait = over_hour(minutes, |m| &m.wait);
        assert_eq!((wait.count(), wait.quantile(0.5)), (1, Some(2048)));
        let duration = over_hour(minutes, |m| &m.duration);
        assert_eq!(duration.count(), 2);
        // Late events of a minute still within the hour land in it.
        lanes.finished(lane.clone(), at(10), Some(1));
        assert_eq!(lanes.last_hour(at(70))[0].1[58].runs, 2);
        // Two hours later: the old minutes are gone.
        lanes.finished(lane.clone(), at(7200), None);
        lanes.finished(lane, at(30), None);
        let hour = lanes.last_hour(at(7200));
        assert_eq!(hour[0].1.iter().map(|m| m.runs).sum::<u32>(), 1, "only the last run is within the hour");
    }

    #[test]
    fn waiting_dispatches_are_bounded() {
        let mut lanes = Lanes::default();
        let now = Utc::now();
        for n in 0..MAX_WAITING + 10 {
            lanes.dispatched(&format!("e{n}"), now);
        }
        assert_eq!((lanes.dispatched.len(), lanes.order.len()), (MAX_WAITING, MAX_WAITING));
        assert!(!lanes.dispatched.contains_key("e0"));
    }
}
