//! The runs table (the history page and a task's page) and `/runs/<execution id>` (every
//! attempt of the run record, its events, the trace id).

use jetsched_shared::wire::{Event, RunRecord};
use maud::{Markup, html};

use super::{Ctx, action, layout, live, task_href, when, when_opt};
use crate::runs::RunRow;
use crate::trace::TraceLinks;

/// The runs table (`with_task`: a column naming the task); each execution links to its page
/// and, with `--trace-url`, to its trace.
pub(crate) fn table(rows: &[RunRow], with_task: bool, trace: &TraceLinks) -> Markup {
    html! {
        @if rows.is_empty() { p.empty { "No run in the last hour." } } @else {
            table.runs {
                thead { tr {
                    th scope="col" { "Execution" } @if with_task { th scope="col" { "Task" } } th scope="col" { "Last event" } th scope="col" { "Nominal" } th scope="col" { "Trigger" }
                    th scope="col" { "Attempts" } th scope="col" { "Worker" } th scope="col" { "Outcome" } th scope="col" { "Duration" } th scope="col" { "Error" }
                } }
                tbody {
                    @for row in rows {
                        tr class=(row.outcome) {
                            td {
                                a href={"/runs/" (row.execution_id)} { code { (row.execution_id) } }
                                (trace.link(if row.trace_id.is_empty() { &row.execution_id } else { &row.trace_id }))
                            }
                            @if with_task { td { a href=(task_href(&row.namespace, &row.task_id)) { (row.namespace) "/" (row.task_id) } } }
                            td { (when_opt(row.last_seen)) }
                            td { (when_opt(row.nominal)) }
                            td { (row.trigger) }
                            td { (row.attempts) }
                            td { (row.worker) }
                            td { span class={"badge " (row.outcome)} { (row.outcome) } }
                            td { @if let Some(ms) = row.duration_ms { (ms) " ms" } }
                            td.error-text { (row.error) }
                        }
                    }
                }
            }
        }
    }
}

/// One run: its record (every attempt) when the runs bucket still has it, and its events.
/// Seconds between reloads of a run's page until the run has finished.
const RUN_REFRESH_SECONDS: u32 = 2;

/// Whether a run may still change: no record yet (queued, or just triggered), an attempt
/// running, a retry waiting, or held by its breaker.
fn unfinished(record: Option<&RunRecord>) -> bool {
    record.is_none_or(|r| !r.status.is_final())
}

/// What a run page links to besides its task: the dead run it replays, its dead letter, the
/// runs that replayed it, and whether it may be retried now.
#[derive(Debug)]
pub(crate) struct Related {
    pub(crate) replay_of: Option<String>,
    /// The run's dead letter (its sequence), or why it could not be looked up.
    pub(crate) dead_letter: Result<Option<u64>, String>,
    pub(crate) replays: Vec<String>,
    pub(crate) retriable: bool,
}

impl Default for Related {
    fn default() -> Related {
        Related { replay_of: None, dead_letter: Ok(None), replays: Vec::new(), retriable: false }
    }
}

fn related(ctx: &Ctx, execution_id: &str, related: &Related) -> Markup {
    html! {
        @if let Some(dead) = &related.replay_of {
            p #replay-of { "replay of " a href={"/runs/" (dead)} { code { (dead) } } }
        }
        @match &related.dead_letter {
            Ok(Some(sequence)) => p #dead-letter { "dead letter " a href={"/dlq/" (sequence)} { (sequence) } },
            Ok(None) => {},
            Err(error) => p.error { "Dead letter unavailable: " (error) },
        }
        @if !related.replays.is_empty() {
            p #replays { "replayed as " @for run in &related.replays { a href={"/runs/" (run)} { code { (run) } } " " } }
        }
        @if related.retriable {
            div.actions #retry {
                (action(ctx, &format!("/runs/{execution_id}/retry"), "Retry now", None))
                span.sub { @if matches!(related.dead_letter, Ok(Some(_))) { "replays its dead letter (the same spec snapshot)" }
                    @else { "runs the task again with its current spec" } }
            }
        }
    }
}

