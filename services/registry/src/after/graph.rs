//! The dependency graph: every task with `after`, kept from the tasks bucket's feed, indexed by
//! its parents; what a run's verdict may start, what a new spec would close into a cycle, what
//! deleting or pausing a task leaves waiting.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv;
use bytes::Bytes;
use jetsched_shared::names::task_key;
use jetsched_shared::spec::TaskSpec;
use tokio::sync::Notify;

use crate::tasks_feed::{Feed, Index};

/// How long a verdict waits for the graph to apply the specs stored before it.
const CATCH_UP: Duration = Duration::from_secs(5);

/// A task with `after`, as stored.
#[derive(Debug, Clone)]
pub(crate) struct Child {
    pub(crate) spec: Arc<TaskSpec>,
    /// The stored spec's bytes, copied into its dispatches as they are.
    pub(crate) json: Bytes,
    pub(crate) revision: u64,
}

#[derive(Default)]
struct Inner {
    /// Children by their key (`<namespace>.<id>`).
    children: HashMap<String, Child>,
    /// Child keys by the key of each parent they name.
    by_parent: HashMap<String, BTreeSet<String>>,
}

/// Shared by the API (checks at `put`, replies of `delete` and `pause`, `graph`) and the
/// verdicts consumer. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Graph {
    inner: Arc<RwLock<Inner>>,
    /// Told when the first child appears (the verdicts consumer starts then).
    children_appeared: Arc<Notify>,
    /// The tasks bucket's feed: how far the graph has applied the bucket. A verdict handled
    /// before it is loaded would find no children of a parent whose children are not loaded yet.
    feed: Feed,
}

impl Graph {
    /// An empty graph that `feed` fills (it is one of the feed's indexes).
    pub(crate) fn new(feed: Feed) -> Graph {
        Graph { inner: Arc::default(), children_appeared: Arc::default(), feed }
    }

    /// Resolves once the specs stored when the feed first opened are all applied.
    pub(crate) async fn loaded(&self) {
        self.feed.loaded().await;
    }

    /// Resolves once the graph has applied every spec stored before this call: a verdict
    /// handled after it finds every child whose `put` was answered before the verdict was
    /// stored, even one this replica's watch had not delivered yet. Past `CATCH_UP` (an entry
    /// the watch will not deliver) it goes on with what it has, and says so.
    pub(crate) async fn caught_up(&self, tasks: &kv::Store) -> anyhow::Result<()> {
        if !self.feed.caught_up(tasks, CATCH_UP).await? {
            tracing::warn!(seen = self.feed.seen(), "the dependency graph lags the tasks bucket");
        }
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether any task has `after`.
    pub(crate) fn has_children(&self) -> bool {
        !self.read().children.is_empty()
    }

    /// Resolves once a child is known (at once when one is).
    pub(crate) async fn children_appeared(&self) {
        loop {
            let notified = self.children_appeared.notified();
            if self.has_children() {
                return;
            }
            notified.await;
        }
    }

    /// The children of the task `parent_key` (`<namespace>.<id>`).
    pub(crate) fn children_of(&self, parent_key: &str) -> Vec<Child> {
        let inner = self.read();
        let Some(keys) = inner.by_parent.get(parent_key) else { return Vec::new() };
        keys.iter().filter_map(|key| inner.children.get(key).cloned()).collect()
    }

    /// One child, by key.
    pub(crate) fn child(&self, key: &str) -> Option<Child> {
        self.read().children.get(key).cloned()
    }

    /// The children naming `parent_key`, as `<namespace>/<id>`: what deleting or pausing it
    /// leaves waiting.
    pub(crate) fn waiting_on(&self, parent_key: &str) -> Vec<String> {
        self.children_of(parent_key)
            .iter()
            .map(|child| format!("{}/{}", child.spec.namespace, child.spec.id))
            .collect()
    }

    /// The cycle `spec` would close, as the tasks along it (`a/x → a/y → a/x`: x waits for y,
    /// which waits for x), or `None`. The graph is the stored one with `spec` in place of its
    /// stored version.
    pub(crate) fn cycle_through(&self, spec: &TaskSpec) -> Option<Vec<String>> {
        let after = spec.after.as_ref()?;
        let start = spec.key();
        let inner = self.read();
        let parents_of = |key: &str| -> Vec<String> {
            if key == start {
                return after.tasks.iter().map(|p| p.key()).collect();
            }
            inner
                .children
                .get(key)
                .and_then(|child| child.spec.after.as_ref())
                .map(|after| after.tasks.iter().map(|p| p.key()).collect())
                .unwrap_or_default()
        };
        // Depth first from the new spec, along parents, with the path kept.
        let mut visited = HashSet::new();
        let mut path = vec![start.clone()];
        let mut stack = vec![parents_of(&start).into_iter()];
        while let Some(next) = stack.last_mut() {
            match next.next() {
                Some(parent) if parent == start => {
                    path.push(parent);
                    return Some(path.iter().map(|key| display(key)).collect());
                }
                Some(parent) => {
                    if visited.insert(parent.clone()) {
                        stack.push(parents_of(&parent).into_iter());
                        path.push(parent);
                    }
                }
                None => {
                    stack.pop();
                    path.pop();
                }
            }
        }
        None
    }
}

impl Index for Graph {
    /// Keeps a task with `after` (by its parents), drops one that no longer has it.
    fn apply(&self, entry: &kv::Entry, spec: Option<&Arc<TaskSpec>>) {
        let child = spec.filter(|spec| spec.after.is_some()).map(|spec| Child {
            spec: spec.clone(),
            json: entry.value.clone(),
            revision: entry.revision,
        });
        let appeared = {
            let mut inner = self.write();
            let was_empty = inner.children.is_empty();
            if let Some(old) = inner.children.remove(&entry.key) {
                for parent in old.spec.after.iter().flat_map(|after| &after.tasks) {
                    let key = parent.key();
                    if let Some(children) = inner.by_parent.get_mut(&key) {
                        children.remove(&entry.key);
                        if children.is_empty() {
                            inner.by_parent.remove(&key);
                        }
                    }
                }
            }
            if let Some(child) = child {
                for parent in child.spec.after.iter().flat_map(|after| &after.tasks) {
                    inner.by_parent.entry(parent.key()).or_default().insert(entry.key.clone());
                }
                inner.children.insert(entry.key.clone(), child);
            }
            was_empty && !inner.children.is_empty()
        };
        if appeared {
            self.children_appeared.notify_waiters();
        }
    }
}

/// Verdicts handled only once the graph holds every child stored before them. The graph is
/// caught up with a verdict once it applied the tasks stream's last sequence read after the
/// verdict was stored: it then holds every child whose `put` was answered before. A verdict
/// received has been stored, so one read of the tasks stream suffices for it. With more
/// verdicts waiting behind it, one check covers them all: the runs stream's last sequence `R`
/// is read first, then the tasks stream's (both from the streams' leaders), and every verdict
/// up to `R` needs no other check.
pub(crate) struct CatchUp {
    tasks: kv::Store,
    runs: kv::Store,
    /// Run records up to this sequence of the runs stream are covered.
    covered: u64,
}

impl CatchUp {
    pub(crate) fn new(tasks: kv::Store, runs: kv::Store) -> CatchUp {
        CatchUp { tasks, runs, covered: 0 }
    }

