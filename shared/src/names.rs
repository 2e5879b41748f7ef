//! Every subject, stream, bucket, consumer and key name jetsched uses, in one place.
//!
//! Nothing outside this module spells a subject or a stream name: services call these
//! functions. All names derive from one configurable prefix (default `jetsched`), so
//! several deployments can share a NATS account.

use crate::error::{ApiError, ErrorCode};
use crate::priority::Priority;

mod after;
mod api;
mod backfills;
mod breaker_keys;
mod cancels;
mod flow;
mod held;
mod limits;
mod msg_ids;
mod reserved;

pub use backfills::{BACKFILL_CANCEL, BACKFILL_LIST, BACKFILL_START, BACKFILL_STATUS};
#[cfg(test)]
use breaker_keys::is_name_token;
pub use breaker_keys::{BreakerKey, breaker_named_key, breaker_shared_key, breaker_task_key};
pub use cancels::{CANCEL_ENDPOINT, CANCEL_TASK_ENDPOINT};
pub use flow::{DedupeScope, dedupe_key};
pub use limits::{CONCURRENCY_LIMIT, concurrency_key, limit_name};
pub use msg_ids::{
    backfill_rerun_msg_id, dead_letter_msg_id, dispatch_msg_id, event_msg_id, manual_msg_id,
    pause_request_msg_id, replay_msg_id,
};
pub use reserved::ReservedSpace;

/// The default prefix.
pub const DEFAULT_PREFIX: &str = "jetsched";

/// What a message of a fast-ingest batch does ([`Names::fast_batch_reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastBatchOp {
    /// The first message of a batch of more than one.
    Start = 0,
    /// A message between the first and the last.
    Append = 1,
    /// The last message: the server acknowledges the whole batch once it is stored.
    Commit = 2,
}

/// Namespace used in event subjects for events that concern no task (leader changes).
pub const SYSTEM_NAMESPACE: &str = "_system";

/// The namespace-like scope of the breakers a worker declares shared by every namespace
/// (`--shared-breakers`): the middle token of their bucket key (`key.=shared.<key>`) and the
/// namespace of their events (the id being the key). `=` is allowed in KV keys and subject
/// tokens but in no namespace id (`[A-Za-z0-9_-]`), so no namespace can collide with it.
pub const SHARED_BREAKER_SCOPE: &str = "=shared";

/// Reasons carried by breaker and auto-pause events.
pub mod breaker_reason {
    /// `run.skipped`'s reason when the run's breaker was open (`on_open: skip`).
    pub const BREAKER_OPEN: &str = "breaker_open";
    /// `run.skipped`'s reason (and the run record's) when the run was dispatched by the task's
    /// schedule and had not started when a worker took it while the task was paused.
    pub const PAUSED: &str = "paused";
    /// `run.skipped`'s reason (and the run record's) when the run's rate limit did not let it
    /// start now (`rate_limit.on_limit: skip`).
    pub const RATE_LIMITED: &str = "rate_limited";
    /// `task.paused`'s reason (and the task's `paused_reason`) when the registry paused the task
    /// after `pause_after_failures` consecutive failed runs.
    pub const CONSECUTIVE_FAILURES: &str = "consecutive_failures";
}

/// Names derived from a prefix: `jetsched` gives streams `JETSCHED_*` and subjects `jetsched.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    prefix: String,
    upper: String,
}

impl Default for Names {
    fn default() -> Self {
        Names::new(DEFAULT_PREFIX).expect("default prefix is valid")
    }
}

