//! The dispatch message body and its execution ids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::millis;
use crate::priority::Priority;
use crate::spec::TaskSpec;

/// Why a run was dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    Manual,
    Catchup,
    Replay,
    /// A nominal time of a backfill (its ids are the live fire's, or a rerun's).
    Backfill,
    /// Its parents' runs of the nominal time ended as the task's `after` asks.
    After,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Catchup => "catchup",
            Trigger::Replay => "replay",
            Trigger::Backfill => "backfill",
            Trigger::After => "after",
        }
    }

    /// Whether the task's schedule dispatched the run (on time or caught up), rather than a
    /// person (a manual trigger, a replay): a paused task's scheduled runs are skipped.
    pub fn is_scheduled(self) -> bool {
        matches!(self, Trigger::Schedule | Trigger::Catchup)
    }
}

/// The body of a message on `JETSCHED_DISPATCH`: everything a worker needs, so it never reads
/// `TASKS`.
///
/// `S` is the spec as carried: parsed and validated ([`TaskSpec`], the default), or its JSON
/// text while a [`DispatchDecoder`] looks it up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Dispatch<S = TaskSpec> {
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    #[serde(with = "millis")]
    pub nominal_time: DateTime<Utc>,
    pub trigger: Trigger,
    /// Leader term (lease revision) of the scheduler that dispatched it; 0 for API triggers.
    pub term: u64,
    /// Revision of the spec in `TASKS` this snapshot comes from.
    pub revision: u64,
    /// The lane the run was dispatched to; `normal` for dispatches sent before priorities.
    #[serde(default)]
    pub priority: Priority,
    /// A replay's dead run: the execution whose dead letter it dispatched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// A trigger's payload: given to the run instead of the spec's body or payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// A run of a task with `after`: the parents' runs that let it start, with their results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<super::ParentRun>,
    pub spec: S,
    /// Trace id of the execution (32 hex digits): not part of the body, filled in by the
    /// receiver from the message's `traceparent` header.
    #[serde(skip)]
    pub trace_id: Option<String>,
}

impl<S> Dispatch<S> {
    /// The same dispatch carrying `spec`.
    fn with_spec<T>(self, spec: T) -> Dispatch<T> {
        Dispatch {
            execution_id: self.execution_id,
            namespace: self.namespace,
            task_id: self.task_id,
            nominal_time: self.nominal_time,
            trigger: self.trigger,
            term: self.term,
            revision: self.revision,
            priority: self.priority,
            replay_of: self.replay_of,
            payload: self.payload,
            parents: self.parents,
            spec,
            trace_id: self.trace_id,
        }
    }
}

/// Decodes dispatch bodies, parsing and validating each distinct spec text once.
///
/// Every run of a task carries the same spec text until the task changes, and reading a spec
/// (with every check the registry made) costs more than the rest of the body: a worker keeps
/// the specs it has read, by their exact text, and clones the one it finds. At most
/// [`DispatchDecoder::CAPACITY`] specs are kept; when full, it starts over.
#[derive(Debug, Default)]
pub struct DispatchDecoder {
    specs: Mutex<HashMap<Box<str>, Arc<TaskSpec>>>,
}

impl DispatchDecoder {
    /// Specs kept at most.
    pub const CAPACITY: usize = 1024;

    /// The dispatch in `bytes`, exactly as `serde_json::from_slice::<Dispatch>` reads it.
    pub fn decode(&self, bytes: &[u8]) -> Result<Dispatch, serde_json::Error> {
        let body: Dispatch<&RawValue> = serde_json::from_slice(bytes)?;
        let text = body.spec.get();
        let known = self.specs().get(text).cloned();
        let spec = match known {
            Some(spec) => TaskSpec::clone(&spec),
            None => {
                let spec = TaskSpec::parse(text.as_bytes()).map_err(serde::de::Error::custom)?;
                let mut specs = self.specs();
                if specs.len() >= Self::CAPACITY {
                    specs.clear();
                }
                specs.insert(text.into(), Arc::new(spec.clone()));
                spec
            }
        };
        Ok(body.with_spec(spec))
    }

