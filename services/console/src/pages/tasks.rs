//! `/tasks` (searchable, filterable, paginated list from the index, with each listed task's
//! next fire, last run and outcome, success rate, priority and breaker) and `/tasks/<ns>/<id>`
//! (spec, next fires in UTC and the task's zone with DST changes marked, recent runs, events).

use chrono::DateTime;
use jetsched_shared::wire::{Event, TaskState};
use maud::{Markup, html};
use serde_json::Value;

use super::{Ctx, action, breaker_href, layout, pager, task_href, when};
use crate::activity::RATE_RUNS;
use crate::index::{TaskPage, TaskQuery, TaskSummary};
use crate::runs::RunRow;
use crate::task_list::TaskExtras;
use crate::trace::TraceLinks;

/// The task state filter's choices.
const STATES: [(&str, &str); 5] = [
    ("", "any"),
    ("active", "active"),
    ("paused", "paused"),
    ("failing", "last run failed"),
    ("breaker", "has a breaker"),
];
/// The priority filter's choices.
const PRIORITIES: [&str; 5] = ["", "critical", "high", "normal", "low"];

/// A listed task's extra cells: next fire, last run (linked), last outcome, success rate,
/// priority, breaker (linked, with its state).
fn extra_cells(task: &TaskSummary, extras: Option<&TaskExtras>) -> Markup {
    let runs = extras.and_then(|e| e.runs.as_ref());
    html! {
        td.next-fire { @match extras.map(|e| &e.next_fire) {
            Some(Ok(Some(at))) => (when(*at)),
            Some(Err(error)) => span title=(error) { "?" },
            _ => "-",
        } }
        td.last-run { @match runs.and_then(|r| r.last_run.as_ref()) {
            Some((execution, at)) => a href={"/runs/" (execution)} { (when(*at)) },
            None => "-",
        } }
        td.last-outcome { @match runs.and_then(|r| r.last_succeeded) {
            Some(true) => span.badge.run-succeeded { "succeeded" },
            Some(false) => span.badge.run-failed { "failed" },
            None => "-",
        } }
        td.success-rate { @match runs.map(|r| r.success()).filter(|(_, n)| *n > 0) {
            Some((ok, n)) => { (ok * 100 / n) "% " small { "(" (ok) "/" (n) ")" } },
            None => "-",
        } }
        td.priority { (task.priority) }
        td.breaker { @match extras.and_then(|e| e.breaker.as_ref()) {
            Some((key, state)) => {
                a href=(breaker_href(key)) { @if key.starts_with("task.") { "its own" } @else { (key) } }
                " "
                @match state {
                    Ok(state) => span class={"badge breaker-" (state)} { (state) },
                    Err(error) => span title=(error) { "?" },
                }
            }
            None => "-",
        } }
    }
}

