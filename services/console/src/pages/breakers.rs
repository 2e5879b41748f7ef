//! `/breakers` (every breaker: state, failure rate and window, counts, when it opened and until
//! when, runs held, tasks behind it, reset) and `/breakers/<key>` (one breaker, its settings,
//! the runs it holds per task, its events).

use jetsched_shared::names::breaker_task_key;
use jetsched_shared::wire::{BreakerInfo, BreakerState, Event};
use maud::{Markup, html};
use serde_json::Value;

use super::{Ctx, action, breaker_href, layout, task_href, when_opt};

/// One breaker as a page shows it.
#[derive(Debug, Clone)]
pub(crate) struct BreakerRow {
    pub(crate) info: BreakerInfo,
    /// Runs it holds in the dispatch stream (`None`: the stream could not be read).
    pub(crate) held: Option<u64>,
    /// The `breaker` settings of the first task behind it (`None`: unknown).
    pub(crate) settings: Option<Value>,
}

/// A setting of the spec's `breaker` object (with the spec's documented default).
fn setting(settings: Option<&Value>, field: &str, default: &str) -> String {
    match settings.and_then(|s| s.get(field)) {
        Some(Value::String(text)) => text.clone(),
        Some(value) => value.to_string(),
        None if settings.is_some() => default.to_string(),
        None => "?".to_string(),
    }
}

/// The failure rate shown: the window's, or while nothing was counted since it opened, the
/// window that opened it.
fn rate(info: &BreakerInfo) -> String {
    let percent = |failures: u64, runs: u64| format!("{:.0}%", failures as f64 * 100.0 / runs as f64);
    match (info.runs, info.opened_runs) {
        (0, 0) => "-".into(),
        (0, opened) => {
            format!("opened at {} ({}/{opened})", percent(info.opened_failures, opened), info.opened_failures)
        }
        (runs, _) => percent(info.failures, runs),
    }
}

fn state_badge(state: BreakerState) -> Markup {
    html! { span class={"badge breaker-" (state.as_str())} data-state=(state.as_str()) { (state.as_str()) } }
}

/// The tasks behind a breaker, each linked.
fn tasks(names: &[String]) -> Markup {
    html! {
        @for (n, task) in names.iter().enumerate() {
            @if n > 0 { ", " }
            @match task.split_once('/') {
                Some((namespace, id)) => a href=(task_href(namespace, id)) { (task) },
                None => (task),
            }
        }
    }
}

fn held(row: &BreakerRow) -> String {
    row.held.map_or_else(|| "?".into(), |n| n.to_string())
}

