//! Names of the request/reply API: the micro services, their endpoint groups and subjects,
//! namespaced endpoints included.

use super::Names;

impl Names {
    /// Name of the NATS micro service (`nats micro ls`).
    pub fn service_name(&self) -> String {
        format!("{}-registry", self.prefix)
    }
    /// The presence micro service of a role: `jetsched-scheduler`, `jetsched-worker`, ...
    pub fn presence_service(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }
    /// `jetsched.api.task` — the group every task endpoint lives under.
    pub fn task_api_group(&self) -> String {
        format!("{}.api.task", self.prefix)
    }
    /// `jetsched.api.task.<endpoint>`.
    pub fn task_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.task_api_group())
    }
    /// `jetsched.api.dlq` — the group of the dead-letter endpoints.
    pub fn dlq_api_group(&self) -> String {
        format!("{}.api.dlq", self.prefix)
    }
    pub fn dlq_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.dlq_api_group())
    }
    /// `jetsched.api.task.<endpoint>.<namespace>`: a task endpoint scoped to one namespace, so
    /// NATS permissions can grant a team its namespace and nothing else.
    pub fn task_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.task_api_group())
    }
    /// `jetsched.api.dlq.<endpoint>.<namespace>`.
    pub fn dlq_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.dlq_api_group())
    }
    /// `jetsched.api.breaker` — the group of the breaker endpoints (`list`, `get`, `reset`).
    pub fn breaker_api_group(&self) -> String {
        format!("{}.api.breaker", self.prefix)
    }
    /// `jetsched.api.breaker.<endpoint>`.
    pub fn breaker_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.breaker_api_group())
    }
    /// `jetsched.api.calendar` — the group of the calendar endpoints (`put`, `get`, `list`,
    /// `delete`); like the task endpoints, each also served as `<endpoint>.<namespace>`.
    pub fn calendar_api_group(&self) -> String {
        format!("{}.api.calendar", self.prefix)
    }
    /// `jetsched.api.calendar.<endpoint>`.
    pub fn calendar_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.calendar_api_group())
    }
    /// `jetsched.api.calendar.<endpoint>.<namespace>`.
    pub fn calendar_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.calendar_api_group())
    }
    /// `jetsched.api.queue` — the group of the queue endpoints (`list`, `pause`, `resume`), for
    /// operators only: a queue spans namespaces.
    pub fn queue_api_group(&self) -> String {
        format!("{}.api.queue", self.prefix)
    }
    /// `jetsched.api.queue.<endpoint>`.
    pub fn queue_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.queue_api_group())
    }
    /// `jetsched.api.runs` — run records read through the registry (namespaced only: a run
    /// record's key carries no namespace, so only the registry can check it).
    pub fn runs_api_group(&self) -> String {
        format!("{}.api.runs", self.prefix)
    }
    /// `jetsched.api.runs.<endpoint>.<namespace>`.
    pub fn runs_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.runs_api_group())
    }
    /// `jetsched.api.events` — a namespace's event history read through the registry
    /// (namespaced only: a team whose account has no access to the events stream reads its
    /// history here, and follows new events on its live subjects).
    pub fn events_api_group(&self) -> String {
        format!("{}.api.events", self.prefix)
    }
    /// `jetsched.api.events.<endpoint>.<namespace>`.
    pub fn events_api_namespaced(&self, endpoint: &str, namespace: &str) -> String {
        format!("{}.{endpoint}.{namespace}", self.events_api_group())
    }
    /// The namespace of a namespaced API subject (`<group>.<endpoint>.<namespace>`, `group`
    /// being one of the groups above), or `None` for any other subject.
    pub fn api_namespace<'a>(&self, group: &str, subject: &'a str) -> Option<&'a str> {
        let rest = subject.strip_prefix(group)?.strip_prefix('.')?;
        let (endpoint, namespace) = rest.split_once('.')?;
        (!endpoint.is_empty() && !namespace.is_empty() && !namespace.contains('.')).then_some(namespace)
    }
    /// Every event of one namespace, whatever its kind: `jetsched.event.*.*.<namespace>.>`
    /// (kinds are two tokens). The live subscription and the events-consumer filter of a team.
    pub fn namespace_events_filter(&self, namespace: &str) -> String {
        format!("{}.event.*.*.{namespace}.>", self.prefix)
    }
    /// The reply-subject prefix of a team's connections, `_INBOX.<namespace>`: a team may
    /// subscribe to its own replies only (`_INBOX.<namespace>.>`; with `_INBOX.>` it could
    /// subscribe to every reply of the account), while the services, which answer any
    /// `_INBOX.>`, need nothing per team.
    pub fn namespace_inbox_prefix(namespace: &str) -> String {
        format!("_INBOX.{namespace}")
    }
    /// Catches requests to endpoints that do not exist: `jetsched.api.>`.
    pub fn api_wildcard(&self) -> String {
        format!("{}.api.>", self.prefix)
    }
}
