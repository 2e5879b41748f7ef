//! `/dlq` (dead letters with filters, paged by the registry's cursor, and the bulk actions on
//! what the filters select) and `/dlq/<sequence>` (the entry with every attempt; replay and
//! purge).

use chrono::{DateTime, NaiveDateTime, Utc};
use jetsched_shared::wire::DlqRequest;
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
    /// Text of the reason or an attempt's error.
    #[serde(default)]
    pub(crate) error: String,
    /// Dead-lettered at or after (UTC, `2026-12-05T10:00` or RFC 3339).
    #[serde(default)]
    pub(crate) since: String,
    /// Dead-lettered before (UTC).
    #[serde(default)]
    pub(crate) until: String,
    /// The registry's cursor of the page to show.
    #[serde(default)]
    pub(crate) cursor: Option<u64>,
}

impl DlqFilter {
    /// The registry's request for what the filter selects, or every problem of its fields.
    pub(crate) fn request(&self) -> Result<DlqRequest, Vec<String>> {
        let mut problems = Vec::new();
        let mut instant = |field: &str, value: &str| match parse_instant(value) {
            Ok(instant) => instant,
            Err(()) => {
                problems
                    .push(format!("{field}: {value:?} is not a time (UTC, as 2026-12-05T10:00 or RFC 3339)"));
                None
            }
        };
        let since = instant("since", &self.since);
        let until = instant("until", &self.until);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(DlqRequest {
            namespace: non_empty(&self.namespace),
            task_id: non_empty(&self.task_id),
            queue: non_empty(&self.queue),
            error: non_empty(&self.error),
            since,
            until,
            cursor: self.cursor,
            ..DlqRequest::default()
        })
    }

    /// The filter as a query string (without the cursor).
    pub(crate) fn query(&self) -> String {
        [
            ("namespace", &self.namespace),
            ("task_id", &self.task_id),
            ("queue", &self.queue),
            ("error", &self.error),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .iter()
        .map(|(key, value)| format!("{key}={}", encode(value)))
        .collect::<Vec<_>>()
        .join("&")
    }

    /// The filter's fields as hidden form inputs.
    pub(crate) fn hidden(&self) -> Markup {
        html! {
            input type="hidden" name="namespace" value=(self.namespace);
            input type="hidden" name="task_id" value=(self.task_id);
            input type="hidden" name="queue" value=(self.queue);
            input type="hidden" name="error" value=(self.error);
            input type="hidden" name="since" value=(self.since);
            input type="hidden" name="until" value=(self.until);
        }
    }
}

fn non_empty(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// An instant typed in a filter: empty, RFC 3339, or a UTC wall-clock time as a browser's
/// `datetime-local` input sends it.
fn parse_instant(value: &str) -> Result<Option<DateTime<Utc>>, ()> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(value) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(value, format).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or(())
}

/// Percent-encodes a query string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
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
    let next_href = next.map(|cursor| format!("/dlq?{}&cursor={cursor}", filter.query()));
    // The count of the selection is known when it fits this page; otherwise the confirmation
    // counts it.
    let selected = match next {
        None if filter.cursor.is_none() => entries.len().to_string(),
        _ => "all".to_string(),
    };
    layout(
        "Dead letters",
        "/dlq",
        html! {
            form.filters method="get" action="/dlq" {
                label { "Namespace " input type="text" name="namespace" value=(filter.namespace) size="12"; }
                label { "Task " input type="text" name="task_id" value=(filter.task_id) size="16"; }
                label { "Queue " input type="text" name="queue" value=(filter.queue) size="10"; }
                label { "Error " input type="text" name="error" value=(filter.error) size="16" placeholder="text of the reason"; }
                label { "Since (UTC) " input type="datetime-local" name="since" value=(filter.since); }
                label { "Until (UTC) " input type="datetime-local" name="until" value=(filter.until); }
                " " button type="submit" { "Filter" }
            }
            @if !entries.is_empty() {
                form.bulk #dlq-bulk method="get" action="/dlq/bulk" {
                    (filter.hidden())
                    button type="submit" name="action" value="replay" { "Replay " (selected) " selected…" }
                    " "
                    button type="submit" name="action" value="purge" { "Purge " (selected) " selected…" }
                }
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
