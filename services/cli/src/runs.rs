//! `jetsched runs`: a task's recent executions, assembled from its events (the event stream, or
//! the registry's history for a team that cannot read the stream), as a table that fits 100
//! columns (`--wide`: every id and time in full) or as JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{Event, EventKind, format_time};
use serde_json::{Value, json};

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, Column};

/// How long `runs` waits for the events stream's information before reading the task's events
/// the way a user confined to its namespace may.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Characters of an execution id the table shows (a UUID's first group).
const SHORT_ID: usize = 8;

/// Reads up to `last` events matching `filter`, oldest first, without waiting for new ones.
async fn recent_events(
    js: &jetstream::Context,
    names: &Names,
    filter: String,
    last: u64,
) -> anyhow::Result<Vec<Event>> {
    let mut stream = js.get_stream(names.events_stream()).await.context("open the events stream")?;
    let state = stream.info().await.context("events stream info")?.state.clone();
    if state.messages == 0 {
        return Ok(Vec::new());
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: state.last_sequence.saturating_sub(last.saturating_mul(20)).max(1),
            },
            ..Default::default()
        })
        .await
        .context("create an ordered consumer on the events stream")?;
    let mut messages = consumer.messages().await.context("read events")?;
    let mut out = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), messages.next()).await {
        let message = message.context("read event")?;
        if let Ok(event) = serde_json::from_slice::<Event>(&message.payload) {
            out.push(event);
        }
        if message.info().map(|i| i.pending).unwrap_or(0) == 0 {
            break;
        }
    }
    let keep = out.len().saturating_sub(last as usize);
    Ok(out.split_off(keep))
}

/// Whether a JetStream request failed because this user cannot reach the events stream: the
/// server refused the subject (the request then times out or reports a permissions violation,
/// depending on the server), or the user's account has no such stream.
fn is_permission_error(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}").to_lowercase();
    // A team's own account has a JetStream of its own, without the events stream.
    text.contains("permission")
        || text.contains("timed out")
        || text.contains("no responders")
        || text.contains("stream not found")
}

/// One execution as its events tell it.
#[derive(Debug, Default)]
struct RunView {
    nominal: Option<DateTime<Utc>>,
    dispatched: Option<DateTime<Utc>>,
    trigger: String,
    attempts: u32,
    worker: String,
    outcome: String,
    /// Start of the first attempt (its first `run.started`).
    first_started: Option<DateTime<Utc>>,
    /// The whole run's duration, from its final event ([`jetsched_shared::wire::RunRecord::duration`]).
    run_duration_ms: Option<u64>,
    /// The last attempt's own duration.
    last_attempt_ms: Option<u64>,
    /// The run reached a final status (succeeded, dead-lettered, skipped).
    ended: bool,
    error: String,
    trace_id: Option<String>,
}

impl RunView {
    fn take(&mut self, event: &Event) {
        if let Some(nominal) = event.nominal_time {
            self.nominal = Some(nominal);
        }
        if let Some(trigger) = event.trigger {
            self.trigger = trigger.as_str().to_string();
        }
        if let Some(worker) = &event.worker {
            self.worker.clone_from(worker);
        }
        if let Some(attempt) = event.attempt {
            self.attempts = self.attempts.max(attempt);
        }
        if event.duration_ms.is_some() {
            self.last_attempt_ms = event.duration_ms;
        }
        if event.run_duration_ms.is_some() {
            self.run_duration_ms = event.run_duration_ms;
        }
        if let Some(error) = &event.error {
            self.error.clone_from(error);
        }
        if event.trace_id.is_some() {
            self.trace_id.clone_from(&event.trace_id);
        }
        let skipped = || format!("skipped ({})", event.reason.as_deref().unwrap_or("?"));
        self.outcome = match event.kind {
            EventKind::FireDispatched => {
                self.dispatched = Some(event.time);
                if !self.outcome.is_empty() {
                    return;
                }
                "dispatched".into()
            }
            EventKind::FireSkipped | EventKind::RunSkipped => {
                self.ended = true;
                skipped()
            }
            EventKind::RunStarted => {
                self.first_started.get_or_insert(event.time);
                "running".into()
            }
            EventKind::RunSucceeded => {
                self.ended = true;
                "succeeded".into()
            }
            EventKind::RunFailed => "failed".into(),
            EventKind::RunRetrying => "retrying".into(),
            EventKind::RunDead => {
                self.ended = true;
                "dead-lettered".into()
            }
            EventKind::RunHeld => match (event.release_at, &event.key) {
                (Some(until), _) => format!("held until {}", until.format("%H:%M:%S")),
                // Waiting for a concurrency slot: no release time, the key it waits on.
                (None, Some(key)) => format!("waiting for a slot of {key}"),
                (None, None) => "held until ?".into(),
            },
            _ => return,
        };
    }

    /// The whole run's duration: what its final event says, or, while it runs, from its first
    /// start to `now` (the rule of `RunRecord::duration`).
    fn duration_ms(&self, now: DateTime<Utc>) -> Option<u64> {
        match (self.run_duration_ms, self.ended, self.first_started) {
            (Some(ms), _, _) => Some(ms),
            (None, false, Some(first)) => u64::try_from((now - first).num_milliseconds()).ok(),
            _ => None,
        }
    }
}

/// Every execution among `events` (oldest first), in the order each first appeared.
fn assemble(events: Vec<Event>) -> Vec<(String, RunView)> {
    let mut runs: BTreeMap<String, RunView> = BTreeMap::new();
    let mut order = Vec::new();
    for event in events {
        let Some(execution) = event.execution_id.clone() else { continue };
        let run = runs.entry(execution.clone()).or_insert_with(|| {
            order.push(execution);
            RunView::default()
        });
        run.take(&event);
    }
    order.into_iter().filter_map(|id| runs.remove(&id).map(|view| (id, view))).collect()
}