/// The list page; the table alone is what htmx swaps while typing. `extras` are the listed
/// tasks' extra cells, in order.
pub(crate) fn list(
    page: &TaskPage,
    states: &[TaskState],
    extras: &[TaskExtras],
    query: &TaskQuery,
    query_string: &str,
    queues: &[String],
) -> Markup {
    let filtered = html! {
        form.filters method="get" action="/tasks" hx-get="/tasks" hx-target="#task-table" hx-select="#task-table"
            hx-swap="outerHTML" hx-push-url="true" hx-trigger="input changed delay:250ms, change, submit" {
            label { "Id " input type="search" name="q" value=(query.q) placeholder="part of the id"; }
            label { "Namespace " input type="text" name="namespace" value=(query.namespace) size="12"; }
            label { "Labels " input type="text" name="label" value=(query.label) placeholder="team=billing" size="16"; }
            label { "State "
                select name="state" {
                    @for (value, text) in STATES {
                        option value=(value) selected[query.state == value] { (text) }
                    }
                }
            }
            label { "Priority "
                select name="priority" {
                    @for value in PRIORITIES {
                        option value=(value) selected[query.priority == value] { (if value.is_empty() { "any" } else { value }) }
                    }
                }
            }
            label { "Executor "
                select name="executor" {
                    @for value in ["", "http", "nats", "shell", "handler"] {
                        option value=(value) selected[query.executor == value] { (if value.is_empty() { "any" } else { value }) }
                    }
                }
            }
            label { "Queue "
                select name="queue" {
                    option value="" selected[query.queue.is_empty()] { "any" }
                    @for queue in queues { option value=(queue) selected[&query.queue == queue] { (queue) } }
                }
            }
            button type="submit" { "Search" }
        }
        p { a.button #new-task href="/tasks/new" { "New task" } }
        div #task-table {
            p.count { (page.matching) " of " (page.total) " tasks" }
            p.sub { "Success: the last " (RATE_RUNS) " runs the console has seen (it reads the last hour of events when it starts)." }
            table {
                thead { tr {
                    th scope="col" { "Namespace" } th scope="col" { "Id" } th scope="col" { "Schedule" }
                    th scope="col" { "Next fire" } th scope="col" { "Last run" } th scope="col" { "Last outcome" }
                    th scope="col" { "Success" } th scope="col" { "Priority" } th scope="col" { "Breaker" }
                    th scope="col" { "Executor" } th scope="col" { "Queue" } th scope="col" { "State" } th scope="col" { "Labels" }
                } }
                tbody {
                    @for (n, task) in page.tasks.iter().enumerate() {
                        tr data-zone=[task.zone.as_deref()] {
                            td { (task.namespace()) }
                            td { a href=(task_href(task.namespace(), task.id())) { (task.id()) } }
                            td { code { (task.schedule) } }
                            (extra_cells(task, extras.get(n)))
                            td { (task.executor) }
                            td { (task.queue) }
                            td { @let state = states.get(n).map_or(if task.paused { "paused" } else { "active" }, |s| s.as_str()); span class={"badge " (state)} { (state) } }
                            td.labels { @for (key, value) in &task.labels { span.label { (key) "=" (value) } " " } }
                        }
                    }
                }
            }
            @if page.tasks.is_empty() { p.empty { "No task matches." } }
            (pager("/tasks", &without_page(query_string), page.page, page.pages))
        }
    };
    layout("Tasks", "/tasks", filtered)
}

/// The query string without its `page` parameter (the pager adds its own).
fn without_page(query_string: &str) -> String {
    query_string.split('&').filter(|p| !p.is_empty() && !p.starts_with("page=")).collect::<Vec<_>>().join("&")
}

/// One upcoming fire: UTC, the zone's wall clock, and whether the zone's offset changed since
/// the fire before (a DST change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fire {
    pub(crate) utc: String,
    pub(crate) local: String,
    pub(crate) offset_change: Option<String>,
}

/// The fires of the registry's `next` reply (`times`, `local_times`, `timezone`).
pub(crate) fn fires(next: &Value) -> (String, Vec<Fire>) {
    let zone = next.get("timezone").and_then(Value::as_str).unwrap_or("UTC").to_string();
    let list = |key: &str| -> Vec<String> {
        next.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (times, locals) = (list("times"), list("local_times"));
    let mut previous = None;
    let mut out = Vec::new();
    for (n, utc) in times.iter().enumerate() {
        let local = locals.get(n).cloned().unwrap_or_default();
        let offset = DateTime::parse_from_rfc3339(&local).ok().map(|t| *t.offset());
        let offset_change = match (previous, offset) {
            (Some(before), Some(now)) if before != now => Some(format!("offset {before} → {now}")),
            _ => None,
        };
        previous = offset.or(previous);
        out.push(Fire { utc: utc.clone(), local, offset_change });
    }
    (zone, out)
}

/// What the task page shows.
pub(crate) struct TaskView<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) id: &'a str,
    pub(crate) spec: &'a Value,
    pub(crate) revision: u64,
    pub(crate) next: Result<Value, String>,
    pub(crate) runs: &'a [RunRow],
    pub(crate) events: &'a [Event],
    /// Active, paused or completed (by the shared rule).
    pub(crate) state: TaskState,
    /// Of a task with `max_runs`: the scheduled fires it has left.
    pub(crate) remaining_runs: Option<u32>,
    /// Runs of the task an open breaker holds now.
    pub(crate) held: Result<u64, String>,
    /// The task's backfills (progress records), newest first.
    pub(crate) backfills: Result<Vec<Value>, String>,
    /// Its parents, children and waits (the registry's `graph`).
    pub(crate) graph: Result<jetsched_shared::wire::GraphReply, String>,
    /// Where trace ids link to.
    pub(crate) trace: &'a TraceLinks,
}

