//! A search of the task list: the query string's filters and the matcher prepared once per
//! search.

use std::collections::HashSet;

use serde::Deserialize;

use super::summary::TaskSummary;

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
    /// `paused`, `active`, `failing` (its last run failed), `breaker` (it has a breaker) or
    /// empty.
    #[serde(default)]
    pub state: String,
    /// `critical`, `high`, `normal`, `low` or empty.
    #[serde(default)]
    pub priority: String,
    #[serde(default)]
    pub executor: String,
    #[serde(default)]
    pub queue: String,
    /// 1-based page number.
    #[serde(default)]
    pub page: Option<usize>,
}

/// A query prepared once per search: the needle lowered, the label filters split.
pub(super) struct Matcher<'a> {
    needle: String,
    query: &'a TaskQuery,
    labels: Vec<(&'a str, Option<&'a str>)>,
    /// Keys of the tasks whose last run failed (for `state=failing`).
    failing: &'a HashSet<Box<str>>,
}

impl<'a> Matcher<'a> {
    pub(super) fn new(query: &'a TaskQuery, failing: &'a HashSet<Box<str>>) -> Matcher<'a> {
        let labels = query
            .label
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|wanted| match wanted.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (wanted, None),
            })
            .collect();
        Matcher { needle: query.q.trim().to_lowercase(), query, labels, failing }
    }

    pub(super) fn matches(&self, task: &TaskSummary) -> bool {
        let query = self.query;
        (self.needle.is_empty() || task.search_text().contains(self.needle.as_str()))
            && (query.namespace.is_empty() || task.namespace() == query.namespace)
            && (query.executor.is_empty() || task.executor == query.executor)
            && (query.queue.is_empty() || *task.queue == *query.queue)
            && (query.priority.is_empty() || task.priority == query.priority)
            && match query.state.as_str() {
                "paused" => task.paused,
                "active" => !task.paused,
                "failing" => self.failing.contains(task.key()),
                "breaker" => task.breaker.is_some(),
                _ => true,
            }
            && self.labels.iter().all(|(key, value)| {
                task.labels.iter().any(|(k, v)| &**k == *key && value.is_none_or(|value| &**v == value))
            })
    }
}
