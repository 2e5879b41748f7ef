//! The bulk dead-letter pages: the confirmation stating how many entries the filter selects,
//! and what the registry did with them.

use maud::{Markup, html};
use serde_json::Value;

use super::dlq::DlqFilter;
use super::{Ctx, layout};
use crate::bulk::{MAX_SELECTED, Selection};

fn verb(action: &str) -> &'static str {
    if action == "purge" { "Purge" } else { "Replay" }
}

fn text<'a>(entry: &'a Value, key: &str) -> &'a str {
    entry.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn confirm(ctx: &Ctx, action: &str, filter: &DlqFilter, selection: &Selection) -> Markup {
    let count = selection.entries.len();
    let back = format!("/dlq?{}", filter.query());
    let body = html! {
        p #bulk-count { strong { (count) } " dead letters selected" @if selection.more { " (the first " (MAX_SELECTED) "; more match)" } "." }
        @if count == 0 { p.empty { "Nothing to " (action) "." } } @else {
            form.action #bulk-form method="post" action={"/dlq/bulk/" (action)} {
                input type="hidden" name="csrf" value=(ctx.csrf);
                (filter.hidden())
                input type="hidden" name="through" value=(selection.through());
                input type="hidden" name="count" value=(count);
                label.confirm { input type="checkbox" name="confirm" value="yes" required; " yes, " (action) " these " (count) " dead letters" }
                " "
                button type="submit" disabled[!ctx.allow_actions]
                    title=[(!ctx.allow_actions).then_some("actions are off: start the console with --allow-actions")]
                    { (verb(action)) " " (count) " selected" }
            }
            table #bulk-entries {
                thead { tr { th { "Sequence" } th { "Task" } th { "Dead at" } th { "Reason" } } }
                tbody {
                    @for listed in &selection.entries {
                        @let sequence = listed.get("sequence").and_then(Value::as_u64).unwrap_or(0);
                        @let entry = listed.get("entry").unwrap_or(&Value::Null);
                        tr {
                            td { a href={"/dlq/" (sequence)} { (sequence) } }
                            td { (text(entry, "namespace")) "/" (text(entry, "task_id")) }
                            td { (text(entry, "dead_at")) }
                            td.error-text { (text(entry, "reason")) }
                        }
                    }
                }
            }
        }
        p { a href=(back) { "← back to the dead letters" } }
    };
    layout(&format!("{} dead letters", verb(action)), "/dlq", body)
}

pub(crate) fn done(action: &str, filter: &DlqFilter, reply: &Value) -> Markup {
    let list = |key: &str| reply.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let (replayed, failed) = (list("replayed"), list("failed"));
    let body = html! {
        div #bulk-result {
            @if action == "purge" {
                p { "Purged " strong { (reply.get("purged").and_then(Value::as_u64).unwrap_or(0)) } " dead letters." }
            } @else {
                p { "Replayed " strong #replayed-count { (replayed.len()) } ", refused " strong #refused-count { (failed.len()) } "." }
                @if !replayed.is_empty() {
                    table #replayed {
                        thead { tr { th { "Dead letter" } th { "Dead run" } th { "New run" } } }
                        tbody {
                            @for done in &replayed {
                                tr {
                                    td { (done.get("sequence").and_then(Value::as_u64).unwrap_or(0)) }
                                    td { a href={"/runs/" (text(done, "original_execution_id"))} { code { (text(done, "original_execution_id")) } } }
                                    td { a href={"/runs/" (text(done, "execution_id"))} { code { (text(done, "execution_id")) } } }
                                }
                            }
                        }
                    }
                }
                @if !failed.is_empty() {
                    h2 { "Refused" }
                    ul #refused { @for refused in &failed {
                        li { (refused.get("sequence").and_then(Value::as_u64).unwrap_or(0)) ": " (text(refused, "error")) }
                    } }
                }
            }
        }
        p { a href={"/dlq?" (filter.query())} { "← back to the dead letters" } }
    };
    layout(&format!("{} dead letters", verb(action)), "/dlq", body)
}