impl Names {
    /// A prefix is `[a-z0-9_]{1,32}` starting with a letter (it becomes a subject token and,
    /// upper-cased, part of stream names).
    pub fn new(prefix: &str) -> Result<Names, ApiError> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix.starts_with(|c: char| c.is_ascii_lowercase())
            && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(ApiError::at(
                ErrorCode::InvalidValue,
                "prefix",
                format!("prefix {prefix:?} must match [a-z][a-z0-9_]{{0,31}}"),
            ));
        }
        Ok(Names { prefix: prefix.to_string(), upper: prefix.to_ascii_uppercase() })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    // ---- KV buckets -------------------------------------------------------------------

    /// `<namespace>.<task_id>` → task spec JSON.
    pub fn tasks_bucket(&self) -> String {
        format!("{}_TASKS", self.upper)
    }
    /// Leader lease (`scheduler` key).
    pub fn leader_bucket(&self) -> String {
        format!("{}_LEADER", self.upper)
    }
    /// Per-task fire state written by the leader.
    pub fn state_bucket(&self) -> String {
        format!("{}_STATE", self.upper)
    }
    /// Per-execution run records written by workers.
    pub fn runs_bucket(&self) -> String {
        format!("{}_RUNS", self.upper)
    }
    /// Circuit breakers shared by every worker: [`breaker_task_key`] → a task's own breaker and
    /// its consecutive-failure count, [`breaker_named_key`] → a namespace's named breaker,
    /// [`breaker_shared_key`] → a named breaker shared by every namespace.
    pub fn breakers_bucket(&self) -> String {
        format!("{}_BREAKERS", self.upper)
    }
    /// Business calendars: [`calendar_key`] → a calendar document (`crate::calendar`), written
    /// by the registry with compare-and-set, followed by the scheduler.
    pub fn calendars_bucket(&self) -> String {
        format!("{}_CALENDARS", self.upper)
    }
    /// Rate limits shared by every worker: [`rate_key`](Self::rate_key) → the key's state
    /// (`{"tat_us", "throttled_since_us"}`), written with compare-and-set.
    pub fn rates_bucket(&self) -> String {
        format!("{}_RATES", self.upper)
    }
    /// A rate limit's key in the rates bucket: `<namespace>.<key>` (the expanded key of
    /// `rate_limit.key`; a key belongs to its namespace).
    pub fn rate_key(namespace: &str, key: &str) -> String {
        format!("{namespace}.{key}")
    }
    /// Queue states set by operators: `<queue>` → `{paused, reason, by, at}`. Workers follow it
    /// and pull nothing from a paused queue's lanes.
    pub fn queues_bucket(&self) -> String {
        format!("{}_QUEUES", self.upper)
    }

    /// The stream subject a KV bucket stores `key` under (`$KV.<bucket>.<key>`), for reads that
    /// must come from the stream leader rather than a possibly lagging replica.
    pub fn kv_subject(bucket: &str, key: &str) -> String {
        format!("$KV.{bucket}.{key}")
    }

    /// The stream backing a KV bucket.
    pub fn kv_stream(bucket: &str) -> String {
        format!("KV_{bucket}")
    }

    /// The reply subject of message `seq` of fast-ingest batch `id` (nats-server 2.14+, a
    /// stream with `allow_batched`): `<inbox>.<id>.<flow>.fail.<seq>.<op>.$FI`, where `flow`
    /// is the most messages the client lets go unacknowledged, `fail` refuses the rest of the
    /// batch after a gap, and `op` is 0 (start), 1 (append) or 2 (commit: the last message).
    /// The server's flow acknowledgements and the batch's final acknowledgement come back on it.
    pub fn fast_batch_reply(inbox: &str, id: &str, flow: u16, seq: u64, op: FastBatchOp) -> String {
        format!("{inbox}.{id}.{flow}.fail.{seq}.{}.$FI", op as u8)
    }

    /// The subject of direct gets of a stream's messages with the request in the body
    /// (`$JS.API.DIRECT.GET.<stream>`), e.g. the latest message of many subjects at once.
    pub fn direct_get_subject(stream: &str) -> String {
        format!("$JS.API.DIRECT.GET.{stream}")
    }

    // ---- streams ----------------------------------------------------------------------

    pub fn intake_stream(&self) -> String {
        format!("{}_INTAKE", self.upper)
    }
    pub fn dispatch_stream(&self) -> String {
        format!("{}_DISPATCH", self.upper)
    }
    pub fn dlq_stream(&self) -> String {
        format!("{}_DLQ", self.upper)
    }
    pub fn events_stream(&self) -> String {
        format!("{}_EVENTS", self.upper)
    }
    pub fn advisories_stream(&self) -> String {
        format!("{}_ADVISORIES", self.upper)
    }
    pub fn alerts_stream(&self) -> String {
        format!("{}_ALERTS", self.upper)
    }
    /// Requests from workers to the registry (pause a task), consumed durably.
    pub fn control_stream(&self) -> String {
        format!("{}_CONTROL", self.upper)
    }

    // ---- subjects ---------------------------------------------------------------------

    /// Fire-and-forget submission of a spec: `jetsched.submit.<namespace>.<task_id>`.
    pub fn submit_subject(&self, namespace: &str, task_id: &str) -> String {
        format!("{}.submit.{namespace}.{task_id}", self.prefix)
    }
    pub fn submit_wildcard(&self) -> String {
        format!("{}.submit.>", self.prefix)
    }
    /// Splits an intake subject back into `(namespace, task_id)`.
    pub fn parse_submit_subject<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str)> {
        self.parse_task_subject(".submit.", subject)
    }
    /// `(namespace, task_id)` of a subject `<prefix><infix><namespace>.<task_id>`.
    fn parse_task_subject<'a>(&self, infix: &str, subject: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix(infix)?;
        let (namespace, task_id) = rest.split_once('.')?;
        (!namespace.is_empty() && !task_id.is_empty() && !task_id.contains('.'))
            .then_some((namespace, task_id))
    }

    /// A worker's request that the registry pause a task (after `pause_after_failures`
    /// consecutive failed runs): `jetsched.control.pause.<namespace>.<task_id>`.
    pub fn pause_request_subject(&self, namespace: &str, task_id: &str) -> String {
        format!("{}.control.pause.{namespace}.{task_id}", self.prefix)
    }
    /// Every pause request: `jetsched.control.pause.>`.
    pub fn pause_request_wildcard(&self) -> String {
        format!("{}.control.pause.>", self.prefix)
    }
    /// Splits a pause-request subject back into `(namespace, task_id)`.
    pub fn parse_pause_request_subject<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str)> {
        self.parse_task_subject(".control.pause.", subject)
    }

    /// A run delayed by its open breaker, held by the server until its time (one subject per
    /// execution, since a schedule rolls up its subject):
    /// `jetsched.delayed.<queue>.<namespace>.<task_id>.<execution_id>`, so held runs are counted
    /// per queue and per task with subject filters. No worker consumer's filter matches it: at
    /// its time the server publishes a copy to the run's dispatch subject.
    pub fn delayed_subject(&self, queue: &str, namespace: &str, task_id: &str, execution_id: &str) -> String {
        format!("{}.delayed.{queue}.{namespace}.{task_id}.{execution_id}", self.prefix)
    }
    /// Every delayed run: `jetsched.delayed.>`.
    pub fn delayed_wildcard(&self) -> String {
        format!("{}.delayed.>", self.prefix)
    }

    /// `jetsched.dispatch.<queue>.<namespace>.<task_id>`.
    pub fn dispatch_subject(&self, queue: &str, namespace: &str, task_id: &str) -> String {
        format!("{}.dispatch.{queue}.{namespace}.{task_id}", self.prefix)
    }
    /// The filter of one queue's consumer: `jetsched.dispatch.<queue>.>`.
    pub fn dispatch_queue_filter(&self, queue: &str) -> String {
        format!("{}.dispatch.{queue}.>", self.prefix)
    }
    pub fn dispatch_wildcard(&self) -> String {
        format!("{}.dispatch.>", self.prefix)
    }

    /// The subject of a run of `priority` in `queue`: [`dispatch_subject`](Self::dispatch_subject)
    /// for `normal` (the layout from before priorities), `jetsched.lane.<priority>.<queue>.<namespace>.<task_id>`
    /// for the other lanes, which the `normal` consumer's filter does not match.
    pub fn lane_subject(&self, queue: &str, priority: Priority, namespace: &str, task_id: &str) -> String {
        match priority {
            Priority::Normal => self.dispatch_subject(queue, namespace, task_id),
            _ => format!("{}.lane.{priority}.{queue}.{namespace}.{task_id}", self.prefix),
        }
    }
    /// The filter of one lane's consumer (`jetsched.dispatch.<queue>.>` for `normal`).
    pub fn lane_filter(&self, queue: &str, priority: Priority) -> String {
        match priority {
            Priority::Normal => self.dispatch_queue_filter(queue),
            _ => format!("{}.lane.{priority}.{queue}.>", self.prefix),
        }
    }
    /// Every run of a lane other than `normal`: `jetsched.lane.>` (in the dispatch stream).
    pub fn lanes_wildcard(&self) -> String {
        format!("{}.lane.>", self.prefix)
    }
    /// Splits a dispatch subject of any lane into `(queue, priority, namespace, task_id)`.
    pub fn parse_lane_subject<'a>(&self, subject: &'a str) -> Option<(&'a str, Priority, &'a str, &'a str)> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix('.')?;
        let (priority, rest) = match rest.strip_prefix("dispatch.") {
            Some(rest) => (Priority::Normal, rest),
            None => {
                let (priority, rest) = rest.strip_prefix("lane.")?.split_once('.')?;
                (Priority::parse(priority).filter(|p| *p != Priority::Normal)?, rest)
            }
        };
        let mut tokens = rest.split('.');
        let (queue, namespace, task_id) = (tokens.next()?, tokens.next()?, tokens.next()?);
        let ok = tokens.next().is_none() && ![queue, namespace, task_id].contains(&"");
        ok.then_some((queue, priority, namespace, task_id))
    }

    /// `jetsched.dlq.<queue>.<namespace>.<task_id>`.
    pub fn dlq_subject(&self, queue: &str, namespace: &str, task_id: &str) -> String {
        format!("{}.dlq.{queue}.{namespace}.{task_id}", self.prefix)
    }
    pub fn dlq_wildcard(&self) -> String {
        format!("{}.dlq.>", self.prefix)
    }
    /// Splits a dead-letter subject back into `(queue, namespace, task_id)`.
    pub fn parse_dlq_subject<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix(".dlq.")?;
        let mut parts = rest.splitn(3, '.');
        let (queue, namespace, task_id) = (parts.next()?, parts.next()?, parts.next()?);
        (!task_id.contains('.')).then_some((queue, namespace, task_id))
    }

    /// `jetsched.event.<kind>.<namespace>.<task_id>`, kind being dotted (`task.registered`).
    pub fn event_subject(&self, kind: &str, namespace: &str, task_id: &str) -> String {
        format!("{}.event.{kind}.{namespace}.{task_id}", self.prefix)
    }
    pub fn events_wildcard(&self) -> String {
        format!("{}.event.>", self.prefix)
    }

    /// `jetsched.alert.<severity>`.
    pub fn alert_subject(&self, severity: &str) -> String {
        format!("{}.alert.{severity}", self.prefix)
    }
    pub fn alerts_wildcard(&self) -> String {
        format!("{}.alert.>", self.prefix)
    }

    /// Server advisories captured durably for the worker's dead-letter path.
    pub fn advisory_subjects(&self) -> Vec<String> {
        let stream = self.dispatch_stream();
        vec![
            self.max_deliveries_advisory_subject(),
            format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.*"),
        ]
    }

    /// The server's advisory for a dispatch that reached its consumer's `max_deliver` without
    /// a verdict (any consumer of the dispatch stream).
    pub fn max_deliveries_advisory_subject(&self) -> String {
        format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.*", self.dispatch_stream())
    }

    // ---- consumers and keys -------------------------------------------------------------

    /// The registry's durable consumer on the intake stream (shared by replicas).
    pub fn intake_consumer(&self) -> &'static str {
        "registry-intake"
    }
    /// The registry's durable consumer of pause requests (shared by replicas).
    pub fn pause_consumer(&self) -> &'static str {
        "registry-pause"
    }
    /// The durable pull consumer of one queue, shared by every worker replica.
    pub fn worker_consumer(&self, queue: &str) -> String {
        format!("workers-{queue}")
    }
    /// The queue a `workers-<queue>` consumer serves, or `None` for other consumers.
    pub fn queue_of_worker_consumer<'a>(&self, consumer: &'a str) -> Option<&'a str> {
        consumer.strip_prefix("workers-").filter(|q| !q.is_empty())
    }
    /// The durable pull consumer of one lane of a queue, shared by every worker replica:
    /// [`worker_consumer`](Self::worker_consumer) for `normal`, `lane-<priority>-<queue>` for the
    /// others (a queue name never starts with a priority and a dash after `lane-`, since the
    /// `workers-` and `lane-` families are told apart by their first token).
    pub fn lane_consumer(&self, queue: &str, priority: Priority) -> String {
        match priority {
            Priority::Normal => self.worker_consumer(queue),
            _ => format!("lane-{priority}-{queue}"),
        }
    }
    /// The `(queue, priority)` a worker consumer of any lane serves, or `None` for other consumers.
    pub fn lane_of_worker_consumer<'a>(&self, consumer: &'a str) -> Option<(&'a str, Priority)> {
        if let Some(rest) = consumer.strip_prefix("lane-") {
            let (priority, queue) = rest.split_once('-')?;
            let priority = Priority::parse(priority).filter(|p| *p != Priority::Normal)?;
            return (!queue.is_empty()).then_some((queue, priority));
        }
        // The advisory consumer shares the `workers-` family but serves no queue.
        (consumer != self.worker_advisory_consumer())
            .then(|| self.queue_of_worker_consumer(consumer))
            .flatten()
            .map(|queue| (queue, Priority::Normal))
    }
    /// The workers' durable consumer of the max-deliveries advisories (advisories stream),
    /// shared by every worker replica: it moves crash-looping runs to the DLQ.
    pub fn worker_advisory_consumer(&self) -> &'static str {
        "workers-max-deliveries"
    }
    /// The alerter's durable consumer of one event kind (`run.failed` → `alerter-run-failed`),
    /// shared by every replica. One consumer per kind, each with a single subject filter: a
    /// consumer with several filters that falls behind costs the server a walk of every subject
    /// of a stored block per message delivered (the events stream holds one subject per task
    /// and kind), enough to keep a busy server from ever catching up; a single filter is
    /// matched by a scan of the block, or skipped through the stream's subject index.
    pub fn alerter_consumer(&self, kind: &str) -> String {
        format!("alerter-{}", kind.replace('.', "-"))
    }
    /// The alerter's earlier single consumer of every kind it read (several filters): removed
    /// when an alerter starts.
    pub fn alerter_combined_consumer(&self) -> &'static str {
        "alerter"
    }
    /// The alerter's bucket of de-duplication windows: `<PREFIX>_ALERTER`.
    pub fn alerter_bucket(&self) -> String {
        format!("{}_ALERTER", self.upper)
    }
    /// The key of the scheduler's lease in the leader bucket.
    pub fn leader_key(&self) -> &'static str {
        "scheduler"
    }
    /// The subject a scheduler replica answers on while its connection lives:
    /// `jetsched.scheduler.leader.<instance>`. Followers ask the lease holder's; "no
    /// responders" means the server has dropped the holder's connection.
    pub fn scheduler_presence_subject(&self, instance: &str) -> String {
        format!("{}.scheduler.leader.{}", self.prefix, token(instance))
    }
    /// A scheduler replica's clock heartbeat in the leader bucket: `clock.<instance>`. The
    /// server's timestamp on it gives the replica's clock offset.
    pub fn clock_key(&self, instance: &str) -> String {
        format!("clock.{}", token(instance))
    }
}