    /// Resolves once the verdict stored at `sequence` of the runs stream may be handled;
    /// `behind`: verdicts waiting for the consumer after it.
    pub(crate) async fn before(&mut self, graph: &Graph, sequence: u64, behind: u64) -> anyhow::Result<()> {
        if sequence != 0 && sequence <= self.covered {
            return Ok(());
        }
        let covers = match behind {
            0 => sequence,
            _ => {
                let mut runs = self.runs.stream.clone();
                runs.info().await.context("read the runs bucket's stream info")?.state.last_sequence
            }
        };
        graph.caught_up(&self.tasks).await?;
        self.covered = self.covered.max(covers);
        Ok(())
    }
}

/// `<namespace>/<id>` of a task key.
fn display(key: &str) -> String {
    match jetsched_shared::names::split_task_key(key) {
        Some((namespace, id)) => format!("{namespace}/{id}"),
        None => key.to_string(),
    }
}

/// The key of a parent a run record names.
pub(crate) fn parent_key(namespace: &str, task_id: &str) -> String {
    task_key(namespace, task_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, after: &[&str]) -> TaskSpec {
        let text = if after.is_empty() {
            format!(
                r#"{{"id":"{id}","namespace":"ns","schedule":{{"every":"1h"}},"executor":{{"kind":"handler","name":"h"}}}}"#
            )
        } else {
            let tasks: Vec<String> = after.iter().map(|t| format!("\"{t}\"")).collect();
            format!(
                r#"{{"id":"{id}","namespace":"ns","after":{{"tasks":[{}]}},"executor":{{"kind":"handler","name":"h"}}}}"#,
                tasks.join(",")
            )
        };
        TaskSpec::parse(text.as_bytes()).expect("a valid spec")
    }

    fn graph(specs: &[TaskSpec]) -> Graph {
        let graph = Graph::new(Feed::default());
        for (i, spec) in specs.iter().enumerate() {
            let mut inner = graph.write();
            let child = Child { spec: Arc::new(spec.clone()), json: Bytes::new(), revision: i as u64 + 1 };
            for parent in spec.after.iter().flat_map(|after| &after.tasks) {
                inner.by_parent.entry(parent.key()).or_default().insert(spec.key());
            }
            if spec.after.is_some() {
                inner.children.insert(spec.key(), child);
            }
        }
        graph
    }

    #[test]
    fn a_cycle_is_named_along_its_path() {
        // b waits for a, c waits for b: a waiting for c closes a cycle of three.
        let g = graph(&[spec("b", &["a"]), spec("c", &["b"])]);
        assert_eq!(
            g.cycle_through(&spec("a", &["c"])),
            Some(vec!["ns/a".into(), "ns/c".into(), "ns/b".into(), "ns/a".into()])
        );
        // a diamond is no cycle
        let g = graph(&[spec("b", &["a"]), spec("c", &["a"])]);
        assert_eq!(g.cycle_through(&spec("d", &["b", "c"])), None);
        assert_eq!(g.waiting_on("ns.a"), vec!["ns/b".to_string(), "ns/c".to_string()]);
    }

    #[test]
    fn a_long_chain_is_walked_without_recursion() {
        let specs: Vec<TaskSpec> =
            (1..5000).map(|i| spec(&format!("t{i}"), &[&format!("t{}", i - 1)])).collect();
        let g = graph(&specs);
        let cycle = g.cycle_through(&spec("t0", &["t4999"])).expect("the chain closes");
        assert_eq!(cycle.len(), 5001);
        assert_eq!(g.cycle_through(&spec("x", &["t4999"])), None);
    }
}
