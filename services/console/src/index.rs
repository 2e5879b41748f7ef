//! The task index: compact summaries of every task (namespace, id, labels, paused, executor
//! kind, queue, schedule text), fed by one ordered watch of the tasks bucket (last value per
//! key, then every change) and searched and paginated in memory, so no page reads the bucket.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use jetsched_shared::admin::Readiness;
use jetsched_shared::names::split_task_key;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What the task list shows of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSummary {
    pub namespace: String,
    pub id: String,
    pub labels: Vec<(String, String)>,
    pub paused: bool,
    pub executor: String,
    pub queue: String,
    pub schedule: String,
    pub revision: u64,
}

/// A tolerant view of a stored spec: only what the summary needs, unknown fields ignored (a
/// newer registry may store fields this console does not know).
#[derive(Deserialize)]
struct SpecView {
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    executor: Option<Value>,
    #[serde(default)]
    schedule: Option<Value>,
}

impl TaskSummary {
    /// The summary of the spec stored under `key`, `None` when the key or value is not a task's.
    pub fn decode(key: &str, value: &[u8], revision: u64) -> Option<TaskSummary> {
        let (namespace, id) = split_task_key(key)?;
        let view: SpecView = serde_json::from_slice(value).ok()?;
        let executor = view
            .executor
            .as_ref()
            .and_then(|e| e.get("kind"))
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        Some(TaskSummary {
            namespace: namespace.to_string(),
            id: id.to_string(),
            labels: view.labels.into_iter().collect(),
            paused: view.paused,
            executor,
            queue: view.queue.unwrap_or_else(|| "default".to_string()),
            schedule: view.schedule.as_ref().map(schedule_text).unwrap_or_default(),
            revision,
        })
    }
}

/// `cron 0 30 2 * * * (Asia/Shanghai)`, `every 5m`, `at 2026-…`, `after 10s`.
pub(crate) fn schedule_text(schedule: &Value) -> String {
    let text = |key: &str| schedule.get(key).and_then(Value::as_str);
    if let Some(cron) = text("cron") {
        let zone = text("timezone").unwrap_or("UTC");
        return format!("cron {cron} ({zone})");
    }
    for kind in ["every", "at", "after"] {
        if let Some(value) = text(kind) {
            return format!("{kind} {value}");
        }
    }
    schedule.to_string()
}

/// A search of the task list; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TaskQuery {
    /// Part of the id (case-insensitive).
    #[serde(default)]
    pub q: String,
    #[serde(default)]
    pub namespace: String,
    /// `key=value` (exact) or `key` (present), several separated by commas.
    #[serde(default)]
    pub label: String,
    /// `paused`, `active` or empty.
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub executor: String,
    #[serde(default)]
    pub queue: String,
    /// 1-based page number.
    #[serde(default)]
    pub page: Option<usize>,
}

impl TaskQuery {
    fn matches(&self, task: &TaskSummary, needle: &str) -> bool {
        (needle.is_empty() || contains_ignore_case(&task.id, needle))
            && (self.namespace.is_empty() || task.namespace == self.namespace)
            && (self.executor.is_empty() || task.executor == self.executor)
            && (self.queue.is_empty() || task.queue == self.queue)
            && match self.state.as_str() {
                "paused" => task.paused,
                "active" => !task.paused,
                _ => true,
            }
            && self.label.split(',').map(str::trim).filter(|l| !l.is_empty()).all(|wanted| {
                match wanted.split_once('=') {
                    Some((key, value)) => task.labels.iter().any(|(k, v)| k == key && v == value),
                    None => task.labels.iter().any(|(k, _)| k == wanted),
                }
            })
    }
}

fn contains_ignore_case(haystack: &str, lowered_needle: &str) -> bool {
    if haystack.is_ascii() {
        haystack
            .as_bytes()
            .windows(lowered_needle.len())
            .any(|w| w.eq_ignore_ascii_case(lowered_needle.as_bytes()))
    } else {
        haystack.to_lowercase().contains(lowered_needle)
    }
}

