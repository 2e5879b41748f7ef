//! Names of cancellation: the bucket of cancel markers every worker follows, and the run
//! endpoints that write them.

use super::Names;

/// `runs.cancel`: cancel one run (`<prefix>.api.runs.cancel.<namespace>`).
pub const CANCEL_ENDPOINT: &str = "cancel";
/// `runs.cancel-task`: cancel a task's runs not started (`<prefix>.api.runs.cancel-task.<namespace>`).
pub const CANCEL_TASK_ENDPOINT: &str = "cancel-task";

impl Names {
    /// Cancel markers: `<execution_id>` → `{namespace, task_id, reason, time}`, written by the
    /// registry, followed by every worker; they age out with the run records.
    pub fn cancels_bucket(&self) -> String {
        format!("{}_CANCELS", self.upper)
    }

    /// The subjects a task's queued runs wait on, every queue and lane (`task` `*`: every task
    /// of the namespace): `jetsched.dispatch.*.<namespace>.<task>`, `jetsched.lane.*.*.<namespace>.<task>`.
    pub fn queued_filters(&self, namespace: &str, task: &str) -> [String; 2] {
        [
            format!("{}.dispatch.*.{namespace}.{task}", self.prefix),
            format!("{}.lane.*.*.{namespace}.{task}", self.prefix),
        ]
    }

    /// The subject a held run waits on, whatever its queue and task:
    /// `jetsched.delayed.*.<namespace>.*.<execution_id>`.
    pub fn delayed_run_filter(&self, namespace: &str, execution_id: &str) -> String {
        format!("{}.delayed.*.{namespace}.*.{execution_id}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancels_are_named_from_the_prefix() {
        let names = Names::new("acme").expect("a valid prefix");
        assert_eq!(names.cancels_bucket(), "ACME_CANCELS");
        assert_eq!(names.queued_filters("ns", "*"), ["acme.dispatch.*.ns.*", "acme.lane.*.*.ns.*"]);
        assert_eq!(names.delayed_run_filter("ns", "e1"), "acme.delayed.*.ns.*.e1");
        assert_eq!(names.runs_api_namespaced(CANCEL_ENDPOINT, "demo"), "acme.api.runs.cancel.demo");
        assert_eq!(names.runs_api_namespaced(CANCEL_TASK_ENDPOINT, "demo"), "acme.api.runs.cancel-task.demo");
    }
}