/// `text` as one subject token and key part: characters outside `[-_=A-Za-z0-9]` become `_`.
fn token(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || "-_=".contains(c) { c } else { '_' }).collect()
}

/// `<namespace>.<task_id>`: the key in the tasks and state buckets.
pub fn task_key(namespace: &str, task_id: &str) -> String {
    format!("{namespace}.{task_id}")
}

/// `<namespace>.<name>`: a calendar's key in the calendars bucket.
pub fn calendar_key(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// Splits a task key back into `(namespace, task_id)`.
pub fn split_task_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('.')
}

/// The environment variable a `shell` program gets a trigger's payload in, as JSON.
pub const PAYLOAD_ENV: &str = "JETSCHED_PAYLOAD";

/// The environment variable that lets nats-server's own message tracing trace sampled
/// dispatches (`true`; default `false`), read with the OpenTelemetry variables.
pub const NATS_MSG_TRACE_ENV: &str = "JETSCHED_NATS_MSG_TRACE";

/// Names of the `jetsched.*` span attributes (re-exported by `trace`).
pub mod span_attr {
    /// `<namespace>/<id>` of the task.
    pub const TASK: &str = "jetsched.task";
    pub const EXECUTION_ID: &str = "jetsched.execution_id";
    /// RFC 3339 with milliseconds, UTC.
    pub const NOMINAL_TIME: &str = "jetsched.nominal_time";
    /// `schedule`, `catchup`, `manual` or `replay`.
    pub const TRIGGER: &str = "jetsched.trigger";
    pub const LEADER_TERM: &str = "jetsched.leader_term";
    /// Dispatch time minus nominal time, in milliseconds.
    pub const FIRE_LAG_MS: &str = "jetsched.fire_lag_ms";
    /// Attempt number of a run.
    pub const ATTEMPT: &str = "jetsched.attempt";
    /// JetStream's delivery count of the dispatch message.
    pub const DELIVERY_COUNT: &str = "jetsched.delivery_count";
    /// How a run attempt ended (`succeeded`, `retrying`, `failed`, ...).
    pub const OUTCOME: &str = "jetsched.outcome";
    /// Why a fire was skipped.
    pub const SKIP_REASON: &str = "jetsched.skip_reason";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix() {
        let names = Names::new("acme").unwrap();
        assert_eq!(names.tasks_bucket(), "ACME_TASKS");
        assert_eq!(names.dispatch_subject("q", "ns", "t"), "acme.dispatch.q.ns.t");
        assert_eq!(names.dispatch_queue_filter("q"), "acme.dispatch.q.>");
        assert_eq!(names.event_subject("task.registered", "ns", "t"), "acme.event.task.registered.ns.t");
        assert_eq!(names.task_api_subject("put"), "acme.api.task.put");
        assert_eq!(names.parse_submit_subject("acme.submit.ns.t"), Some(("ns", "t")));
        assert_eq!(names.parse_submit_subject("acme.submit.ns"), None);
        assert_eq!(names.parse_submit_subject("other.submit.ns.t"), None);
        assert_eq!(dispatch_msg_id("ns", "t", 1_700_000_000_000), "ns.t:1700000000000");
        assert_eq!(manual_msg_id("ns", "t", "e1"), "ns.t:manual:e1");
        assert_eq!(replay_msg_id("e1"), "replay:e1");
        assert_eq!(dead_letter_msg_id("e1"), "dlq:e1");
        assert_ne!(event_msg_id(), event_msg_id());
    }

