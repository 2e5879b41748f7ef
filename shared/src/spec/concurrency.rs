//! The `concurrency` of a task spec: at most `limit` runs under one key at a time, counted across
//! every worker replica ([docs/limits.md]). The key is a template ([`super::limit_key`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::limit_key;
use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err};

/// The largest `limit`.
pub(super) const MAX_LIMIT: u32 = 10_000;

/// A concurrency limit: runs whose key expands the same share `limit` slots.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// A template over `{namespace}`, `{id}` and `{labels.<label>}`, with literal text
    /// `[A-Za-z0-9_-]`; expanded, a key `[A-Za-z0-9_-]{1,128}` (scoped to the namespace).
    #[schemars(length(min = 1, max = 256))]
    pub key: String,
    /// Runs under the key at once, 1 to 10000 (operators may override it per key).
    #[schemars(range(min = 1, max = 10000))]
    pub limit: u32,
}

const FIELDS: &[&str] = &["key", "limit"];

impl ConcurrencySpec {
    /// The key of a run of the task `namespace`/`id` with `labels`.
    pub fn expand(
        &self,
        namespace: &str,
        id: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, String> {
        limit_key::expand(&self.key, namespace, id, labels)
    }

    /// Reads the `concurrency` object, recording each of its problems; `None` when it has one.
    /// The key's labels are checked against the spec's once both are read ([`Self::check_labels`]).
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<ConcurrencySpec> {
        let obj = problems.take(Obj::new(value, "concurrency"))?;
        obj.deny_unknown(FIELDS, problems);
        let key = problems.take(obj.required_string("key").and_then(|key| {
            let checked = if key.chars().count() > 256 {
                Err("must be at most 256 characters".to_string())
            } else {
                limit_key::check_template(key)
            };
            checked.map(|()| key.to_owned()).map_err(|m| err(ErrorCode::InvalidValue, "concurrency.key", m))
        }));
        let limit = problems.take(obj.required("limit").and_then(|_| obj.u32("limit")).and_then(|n| {
            let n = n.unwrap_or(0);
            if (1..=MAX_LIMIT).contains(&n) {
                Ok(n)
            } else {
                Err(err(ErrorCode::InvalidValue, "concurrency.limit", format!("must be 1 to {MAX_LIMIT}")))
            }
        }));
        Some(ConcurrencySpec { key: key?, limit: limit? })
    }

    /// The key expanded with the spec's own namespace, id and labels: a missing label or an
    /// expansion that is no valid key is a problem of `concurrency.key`.
    pub(crate) fn check_labels(
        &self,
        namespace: &str,
        id: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), crate::error::ApiError> {
        self.expand(namespace, id, labels)
            .map(|_| ())
            .map_err(|m| err(ErrorCode::InvalidValue, "concurrency.key", m))
    }

    /// The canonical form.
    pub(crate) fn to_json(&self) -> Value {
        json!({"key": self.key, "limit": self.limit})
    }
}
