//! Names of dependencies between tasks: the bucket of children's waits for their parents, the
//! stream their deadlines wait in, and the registry's durable consumers.

use super::Names;

impl Names {
    /// Children's waits for their parents' runs: [`wait_key`](Self::wait_key) → a
    /// [`crate::wire::Wait`], written by the registry with compare-and-set.
    pub fn waits_bucket(&self) -> String {
        format!("{}_WAITS", self.upper)
    }

    /// A child's wait for one nominal time: `<namespace>.<task_id>.<nominal_ms>`.
    pub fn wait_key(namespace: &str, task_id: &str, nominal_ms: i64) -> String {
        format!("{namespace}.{task_id}.{nominal_ms}")
    }

    /// The key filter of a child's waits.
    pub fn wait_filter(namespace: &str, task_id: &str) -> String {
        format!("{namespace}.{task_id}.>")
    }

    /// Deadlines of waits: a server-scheduled message per wait on
    /// [`after_deadline_subject`](Self::after_deadline_subject) that the server publishes on
    /// [`after_due_subject`](Self::after_due_subject) when `within` has passed.
    pub fn after_stream(&self) -> String {
        format!("{}_AFTER", self.upper)
    }

    pub fn after_wildcard(&self) -> String {
        format!("{}.after.>", self.prefix)
    }

    /// Where a wait's deadline waits: `<prefix>.after.deadline.<namespace>.<task_id>.<ms>`.
    pub fn after_deadline_subject(&self, namespace: &str, task_id: &str, nominal_ms: i64) -> String {
        format!("{}.after.deadline.{namespace}.{task_id}.{nominal_ms}", self.prefix)
    }

    /// Where the server publishes a wait's deadline when it comes:
    /// `<prefix>.after.due.<namespace>.<task_id>.<ms>`.
    pub fn after_due_subject(&self, namespace: &str, task_id: &str, nominal_ms: i64) -> String {
        format!("{}.after.due.{namespace}.{task_id}.{nominal_ms}", self.prefix)
    }

    pub fn after_due_wildcard(&self) -> String {
        format!("{}.after.due.>", self.prefix)
    }

    /// Where the scheduler sends the fire of a task with `after` and a schedule of its own (a
    /// dispatch, held until its parents' runs of the fire's nominal time meet its rule):
    /// `<prefix>.after.fire.<namespace>.<task_id>`.
    pub fn after_fire_subject(&self, namespace: &str, task_id: &str) -> String {
        format!("{}.after.fire.{namespace}.{task_id}", self.prefix)
    }

    pub fn after_fire_wildcard(&self) -> String {
        format!("{}.after.fire.>", self.prefix)
    }

    /// The namespace, task and nominal time of a due subject.
    pub fn parse_after_due_subject<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str, i64)> {
        let rest = subject.strip_prefix(self.prefix.as_str())?.strip_prefix(".after.due.")?;
        let mut parts = rest.split('.');
        let (namespace, task_id, ms) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some((namespace, task_id, ms.parse().ok()?))
    }

    /// The registry's durable consumer of run records (every replica shares it): the verdicts
    /// children wait for.
    pub fn after_verdicts_consumer(&self) -> &'static str {
        "registry-after"
    }

    /// The registry's durable consumer of waits' deadlines.
    pub fn after_deadlines_consumer(&self) -> &'static str {
        "registry-after-due"
    }

    /// The registry's durable consumer of the fires of tasks with `after` and a schedule.
    pub fn after_fires_consumer(&self) -> &'static str {
        "registry-after-fire"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_subjects_round_trip() {
        let names = Names::new("acme").unwrap();
        let subject = names.after_due_subject("ns", "child", 1_700_000_000_000);
        assert_eq!(subject, "acme.after.due.ns.child.1700000000000");
        assert_eq!(names.parse_after_due_subject(&subject), Some(("ns", "child", 1_700_000_000_000)));
        assert_eq!(names.parse_after_due_subject("acme.after.due.ns.child"), None);
        assert_eq!(names.parse_after_due_subject("other.after.due.ns.child.1"), None);
        assert_eq!(Names::wait_key("ns", "child", 5), "ns.child.5");
        assert_eq!(names.after_fire_subject("ns", "child"), "acme.after.fire.ns.child");
    }
}
