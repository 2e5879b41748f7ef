//! `/dlq` (dead letters with filters, paged by the registry's cursor) and `/dlq/<sequence>`
//! (the entry with every attempt; replay and purge).

use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use super::{Ctx, action, layout, task_href};

/// The filters of the dead-letter list.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct DlqFilter {
    #[serde(default)]
    pub(crate) namespace: String,
    #[serde(default)]
    pub(crate) task_id: String,
    #[serde(default)]
    pub(crate) queue: String,
    /// The registry's cursor of the page to show.
    #[serde(default)]
    pub(crate) cursor: Option<u64>,
}

fn text<'a>(entry: &'a Value, key: &str) -> &'a str {
    entry.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A stored time as a `<time>` element (as stored when it does not parse).
fn time_of(entry: &Value, key: &str) -> Markup {
    let stored = text(entry, key);
    match chrono::DateTime::parse_from_rfc3339(stored) {
        Ok(at) => super::when(at.to_utc()),
        Err(_) => html! { (stored) },
    }
}

/// The list; `entries` are `{sequence, entry}` objects, `next` the cursor of the next page.
pub(crate) fn list(entries: &[Value], next: Option<u64>, filter: &DlqFilter, total: Option<u64>) -> Markup {
    let next_href = next.map(|cursor| {
        format!(
            "/dlq?namespace={}&task_id={}&queue={}&cursor={cursor}",
            filter.namespace, filter.task_id, filter.queue
        )
    });
    layout(
        "Dead letters",
        "/dlq",
        html! {
            form.filters method="get" action="/dlq" {
                label { "Namespace " input type="text" name="namespace" value=(filter.namespace) size="12"; }
                label { "Task " input type="text" name="task_id" value=(filter.task_id) size="16"; }
                label { "Queue " input type="text" name="queue" value=(filter.queue) size="10"; }
                " " button type="submit" { "Filter" }
            }
            @if let Some(total) = total { p.count { (total) " dead letters in the stream" } }
            @if entries.is_empty() { p.empty { "No dead letter matches." } } @else {
                table #dlq-entries {
                    thead { tr { th scope="col" { "Sequence" } th scope="col" { "Task" } th scope="col" { "Queue" } th scope="col" { "Dead at" } th scope="col" { "Attempts" } th scope="col" { "Reason" } } }
                    tbody {
                        @for listed in entries {
                            @let sequence = listed.get("sequence").and_then(Value::as_u64).unwrap_or(0);
                            @let entry = listed.get("entry").unwrap_or(&Value::Null);
                            tr {
                                td { a href={"/dlq/" (sequence)} { (sequence) } }
                                td { a href=(task_href(text(entry, "namespace"), text(entry, "task_id"))) { (text(entry, "namespace")) "/" (text(entry, "task_id")) } }
                                td { (text(entry, "queue")) }
                                td { (time_of(entry, "dead_at")) }
                                td { (entry.get("attempts").and_then(Value::as_array).map_or(0, Vec::len)) }
                                td.error-text { (text(entry, "reason")) }
                            }
                        }
                    }
                }
            }
            @if let Some(href) = next_href { nav.pager { a rel="next" href=(href) { "next →" } } }
        },
    )
}

/// One entry with every attempt, and its actions.
pub(crate) fn entry(ctx: &Ctx, sequence: u64, entry: &Value) -> Markup {
    let attempts = entry.get("attempts").and_then(Value::as_array).cloned().unwrap_or_default();
    let raw = serde_json::to_string_pretty(entry).unwrap_or_default();
    let execution = text(entry, "execution_id");
    layout(
        &format!("Dead letter {sequence}"),
        "/dlq",
        html! {
            div.actions {
                (action(ctx, &format!("/dlq/{sequence}/replay"), "Replay", None))
                (action(ctx, &format!("/dlq/{sequence}/purge"), "Purge", Some("yes, remove this entry")))
            }
            dl.facts {
                dt { "Task" } dd { a href=(task_href(text(entry, "namespace"), text(entry, "task_id"))) { (text(entry, "namespace")) "/" (text(entry, "task_id")) } }
                dt { "Execution" } dd { a href={"/runs/" (execution)} { code { (execution) } } }
                dt { "Queue" } dd { (text(entry, "queue")) }
                dt { "Reason" } dd.error-text { (text(entry, "reason")) }
                dt { "Source" } dd { (text(entry, "source")) }
                dt { "Dead at" } dd { (time_of(entry, "dead_at")) }
                dt { "Trace id" } dd { code { (text(entry, "trace_id")) } }
            }
            h2 { "Attempts" }
            table #attempts {
                thead { tr { th scope="col" { "#" } th scope="col" { "Worker" } th scope="col" { "Started" } th scope="col" { "Finished" } th scope="col" { "Outcome" } th scope="col" { "Error" } th scope="col" { "Detail" } } }
                tbody {
                    @for attempt in &attempts {
                        tr {
                            td { (attempt.get("attempt").and_then(Value::as_u64).unwrap_or(0)) }
                            td { (text(attempt, "worker")) }
                            td { (time_of(attempt, "started")) }
                            td { (time_of(attempt, "finished")) }
                            td { (text(attempt, "outcome")) }
                            td.error-text { (text(attempt, "error")) }
                            td { pre { (text(attempt, "detail")) } }
                        }
                    }
                }
            }
            details { summary { "Entry as stored" } pre.spec { code { (raw) } } }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_escape_reasons_and_attempt_errors() {
        let entry = json!({"namespace": "ns", "task_id": "t", "reason": "<b>boom</b>", "execution_id": "e",
                           "attempts": [{"attempt": 1, "error": "<script>x</script>", "detail": "</pre>"}]});
        let list_html =
            list(&[json!({"sequence": 7, "entry": entry})], Some(8), &DlqFilter::default(), Some(1))
                .into_string();
        assert!(list_html.contains("&lt;b&gt;boom") && !list_html.contains("<b>boom"), "{list_html}");
        assert!(list_html.contains("cursor=8") && list_html.contains(r#"href="/dlq/7""#));
        let ctx = Ctx { csrf: "c".into(), allow_actions: true };
        let page = super::entry(&ctx, 7, &entry).into_string();
        assert!(
            !page.contains("<script>x") && page.contains("/dlq/7/replay") && page.contains("/dlq/7/purge")
        );
    }
}
