//! The task index: compact summaries of every task (namespace, id, labels, paused, executor
//! kind, queue, priority, breaker, schedule text), fed by one ordered watch of the tasks bucket
//! (last value per key, then every change) and searched and paginated in memory, so no page
//! reads the bucket.

pub(crate) mod feed;
mod query;
mod summary;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use query::Matcher;
pub use query::TaskQuery;
pub use summary::TaskSummary;

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

/// Every task's summary, ordered by namespace and id, with the queues in use (counted) and the
/// label keys seen, shared by the summaries that name them.
#[derive(Debug, Default)]
pub struct TaskIndex {
    tasks: BTreeSet<TaskSummary>,
    queues: HashMap<Arc<str>, usize>,
    label_keys: HashSet<Arc<str>>,
}

fn sort_key(namespace: &str, id: &str) -> String {
    format!("{namespace}\0{id}")
}

impl TaskIndex {
    pub fn put(&mut self, mut task: TaskSummary) {
        let queue = match self.queues.get_key_value(&task.queue) {
            Some((queue, _)) => queue.clone(),
            None => task.queue.clone(),
        };
        *self.queues.entry(queue.clone()).or_default() += 1;
        task.queue = queue;
        for (key, _) in task.labels.iter_mut() {
            match self.label_keys.get(key) {
                Some(shared) => *key = shared.clone(),
                None => {
                    self.label_keys.insert(key.clone());
                }
            }
        }
        if let Some(old) = self.tasks.replace(task) {
            self.forget_queue(&old.queue);
        }
    }

    pub fn remove(&mut self, namespace: &str, id: &str) {
        if let Some(old) = self.tasks.take(sort_key(namespace, id).as_str()) {
            self.forget_queue(&old.queue);
        }
    }

    fn forget_queue(&mut self, queue: &Arc<str>) {
        if let Some(count) = self.queues.get_mut(queue) {
            *count -= 1;
            if *count == 0 {
                self.queues.remove(queue);
            }
        }
    }

    pub fn get(&self, namespace: &str, id: &str) -> Option<&TaskSummary> {
        self.tasks.get(sort_key(namespace, id).as_str())
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Queues named by any task, sorted.
    pub fn queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self.queues.keys().map(|q| q.to_string()).collect();
        queues.sort();
        queues
    }

    /// Page `query.page` (1-based, clamped) of `page_size` tasks matching `query`; one pass
    /// over the summaries, cloning only the page. `failing` holds the keys of the tasks whose
    /// last run failed (what `state=failing` keeps).
    pub fn search(&self, query: &TaskQuery, page_size: usize, failing: &HashSet<Box<str>>) -> TaskPage {
        let matcher = Matcher::new(query, failing);
        let page_size = page_size.max(1);
        let wanted = query.page.unwrap_or(1).max(1);
        let skip = (wanted - 1) * page_size;
        let mut matching = 0;
        let mut tasks = Vec::with_capacity(page_size);
        for task in &self.tasks {
            if matcher.matches(task) {
                if matching >= skip && tasks.len() < page_size {
                    tasks.push(task.clone());
                }
                matching += 1;
            }
        }
        let pages = matching.div_ceil(page_size).max(1);
        if tasks.is_empty() && wanted > pages {
            // Past the end: show the last page.
            return self.search(&TaskQuery { page: Some(pages), ..query.clone() }, page_size, failing);
        }
        TaskPage { tasks, matching, total: self.tasks.len(), page: wanted, pages }
    }
}

