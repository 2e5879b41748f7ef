//! `graph`: a task's dependencies (its rule, parents, children and waits), and what `rm` and
//! `pause` say they leave waiting.

use anyhow::Context;
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::output::{self, outln};

/// After `rm` or `pause`: the tasks with `after` that wait for runs the task will not make.
pub(crate) fn left_waiting(json_out: bool, reply: &Value) {
    let Some(children) = reply["waiting_children"].as_array().filter(|c| !c.is_empty()) else { return };
    if json_out {
        return;
    }
    let names: Vec<&str> = children.iter().filter_map(Value::as_str).collect();
    outln!("waiting on it (after): {}", names.join(", "));
}

/// `graph`: the task's rule, parents, children and waits.
pub(crate) async fn graph(api: &Api, task: &str, json_out: bool) -> Result<(), Failure> {
    let reference = task_ref(task);
    let reply: Value = api.task_in("graph", &reference.namespace, &reference).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let graph: jetsched_shared::wire::GraphReply = serde_json::from_value(reply).context("graph reply")?;
    let last = |run: &Option<jetsched_shared::wire::LastRun>| match run {
        Some(run) => format!(
            "{} {} {}",
            jetsched_shared::wire::format_time(run.nominal_time),
            run.status.map_or("(no record)", |s| s.as_str()),
            run.execution_id
        ),
        None => "-".to_string(),
    };
    outln!("{}  last run: {}", graph.task, last(&graph.last_run));
    if let Some(rule) = &graph.rule {
        outln!("{rule}");
    }
    let rows = |nodes: &[jetsched_shared::wire::GraphNode], role: &str| -> Vec<Vec<String>> {
        nodes
            .iter()
            .map(|node| {
                let state = match (node.exists, node.paused) {
                    (false, _) => "deleted",
                    (true, true) => "paused",
                    (true, false) => "active",
                };
                vec![role.to_string(), node.task.clone(), state.to_string(), last(&node.last_run)]
            })
            .collect()
    };
    let mut table = rows(&graph.parents, "parent");
    table.extend(rows(&graph.children, "child"));
    if !table.is_empty() {
        output::table(&["", "TASK", "STATE", "LAST RUN"], &table);
    }
    for (shown, total, role) in [
        (graph.parents.len(), graph.parents_total, "parents"),
        (graph.children.len(), graph.children_total, "children"),
    ] {
        if total > shown {
            outln!("... and {} more {role} ({total} in all)", total - shown);
        }
    }
    if !graph.waits.is_empty() {
        let waits: Vec<Vec<String>> = graph
            .waits
            .iter()
            .map(|wait| {
                let have: Vec<String> = wait
                    .parents
                    .values()
                    .map(|run| format!("{} {}", run.task, run.status.as_str()))
                    .collect();
                vec![
                    jetsched_shared::wire::format_time(wait.nominal_time),
                    wait.state.as_str().to_string(),
                    have.join(", "),
                    wait.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        output::table(&["NOMINAL TIME", "WAIT", "PARENTS' RUNS", "WHY"], &waits);
    }
    Ok(())
}
