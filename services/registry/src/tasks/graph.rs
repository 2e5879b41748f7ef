//! `graph`: a task's parents and children with the last run of each and its waits; and what
//! `next` says of a task that waits for its parents.

use futures::{StreamExt, TryStreamExt};
use jetsched_shared::names::task_key;
use jetsched_shared::spec::{AfterMode, AfterSpec, TaskSpec};
use jetsched_shared::wire::{
    GRAPH_NODES, GraphNode, GraphReply, LastRun, TaskReply, Wait, WaitState, format_time,
};

use super::{TaskStore, decode};
use crate::failure::Failure;

/// Waits `graph` shows.
const GRAPH_WAITS: usize = 10;
/// Parents or children of `graph` read at once.
const NODES_AT_ONCE: usize = 16;

/// The rule of `after` as a sentence.
pub(crate) fn rule_text(after: &AfterSpec) -> String {
    let parents: Vec<String> = after.tasks.iter().map(ToString::to_string).collect();
    let how = match (after.mode, parents.len()) {
        (_, 1) => parents[0].clone(),
        (AfterMode::All, _) => format!("all of {}", parents.join(", ")),
        (AfterMode::Any, _) => format!("any of {}", parents.join(", ")),
    };
    format!(
        "runs when {how} {} for the same nominal time, waiting at most {} after the first",
        after.when.as_str(),
        after.within_text()
    )
}

/// The rule of `spec`: a child with a schedule of its own says that its fires wait.
fn task_rule_text(spec: &TaskSpec, after: &AfterSpec) -> String {
    match spec.holds_fires_for_parents() {
        false => rule_text(after),
        true => format!("fires on its schedule, then {}", rule_text(after)),
    }
}

/// One open wait as `next` tells it (`held`: a child with a schedule of its own).
fn wait_text(wait: &Wait, after: &AfterSpec, held: bool) -> String {
    let mut missing: Vec<String> =
        after.tasks.iter().map(ToString::to_string).filter(|task| !wait.parents.contains_key(task)).collect();
    let unfired = held && wait.fired.is_none();
    if unfired {
        missing.push("its own fire".to_string());
    }
    let until = match unfired {
        true => format!("gives up {} after its fire", after.within_text()),
        false => format!("gives up at {}", format_time(wait.deadline)),
    };
    format!("{}: waiting for {} ({until})", format_time(wait.nominal_time), missing.join(", "))
}

impl TaskStore {
    /// The task `namespace`/`id`, its parents and children, the last run of each, its waits.
    pub async fn graph(&self, namespace: &str, id: &str) -> Result<GraphReply, Failure> {
        crate::spans::task(namespace, id);
        let task = self.get(namespace, id).await?.task;
        let parents: Vec<String> =
            task.after.iter().flat_map(|after| &after.tasks).map(ToString::to_string).collect();
        let children = self.waiting_children(namespace, id);
        let (parents_total, children_total) = (parents.len(), children.len());
        let parents = self.nodes(namespace, parents).await?;
        let children = self.nodes(namespace, children).await?;
        let waits = match (&self.after, &task.after) {
            (Some(engine), Some(_)) => engine
                .waits_of(namespace, id, GRAPH_WAITS)
                .await
                .map_err(|e| Failure::unavailable("read the task's waits", e))?,
            _ => Vec::new(),
        };
        let last_run = self.last_run(&task, waits.first()).await?;
        Ok(GraphReply {
            task: format!("{namespace}/{id}"),
            last_run,
            rule: task.after.as_deref().map(|after| task_rule_text(&task, after)),
            parents,
            children,
            parents_total,
            children_total,
            waits,
        })
    }

    /// What `next` says of a task with `after`: its rule, then each open wait.
    pub(crate) async fn waits_for(&self, spec: &TaskSpec) -> Result<Vec<String>, Failure> {
        let Some(after) = &spec.after else { return Ok(Vec::new()) };
        let mut lines = vec![task_rule_text(spec, after)];
        if let Some(engine) = &self.after {
            let waits = engine
                .waits_of(&spec.namespace, &spec.id, 1000)
                .await
                .map_err(|e| Failure::unavailable("read the task's waits", e))?;
            lines.extend(
                waits
                    .iter()
                    .filter(|wait| wait.state == WaitState::Waiting)
                    .map(|wait| wait_text(wait, after, spec.holds_fires_for_parents())),
            );
        }
        Ok(lines)
    }

    /// The first [`GRAPH_NODES`] of `tasks` (`<namespace>/<id>`), each with its state and last
    /// run, read a few at a time.
    async fn nodes(&self, namespace: &str, tasks: Vec<String>) -> Result<Vec<GraphNode>, Failure> {
        let described = tasks.into_iter().take(GRAPH_NODES).map(|task| async move {
            let (ns, id) = task.split_once('/').unwrap_or((namespace, task.as_str()));
            let spec = match self.entry(&task_key(ns, id)).await? {
                Some(entry) => Some(decode(&entry)?),
                None => None,
            };
            self.node(&task, spec.as_ref()).await
        });
        futures::stream::iter(described).buffered(NODES_AT_ONCE).try_collect().await
    }

    async fn node(&self, task: &str, spec: Option<&TaskSpec>) -> Result<GraphNode, Failure> {
        let Some(spec) = spec else {
            return Ok(GraphNode { task: task.to_string(), exists: false, paused: false, last_run: None });
        };
        let newest = match (&self.after, &spec.after) {
            (Some(engine), Some(_)) => engine
                .waits_of(&spec.namespace, &spec.id, 1)
                .await
                .map_err(|e| Failure::unavailable("read the task's waits", e))?,
            _ => Vec::new(),
        };
        let last_run = self.last_run(spec, newest.first()).await?;
        Ok(GraphNode { task: task.to_string(), exists: true, paused: spec.paused, last_run })
    }

    /// A child's last run is its newest wait's dispatched run; a scheduled task's, its last
    /// fire's.
    async fn last_run(
        &self,
        spec: &TaskSpec,
        newest_wait: Option<&Wait>,
    ) -> Result<Option<LastRun>, Failure> {
        if spec.after.is_some() {
            let Some(wait) = newest_wait.filter(|wait| wait.state == WaitState::Dispatched) else {
                return Ok(None);
            };
            let status = match &self.after {
                Some(engine) => engine.run_status(&wait.execution_id).await,
                None => None,
            };
            return Ok(Some(LastRun {
                execution_id: wait.execution_id.clone(),
                nominal_time: wait.nominal_time,
                status,
            }));
        }
        let mut reply =
            [TaskReply { task: spec.clone(), revision: 0, status: None, waiting_children: Vec::new() }];
        self.fill_status(&mut reply).await?;
        let status = reply[0].status.take();
        Ok(status.and_then(|status| {
            Some(LastRun {
                execution_id: status.last_execution_id?,
                nominal_time: status.last_fire?,
                status: status.last_outcome,
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_reads_as_a_sentence() {
        let spec = TaskSpec::parse_value(serde_json::json!({
            "id": "d", "namespace": "ns",
            "after": {"tasks": ["b", "other/c"], "mode": "all", "within": "2h"},
            "executor": {"kind": "handler", "name": "h"}
        }))
        .unwrap();
        assert_eq!(
            rule_text(spec.after.as_ref().unwrap()),
            "runs when all of ns/b, other/c succeeded for the same nominal time, waiting at most 2h after the first"
        );
    }
}