pub(crate) async fn runs(
    api: &Api,
    client: &async_nats::Client,
    names: &Names,
    task: &str,
    last: u64,
    wide: bool,
    json_out: bool,
) -> Result<(), Failure> {
    let task = task_ref(task);
    // The stream's information answers within milliseconds when this user may read it; a user
    // confined to a namespace is refused (the request then waits for its timeout), so keep the
    // wait short.
    let mut js = jetstream::new(client.clone());
    js.set_timeout(PROBE_TIMEOUT);
    let subject = names.event_subject("*.*", &task.namespace, &task.id);
    let events = match recent_events(&js, names, subject.clone(), last).await {
        Ok(events) => events,
        // A team (an account of its own, or a user confined to its namespace) cannot read the
        // events stream: the registry reads the task's history for it.
        Err(error) if is_permission_error(&error) => api
            .event_history(&task.namespace, Some(&task.id), last)
            .await?
            .into_iter()
            .filter_map(|event| serde_json::from_value::<Event>(event).ok())
            .collect(),
        Err(error) => return Err(error.into()),
    };
    let views = assemble(events);
    let now = Utc::now();
    if json_out {
        let list: Vec<Value> = views
            .iter()
            .map(|(id, r)| {
                json!({"execution_id": id, "nominal_time": r.nominal.map(format_time),
                       "dispatched_at": r.dispatched.map(format_time), "trigger": r.trigger,
                       "attempts": r.attempts, "worker": r.worker, "outcome": r.outcome,
                       "duration_ms": r.duration_ms(now), "last_attempt_ms": r.last_attempt_ms,
                       "error": r.error, "trace_id": r.trace_id})
            })
            .collect();
        output::pretty(&Value::Array(list));
        return Ok(());
    }
    print_table(&views, wide, now);
    Ok(())
}

/// The runs as a table: 100 columns at most (ids and times shortened, long cells cut with
/// `…`), or everything in full with `wide`.
fn print_table(views: &[(String, RunView)], wide: bool, now: DateTime<Utc>) {
    let time = |t: Option<DateTime<Utc>>| match (t, wide) {
        (Some(t), true) => format_time(t),
        (Some(t), false) => t.format("%m-%d %H:%M:%S").to_string(),
        (None, _) => String::new(),
    };
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|(id, r)| {
            let lag = match (r.nominal, r.dispatched) {
                (Some(nominal), Some(dispatched)) => {
                    output::short_duration((dispatched - nominal).num_milliseconds())
                }
                _ => String::new(),
            };
            let mut row = vec![
                if wide { id.clone() } else { id.chars().take(SHORT_ID).collect() },
                time(r.nominal),
                lag,
                r.trigger.clone(),
                r.attempts.to_string(),
                r.worker.clone(),
                r.outcome.clone(),
                r.duration_ms(now).map(|ms| output::short_duration(ms as i64)).unwrap_or_default(),
            ];
            if wide {
                row.push(r.trace_id.clone().unwrap_or_default());
            }
            row.push(r.error.replace('\n', " "));
            row
        })
        .collect();
    let mut header =
        vec!["EXECUTION", "NOMINAL (UTC)", "LAG", "TRIGGER", "TRY", "WORKER", "OUTCOME", "DURATION"];
    if wide {
        header.push("TRACE");
        header.push("ERROR");
        output::table(&header, &rows);
        return;
    }
    header.push("ERROR");
    // The worker, the outcome and the error give way, each down to a readable minimum.
    let columns = [
        Column::Fixed,
        Column::Fixed,
        Column::Fixed,
        Column::Fixed,
        Column::Fixed,
        Column::Shrinks(10),
        Column::Shrinks(14),
        Column::Fixed,
        Column::Shrinks(5),
    ];
    output::fitted_table(&header, &columns, &rows, output::MAX_WIDTH);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("an instant")
    }

    fn event(kind: EventKind, ms: i64) -> Event {
        Event {
            execution_id: Some("0194f3c2-7d1e-7b11-9a5e-3c1d2e4f5a6b".into()),
            time: at(ms),
            ..Event::new(kind, "ns", "t")
        }
    }

    /// The whole run's duration comes from the final event; while the run goes on, it runs from
    /// the first attempt's start; the last attempt's own time is kept apart.
    #[test]
    fn a_runs_duration_is_the_whole_runs_and_the_last_attempts_is_named_so() {
        let mut events = vec![
            Event { nominal_time: Some(at(0)), ..event(EventKind::FireDispatched, 12) },
            Event { attempt: Some(1), ..event(EventKind::RunStarted, 100) },
            Event { attempt: Some(1), duration_ms: Some(900), ..event(EventKind::RunRetrying, 1_000) },
            Event { attempt: Some(2), ..event(EventKind::RunStarted, 3_000) },
        ];
        let views = assemble(events.clone());
        assert_eq!(views[0].1.duration_ms(at(4_100)), Some(4_000), "running: first start to now");
        events.push(Event {
            attempt: Some(2),
            duration_ms: Some(500),
            run_duration_ms: Some(3_400),
            ..event(EventKind::RunSucceeded, 3_500)
        });
        let views = assemble(events);
        let run = &views[0].1;
        assert_eq!((run.duration_ms(at(99_000)), run.last_attempt_ms), (Some(3_400), Some(500)));
        assert_eq!(run.outcome, "succeeded");
    }
}
