//! `/runs`: run history from the events stream, newest first, with a time range, namespace,
//! task and outcome filters, and a cursor to older pages.

use maud::{Markup, html};

use super::layout;
use crate::history::{HistoryPage, HistoryQuery, MAX_SCAN, OUTCOMES, PAGE};
use crate::trace::TraceLinks;

/// The query string without its `before` parameter (the links add their own).
fn without_cursor(query_string: &str) -> String {
    query_string
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("before="))
        .collect::<Vec<_>>()
        .join("&")
}

fn filters(query: &HistoryQuery) -> Markup {
    html! {
        form.filters method="get" action="/runs" {
            label { "From " input type="datetime-local" step="1" name="from" value=(query.from) title="UTC"; }
            label { "To " input type="datetime-local" step="1" name="to" value=(query.to) title="UTC"; }
            label { "Namespace " input type="text" name="namespace" value=(query.namespace) size="12"; }
            label { "Task " input type="text" name="task" value=(query.task) placeholder="task id" size="16"; }
            label { "Outcome "
                select name="outcome" {
                    option value="" selected[query.outcome.is_empty()] { "any" }
                    @for value in OUTCOMES { option value=(value) selected[query.outcome == value] { (value) } }
                }
            }
            " " button type="submit" { "Filter" }
        }
    }
}

/// The history page: a page of runs, or every problem of the query (or of the read).
pub(crate) fn page(
    query: &HistoryQuery,
    query_string: &str,
    found: Result<&HistoryPage, &[String]>,
    trace: &TraceLinks,
) -> Markup {
    let base = without_cursor(query_string);
    let link = |before: Option<u64>| match (before, base.is_empty()) {
        (Some(before), true) => format!("/runs?before={before}"),
        (Some(before), false) => format!("/runs?{base}&before={before}"),
        (None, true) => "/runs".to_string(),
        (None, false) => format!("/runs?{base}"),
    };
    let body = html! {
        (filters(query))
        p.sub { "Times are UTC. Runs are listed by their final event (succeeded, failed, dead-lettered, skipped), newest first, " (PAGE) " a page, from the events stream." }
        @match found {
            Err(problems) => div.error role="alert" #history-problems { @for problem in problems { p { (problem) } } },
            Ok(found) => {
                p.count #history-count {
                    (found.rows.len()) " runs"
                    @if found.scanned >= MAX_SCAN { " (the page read its " (MAX_SCAN) " events; older ones follow)" }
                }
                @if found.rows.is_empty() { p.empty { "No run in this range." } } @else { (super::runs::table(&found.rows, true, trace)) }
                nav.pager aria-label="pages" {
                    @if query.before.is_some() { a #newest href=(link(None)) { "↑ newest" } " " }
                    @if let Some(older) = found.older { a #older rel="next" href=(link(Some(older))) { "older →" } }
                }
            }
        }
    };
    layout("Runs", "/runs", body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::RunRow;

    #[test]
    fn rows_are_escaped_and_the_cursor_keeps_the_filters() {
        let found = HistoryPage {
            rows: vec![RunRow {
                execution_id: "e1".into(),
                namespace: "ns".into(),
                task_id: "t".into(),
                outcome: "failed".into(),
                error: "HTTP 500: <html><script>x()</script>".into(),
                ..RunRow::default()
            }],
            older: Some(42),
            scanned: 400,
        };
        let query = HistoryQuery { outcome: "failed".into(), before: Some(90), ..HistoryQuery::default() };
        let html = page(&query, "outcome=failed&before=90", Ok(&found), &TraceLinks::default()).into_string();
        assert!(!html.contains("<script>x()") && html.contains("&lt;script&gt;x()"), "{html}");
        assert!(html.contains(r#"<option value="failed" selected>"#), "{html}");
        assert!(html.contains(r#"href="/runs?outcome=failed&amp;before=42""#), "{html}");
        assert!(html.contains(r#"href="/runs?outcome=failed""#), "newest: {html}");
        assert!(html.contains(r#"href="/runs/e1""#) && html.contains("1 runs"));
    }

    #[test]
    fn the_last_page_has_no_older_link_and_problems_are_listed() {
        let found = HistoryPage::default();
        let html = page(&HistoryQuery::default(), "", Ok(&found), &TraceLinks::default()).into_string();
        assert!(!html.contains("older →") && html.contains("No run in this range."), "{html}");
        let problems = ["from: \"<b>\" is not a time".to_string(), "task: bad".to_string()];
        let html = page(&HistoryQuery::default(), "", Err(&problems), &TraceLinks::default()).into_string();
        assert!(html.contains("&lt;b&gt;") && html.contains("task: bad"), "{html}");
    }
}