/// One page of a search.
#[derive(Debug, Clone)]
pub struct TaskPage {
    pub tasks: Vec<TaskSummary>,
    /// Tasks matching the search, all pages.
    pub matching: usize,
    /// Tasks in the index.
    pub total: usize,
    pub page: usize,
    pub pages: usize,
}

/// Every task's summary, ordered by namespace and id.
#[derive(Debug, Default)]
pub struct TaskIndex {
    tasks: BTreeMap<(String, String), TaskSummary>,
}

impl TaskIndex {
    pub fn put(&mut self, task: TaskSummary) {
        self.tasks.insert((task.namespace.clone(), task.id.clone()), task);
    }

    pub fn remove(&mut self, namespace: &str, id: &str) {
        self.tasks.remove(&(namespace.to_string(), id.to_string()));
    }

    pub fn get(&self, namespace: &str, id: &str) -> Option<&TaskSummary> {
        self.tasks.get(&(namespace.to_string(), id.to_string()))
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Queues named by any task, sorted.
    pub fn queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self.tasks.values().map(|t| t.queue.clone()).collect();
        queues.sort();
        queues.dedup();
        queues
    }

    /// Page `query.page` (1-based, clamped) of `page_size` tasks matching `query`; one pass
    /// over the summaries, cloning only the page.
    pub fn search(&self, query: &TaskQuery, page_size: usize) -> TaskPage {
        let needle = query.q.trim().to_lowercase();
        let page_size = page_size.max(1);
        let wanted = query.page.unwrap_or(1).max(1);
        let skip = (wanted - 1) * page_size;
        let mut matching = 0;
        let mut tasks = Vec::with_capacity(page_size);
        for task in self.tasks.values() {
            if query.matches(task, &needle) {
                if matching >= skip && tasks.len() < page_size {
                    tasks.push(task.clone());
                }
                matching += 1;
            }
        }
        let pages = matching.div_ceil(page_size).max(1);
        if tasks.is_empty() && wanted > pages {
            // Past the end: show the last page.
            return self.search(&TaskQuery { page: Some(pages), ..query.clone() }, page_size);
        }
        TaskPage { tasks, matching, total: self.tasks.len(), page: wanted, pages }
    }
}

/// The index shared by the pages and its follower.
pub(crate) type SharedIndex = Arc<RwLock<TaskIndex>>;

/// An opened watch of the tasks bucket and how many messages the bucket held when it opened.
pub(crate) struct IndexFeed {
    watch: kv::Watch,
    messages: u64,
    index: SharedIndex,
}

impl IndexFeed {
    /// Opens the watch first, then reads the bucket's size: anything stored after arrives
    /// through the watch.
    pub(crate) async fn open(store: &kv::Store, index: SharedIndex) -> anyhow::Result<IndexFeed> {
        let watch = store.watch_with_history(">").await.context("watch the tasks bucket")?;
        let mut stream = store.stream.clone();
        let info = stream.info().await.context("read the tasks bucket's stream info")?;
        Ok(IndexFeed { watch, messages: info.state.messages, index })
    }

