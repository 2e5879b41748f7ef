//! Names of the runs an open breaker holds in the dispatch stream, as a reader counts them:
//! `<prefix>.delayed.<queue>.<namespace>.<task_id>.<execution_id>`.

use super::Names;

impl Names {
    /// Every held run of one task, whatever its queue: `jetsched.delayed.*.<namespace>.<task_id>.>`.
    pub fn delayed_task_filter(&self, namespace: &str, task_id: &str) -> String {
        format!("{}.delayed.*.{namespace}.{task_id}.>", self.prefix)
    }

    /// The queue of a held run's subject (`None` for a subject of another layout).
    pub fn parse_delayed_queue<'a>(&self, subject: &'a str) -> Option<&'a str> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix(".delayed.")?;
        let mut parts = rest.splitn(4, '.');
        let (queue, _namespace, _task_id, _execution) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        Some(queue)
    }

    /// The `(namespace, task_id)` of a held run's subject (`None` for a subject of another
    /// layout).
    pub fn parse_delayed_task<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix(".delayed.")?;
        let mut parts = rest.splitn(4, '.');
        let (_queue, namespace, task_id, _execution) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        Some((namespace, task_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_runs_are_found_by_task() {
        let names = Names::new("acme").expect("a valid prefix");
        assert_eq!(names.delayed_task_filter("billing", "nightly"), "acme.delayed.*.billing.nightly.>");
        assert_eq!(
            names.parse_delayed_task("acme.delayed.q.billing.nightly.e1"),
            Some(("billing", "nightly"))
        );
        assert_eq!(names.parse_delayed_task("acme.delayed.q.e1"), None);
        assert_eq!(names.parse_delayed_task("other.delayed.q.billing.nightly.e1"), None);
    }
}
