//! Keys of the breakers bucket: a task's own breaker, a namespace's named breaker, and a named
//! breaker the workers declare shared by every namespace.

use super::SHARED_BREAKER_SCOPE;

/// A task's own breaker (and auto-pause count) in the breakers bucket: `task.<namespace>.<id>`.
pub fn breaker_task_key(namespace: &str, task_id: &str) -> String {
    format!("task.{namespace}.{task_id}")
}

/// A namespace's named breaker in the breakers bucket: `key.<namespace>.<key>` (tasks of that
/// namespace naming `key` share it; another namespace naming the same key has its own).
pub fn breaker_named_key(namespace: &str, key: &str) -> String {
    format!("key.{namespace}.{key}")
}

/// A named breaker shared by every namespace (a key the workers declare shared) in the
/// breakers bucket: `key.=shared.<key>` ([`SHARED_BREAKER_SCOPE`]).
pub fn breaker_shared_key(key: &str) -> String {
    format!("key.{SHARED_BREAKER_SCOPE}.{key}")
}

/// What a breakers-bucket key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerKey<'a> {
    /// A task's own breaker: `(namespace, task_id)`.
    Task(&'a str, &'a str),
    /// A named breaker of one namespace: `(namespace, key)`.
    Named(&'a str, &'a str),
    /// A named breaker shared by every namespace: its key.
    Shared(&'a str),
}

impl<'a> BreakerKey<'a> {
    /// Parses a breakers-bucket key; `None` for anything else (including the earlier
    /// un-namespaced `key.<key>`, which no worker reads any more).
    pub fn parse(key: &'a str) -> Option<BreakerKey<'a>> {
        if let Some(rest) = key.strip_prefix("task.") {
            let (namespace, task_id) = rest.split_once('.')?;
            return (!namespace.is_empty() && !task_id.is_empty() && !task_id.contains('.'))
                .then_some(BreakerKey::Task(namespace, task_id));
        }
        let (scope, name) = key.strip_prefix("key.")?.split_once('.')?;
        if !is_name_token(name) {
            return None;
        }
        if scope == SHARED_BREAKER_SCOPE {
            return Some(BreakerKey::Shared(name));
        }
        is_name_token(scope).then_some(BreakerKey::Named(scope, name))
    }

    /// The `(namespace, id)` its events are published under: the task's; the namespace and the
    /// key for a namespace's named breaker; ([`SHARED_BREAKER_SCOPE`], key) for a shared one.
    pub fn event_target(self) -> (&'a str, &'a str) {
        match self {
            BreakerKey::Task(namespace, task_id) => (namespace, task_id),
            BreakerKey::Named(namespace, name) => (namespace, name),
            BreakerKey::Shared(name) => (SHARED_BREAKER_SCOPE, name),
        }
    }

    /// What a user calls it (and gives the CLI): `<namespace>/<id>` for a task's own breaker,
    /// `<namespace>:<key>` for a namespace's named one, the bare key for a shared one.
    pub fn name(self) -> String {
        match self {
            BreakerKey::Task(namespace, task_id) => format!("{namespace}/{task_id}"),
            BreakerKey::Named(namespace, name) => format!("{namespace}:{name}"),
            BreakerKey::Shared(name) => name.to_string(),
        }
    }

    /// The key a named breaker was given in specs (`None` for a task's own).
    pub fn spec_key(self) -> Option<&'a str> {
        match self {
            BreakerKey::Task(..) => None,
            BreakerKey::Named(_, name) | BreakerKey::Shared(name) => Some(name),
        }
    }
}

/// `[A-Za-z0-9_-]+`: a namespace id or a breaker key as one key token.
pub(super) fn is_name_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