pub(crate) fn list(ctx: &Ctx, rows: &[BreakerRow], problem: Option<&str>) -> Markup {
    let open = rows.iter().filter(|r| r.info.state != BreakerState::Closed).count();
    layout(
        "Breakers",
        "/breakers",
        html! {
            @if let Some(problem) = problem { p.error role="alert" { (problem) } }
            p.count { (rows.len()) " breakers, " (open) " not closed" }
            @if rows.is_empty() { p.empty { "No task has a breaker." } } @else {
                table #breakers {
                    thead { tr {
                        th scope="col" { "Breaker" } th scope="col" { "State" } th scope="col" { "Failure rate" } th scope="col" { "Window" } th scope="col" { "Failures/runs" }
                        th scope="col" { "Opened at" } th scope="col" { "Open until" } th scope="col" { "Held runs" } th scope="col" { "Tasks" } th scope="col" { "" }
                    } }
                    tbody {
                        @for row in rows {
                            @let info = &row.info;
                            tr class={"breaker " (info.state.as_str())} data-key=(info.key) {
                                td { a href=(breaker_href(&info.key)) { (info.name) } }
                                td { (state_badge(info.state)) }
                                td { (rate(info)) }
                                td { (setting(row.settings.as_ref(), "window", "1m")) }
                                td { (info.failures) "/" (info.runs) }
                                td { (when_opt(info.opened_at)) }
                                td { (when_opt(info.open_until)) }
                                td.held { (held(row)) }
                                td { (tasks(&info.tasks)) }
                                td { @if info.state != BreakerState::Closed { (action(ctx, &format!("{}/reset", breaker_href(&info.key)), "Reset", None)) } }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub(crate) fn breaker(
    ctx: &Ctx,
    row: &BreakerRow,
    per_task: &[(String, Option<u64>)],
    events: &[Event],
) -> Markup {
    let info = &row.info;
    let settings = row.settings.as_ref();
    let body = html! {
        p.sub { "key " code { (info.key) } " · revision " (info.revision) " · " (state_badge(info.state)) }
        div.actions { (action(ctx, &format!("{}/reset", breaker_href(&info.key)), "Reset", None)) }
        dl.facts #breaker-facts {
            dt { "State" } dd #breaker-state { (info.state.as_str()) }
            dt { "Failure rate" } dd { (rate(info)) " (opens at " (setting(settings, "failure_rate", "0.5")) ", at least " (setting(settings, "min_runs", "10")) " runs)" }
            dt { "Window" } dd { (setting(settings, "window", "1m")) }
            dt { "Failures/runs in the window" } dd { (info.failures) "/" (info.runs) }
            dt { "Opened at" } dd { (when_opt(info.opened_at)) }
            dt { "Open until" } dd { (when_opt(info.open_until)) }
            dt { "Open for" } dd { (setting(settings, "open_for", "30s")) " (at most " (setting(settings, "max_open_for", "10m")) ")" }
            dt { "While open" } dd { (setting(settings, "on_open", "delay")) }
            dt { "Failures in a row" } dd { (info.consecutive_failures) }
            dt { "Held runs" } dd #held-runs { (held(row)) }
            dt { "Updated" } dd { (when_opt(info.updated_at)) }
        }
        h2 { "Tasks" }
        table #breaker-tasks {
            thead { tr { th scope="col" { "Task" } th scope="col" { "Held runs" } } }
            tbody {
                @for (task, held) in per_task {
                    tr { td { (tasks(std::slice::from_ref(task))) } td { (held.map_or_else(|| "?".into(), |n| n.to_string())) } }
                }
            }
        }
        h2 { "Events" }
        (super::events::table(events, &crate::trace::TraceLinks::default()))
    };
    layout(&format!("Breaker {}", info.name), "/breakers", body)
}

/// The breaker line of a task's page, from its spec alone (no request): its own breaker by
/// bucket key, a named one as `<namespace>:<key>`, which the registry resolves (a key the
/// workers share across namespaces included).
pub(crate) fn of_task(namespace: &str, id: &str, spec: &Value) -> Markup {
    let Some(breaker) = spec.get("breaker") else { return html! { "none" } };
    let (href, name) = match breaker.get("key").and_then(Value::as_str) {
        Some(key) => (breaker_href(&format!("{namespace}:{key}")), format!("{namespace}:{key}")),
        None => (breaker_href(&breaker_task_key(namespace, id)), format!("{namespace}/{id} (its own)")),
    };
    html! { a #task-breaker href=(href) { (name) } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn open_breaker() -> BreakerRow {
        let info: BreakerInfo = serde_json::from_value(json!({
            "key": "key.billing.<pay>", "name": "billing:<pay>", "state": "open", "failure_rate": 0.0,
            "runs": 0, "failures": 0, "opened_runs": 10, "opened_failures": 8,
            "opened_at": "2026-12-04T10:00:00.000Z", "open_until": "2026-12-04T10:00:30.000Z",
            "tasks": ["billing/charge", "billing/refund"], "revision": 4
        }))
        .expect("a breaker");
        BreakerRow { info, held: Some(3), settings: Some(json!({"key": "<pay>", "window": "2m"})) }
    }

    #[test]
    fn the_list_shows_state_window_held_runs_tasks_and_reset() {
        let ctx = Ctx { csrf: "c".into(), allow_actions: true };
        let html = list(&ctx, &[open_breaker()], None).into_string();
        assert!(html.contains("1 breakers, 1 not closed"), "{html}");
        assert!(html.contains("opened at 80% (8/10)") && html.contains("<td>2m</td>"), "{html}");
        assert!(html.contains(r#"<td class="held">3</td>"#), "{html}");
        assert!(
            html.contains(r#"href="/tasks/billing/charge""#)
                && html.contains(r#"href="/tasks/billing/refund""#)
        );
        assert!(html.contains(r#"action="/breakers/key.billing.&lt;pay&gt;/reset""#), "{html}");
        assert!(!html.contains("<pay>"), "escaped: {html}");
        assert!(html.contains("2026-12-04 10:00:30Z"));
    }

    #[test]
    fn a_closed_breaker_offers_no_reset_in_the_list_and_unknowns_show() {
        let ctx = Ctx { csrf: "c".into(), allow_actions: false };
        let mut row = open_breaker();
        row.info.state = BreakerState::Closed;
        row.held = None;
        row.settings = None;
        let html = list(&ctx, &[row.clone()], Some("held runs unavailable: <x>")).into_string();
        assert!(!html.contains("/reset") && html.contains(r#"<td class="held">?</td>"#), "{html}");
        assert!(html.contains("held runs unavailable: &lt;x&gt;"));
        let page = breaker(&ctx, &row, &[("billing/charge".into(), Some(2))], &[]).into_string();
        assert!(page.contains("disabled") && page.contains("Failures in a row"), "{page}");
        assert!(page.contains("<td>2</td>"), "{page}");
    }

    #[test]
    fn a_task_links_to_its_own_or_its_named_breaker() {
        let own = of_task("billing", "charge", &json!({"breaker": {}})).into_string();
        assert!(own.contains(r#"href="/breakers/task.billing.charge""#), "{own}");
        let named = of_task("billing", "charge", &json!({"breaker": {"key": "card-api"}})).into_string();
        assert!(named.contains(r#"href="/breakers/billing:card-api""#), "{named}");
        assert_eq!(of_task("billing", "charge", &json!({})).into_string(), "none");
    }

    #[test]
    fn settings_fall_back_to_the_specs_defaults() {
        let settings = json!({"failure_rate": 0.25});
        assert_eq!(setting(Some(&settings), "failure_rate", "0.5"), "0.25");
        assert_eq!(setting(Some(&settings), "window", "1m"), "1m");
        assert_eq!(setting(None, "window", "1m"), "?");
    }
}
