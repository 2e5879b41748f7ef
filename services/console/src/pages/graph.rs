//! A task's dependencies on its page (the registry's `graph`): its rule, its parents → the task
//! → its children, each with its state and last run (linked), and its recent waits for its
//! parents: which parents' runs are in, which are missing, until when, and the run it started.

use jetsched_shared::wire::{GraphNode, GraphReply, LastRun, Wait, WaitState};
use maud::{Markup, html};

use super::task_href;
use super::when::{when, when_opt};

/// The section, when the task has parents or children (nothing otherwise); why not, when the
/// registry could not say.
pub(crate) fn section(graph: &Result<GraphReply, String>) -> Markup {
    match graph {
        Ok(graph) if graph.parents.is_empty() && graph.children.is_empty() => html! {},
        Ok(graph) => html! {
            section #dependencies {
                h2 { "Dependencies" }
                @if let Some(rule) = &graph.rule { p #dependency-rule { (rule) } }
                (drawing(graph))
                @if !graph.waits.is_empty() { (waits(graph)) }
            }
        },
        Err(error) => html! {
            section #dependencies { h2 { "Dependencies" } p.error { "Dependencies unavailable: " (error) } }
        },
    }
}

/// Parents, the task, children: three columns of boxes with arrows between them.
fn drawing(graph: &GraphReply) -> Markup {
    let this =
        GraphNode { task: graph.task.clone(), exists: true, paused: false, last_run: graph.last_run.clone() };
    html! {
        div.dag role="group" aria-label="parents, this task, children" {
            div.nodes #dag-parents {
                @if graph.parents.is_empty() { p.empty { "No parent" } }
                @for node in &graph.parents { (node_box(node, false)) }
                (more(graph.parents.len(), graph.parents_total, "parents"))
            }
            div.arrow aria-hidden="true" { "→" }
            div.nodes #dag-task { (node_box(&this, true)) }
            div.arrow aria-hidden="true" { "→" }
            div.nodes #dag-children {
                @if graph.children.is_empty() { p.empty { "No child" } }
                @for node in &graph.children { (node_box(node, false)) }
                (more(graph.children.len(), graph.children_total, "children"))
            }
        }
    }
}

/// "and N more" when the registry described only the first of them.
fn more(shown: usize, total: usize, what: &str) -> Markup {
    html! { @if total > shown { p.count { "and " (total - shown) " more " (what) " (" (total) " in all)" } } }
}

fn node_box(node: &GraphNode, this: bool) -> Markup {
    let (namespace, id) = node.task.split_once('/').unwrap_or(("", &node.task));
    html! {
        div class={"node" @if this { " self" }} data-task=(node.task) {
            @if this { strong { (node.task) } } @else { a href=(task_href(namespace, id)) { (node.task) } }
            @if !node.exists { " " span.badge.dead { "deleted" } }
            @if node.paused { " " span.badge.paused { "paused" } }
            div.last-run { (last_run(node.last_run.as_ref())) }
        }
    }
}

fn last_run(run: Option<&LastRun>) -> Markup {
    html! {
        @match run {
            None => span.empty title="its last scheduled fire, or for a task with after the last run its parents started; manual runs and backfills do not count here" { "no run yet" },
            Some(run) => {
                @let status = run.status.map(|status| status.as_str());
                span class={"badge run-" (status.unwrap_or("unknown"))} { (status.unwrap_or("record expired")) } " "
                a href={"/runs/" (run.execution_id)} { "run of " } (when(run.nominal_time))
            }
        }
    }
}

