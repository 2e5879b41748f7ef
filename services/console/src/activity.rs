//! Recent activity: the events of the last hour (bounded) and the alerts of the last hour, each
//! followed through an ordered consumer that starts an hour back; new events are broadcast to
//! the live pages. The run events also feed each task's recent runs (`task_runs`) and each
//! queue and lane's last hour (`lanes`).

mod lanes;
mod task_runs;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::alert::AlertMessage;
use jetsched_shared::wire::{Event, EventKind};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub(crate) use lanes::{Histogram, Lane, LaneMinute, over_hour};
pub(crate) use task_runs::{RATE_RUNS, TaskRunIndex, TaskRuns};

use crate::index::SharedIndex;

/// How far back the console reads when it starts, and what it keeps.
pub(crate) const HORIZON: Duration = Duration::from_secs(3600);
/// Alerts kept.
const MAX_ALERTS: usize = 200;

/// Fires, runs and failures in one minute of the chart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    pub(crate) fires: u32,
    pub(crate) runs: u32,
    pub(crate) failures: u32,
}

/// The recent events and alerts.
#[derive(Debug)]
pub(crate) struct Activity {
    events: VecDeque<Event>,
    capacity: usize,
    alerts: VecDeque<AlertMessage>,
    runs: TaskRunIndex,
    lanes: lanes::Lanes,
}

impl Activity {
    pub(crate) fn new(capacity: usize) -> Activity {
        Activity {
            events: VecDeque::new(),
            capacity,
            alerts: VecDeque::new(),
            runs: TaskRunIndex::default(),
            lanes: lanes::Lanes::default(),
        }
    }

    /// Keeps `event` and counts it in the tasks' runs and, when the task's `lane` is known, in
    /// its lane's last hour.
    pub(crate) fn record(&mut self, event: Event, lane: Option<Lane>) {
        self.runs.record(&event);
        if let Some(execution) = event.execution_id.as_deref() {
            match (event.kind, lane) {
                (EventKind::FireDispatched, _) => self.lanes.dispatched(execution, event.time),
                (EventKind::RunStarted, Some(lane)) => self.lanes.started(lane, execution, event.time),
                (EventKind::RunSucceeded | EventKind::RunFailed, Some(lane)) => {
                    // Workers publish `run.started` only for runs that last: the start of a
                    // short one is its end less its duration.
                    let duration = chrono::Duration::milliseconds(event.duration_ms.unwrap_or(0) as i64);
                    self.lanes.started(lane.clone(), execution, event.time - duration);
                    self.lanes.finished(lane, event.time, event.duration_ms)
                }
                _ => {}
            }
        }
        self.push_event(event);
    }

    /// Each task's recent runs.
    pub(crate) fn task_runs(&self) -> &TaskRunIndex {
        &self.runs
    }

    /// Each lane's last hour before `now`.
    pub(crate) fn lanes(&self, now: DateTime<Utc>) -> Vec<(Lane, Vec<LaneMinute>)> {
        self.lanes.last_hour(now)
    }

    pub(crate) fn push_event(&mut self, event: Event) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    pub(crate) fn push_alert(&mut self, alert: AlertMessage) {
        if self.alerts.len() == MAX_ALERTS {
            self.alerts.pop_front();
        }
        self.alerts.push_back(alert);
    }

    /// Events, newest first.
    pub(crate) fn events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().rev()
    }

    /// Alerts since `since`, newest first.
    pub(crate) fn alerts_since(&self, since: DateTime<Utc>) -> Vec<AlertMessage> {
        self.alerts.iter().rev().filter(|a| a.time >= since).cloned().collect()
    }

    /// Fires and finished runs per second over the minute before `now`.
    pub(crate) fn rates(&self, now: DateTime<Utc>) -> (f64, f64) {
        let since = now - chrono::Duration::seconds(60);
        let (mut fires, mut runs, mut ends) = (0u32, 0u32, RunEnds::default());
        for event in self.events().take_while(|e| e.time >= since) {
            match event.kind {
                EventKind::FireDispatched => fires += 1,
                _ if ends.ended(event).is_some() => runs += 1,
                _ => {}
            }
        }
        (f64::from(fires) / 60.0, f64::from(runs) / 60.0)
    }

    /// The last `minutes` minutes before `now`, oldest first.
    pub(crate) fn per_minute(&self, now: DateTime<Utc>, minutes: usize) -> Vec<Minute> {
        let mut out = vec![Minute::default(); minutes];
        let end = now.timestamp() / 60;
        let mut ends = RunEnds::default();
        for event in self.events() {
            let age = end - event.time.timestamp() / 60;
            if age < 0 {
                continue;
            }
            let Ok(age) = usize::try_from(age) else { continue };
            if age >= minutes {
                break;
            }
            let slot = &mut out[minutes - 1 - age];
            if event.kind == EventKind::FireDispatched {
                slot.fires += 1;
            }
            if let Some(failed) = ends.ended(event) {
                slot.runs += 1;
                slot.failures += u32::from(failed);
            }
        }
        out
    }
}