    #[test]
    fn a_fast_batch_reply_has_the_servers_shape() {
        // nats-server reads it from the end: `<inbox>.<id>.<flow>.<gap>.<seq>.<op>.$FI`.
        assert_eq!(
            Names::fast_batch_reply("_INBOX.abc", "b7", 256, 3, FastBatchOp::Commit),
            "_INBOX.abc.b7.256.fail.3.2.$FI"
        );
        assert_eq!(
            Names::fast_batch_reply("_INBOX.x", "b1", 8, 1, FastBatchOp::Start),
            "_INBOX.x.b1.8.fail.1.0.$FI"
        );
    }

    #[test]
    fn a_replica_instance_is_one_token_of_its_presence_subject_and_clock_key() {
        let names = Names::new("acme").unwrap();
        assert_eq!(names.scheduler_presence_subject("host.lan-42"), "acme.scheduler.leader.host_lan-42");
        assert_eq!(names.clock_key("a b*>"), "clock.a_b__");
    }

    #[test]
    fn namespaced_api_subjects_carry_the_namespace_last() {
        let names = Names::new("acme").unwrap();
        assert_eq!(names.task_api_namespaced("put", "demo"), "acme.api.task.put.demo");
        assert_eq!(names.dlq_api_namespaced("list", "demo"), "acme.api.dlq.list.demo");
        assert_eq!(names.runs_api_namespaced("get", "demo"), "acme.api.runs.get.demo");
        let group = names.task_api_group();
        assert_eq!(names.api_namespace(&group, "acme.api.task.put.demo"), Some("demo"));
        assert_eq!(names.api_namespace(&group, "acme.api.task.put"), None);
        assert_eq!(names.api_namespace(&group, "acme.api.task.put.a.b"), None);
        assert_eq!(names.api_namespace(&group, "acme.api.dlq.put.demo"), None);
        assert_eq!(names.namespace_events_filter("demo"), "acme.event.*.*.demo.>");
        assert_eq!(Names::namespace_inbox_prefix("demo"), "_INBOX.demo");
        assert_eq!(names.parse_dlq_subject("acme.dlq.q.demo.t"), Some(("q", "demo", "t")));
        assert_eq!(names.parse_dlq_subject("acme.dlq.q.demo"), None);
    }