/// The recent waits, newest nominal time first.
fn waits(graph: &GraphReply) -> Markup {
    let held = graph.waits.iter().any(|wait| wait.fired.is_some());
    html! {
        table #dependency-waits {
            caption { "Recent waits for the parents' runs of a nominal time" }
            thead { tr {
                th scope="col" { "Nominal" } th scope="col" { "State" } th scope="col" { "Parents' runs in" }
                th scope="col" { "Missing" } @if held { th scope="col" { "Own fire" } }
                th scope="col" { "Gives up / ended" } th scope="col" { "Run" }
            } }
            tbody {
                @for wait in &graph.waits {
                    tr {
                        td { (when(wait.nominal_time)) }
                        td { span class={"badge wait-" (wait.state.as_str())} { (wait.state.as_str()) }
                             @if let Some(reason) = &wait.reason { " " span.sub { (reason) } } }
                        td { @for (task, run) in &wait.parents {
                            div { (task) " " span class={"badge run-" (run.status.as_str())} { (run.status.as_str()) } }
                        } }
                        td { (missing(graph, wait).join(", ")) }
                        @if held { td { (wait.fired.map_or("not yet", |trigger| trigger.as_str())) } }
                        td { @if wait.ended.is_some() { (when_opt(wait.ended)) } @else { (when(wait.deadline)) } }
                        td { @if wait.state == WaitState::Dispatched {
                            a href={"/runs/" (wait.execution_id)} { code { (wait.execution_id) } }
                        } }
                    }
                }
            }
        }
    }
}

/// The parents whose runs of the wait's nominal time have not come.
fn missing(graph: &GraphReply, wait: &Wait) -> Vec<String> {
    graph.parents.iter().map(|p| p.task.clone()).filter(|task| !wait.parents.contains_key(task)).collect()
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use jetsched_shared::wire::{ParentRun, RunStatus};
    use serde_json::json;

    use super::*;

    fn node(task: &str, exists: bool, status: Option<RunStatus>) -> GraphNode {
        GraphNode {
            task: task.into(),
            exists,
            paused: false,
            last_run: status.map(|status| LastRun {
                execution_id: format!("run-{task}"),
                nominal_time: DateTime::<Utc>::UNIX_EPOCH,
                status: Some(status),
            }),
        }
    }

    #[test]
    fn a_task_without_parents_or_children_shows_nothing() {
        let graph = GraphReply {
            task: "ns/solo".into(),
            last_run: None,
            rule: None,
            parents: vec![],
            children: vec![],
            parents_total: 0,
            children_total: 0,
            waits: vec![],
        };
        assert_eq!(section(&Ok(graph)).into_string(), "");
        assert!(
            section(&Err("no registry".into()))
                .into_string()
                .contains("Dependencies unavailable: no registry")
        );
    }

    #[test]
    fn parents_children_last_runs_and_waits_are_shown_and_escaped() {
        let wait: Wait = serde_json::from_value(json!({
            "namespace": "ns", "task_id": "d", "nominal_time": "1970-01-01T00:00:00Z", "state": "waiting",
            "execution_id": "exec-d", "since": "1970-01-01T00:00:00Z", "deadline": "1970-01-01T01:00:00Z", "parents": {}, "fired": "schedule"
        }))
        .unwrap();
        let mut wait = wait;
        wait.parents.insert(
            "ns/b".into(),
            ParentRun {
                task: "ns/b".into(),
                execution_id: "run-b".into(),
                status: RunStatus::Succeeded,
                finished: None,
                result: None,
                result_omitted: false,
            },
        );
        let graph = GraphReply {
            task: "ns/d".into(),
            last_run: None,
            rule: Some("runs when all of ns/b, ns/<c> succeeded".into()),
            parents: vec![node("ns/b", true, Some(RunStatus::Succeeded)), node("ns/<c>", false, None)],
            children: vec![node("ns/e", true, Some(RunStatus::Dead))],
            parents_total: 2,
            children_total: 250,
            waits: vec![wait],
        };
        let page = section(&Ok(graph)).into_string();
        assert!(page.contains(r#"<a href="/tasks/ns/b">ns/b</a>"#), "{page}");
        assert!(page.contains("ns/&lt;c&gt;") && !page.contains("ns/<c>"), "escaped: {page}");
        assert!(page.contains(r#"<span class="badge dead">deleted</span>"#), "{page}");
        assert!(page.contains(r#"<a href="/runs/run-ns/e">"#) && page.contains("badge run-dead"), "{page}");
        assert!(page.contains("no run yet"), "{page}");
        assert!(page.contains("<td>ns/&lt;c&gt;</td>"), "the missing parent: {page}");
        assert!(
            page.contains("<th scope=\"col\">Own fire</th>") && page.contains("<td>schedule</td>"),
            "{page}"
        );
    }
}