/// Counts each run's end once: a run that fails for good says so twice (`run.failed`, then
/// `run.dead`), and a `run.failed` repeats while its dead letter cannot be stored.
#[derive(Default)]
struct RunEnds<'a> {
    failed: HashSet<&'a str>,
}

impl<'a> RunEnds<'a> {
    /// `Some(failed)` when `event` ends a run not counted yet, `None` otherwise.
    fn ended(&mut self, event: &'a Event) -> Option<bool> {
        match event.kind {
            EventKind::RunSucceeded => Some(false),
            EventKind::RunFailed | EventKind::RunDead => match event.execution_id.as_deref() {
                Some(run) => self.failed.insert(run).then_some(true),
                None => Some(true),
            },
            _ => None,
        }
    }
}

/// Runs that failed for good among `events` (newest first), one event each: the `run.dead`
/// of a dead-lettered run, else its `run.failed`.
pub(crate) fn failed_runs<'a>(events: impl Iterator<Item = &'a Event>) -> impl Iterator<Item = &'a Event> {
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    let mut out: Vec<&'a Event> = Vec::new();
    for event in events.filter(|e| matches!(e.kind, EventKind::RunFailed | EventKind::RunDead)) {
        let Some(run) = event.execution_id.as_deref() else {
            out.push(event);
            continue;
        };
        match seen.get(run) {
            Some(&at) if event.kind == EventKind::RunDead => out[at] = event,
            Some(_) => {}
            None => {
                seen.insert(run, out.len());
                out.push(event);
            }
        }
    }
    out.into_iter()
}

pub(crate) type SharedActivity = Arc<RwLock<Activity>>;

/// Follows `stream` from an hour back until `shutdown`, handing every decodable message to
/// `apply`. A stream that does not exist (yet) is retried a little later.
pub(crate) async fn follow<T: serde::de::DeserializeOwned>(
    js: jetstream::Context,
    stream: String,
    shutdown: CancellationToken,
    mut apply: impl FnMut(T),
) -> anyhow::Result<()> {
    let mut start = Utc::now() - chrono::Duration::from_std(HORIZON).expect("an hour");
    loop {
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            result = follow_once(&js, &stream, start, &mut apply) => result,
        };
        match result {
            Ok(last) => start = last,
            Err(error) => tracing::warn!(error = format!("{error:#}"), stream, "following a stream"),
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// One ordered consumer from `start`; returns the time of the last message seen when it ends.
async fn follow_once<T: serde::de::DeserializeOwned>(
    js: &jetstream::Context,
    stream: &str,
    start: DateTime<Utc>,
    apply: &mut impl FnMut(T),
) -> anyhow::Result<DateTime<Utc>> {
    let stream_handle = js.get_stream(stream).await.with_context(|| format!("open stream {stream}"))?;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        start.timestamp_nanos_opt().unwrap_or_default(),
    ))
    .context("start time")?;
    let consumer = stream_handle
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            ..Default::default()
        })
        .await
        .with_context(|| format!("ordered consumer on {stream}"))?;
    let mut messages = consumer.messages().await.with_context(|| format!("read {stream}"))?;
    let mut last = start;
    while let Some(message) = messages.next().await {
        match message {
            Ok(message) => {
                if let Ok(info) = message.info() {
                    let nanos = info.published.unix_timestamp_nanos();
                    last = DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX));
                }
                if let Ok(value) = serde_json::from_slice::<T>(&message.payload) {
                    apply(value);
                }
            }
            Err(error) => tracing::warn!(%error, stream, "reading a stream"),
        }
    }
    Ok(last)
}

/// The lane of the task an event is about, from the index (`None`: not a run's, or the task
/// is not indexed).
fn lane_of(index: &SharedIndex, event: &Event) -> Option<Lane> {
    if !matches!(event.kind, EventKind::RunStarted | EventKind::RunSucceeded | EventKind::RunFailed) {
        return None;
    }
    let index = index.read().expect("task index lock");
    let task = index.get(&event.namespace, &event.task_id)?;
    Some((task.queue.clone(), task.priority))
}