    #[test]
    fn breaker_names_and_keys() {
        let names = Names::new("acme").unwrap();
        assert_eq!(names.breakers_bucket(), "ACME_BREAKERS");
        assert_eq!(names.rates_bucket(), "ACME_RATES");
        assert_eq!(Names::rate_key("ns", "customer-1"), "ns.customer-1");
        assert_eq!(names.queues_bucket(), "ACME_QUEUES");
        assert_eq!(names.queue_api_subject("pause"), "acme.api.queue.pause");
        assert_eq!(names.control_stream(), "ACME_CONTROL");
        assert_eq!(names.pause_request_subject("ns", "t"), "acme.control.pause.ns.t");
        assert_eq!(names.parse_pause_request_subject("acme.control.pause.ns.t"), Some(("ns", "t")));
        assert_eq!(names.parse_pause_request_subject("acme.control.pause.ns"), None);
        assert_eq!(names.breaker_api_subject("reset"), "acme.api.breaker.reset");
        assert_eq!(names.delayed_subject("q", "ns", "t", "e1"), "acme.delayed.q.ns.t.e1");
        assert_eq!(names.parse_delayed_task(&names.delayed_subject("q", "ns", "t", "e1")), Some(("ns", "t")));
        assert_eq!(names.parse_delayed_queue(&names.delayed_subject("q", "ns", "t", "e1")), Some("q"));
        for priority in Priority::ALL {
            let subject = names.lane_subject("q", priority, "ns", "t");
            assert_eq!(names.parse_lane_subject(&subject), Some(("q", priority, "ns", "t")));
            let consumer = names.lane_consumer("q-x", priority);
            assert_eq!(names.lane_of_worker_consumer(&consumer), Some(("q-x", priority)));
            let filter = names.lane_filter("q", priority);
            assert!(subject.starts_with(filter.trim_end_matches('>')), "{subject} in {filter}");
            // No other lane's filter and no delayed subject overlaps it.
            for other in Priority::ALL.into_iter().filter(|p| *p != priority) {
                assert!(!subject.starts_with(names.lane_filter("q", other).trim_end_matches('>')));
            }
            assert!(!subject.starts_with(names.delayed_wildcard().trim_end_matches('>')));
        }
        assert_eq!(names.lane_subject("q", Priority::Low, "ns", "t"), "acme.lane.low.q.ns.t");
        assert_eq!(names.lane_consumer("q", Priority::Critical), "lane-critical-q");
        assert_eq!(names.lane_consumer("q", Priority::Normal), "workers-q");
        assert_eq!(names.lane_of_worker_consumer("workers-max-deliveries"), None);
        assert_eq!(names.parse_lane_subject("acme.lane.normal.q.ns.t"), None);
        assert_eq!(breaker_task_key("ns", "t"), "task.ns.t");
        assert_eq!(breaker_named_key("ns", "payments-api"), "key.ns.payments-api");
        assert_eq!(breaker_shared_key("payments-api"), "key.=shared.payments-api");
        assert_eq!(BreakerKey::parse("task.ns.t"), Some(BreakerKey::Task("ns", "t")));
        assert_eq!(BreakerKey::parse("key.ns.pay"), Some(BreakerKey::Named("ns", "pay")));
        assert_eq!(BreakerKey::parse("key.=shared.pay"), Some(BreakerKey::Shared("pay")));
        assert_eq!(BreakerKey::parse("key.ns.pay").unwrap().event_target(), ("ns", "pay"));
        assert_eq!(
            BreakerKey::parse("key.=shared.pay").unwrap().event_target(),
            (SHARED_BREAKER_SCOPE, "pay")
        );
        let named =
            ["task.ns.t", "key.ns.pay", "key.=shared.pay"].map(|k| BreakerKey::parse(k).unwrap().name());
        assert_eq!(named, ["ns/t", "ns:pay", "pay"]);
        for bad in [
            "task.ns",
            "task.ns.t.x",
            "key.",
            "other.x",
            "key.pay",
            "key.a.b.c",
            "key.=other.pay",
            "key..pay",
        ] {
            assert_eq!(BreakerKey::parse(bad), None, "{bad}");
        }
        // Every key is a valid KV key, and no namespace id can take the shared scope's place.
        let kv_key = |k: &str| k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b));
        assert!(kv_key(&breaker_shared_key("a_b-1")) && kv_key(&breaker_named_key("n-s_1", "a_b-1")));
        assert!(!is_name_token(SHARED_BREAKER_SCOPE));
        assert_eq!(pause_request_msg_id("ns", "t", "e1"), "pause:ns.t:e1");
    }

    #[test]
    fn bad_prefixes_are_rejected() {
        for bad in ["", "UP", "a.b", "a>", "1abc", &"a".repeat(33)] {
            assert!(Names::new(bad).is_err(), "{bad:?}");
        }
    }
}