pub(crate) fn run(
    ctx: &Ctx,
    execution_id: &str,
    record: Option<&RunRecord>,
    events: &[Event],
    links: &Related,
    trace: &TraceLinks,
) -> Markup {
    let trace_id = record
        .and_then(|r| r.trace_id.as_deref())
        .or_else(|| events.iter().find_map(|e| e.trace_id.as_deref()))
        .unwrap_or(execution_id);
    let title = format!("Run {execution_id}");
    // Queued (no record yet, but known from its events), held, retrying or running.
    let cancellable = record.map_or(!events.is_empty(), |r| !r.status.is_final());
    let body = html! {
            @if cancellable {
                div.actions #run-actions {
                    (action(ctx, &format!("/runs/{execution_id}/cancel"), "Cancel", Some("yes, cancel this run")))
                }
            }
            (related(ctx, execution_id, links))
            @match record {
                Some(record) => {
                    dl.facts {
                        dt { "Task" } dd { a href=(task_href(&record.namespace, &record.task_id)) { (record.namespace) "/" (record.task_id) } }
                        dt { "Status" } dd { span class={"badge " (record.status.as_str())} { (record.status.as_str()) } }
                        @if let Some(until) = record.release_at { dt { "Held until" } dd #held-until { (when(until)) } }
                        @if let Some(reason) = &record.reason { dt { "Reason" } dd #run-reason { (reason) } }
                        dt { "Duration" } dd #run-duration { (record.duration(chrono::Utc::now()).num_milliseconds()) " ms" @if !record.status.is_final() { " so far" } }
                        dt { "Nominal time" } dd { (when(record.nominal_time)) }
                        dt { "Trigger" } dd { (record.trigger.as_str()) }
                        dt { "Queue" } dd { (record.queue) }
                        dt { "Trace id" } dd { code #trace-id { (record.trace_id.as_deref().unwrap_or("-")) } (trace.link(trace_id)) }
                        @if let Some(error) = &record.error { dt { "Error" } dd.error-text { (error) } }
                    }
                    h2 { "Attempts" }
                    table #attempts {
                        thead { tr { th scope="col" { "#" } th scope="col" { "Worker" } th scope="col" { "Started" } th scope="col" { "Finished" } th scope="col" { "Outcome" } th scope="col" { "Error" } th scope="col" { "Detail" } } }
                        tbody {
                            @for attempt in &record.attempts {
                                tr {
                                    td { (attempt.attempt) }
                                    td { (attempt.worker) }
                                    td { (when(attempt.started)) }
                                    td { (when_opt(attempt.finished)) }
                                    td { (attempt.outcome.map(|o| format!("{o:?}").to_lowercase()).unwrap_or_else(|| "running".into())) }
                                    td.error-text { (attempt.error.as_deref().unwrap_or("")) }
                                    td { @if let Some(detail) = &attempt.detail { pre { (detail) } } }
                                }
                            }
                        }
                    }
                }
                None if events.is_empty() => p.empty #waiting {
                    "No record or event of this run yet: a run just triggered waits in its queue until a worker takes it. "
                    "This page updates itself until the run has finished."
                }
                None => p.empty { "The runs bucket has no record of this execution (it has not started, or its record expired)." }
            }
            h2 { "Events" }
            (super::events::table(events, trace))
    };
    match unfinished(record) {
        // Redrawn after each event of a run (the task's, once known); reloaded without JavaScript.
        true => {
            let task = record
                .map(|r| (r.namespace.as_str(), r.task_id.as_str()))
                .or_else(|| events.first().map(|e| (e.namespace.as_str(), e.task_id.as_str())));
            let stream = match task {
                Some((namespace, id)) => format!("/events/stream?kind=run&task={namespace}/{id}"),
                None => "/events/stream?kind=run".to_string(),
            };
            live(&title, "/runs", &stream, Some(RUN_REFRESH_SECONDS), body)
        }
        false => layout(&title, "/runs", body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetsched_shared::wire::RunStatus;

    fn ctx() -> Ctx {
        Ctx { csrf: "t".into(), allow_actions: true }
    }

    #[test]
    fn a_run_page_reloads_until_the_run_has_finished() {
        let refresh = r#"http-equiv="refresh""#;
        let none = Related::default();
        let traces = TraceLinks::default();
        let waiting = run(&ctx(), "e1", None, &[], &none, &traces).into_string();
        assert!(
            waiting.contains(refresh) && waiting.contains("No record or event of this run yet"),
            "{waiting}"
        );
        let mut record: RunRecord = serde_json::from_value(serde_json::json!({
            "execution_id": "e1", "namespace": "ns", "task_id": "t", "status": "running",
            "nominal_time": "2026-12-04T10:00:00.000Z", "trigger": "manual", "queue": "default",
            "attempt": 1, "worker": "w1", "started": "2026-12-04T10:00:00.001Z",
            "first_started": "2026-12-04T10:00:00.001Z", "attempts": []
        }))
        .expect("a run record");
        assert!(run(&ctx(), "e1", Some(&record), &[], &none, &traces).into_string().contains(refresh));
        let live = run(&ctx(), "e1", Some(&record), &[], &none, &traces).into_string();
        assert!(live.contains(r#"data-live="/events/stream?kind=run&amp;task=ns/t""#), "{live}");
        assert!(live.contains("/runs/e1/cancel"), "{live}");
        record.status = RunStatus::Succeeded;
        record.trace_id = Some("0af7651916cd43dd8448eb211c80319c".into());
        let links = TraceLinks::new(Some("http://jaeger:16686/trace/{trace_id}"));
        let done = run(&ctx(), "e1", Some(&record), &[], &none, &links).into_string();
        assert!(!done.contains(refresh) && !done.contains("data-live"), "{done}");
        assert!(!done.contains("/runs/e1/cancel"), "{done}");
        assert!(
            done.contains(r#"href="http://jaeger:16686/trace/0af7651916cd43dd8448eb211c80319c""#),
            "{done}"
        );
        record.status = RunStatus::Dead;
        let related = Related {
            replay_of: Some("e0".into()),
            dead_letter: Ok(Some(12)),
            replays: vec!["e2".into()],
            retriable: true,
        };
        let page = run(&ctx(), "e1", Some(&record), &[], &related, &traces).into_string();
        for wanted in [r#"href="/runs/e0""#, r#"href="/dlq/12""#, r#"href="/runs/e2""#, "/runs/e1/retry"] {
            assert!(page.contains(wanted), "{wanted}: {page}");
        }
    }
}