/// The index shared by the pages and its follower.
pub(crate) type SharedIndex = Arc<RwLock<TaskIndex>>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn task(namespace: &str, id: &str, labels: &[(&str, &str)], paused: bool) -> TaskSummary {
        let spec = json!({
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            "paused": paused,
            "executor": {"kind": if paused { "http" } else { "nats" }},
            "schedule": {"every": "1m"},
        });
        TaskSummary::decode(&format!("{namespace}.{id}"), spec.to_string().as_bytes(), 1).unwrap()
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
        let first = index.search(&TaskQuery::default(), 50, &HashSet::new());
        assert_eq!((first.matching, first.total, first.page, first.pages), (120, 120, 1, 3));
        assert_eq!(first.tasks.len(), 50);
        assert_eq!((first.tasks[0].namespace(), first.tasks[0].id()), ("billing", "Report-000"));
        let last = index.search(&TaskQuery { page: Some(3), ..Default::default() }, 50, &HashSet::new());
        assert_eq!(last.tasks.len(), 20);
        assert_eq!(last.tasks[19].id(), "Report-119");
        let beyond = index.search(&TaskQuery { page: Some(9), ..Default::default() }, 50, &HashSet::new());
        assert_eq!((beyond.page, beyond.tasks.len()), (3, 20));
    }

    #[test]
    fn filters_combine() {
        let index = index();
        let query = |q: TaskQuery| index.search(&q, 1000, &HashSet::new()).matching;
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
    fn priority_breaker_and_failing_filters_combine_with_the_others() {
        let mut index = index();
        for (id, spec) in [
            ("urgent", json!({"priority": "high", "breaker": {"key": "card-api"}, "queue": "fast"})),
            (
                "own-breaker",
                json!({"priority": "high", "breaker": {}, "schedule": {"cron": "0 0 2 * * *", "timezone": "Asia/Tokyo"}}),
            ),
            ("odd", json!({"priority": "whatever"})),
        ] {
            index.put(TaskSummary::decode(&format!("ops.{id}"), spec.to_string().as_bytes(), 1).unwrap());
        }
        let urgent = index.get("ops", "urgent").unwrap();
        assert_eq!((urgent.priority, urgent.breaker.as_deref()), ("high", Some("ops:card-api")));
        let own = index.get("ops", "own-breaker").unwrap();
        assert_eq!((own.breaker.as_deref(), own.zone.as_deref()), (Some(""), Some("Asia/Tokyo")));
        assert_eq!(index.get("ops", "odd").unwrap().priority, "normal");
        let failing: HashSet<Box<str>> = ["ops\0urgent".into(), "billing\0Report-003".into()].into();
        let query = |q: TaskQuery| {
            let page = index.search(&q, 1000, &failing);
            page.tasks.iter().map(|t| t.id().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(
            query(TaskQuery { priority: "high".into(), ..Default::default() }),
            ["own-breaker", "urgent"]
        );
        assert_eq!(
            query(TaskQuery { state: "breaker".into(), ..Default::default() }),
            ["own-breaker", "urgent"]
        );
        assert_eq!(
            query(TaskQuery { state: "failing".into(), ..Default::default() }),
            ["Report-003", "urgent"]
        );
        assert_eq!(
            query(TaskQuery {
                state: "failing".into(),
                queue: "fast".into(),
                priority: "high".into(),
                ..Default::default()
            }),
            ["urgent"]
        );
        assert_eq!(query(TaskQuery { priority: "low".into(), ..Default::default() }), Vec::<String>::new());
    }

    #[test]
    fn updates_replace_and_removals_forget_queues() {
        let mut index = TaskIndex::default();
        let put = |index: &mut TaskIndex, id: &str, queue: &str| {
            let spec = json!({"queue": queue, "labels": {"team": "a"}});
            index.put(TaskSummary::decode(&format!("ns.{id}"), spec.to_string().as_bytes(), 1).unwrap());
        };
        put(&mut index, "a", "fast");
        put(&mut index, "b", "fast");
        put(&mut index, "a", "slow");
        assert_eq!((index.len(), index.queues()), (2, vec!["fast".to_string(), "slow".to_string()]));
        assert_eq!(&*index.get("ns", "a").unwrap().queue, "slow");
        index.remove("ns", "b");
        index.remove("ns", "zzz");
        assert_eq!((index.len(), index.queues()), (1, vec!["slow".to_string()]));
        assert!(index.get("ns", "b").is_none());
        // Namespaces sort before longer ones sharing their start.
        put(&mut index, "x", "slow");
        let spec = json!({}).to_string();
        index.put(TaskSummary::decode("ns-2.a", spec.as_bytes(), 1).unwrap());
        let page = index.search(&TaskQuery::default(), 10, &HashSet::new());
        let order: Vec<_> = page.tasks.iter().map(|t| format!("{}/{}", t.namespace(), t.id())).collect();
        assert_eq!(order, ["ns/a", "ns/x", "ns-2/a"]);
    }

    #[test]
    fn summaries_decode_tolerantly() {
        let value =
            br#"{"id":"x","namespace":"ns","schedule":{"cron":"0 0 2 * * *","timezone":"Europe/Berlin"},
            "executor":{"kind":"http","url":"http://a"},"labels":{"a":"<b>"},"paused":true,"future":1}"#;
        let summary = TaskSummary::decode("ns.x", value, 7).unwrap();
        assert_eq!(&*summary.schedule, "cron 0 0 2 * * * (Europe/Berlin)");
        assert_eq!((summary.executor, &*summary.queue, summary.paused), ("http", "default", true));
        assert_eq!((&*summary.labels[0].0, &*summary.labels[0].1), ("a", "<b>"));
        assert_eq!((summary.namespace(), summary.id()), ("ns", "x"));
        assert!(TaskSummary::decode("nokey", value, 1).is_none());
        assert!(TaskSummary::decode("ns.x", b"not json", 1).is_none());
    }
}