    fn specs(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Arc<TaskSpec>>> {
        // A panic while holding the map cannot leave it inconsistent: use it as it is.
        self.specs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The execution id of a scheduled fire: a UUID v5 of `<namespace>.<task_id>:<nominal_ms>`, so
/// every leader derives the same id for the same fire and a worker's run record recognises a
/// duplicate that stream de-duplication could not.
pub fn scheduled_execution_id(namespace: &str, task_id: &str, nominal_unix_ms: i64) -> String {
    execution_id_of_fire(&crate::names::dispatch_msg_id(namespace, task_id, nominal_unix_ms))
}

/// [`scheduled_execution_id`] from the fire's message id ([`crate::names::dispatch_msg_id`]),
/// for a caller that has built it already.
pub fn execution_id_of_fire(dispatch_msg_id: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, dispatch_msg_id.as_bytes()).to_string()
}

/// The execution id of a manual trigger or replay: random, time-ordered.
pub fn fresh_execution_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A dispatch body around `spec` (its JSON text as a worker receives it).
    fn body(spec: &str, n: u64) -> Vec<u8> {
        format!(
            r#"{{"execution_id":"e-{n}","namespace":"ns","task_id":"t","nominal_time":"2026-12-03T10:00:00.{:03}Z","trigger":"schedule","term":7,"revision":{n},"priority":"high","spec":{spec}}}"#,
            n % 1000
        )
        .into_bytes()
    }

    fn specs() -> Vec<String> {
        vec![
            r#"{"id":"t","namespace":"ns","schedule":{"every":"1m"},"executor":{"kind":"handler","name":"noop"}}"#.into(),
            r#"{"id":"t","namespace":"ns","schedule":{"cron":"*/5 * * * * *","timezone":"Europe/Paris"},"executor":{"kind":"nats","subject":"work.x"},"labels":{"team":"a"}}"#.into(),
            r#"{"id":"t","namespace":"ns","schedule":{"cron":"*/5 * * * * *","timezone":"Europe/Paris"},"executor":{"kind":"nats","subject":"work.x"},"labels":{"team":"b"}}"#.into(),
            r#"{"id":"t","namespace":"ns","schedule":{"every":"1m"},"executor":{"kind":"http","url":"http://127.0.0.1:9/x"},"retry":{"max_attempts":4},"overlap":"skip"}"#.into(),
        ]
    }

    fn same(decoded: &Dispatch, bytes: &[u8]) {
        let reference: Dispatch = serde_json::from_slice(bytes).expect("the reference reads it");
        assert_eq!(decoded.spec, reference.spec);
        assert_eq!(serde_json::to_value(decoded).unwrap(), serde_json::to_value(&reference).unwrap());
    }

    proptest! {
        /// Whatever order specs arrive in, and however often each returns (changed in between
        /// or not), the decoder reads each body exactly as a plain decode does.
        #[test]
        fn decodes_every_body_as_a_plain_decode(picks in prop::collection::vec(0..4usize, 1..40)) {
            let decoder = DispatchDecoder::default();
            let specs = specs();
            for (n, pick) in picks.into_iter().enumerate() {
                let bytes = body(&specs[pick], n as u64);
                same(&decoder.decode(&bytes).expect("decodes"), &bytes);
            }
            prop_assert!(decoder.specs().len() <= specs.len());
        }
    }

    #[test]
    fn a_spec_read_once_is_kept_and_an_invalid_one_is_refused_like_a_plain_decode() {
        let decoder = DispatchDecoder::default();
        let spec = &specs()[1];
        for n in 0..3 {
            same(&decoder.decode(&body(spec, n)).unwrap(), &body(spec, n));
        }
        assert_eq!(decoder.specs().len(), 1);

        let invalid = r#"{"id":"t","namespace":"ns","schedule":{"cron":"not a cron"},"executor":{"kind":"handler","name":"noop"},"timeout":"0s"}"#;
        let error = decoder.decode(&body(invalid, 9)).unwrap_err().to_string();
        let reference = serde_json::from_slice::<Dispatch>(&body(invalid, 9)).unwrap_err().to_string();
        assert!(error.contains("schedule.cron") && error.contains("timeout"), "{error}");
        assert!(reference.starts_with(&error), "{error} / {reference}");
        assert_eq!(decoder.specs().len(), 1, "nothing is kept of an invalid spec");
        assert!(decoder.decode(b"{not json").is_err());
    }

    #[test]
    fn at_most_capacity_specs_are_kept() {
        let decoder = DispatchDecoder::default();
        for n in 0..(DispatchDecoder::CAPACITY + 10) as u64 {
            let spec = format!(
                r#"{{"id":"t","namespace":"ns","schedule":{{"every":"{}s"}},"executor":{{"kind":"handler","name":"noop"}}}}"#,
                n + 1
            );
            same(&decoder.decode(&body(&spec, n)).unwrap(), &body(&spec, n));
            assert!(decoder.specs().len() <= DispatchDecoder::CAPACITY);
        }
        assert_eq!(decoder.specs().len(), 10, "started over once full");
    }
}
