//! Runs assembled from recent events: one row per execution (task, trigger, attempts, worker,
//! outcome, error, trace id), newest first, filterable by outcome.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use jetsched_shared::wire::{Event, EventKind};

/// One execution as its events tell it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunRow {
    pub(crate) execution_id: String,
    pub(crate) namespace: String,
    pub(crate) task_id: String,
    pub(crate) nominal: Option<DateTime<Utc>>,
    /// Time of the latest event of the run.
    pub(crate) last_seen: Option<DateTime<Utc>>,
    pub(crate) trigger: String,
    pub(crate) attempts: u32,
    pub(crate) worker: String,
    pub(crate) outcome: String,
    /// The whole run's duration (first attempt's start to its final status), once final.
    pub(crate) duration_ms: Option<u64>,
    pub(crate) error: String,
    pub(crate) trace_id: String,
}

/// The runs among `events` (any order), newest first; `keep` filters them.
pub(crate) fn runs_from_events<'a>(
    events: impl Iterator<Item = &'a Event>,
    keep: impl Fn(&RunRow) -> bool,
) -> Vec<RunRow> {
    let mut runs: HashMap<&str, RunRow> = HashMap::new();
    let mut ordered: Vec<&'a Event> = events.filter(|e| e.execution_id.is_some()).collect();
    // Events of one run stored in the same millisecond (a last attempt's `run.failed` and the
    // `run.dead` right after it) count in the order of the run's life, not of their arrival.
    ordered.sort_by_key(|e| (e.time, stage(e.kind)));
    for event in ordered {
        let execution = event.execution_id.as_deref().expect("filtered");
        let run = runs.entry(execution).or_insert_with(|| RunRow {
            execution_id: execution.to_string(),
            namespace: event.namespace.clone(),
            task_id: event.task_id.clone(),
            ..RunRow::default()
        });
        run.last_seen = Some(event.time);
        if event.nominal_time.is_some() {
            run.nominal = event.nominal_time;
        }
        if let Some(trigger) = event.trigger {
            run.trigger = trigger.as_str().to_string();
        }
        if let Some(worker) = &event.worker {
            run.worker.clone_from(worker);
        }
        if let Some(attempt) = event.attempt {
            run.attempts = run.attempts.max(attempt);
        }
        if event.run_duration_ms.is_some() {
            run.duration_ms = event.run_duration_ms;
        }
        if let Some(error) = &event.error {
            run.error.clone_from(error);
        }
        if let Some(trace) = &event.trace_id {
            run.trace_id.clone_from(trace);
        }
        let outcome = match event.kind {
            EventKind::FireDispatched if run.outcome.is_empty() => "dispatched",
            EventKind::FireSkipped | EventKind::RunSkipped => "skipped",
            EventKind::RunHeld => "held",
            EventKind::RunStarted => "running",
            EventKind::RunSucceeded => "succeeded",
            EventKind::RunFailed => "failed",
            EventKind::RunRetrying => "retrying",
            EventKind::RunDead => "dead-lettered",
            EventKind::RunCancelled => "cancelled",
            _ => continue,
        };
        run.outcome = outcome.to_string();
    }
    let mut rows: Vec<RunRow> = runs.into_values().filter(|row| keep(row)).collect();
    rows.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then_with(|| a.execution_id.cmp(&b.execution_id)));
    rows
}

/// Where an event stands in a run's life: later stages win a tie in time.
fn stage(kind: EventKind) -> u8 {
    match kind {
        EventKind::FireDispatched => 0,
        EventKind::RunHeld => 1,
        EventKind::RunStarted => 1,
        EventKind::RunRetrying => 2,
        EventKind::RunFailed => 3,
        EventKind::RunSucceeded
        | EventKind::RunDead
        | EventKind::FireSkipped
        | EventKind::RunSkipped
        | EventKind::RunCancelled => 4,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetsched_shared::wire::Trigger;

    fn event(kind: EventKind, execution: &str, second: i64) -> Event {
        Event {
            execution_id: Some(execution.into()),
            time: DateTime::from_timestamp(1_700_000_000 + second, 0).unwrap(),
            ..Event::new(kind, "ns", "task")
        }
    }

    #[test]
    fn a_run_takes_the_facts_of_all_its_events() {
        let events = [
            Event { trigger: Some(Trigger::Manual), ..event(EventKind::FireDispatched, "a", 0) },
            Event { attempt: Some(1), worker: Some("w1".into()), ..event(EventKind::RunStarted, "a", 1) },
            Event { error: Some("<boom>".into()), attempt: Some(1), ..event(EventKind::RunRetrying, "a", 2) },
            Event { attempt: Some(2), trace_id: Some("t".into()), ..event(EventKind::RunSucceeded, "a", 3) },
            event(EventKind::FireDispatched, "b", 4),
            Event::new(EventKind::TaskPaused, "ns", "task"),
        ];
        let rows = runs_from_events(events.iter(), |_| true);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].execution_id, "b");
        assert_eq!(rows[0].outcome, "dispatched");
        let a = &rows[1];
        assert_eq!(
            (a.trigger.as_str(), a.attempts, a.worker.as_str(), a.outcome.as_str(), a.error.as_str()),
            ("manual", 2, "w1", "succeeded", "<boom>")
        );
        assert_eq!(a.trace_id, "t");
        let failed = runs_from_events(events.iter(), |row| row.outcome == "succeeded");
        assert_eq!(failed.len(), 1);
    }

    #[test]
    fn a_dead_run_is_dead_lettered_whichever_of_its_last_two_events_arrived_first() {
        for order in [[EventKind::RunDead, EventKind::RunFailed], [EventKind::RunFailed, EventKind::RunDead]]
        {
            let events =
                [event(EventKind::FireDispatched, "a", 0), event(order[0], "a", 5), event(order[1], "a", 5)];
            let rows = runs_from_events(events.iter(), |row| row.outcome == "dead-lettered");
            assert_eq!(rows.len(), 1, "{order:?}");
        }
    }
}
