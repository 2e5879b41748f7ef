//! Each task's recent runs as the task list shows them: the last run (its execution and start),
//! the last outcome and the success rate over the last [`RATE_RUNS`] finished runs, kept up to
//! date from the run events, so the list looks up its page's tasks and scans nothing.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use jetsched_shared::wire::{Event, EventKind};

/// Finished runs the success rate is taken over.
pub(crate) const RATE_RUNS: u32 = 20;

/// One task's recent runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskRuns {
    /// The last run started: its execution id and when.
    pub(crate) last_run: Option<(Box<str>, DateTime<Utc>)>,
    /// Whether the last finished run succeeded.
    pub(crate) last_succeeded: Option<bool>,
    /// Outcomes of the last finished runs, newest in bit 0 (1: succeeded).
    outcomes: u32,
    /// How many of `outcomes` are known (at most [`RATE_RUNS`]).
    finished: u32,
    /// The last run counted as failed (a failed run says so again when it is dead-lettered).
    last_failed: Option<Box<str>>,
}

impl TaskRuns {
    /// `(succeeded, finished)` over the last [`RATE_RUNS`] finished runs.
    pub(crate) fn success(&self) -> (u32, u32) {
        let mask = if self.finished >= 32 { u32::MAX } else { (1u32 << self.finished) - 1 };
        ((self.outcomes & mask).count_ones(), self.finished)
    }

    fn finish(&mut self, succeeded: bool) {
        self.outcomes = (self.outcomes << 1) | u32::from(succeeded);
        self.finished = (self.finished + 1).min(RATE_RUNS);
        self.last_succeeded = Some(succeeded);
    }
}

/// The recent runs of every task that ran, by index key (`<namespace>\0<id>`), and the tasks
/// whose last run failed.
#[derive(Debug, Default)]
pub(crate) struct TaskRunIndex {
    tasks: HashMap<Box<str>, TaskRuns>,
    failing: HashSet<Box<str>>,
}

impl TaskRunIndex {
    /// Counts `event` when it starts or ends a run.
    pub(crate) fn record(&mut self, event: &Event) {
        let Some(execution) = event.execution_id.as_deref() else { return };
        if !matches!(
            event.kind,
            EventKind::RunStarted | EventKind::RunSucceeded | EventKind::RunFailed | EventKind::RunDead
        ) {
            return;
        }
        let key = format!("{}\0{}", event.namespace, event.task_id);
        let runs = self.tasks.entry(key.as_str().into()).or_default();
        // A run's start: its `run.started`, or (a worker publishes that one only for runs that
        // last) its end less its duration.
        let start = event.time - chrono::Duration::milliseconds(event.duration_ms.unwrap_or(0) as i64);
        let known = runs.last_run.as_ref().is_some_and(|(last, _)| &**last == execution);
        if !known && runs.last_run.as_ref().is_none_or(|(_, at)| *at <= start) {
            runs.last_run = Some((execution.into(), start));
        }
        let succeeded = match event.kind {
            EventKind::RunStarted => return,
            EventKind::RunSucceeded => true,
            _ if runs.last_failed.as_deref() == Some(execution) => return,
            _ => {
                runs.last_failed = Some(execution.into());
                false
            }
        };
        runs.finish(succeeded);
        if succeeded {
            self.failing.remove(key.as_str());
        } else {
            self.failing.insert(key.into());
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&TaskRuns> {
        self.tasks.get(key)
    }

    /// Keys of the tasks whose last finished run failed.
    pub(crate) fn failing(&self) -> &HashSet<Box<str>> {
        &self.failing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: EventKind, task: &str, execution: &str, second: i64) -> Event {
        Event {
            execution_id: Some(execution.into()),
            time: DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap(),
            ..Event::new(kind, "ns", task)
        }
    }

    #[test]
    fn last_run_outcome_and_success_rate_of_each_task() {
        let mut index = TaskRunIndex::default();
        for n in 0..25 {
            let execution = format!("e{n}");
            index.record(&run(EventKind::RunStarted, "t", &execution, n));
            // Every fifth run fails for good, saying so twice.
            if n % 5 == 4 {
                index.record(&run(EventKind::RunFailed, "t", &execution, n));
                index.record(&run(EventKind::RunDead, "t", &execution, n));
            } else {
                index.record(&run(EventKind::RunSucceeded, "t", &execution, n));
            }
        }
        let runs = index.get("ns\0t").unwrap();
        assert_eq!(runs.last_run.as_ref().map(|(e, _)| &**e), Some("e24"));
        assert_eq!(runs.last_succeeded, Some(false));
        assert_eq!(runs.success(), (16, RATE_RUNS), "four of the last twenty failed");
        assert!(index.failing().contains("ns\0t"));
        index.record(&run(EventKind::RunStarted, "t", "e25", 25));
        index.record(&run(EventKind::RunSucceeded, "t", "e25", 25));
        assert!(index.failing().is_empty());
        assert_eq!(
            index.get("ns\0t").unwrap().success(),
            (16, RATE_RUNS),
            "the failure of e4 left the window"
        );
        // A short run publishes no `run.started`: its end less its duration is its start.
        let quick = Event { duration_ms: Some(500), ..run(EventKind::RunSucceeded, "v", "q1", 10) };
        index.record(&quick);
        let (execution, at) = index.get("ns\0v").unwrap().last_run.clone().unwrap();
        assert_eq!((&*execution, at), ("q1", quick.time - chrono::Duration::milliseconds(500)));
        // Events without an execution, or of other kinds, change nothing.
        index.record(&Event::new(EventKind::TaskPaused, "ns", "u"));
        index.record(&run(EventKind::FireDispatched, "u", "e1", 1));
        assert!(index.get("ns\0u").is_none());
    }
}