/// Starts following the events and alerts streams into `activity`, broadcasting new events.
/// The events are read once the task index is loaded (`index_loaded`), so each run counts in
/// its task's lane.
pub(crate) fn spawn(
    tracker: &tokio_util::task::TaskTracker,
    js: &jetstream::Context,
    names: &jetsched_shared::names::Names,
    (activity, index, mut index_loaded): (SharedActivity, SharedIndex, tokio::sync::watch::Receiver<bool>),
    live: broadcast::Sender<Event>,
    shutdown: &CancellationToken,
) {
    let events = activity.clone();
    let (js_events, stream, stop) = (js.clone(), names.events_stream(), shutdown.clone());
    tracker.spawn(async move {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            // A closed sender (the feed ended) lets the events be read anyway.
            _ = index_loaded.wait_for(|loaded| *loaded) => {}
        }
        follow(js_events, stream, stop, move |event: Event| {
            let lane = lane_of(&index, &event);
            events.write().expect("activity lock").record(event.clone(), lane);
            // Nobody listening is fine.
            let _ = live.send(event);
        })
        .await
    });
    tracker.spawn(follow(js.clone(), names.alerts_stream(), shutdown.clone(), move |alert: AlertMessage| {
        activity.write().expect("activity lock").push_alert(alert);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(kind: EventKind, time: DateTime<Utc>) -> Event {
        Event { time, ..Event::new(kind, "ns", "t") }
    }

    #[test]
    fn minutes_and_rates_count_fires_runs_and_failures() {
        let now = DateTime::parse_from_rfc3339("2026-03-01T10:00:30Z").unwrap().to_utc();
        let mut activity = Activity::new(100);
        let ago = |s: i64| now - chrono::Duration::seconds(s);
        for (kind, age) in [
            (EventKind::FireDispatched, 200),
            (EventKind::RunSucceeded, 199),
            (EventKind::FireDispatched, 20),
            (EventKind::RunStarted, 19),
            (EventKind::RunFailed, 10),
            (EventKind::FireDispatched, 5),
        ] {
            activity.push_event(at(kind, ago(age)));
        }
        let minutes = activity.per_minute(now, 5);
        assert_eq!(minutes.len(), 5);
        assert_eq!(minutes[4], Minute { fires: 2, runs: 1, failures: 1 });
        assert_eq!(minutes[3], Minute::default(), "{minutes:?}");
        assert_eq!(minutes[1], Minute { fires: 1, runs: 1, failures: 0 }, "{minutes:?}");
        let (fires, runs) = activity.rates(now);
        assert!((fires - 2.0 / 60.0).abs() < 1e-9 && (runs - 1.0 / 60.0).abs() < 1e-9);
    }

    #[test]
    fn the_buffer_is_bounded() {
        let mut activity = Activity::new(3);
        for n in 0..5 {
            activity.push_event(Event::new(EventKind::TaskRegistered, "ns", format!("t{n}")));
        }
        let ids: Vec<_> = activity.events().map(|e| e.task_id.clone()).collect();
        assert_eq!(ids, ["t4", "t3", "t2"]);
    }

    #[test]
    fn a_dead_run_counts_and_lists_once() {
        let now = DateTime::parse_from_rfc3339("2026-03-01T10:00:30Z").unwrap().to_utc();
        let mut activity = Activity::new(100);
        let run = |kind, execution: &str| Event {
            execution_id: Some(execution.into()),
            ..at(kind, now - chrono::Duration::seconds(5))
        };
        for event in [
            run(EventKind::RunFailed, "a"),
            run(EventKind::RunDead, "a"),
            run(EventKind::RunDead, "b"),
            run(EventKind::RunFailed, "b"),
            run(EventKind::RunFailed, "c"),
        ] {
            activity.push_event(event);
        }
        assert_eq!(activity.per_minute(now, 1), vec![Minute { fires: 0, runs: 3, failures: 3 }]);
        assert_eq!(activity.rates(now).1 * 60.0, 3.0);
        let listed: Vec<(&str, EventKind)> =
            failed_runs(activity.events()).map(|e| (e.execution_id.as_deref().unwrap(), e.kind)).collect();
        assert_eq!(
            listed,
            [("c", EventKind::RunFailed), ("b", EventKind::RunDead), ("a", EventKind::RunDead)]
        );
    }
}
