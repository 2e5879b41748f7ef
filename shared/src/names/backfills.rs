//! Names of backfills: the bucket of their durable progress, its keys, and the API group that
//! starts, reads and cancels them.

use super::Names;

/// `backfill.start`: start a backfill of a task (`<prefix>.api.backfill.start[.<namespace>]`).
pub const BACKFILL_START: &str = "start";
/// `backfill.status`: one backfill's progress.
pub const BACKFILL_STATUS: &str = "status";
/// `backfill.list`: the backfills of a task (or of a namespace).
pub const BACKFILL_LIST: &str = "list";
/// `backfill.cancel`: stop a running backfill.
pub const BACKFILL_CANCEL: &str = "cancel";

impl Names {
    /// Backfill progress: [`backfill_key`](Self::backfill_key) → `{state, cursor, counts, ...}`,
    /// created by the registry, advanced by the scheduler leader with compare-and-set.
    pub fn backfills_bucket(&self) -> String {
        format!("{}_BACKFILLS", self.upper)
    }

    /// A backfill's id and its key in the backfills bucket: `<namespace>.<task_id>.<token>`,
    /// so a namespace's and a task's backfills are listed by key filter and a team reaches
    /// only its own.
    pub fn backfill_key(namespace: &str, task_id: &str, token: &str) -> String {
        format!("{namespace}.{task_id}.{token}")
    }

    /// The namespace and task of a backfill id, or `None` when it is not one.
    pub fn parse_backfill_key(id: &str) -> Option<(&str, &str, &str)> {
        let mut parts = id.splitn(3, '.');
        let (namespace, task_id, token) = (parts.next()?, parts.next()?, parts.next()?);
        let ok = |part: &str| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        (ok(namespace) && ok(task_id) && ok(token)).then_some((namespace, task_id, token))
    }

    /// The key filter of a task's backfills (`task` `None`: every backfill of the namespace).
    pub fn backfill_filter(namespace: &str, task_id: Option<&str>) -> String {
        format!("{namespace}.{}.*", task_id.unwrap_or("*"))
    }

    /// `jetsched.api.backfill`: the group of the backfill endpoints.
    pub fn backfill_api_group(&self) -> String {
        format!("{}.api.backfill", self.prefix)
    }

    /// `jetsched.api.backfill.<endpoint>`.
    pub fn backfill_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.backfill_api_group())
    }

    /// `jetsched.api.backfill.<endpoint>.<namespace>`.
    pub fn backfill_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.backfill_api_group())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backfills_are_named_from_the_prefix_and_keyed_by_task() {
        let names = Names::new("acme").expect("a valid prefix");
        assert_eq!(names.backfills_bucket(), "ACME_BACKFILLS");
        assert_eq!(names.backfill_api_subject(BACKFILL_START), "acme.api.backfill.start");
        assert_eq!(names.backfill_api_namespaced(BACKFILL_CANCEL, "demo"), "acme.api.backfill.cancel.demo");
        let key = Names::backfill_key("demo", "report", "01jx");
        assert_eq!(key, "demo.report.01jx");
        assert_eq!(Names::parse_backfill_key(&key), Some(("demo", "report", "01jx")));
        assert_eq!(Names::parse_backfill_key("demo.report"), None);
        assert_eq!(Names::parse_backfill_key("demo.report.a.b"), None);
        assert_eq!(Names::backfill_filter("demo", Some("report")), "demo.report.*");
        assert_eq!(Names::backfill_filter("demo", None), "demo.*.*");
    }
}