pub(crate) fn task(ctx: &Ctx, view: &TaskView<'_>) -> Markup {
    let href = task_href(view.namespace, view.id);
    let paused = view.spec.get("paused").and_then(Value::as_bool).unwrap_or(false);
    let spec = serde_json::to_string_pretty(view.spec).unwrap_or_default();
    let zone = view.spec.pointer("/schedule/timezone").and_then(Value::as_str);
    let body = html! {
        div.task data-zone=[zone] {
        p.sub {
            "namespace " strong { (view.namespace) } " · revision " (view.revision) " · "
            span class={"badge " (view.state.as_str())} #task-state { (view.state.as_str()) }
            @if let Some(reason) = view.spec.get("paused_reason").and_then(Value::as_str) { " " span #pause-reason { "(" (reason) ")" } }
            " · priority " span #task-priority { (view.spec.get("priority").and_then(Value::as_str).unwrap_or("normal")) }
            " · breaker " (super::breakers::of_task(view.namespace, view.id, view.spec))
            " · held runs " span #task-held { (view.held.as_ref().map_or_else(|e| format!("? ({e})"), |n| n.to_string())) }
            @if let Some(left) = view.remaining_runs { " · remaining runs " span #task-remaining { (left) } }
        }
        div.actions {
            @if paused { (action(ctx, &format!("{href}/resume"), "Resume", None)) }
            @else { (pause_form(ctx, &format!("{href}/pause"))) }
            (action(ctx, &format!("{href}/trigger"), "Trigger now", None))
            (action(ctx, &format!("{href}/delete"), "Delete", Some("yes, delete this task")))
            @if view.held.as_ref().is_ok_and(|held| *held > 0) {
                (action(ctx, &format!("{href}/cancel-held"), "Cancel held runs", Some("yes, cancel its held runs")))
            }
            (action(ctx, &format!("{href}/cancel-queued"), "Cancel queued runs", Some("yes, cancel its queued runs")))
            a.button #edit-task href={(href) "/edit"} { "Edit spec" }
        }
        section {
            h2 { "Next fires" }
            @match &view.next {
                Ok(next) => {
                    @let (zone, fires) = fires(next);
                    @if fires.is_empty() { p.empty { "No fire ahead." } } @else {
                        table #next-fires {
                            thead { tr { th scope="col" { "UTC" } th scope="col" { (zone) } th scope="col" { "" } } }
                            tbody {
                                @for fire in &fires {
                                    tr class=[fire.offset_change.is_some().then_some("dst")] {
                                        td { (fire.utc) } td { (fire.local) }
                                        td { @if let Some(change) = &fire.offset_change { span.badge.dst { "DST change: " (change) } } }
                                    }
                                }
                            }
                        }
                    }
                }
                Err(error) => p.error { "Next fires unavailable: " (error) }
            }
            @if let Some(reason) = view.next.as_ref().ok().and_then(|next| next.get("ends_by")).and_then(Value::as_str) {
                p #task-ends {
                    "No fire after "
                    (view.next.as_ref().ok().and_then(|next| next.get("last_fire")).and_then(Value::as_str).unwrap_or("the last one"))
                    ": the task ends by " (reason) "."
                }
            }
        }
        (super::graph::section(&view.graph))
        section #backfills {
            h2 { "Backfills" }
            (backfill_form(ctx, &format!("{href}/backfill")))
            @match &view.backfills {
                Ok(list) if list.is_empty() => p.empty { "No backfill of this task." }
                Ok(list) => (backfill_table(ctx, list)),
                Err(error) => p.error { "Backfills unavailable: " (error) }
            }
        }
        section {
            h2 { "Recent runs" }
            (super::runs::table(view.runs, false, view.trace))
        }
        section {
            h2 { "Events" }
            (super::events::table(view.events, view.trace))
        }
        section {
            h2 { "Spec" }
            pre.spec { code { (spec) } }
        }
        }
    };
    layout(&format!("Task {}", view.id), "/tasks", body)
}

