//! One task's summary in the index: what the task list shows of it, decoded tolerantly from
//! the stored spec, ordered and found by namespace, then id.

use std::borrow::Borrow;
use std::sync::Arc;

use jetsched_shared::names::split_task_key;
use jetsched_shared::priority::Priority;
use jetsched_shared::wire::parse_time;
use serde::Deserialize;

/// What the task list shows of one task, compact: a hundred thousand of them stay within a
/// few tens of MiB (one string holds namespace and id; queue names and label keys are shared).
#[derive(Debug, Clone)]
pub struct TaskSummary {
    /// `<namespace>\0<id>`: sorts by namespace, then id.
    key: Box<str>,
    namespace_len: usize,
    /// The id in lower case when it differs from the id (what the id search looks in).
    lowered: Option<Box<str>>,
    pub labels: Box<[(Arc<str>, Box<str>)]>,
    pub paused: bool,
    pub executor: &'static str,
    pub queue: Arc<str>,
    pub schedule: Box<str>,
    /// The instant of a one-shot (`at`): with its fire state it tells whether it completed.
    pub one_shot_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revision: u64,
    /// `critical`, `high`, `normal` (the default) or `low`.
    pub priority: &'static str,
    /// The breaker's name: `<namespace>:<key>` for a named one, empty for the task's own;
    /// `None` without a breaker.
    pub breaker: Option<Box<str>>,
    /// The cron schedule's time zone, when it has one.
    pub zone: Option<Box<str>>,
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
    labels: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    executor: Option<ExecutorView>,
    #[serde(default)]
    schedule: Option<ScheduleView>,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    breaker: Option<BreakerView>,
}

#[derive(Deserialize)]
struct BreakerView {
    #[serde(default)]
    key: Option<String>,
}

#[derive(Deserialize)]
struct ExecutorView {
    #[serde(default)]
    kind: Option<String>,
}

#[derive(Default, Deserialize)]
struct ScheduleView {
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    every: Option<String>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    after: Option<String>,
}

/// The executor kinds the console knows; anything else shows as `?`.
const EXECUTORS: [&str; 4] = ["http", "nats", "shell", "handler"];

impl TaskSummary {
    /// The summary of the spec stored under `key`, `None` when the key or value is not a task's.
    pub fn decode(key: &str, value: &[u8], revision: u64) -> Option<TaskSummary> {
        let (namespace, id) = split_task_key(key)?;
        let view: SpecView = serde_json::from_slice(value).ok()?;
        let kind = view.executor.and_then(|e| e.kind).unwrap_or_default();
        let lowered = id.to_lowercase();
        let priority = view.priority.as_deref().unwrap_or_default();
        let zone = view.schedule.as_ref().filter(|s| s.cron.is_some()).and_then(|s| s.timezone.clone());
        Some(TaskSummary {
            key: format!("{namespace}\0{id}").into(),
            namespace_len: namespace.len(),
            lowered: (lowered != id).then(|| lowered.into()),
            labels: view.labels.into_iter().map(|(k, v)| (Arc::from(k), v.into())).collect(),
            paused: view.paused,
            executor: EXECUTORS.into_iter().find(|known| *known == kind).unwrap_or("?"),
            queue: Arc::from(view.queue.as_deref().unwrap_or("default")),
            one_shot_at: view.schedule.as_ref().and_then(|s| s.at.as_deref()).and_then(parse_time),
            schedule: view.schedule.map(|s| schedule_text(&s)).unwrap_or_default().into(),
            revision,
            priority: Priority::ALL
                .into_iter()
                .map(Priority::as_str)
                .find(|known| *known == priority)
                .unwrap_or(Priority::Normal.as_str()),
            breaker: view
                .breaker
                .map(|b| b.key.map(|key| format!("{namespace}:{key}")).unwrap_or_default().into()),
            zone: zone.map(Into::into),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.key[..self.namespace_len]
    }

    pub fn id(&self) -> &str {
        &self.key[self.namespace_len + 1..]
    }

    /// The index's key of the task (`<namespace>\0<id>`), also the activity's.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(super) fn search_text(&self) -> &str {
        self.lowered.as_deref().unwrap_or_else(|| self.id())
    }
}

/// `cron 0 30 2 * * * (Asia/Shanghai)`, `every 5m`, `at 2026-…`, `after 10s`.
fn schedule_text(schedule: &ScheduleView) -> String {
    if let Some(cron) = &schedule.cron {
        return format!("cron {cron} ({})", schedule.timezone.as_deref().unwrap_or("UTC"));
    }
    for (kind, value) in [("every", &schedule.every), ("at", &schedule.at), ("after", &schedule.after)] {
        if let Some(value) = value {
            return format!("{kind} {value}");
        }
    }
    String::new()
}

// Summaries are ordered and found by their key alone (namespace, then id).
impl PartialEq for TaskSummary {
    fn eq(&self, other: &TaskSummary) -> bool {
        self.key == other.key
    }
}

impl Eq for TaskSummary {}

impl PartialOrd for TaskSummary {
    fn partial_cmp(&self, other: &TaskSummary) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TaskSummary {
    fn cmp(&self, other: &TaskSummary) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl Borrow<str> for TaskSummary {
    fn borrow(&self) -> &str {
        &self.key
    }
}
