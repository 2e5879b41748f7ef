//! Quotas per namespace, set by the operator: how many tasks a namespace may hold and how large
//! each of its specs may be. A request over a quota is refused with `quota_exceeded`, the field
//! naming the limit (`quota.tasks`, `quota.spec_bytes`); nothing is written.
//!
//! `--quota <namespace>.<limit>=<value>`, `*` standing for every namespace without a setting of
//! its own: `--quota '*.tasks=1000' --quota billing.tasks=5000 --quota demo.spec_bytes=8192`.
//!
//! The task count is read from the tasks bucket (the live keys under the namespace) before a
//! new task is created, and creations of one namespace are serialised within a registry
//! replica, so one registry never lets a namespace past its count. Several replicas each check
//! before they write: concurrent creations on different replicas may pass a full namespace by
//! at most one task per replica.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use jetsched_shared::config::Problems;
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::spec::validate_id;

/// The limits a namespace can be given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most tasks the namespace may hold.
    pub tasks: Option<u64>,
    /// Largest spec of the namespace, in bytes (as the client sent it).
    pub spec_bytes: Option<u64>,
}

impl Limits {
    fn set(&mut self, limit: &str, value: u64) -> Result<(), String> {
        match limit {
            "tasks" => self.tasks = Some(value),
            "spec_bytes" => self.spec_bytes = Some(value),
            other => return Err(format!("unknown limit {other:?}; expected tasks or spec_bytes")),
        }
        Ok(())
    }
}

/// Every namespace's limits, from the `--quota` settings.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    default: Limits,
    namespaces: BTreeMap<String, Limits>,
    /// One lock per namespace with a task quota: its creations are counted one at a time.
    creating: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Quotas {
    /// Reads `--quota` settings, recording every malformed one in `problems`.
    pub fn parse(settings: &[String], problems: &mut Problems) -> Quotas {
        let mut quotas = Quotas::default();
        for setting in settings {
            let parsed = (|| {
                let (target, value) =
                    setting.split_once('=').ok_or("expected <namespace>.<limit>=<value>")?;
                let (namespace, limit) =
                    target.rsplit_once('.').ok_or("expected <namespace>.<limit>=<value>")?;
                let value: u64 =
                    value.trim().parse().map_err(|_| format!("{value:?} is not a whole number"))?;
                let limits = match namespace {
                    "*" => &mut quotas.default,
                    namespace => {
                        validate_id("namespace", namespace).map_err(|e| e.message)?;
                        quotas.namespaces.entry(namespace.to_string()).or_default()
                    }
                };
                limits.set(limit, value)
            })();
            if let Err(rule) = parsed {
                problems.push("quota", setting, rule);
            }
        }
        quotas
    }

    /// The limits of `namespace`: its own settings, the `*` ones where it has none.
    pub fn of(&self, namespace: &str) -> Limits {
        let own = self.namespaces.get(namespace).copied().unwrap_or_default();
        Limits {
            tasks: own.tasks.or(self.default.tasks),
            spec_bytes: own.spec_bytes.or(self.default.spec_bytes),
        }
    }

    /// Refuses a spec of `namespace` larger than its `spec_bytes`.
    pub fn check_spec_bytes(&self, namespace: &str, bytes: usize) -> Result<(), ApiError> {
        match self.of(namespace).spec_bytes {
            Some(limit) if bytes as u64 > limit => Err(exceeded(
                "spec_bytes",
                format!("the spec is {bytes} bytes; namespace {namespace:?} allows {limit}"),
            )),
            _ => Ok(()),
        }
    }

    /// The lock under which a new task of `namespace` is counted and created, when the
    /// namespace has a task quota.
    pub fn creation_lock(&self, namespace: &str) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.of(namespace).tasks?;
        let mut locks = self.creating.lock().expect("quota locks");
        Some(locks.entry(namespace.to_string()).or_default().clone())
    }

    /// Refuses one more task in `namespace` when it holds `count` already.
    pub fn check_tasks(&self, namespace: &str, count: u64) -> Result<(), ApiError> {
        match self.of(namespace).tasks {
            Some(limit) if count >= limit => Err(exceeded(
                "tasks",
                format!("namespace {namespace:?} holds {count} tasks, its quota is {limit}"),
            )),
            _ => Ok(()),
        }
    }
}

fn exceeded(limit: &str, message: String) -> ApiError {
    ApiError::at(ErrorCode::QuotaExceeded, format!("quota.{limit}"), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(settings: &[&str]) -> (Quotas, Problems) {
        let mut problems = Problems::new();
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        (Quotas::parse(&settings, &mut problems), problems)
    }

    #[test]
    fn namespaces_take_their_own_limits_then_the_default() {
        let (quotas, problems) = parse(&["*.tasks=10", "billing.tasks=500", "demo.spec_bytes=100"]);
        assert!(problems.is_empty());
        assert_eq!(quotas.of("billing"), Limits { tasks: Some(500), spec_bytes: None });
        assert_eq!(quotas.of("demo"), Limits { tasks: Some(10), spec_bytes: Some(100) });
        assert_eq!(quotas.of("other"), Limits { tasks: Some(10), spec_bytes: None });
        assert!(quotas.check_tasks("demo", 9).is_ok());
        let refused = quotas.check_tasks("demo", 10).unwrap_err();
        assert_eq!((refused.code, refused.field.as_deref()), (ErrorCode::QuotaExceeded, Some("quota.tasks")));
        let refused = quotas.check_spec_bytes("demo", 101).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("quota.spec_bytes"));
        assert!(quotas.check_spec_bytes("billing", 1 << 20).is_ok());
        assert!(quotas.creation_lock("billing").is_some());
        assert!(Quotas::default().creation_lock("billing").is_none());
    }

    #[test]
    fn every_malformed_setting_is_a_problem() {
        let (_, problems) = parse(&["tasks=1", "demo.tasks=x", "demo.cpu=1", "bad ns.tasks=1", "*.tasks=3"]);
        assert_eq!(problems.len(), 4);
    }
}
