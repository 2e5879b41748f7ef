//! Run records read through the registry, `<prefix>.api.runs.get.<namespace>`: a record is
//! keyed by its execution id alone, so KV permissions cannot tell teams apart; the registry
//! reads it and answers only when the record belongs to the subject's namespace.
//!
//! Request `{"execution_id": "...", "namespace"?}` → `{"run": <record>, "revision": n}`. A record
//! of another namespace is answered `not_found`, exactly like a missing one: scheduled
//! execution ids derive from the task name and fire time, so a different answer would confirm
//! that another team's task exists.

use async_nats::jetstream::kv;
use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::spec::validate_id;
use serde::Deserialize;
use serde_json::Value;

use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;
use crate::scope::{check_namespace, same_namespace};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    execution_id: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// Answers `runs.get` for `namespace`.
pub(crate) async fn get(runs: &kv::Store, namespace: &str, payload: &[u8]) -> Result<Vec<u8>, Failure> {
    check_namespace(namespace)?;
    let request: RunRequest = decode(payload, Empty::Refused, Detail::Syntax)?;
    same_namespace(request.namespace.as_deref(), namespace)?;
    validate_id("execution_id", &request.execution_id)?;
    let missing = || {
        ApiError::new(
            ErrorCode::NotFound,
            format!("no run {} in namespace {namespace}", request.execution_id),
        )
    };
    let entry = runs
        .entry(&request.execution_id)
        .await
        .map_err(|e| Failure::unavailable("read runs bucket", e))?
        .filter(|entry| entry.operation == kv::Operation::Put)
        .ok_or_else(missing)?;
    let record: Value = serde_json::from_slice(&entry.value)
        .map_err(|e| Failure::internal("stored run record is not JSON", e))?;
    if record.get("namespace").and_then(Value::as_str) != Some(namespace) {
        return Err(missing().into());
    }
    encode(&serde_json::json!({ "run": record, "revision": entry.revision }))
}