/// Starting a backfill of the task: every nominal time in `[from, to)` run once (the registry
/// checks the request and names every problem).
fn backfill_form(ctx: &Ctx, href: &str) -> Markup {
    html! {
        form.action.backfill #backfill-form method="post" action=(href) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            label { "From " input type="text" name="from" required size="22" placeholder="2026-01-01T00:00:00Z"; }
            " "
            label { "To " input type="text" name="to" required size="22" placeholder="2026-02-01T00:00:00Z"; }
            " "
            (choice("Reprocess ", "reprocess", &["none", "failed", "all"]))
            " "
            label title="0: no bound" { "Max active " input type="number" name="max_active" min="0" max="1000" value="10" size="5"; }
            " "
            (choice("Overlap ", "overlap", &["allow", "skip", "buffer_one"]))
            " "
            button type="submit" disabled[!ctx.allow_actions]
                title=[(!ctx.allow_actions).then_some("actions are off: start the console with --allow-actions")]
                { "Backfill" }
        }
    }
}

/// A labelled select of `options`, the first selected.
fn choice(label: &str, name: &str, options: &[&str]) -> Markup {
    html! {
        label { (label)
            select name=(name) {
                @for (i, option) in options.iter().enumerate() {
                    option value=(option) selected[i == 0] { (option) }
                }
            }
        }
    }
}

/// The task's backfills: range, state and counts, and a Cancel button while one runs.
fn backfill_table(ctx: &Ctx, backfills: &[Value]) -> Markup {
    let text = |b: &Value, key: &str| match &b[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    html! {
        table #backfill-table {
            thead { tr {
                th scope="col" { "Backfill" } th scope="col" { "State" } th scope="col" { "From" }
                th scope="col" { "To" } th scope="col" { "Overlap" } th scope="col" { "Dispatched" }
                th scope="col" { "Skipped" } th scope="col" { "Rerun" } th scope="col" { "Calendar" }
                th scope="col" { "Overlapped" } th scope="col" { "Total" } th scope="col" { "" }
            } }
            tbody {
                @for b in backfills {
                    @let id = text(b, "id");
                    tr data-backfill=(id) {
                        td.mono { (id) }
                        td.state { span class={"badge " (text(b, "state"))} { (text(b, "state")) } }
                        td { (text(b, "from")) } td { (text(b, "to")) } td { (text(b, "overlap")) }
                        td.dispatched { (text(b, "dispatched")) } td { (text(b, "skipped")) }
                        td { (text(b, "rerun")) } td.calendar { (text(b, "calendar")) }
                        td { (text(b, "overlapped")) } td { (text(b, "total")) }
                        td { @if b["state"] == "running" {
                            (action(ctx, &format!("/backfills/{id}/cancel"), "Cancel", Some("yes, cancel this backfill")))
                        } }
                    }
                }
            }
        }
    }
}