    /// Follows the bucket until `shutdown`; marks the `task_index` check ready once the initial
    /// load is complete. Write locks are taken per chunk of entries and never held across an
    /// await.
    pub(crate) async fn follow(
        self,
        readiness: Readiness,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let IndexFeed { watch, messages, index } = self;
        let mut loaded = messages == 0;
        readiness.set("task_index", loaded);
        let mut chunks = watch.ready_chunks(1024);
        loop {
            let chunk = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                chunk = chunks.next() => chunk,
            };
            let Some(chunk) = chunk else { anyhow::bail!("the tasks bucket's watch ended") };
            let mut decoded = Vec::with_capacity(chunk.len());
            for entry in chunk {
                match entry {
                    Ok(entry) => {
                        loaded |= entry.delta == 0;
                        let Some((namespace, id)) = split_task_key(&entry.key) else { continue };
                        let summary = match entry.operation {
                            Operation::Put => TaskSummary::decode(&entry.key, &entry.value, entry.revision),
                            Operation::Delete | Operation::Purge => None,
                        };
                        decoded.push((namespace.to_string(), id.to_string(), summary));
                    }
                    Err(error) => tracing::warn!(%error, "tasks bucket watch"),
                }
            }
            {
                let mut index = index.write().expect("task index lock");
                for (namespace, id, summary) in decoded {
                    match summary {
                        Some(summary) => index.put(summary),
                        None => index.remove(&namespace, &id),
                    }
                }
            }
            if loaded {
                readiness.set("task_index", true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(namespace: &str, id: &str, labels: &[(&str, &str)], paused: bool) -> TaskSummary {
        TaskSummary {
            namespace: namespace.into(),
            id: id.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            paused,
            executor: if paused { "http".into() } else { "nats".into() },
            queue: "default".into(),
            schedule: "every 1m".into(),
            revision: 1,
        }
    }

    fn index() -> TaskIndex {
        let mut index = TaskIndex::default();
        for n in 0..120 {
            let labels: &[(&str, &str)] =
                if n % 3 == 0 { &[("team", "billing")] } else { &[("team", "ops")] };
            index.put(task(
                if n < 100 { "billing" } else { "ops" },
                &format!("Report-{n:03}"),
                labels,
                n % 2 == 0,
            ));
        }
        index
    }

    #[test]
    fn pages_are_ordered_and_clamped() {
        let index = index();
        let first = index.search(&TaskQuery::default(), 50);
        assert_eq!((first.matching, first.total, first.page, first.pages), (120, 120, 1, 3));
        assert_eq!(first.tasks.len(), 50);
        assert_eq!(first.tasks[0].id, "Report-000");
        let last = index.search(&TaskQuery { page: Some(3), ..Default::default() }, 50);
        assert_eq!(last.tasks.len(), 20);
        assert_eq!(last.tasks[19].id, "Report-119");
        let beyond = index.search(&TaskQuery { page: Some(9), ..Default::default() }, 50);
        assert_eq!((beyond.page, beyond.tasks.len()), (3, 20));
    }

    #[test]
    fn filters_combine() {
        let index = index();
        let query = |q: TaskQuery| index.search(&q, 1000).matching;
        assert_eq!(query(TaskQuery { q: "report-01".into(), ..Default::default() }), 10);
        assert_eq!(query(TaskQuery { namespace: "ops".into(), ..Default::default() }), 20);
        assert_eq!(query(TaskQuery { label: "team=billing".into(), ..Default::default() }), 40);
        assert_eq!(query(TaskQuery { label: "team".into(), ..Default::default() }), 120);
        assert_eq!(query(TaskQuery { label: "team=billing, owner".into(), ..Default::default() }), 0);
        assert_eq!(query(TaskQuery { state: "paused".into(), ..Default::default() }), 60);
        assert_eq!(query(TaskQuery { executor: "nats".into(), ..Default::default() }), 60);
        assert_eq!(
            query(TaskQuery {
                namespace: "billing".into(),
                state: "active".into(),
                label: "team=billing".into(),
                ..Default::default()
            }),
            // n < 100, odd, multiple of 3: 3, 9, ..., 99.
            17
        );
        assert_eq!(query(TaskQuery { queue: "other".into(), ..Default::default() }), 0);
    }

    #[test]
    fn summaries_decode_tolerantly() {
        let value =
            br#"{"id":"x","namespace":"ns","schedule":{"cron":"0 0 2 * * *","timezone":"Europe/Berlin"},
            "executor":{"kind":"http","url":"http://a"},"labels":{"a":"<b>"},"paused":true,"future":1}"#;
        let summary = TaskSummary::decode("ns.x", value, 7).unwrap();
        assert_eq!(summary.schedule, "cron 0 0 2 * * * (Europe/Berlin)");
        assert_eq!(
            (summary.executor.as_str(), summary.queue.as_str(), summary.paused),
            ("http", "default", true)
        );
        assert_eq!(summary.labels, vec![("a".to_string(), "<b>".to_string())]);
        assert!(TaskSummary::decode("nokey", value, 1).is_none());
        assert!(TaskSummary::decode("ns.x", b"not json", 1).is_none());
    }
}