/// The pause action with its reason (kept as the task's `paused_reason`, shown on its page and
/// by `jetsched get`).
fn pause_form(ctx: &Ctx, href: &str) -> Markup {
    html! {
        form.action #pause-form method="post" action=(href) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            label { "Reason " input type="text" name="reason" maxlength="256" size="24" placeholder="why (optional)"; }
            " "
            button type="submit" disabled[!ctx.allow_actions]
                title=[(!ctx.allow_actions).then_some("actions are off: start the console with --allow-actions")]
                { "Pause" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TaskSummary;
    use serde_json::json;

    fn hostile_page() -> TaskPage {
        TaskPage {
            tasks: vec![
                TaskSummary::decode(
                    "ns.ok-id",
                    br#"{"labels": {"team": "<script>alert(1)</script>"}, "executor": {"kind": "http"}}"#,
                    1,
                )
                .unwrap(),
            ],
            matching: 1,
            total: 3,
            page: 1,
            pages: 1,
        }
    }

    #[test]
    fn hostile_labels_are_escaped() {
        let query = TaskQuery { q: "\"><img src=x onerror=alert(1)>".into(), ..Default::default() };
        let html = list(&hostile_page(), &[], &[], &query, "q=x", &["default".into()]).into_string();
        assert!(!html.contains("<script>alert(1)"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("<img src=x"), "{html}");
        assert!(html.contains("1 of 3 tasks"));
    }

    #[test]
    fn listed_tasks_show_next_fire_last_run_outcome_rate_priority_and_breaker() {
        let task = |key: &str, spec: serde_json::Value| {
            TaskSummary::decode(key, spec.to_string().as_bytes(), 1).unwrap()
        };
        let page = TaskPage {
            tasks: vec![
                task(
                    "ns.a",
                    json!({"priority": "high", "breaker": {"key": "card-api"}, "schedule": {"cron": "0 0 2 * * *", "timezone": "Asia/Tokyo"}}),
                ),
                task("ns.b", json!({})),
            ],
            matching: 2,
            total: 2,
            page: 1,
            pages: 1,
        };
        let mut index = crate::activity::TaskRunIndex::default();
        for (kind, execution) in [
            (jetsched_shared::wire::EventKind::RunStarted, "e1"),
            (jetsched_shared::wire::EventKind::RunSucceeded, "e1"),
            (jetsched_shared::wire::EventKind::RunStarted, "e2"),
            (jetsched_shared::wire::EventKind::RunFailed, "e2"),
        ] {
            index.record(&Event { execution_id: Some(execution.into()), ..Event::new(kind, "ns", "a") });
        }
        let next = chrono::Utc::now() + chrono::Duration::seconds(90);
        let extras = [
            TaskExtras {
                next_fire: Ok(Some(next)),
                runs: index.get("ns\0a").cloned(),
                breaker: Some(("ns:card-api".into(), Ok("open".into()))),
            },
            TaskExtras { next_fire: Err("<no state>".into()), runs: None, breaker: None },
        ];
        let html = list(&page, &[], &extras, &TaskQuery::default(), "", &[]).into_string();
        assert!(html.contains(r#"<tr data-zone="Asia/Tokyo">"#), "{html}");
        assert!(html.contains("(in 1 min)") && html.contains(r#"<a href="/runs/e2"><time"#), "{html}");
        assert!(html.contains(r#"<span class="badge run-failed">failed</span>"#), "{html}");
        assert!(html.contains("50% <small>(1/2)</small>"), "{html}");
        assert!(html.contains(r#"<td class="priority">high</td>"#), "{html}");
        assert!(html.contains(r#"<a href="/breakers/ns:card-api">ns:card-api</a> <span class="badge breaker-open">open</span>"#), "{html}");
        assert!(html.contains(r#"title="&lt;no state&gt;""#), "{html}");
        assert!(
            html.contains(r#"<option value="failing">"#) && html.contains(r#"name="priority""#),
            "{html}"
        );
    }

    #[test]
    fn fires_mark_offset_changes() {
        let next = json!({
            "timezone": "Europe/Berlin",
            "times": ["2026-03-28T01:30:00.000Z", "2026-03-29T00:30:00.000Z", "2026-03-30T00:30:00.000Z"],
            "local_times": ["2026-03-28T02:30:00+01:00", "2026-03-29T02:30:00+02:00", "2026-03-30T02:30:00+02:00"],
        });
        let (zone, fires) = fires(&next);
        assert_eq!(zone, "Europe/Berlin");
        assert_eq!(fires[0].offset_change, None);
        assert_eq!(fires[1].offset_change.as_deref(), Some("offset +01:00 → +02:00"));
        assert_eq!(fires[2].offset_change, None);
    }

    #[test]
    fn the_task_page_escapes_errors_and_the_spec() {
        let ctx = Ctx { csrf: "c".into(), allow_actions: true };
        let spec = json!({"id": "t", "labels": {"x": "</pre><b>bold</b>"}, "paused": true});
        let events = [Event {
            error: Some("<i>bad</i>".into()),
            ..Event::new(jetsched_shared::wire::EventKind::RunFailed, "ns", "t")
        }];
        let view = TaskView {
            namespace: "ns",
            id: "t",
            spec: &spec,
            revision: 3,
            state: TaskState::Active,
            remaining_runs: None,
            next: Err("<u>no registry</u>".into()),
            runs: &[],
            events: &events,
            held: Ok(2),
            backfills: Ok(vec![
                json!({"id": "ns.t.<s>bf", "state": "running", "from": "<s>x", "dispatched": 3}),
            ]),
            graph: Err("<u>no registry</u>".into()),
            trace: &TraceLinks::default(),
        };
        let html = task(&ctx, &view).into_string();
        assert!(!html.contains("<b>bold") && !html.contains("<i>bad") && !html.contains("<u>no"), "{html}");
        assert!(html.contains("/tasks/ns/t/resume") && !html.contains("/tasks/ns/t/pause"));
        assert!(html.contains("revision 3"));
        assert!(html.contains(r#"<span id="task-held">2</span>"#), "{html}");
        assert!(!html.contains("<s>"), "a backfill's fields are escaped: {html}");
        assert!(
            html.contains("/tasks/ns/t/backfill") && html.contains("/cancel"),
            "the backfill form and its cancel"
        );
    }
}
