//! Namespaced API subjects (`<prefix>.api.task.<endpoint>.<namespace>`): a request on one is
//! confined to that namespace, so NATS subject permissions can give a team its namespace and
//! nothing else.
//!
//! A body that leaves out `namespace` takes the subject's; a body naming another namespace is
//! refused with `namespace_mismatch` (field `namespace`) before anything is read or written.

use jetsched_shared::error::{ApiError, ErrorCode};
use jetsched_shared::spec::validate_id;
use serde_json::{Map, Value};

use crate::codec::TaskEndpoint;

/// The refusal of a request that reaches outside its subject's namespace.
pub fn mismatch(field: &str, named: &str, namespace: &str) -> ApiError {
    ApiError::at(
        ErrorCode::NamespaceMismatch,
        field,
        format!(
            "the request names namespace {named:?} but was sent on the subject of namespace {namespace:?}"
        ),
    )
}

/// Refuses a request body naming a namespace other than its subject's.
pub fn same_namespace(named: Option<&str>, namespace: &str) -> Result<(), ApiError> {
    match named {
        Some(named) if named != namespace => Err(mismatch("namespace", named, namespace)),
        _ => Ok(()),
    }
}

/// Checks the subject's namespace token (a subject may carry any token).
pub fn check_namespace(namespace: &str) -> Result<(), ApiError> {
    validate_id("namespace", namespace)
}

/// Puts `namespace` into the object where it is missing; refuses another one.
fn confine(object: &mut Map<String, Value>, field: &str, namespace: &str) -> Result<(), ApiError> {
    match object.get("namespace") {
        None | Some(Value::Null) => {
            object.insert("namespace".to_string(), Value::String(namespace.to_string()));
            Ok(())
        }
        Some(Value::String(named)) if named == namespace => Ok(()),
        Some(Value::String(named)) => Err(mismatch(field, named, namespace)),
        // Not a string: left for the decoder, which names the type error.
        Some(_) => Ok(()),
    }
}

/// A request body (an object) confined to `namespace` like a task request's: `namespace` added
/// when missing, refused when another; anything else passed on for the decoder to refuse.
pub fn confine_object(namespace: &str, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
    confine_body(TaskEndpoint::Get, namespace, payload)
}

/// The body of a task request confined to `namespace`: unchanged when it already names it,
/// with `namespace` added when it does not (an empty body is `{}`), refused when it names
/// another. A body that is not a JSON object is passed on for the decoder to refuse. `next`
/// with an inline spec confines the spec too.
pub fn confine_body(endpoint: TaskEndpoint, namespace: &str, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
    let value: Value = if payload.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        match serde_json::from_slice(payload) {
            Ok(value) => value,
            Err(_) => return Ok(payload.to_vec()),
        }
    };
    let Value::Object(mut object) = value else { return Ok(payload.to_vec()) };
    if endpoint == TaskEndpoint::Next
        && let Some(Value::Object(spec)) = object.get_mut("spec")
    {
        confine(spec, "spec.namespace", namespace)?;
    }
    confine(&mut object, "namespace", namespace)?;
    Ok(serde_json::to_vec(&object).expect("a JSON object serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined(endpoint: TaskEndpoint, body: &str) -> Result<Value, ErrorCode> {
        confine_body(endpoint, "demo", body.as_bytes())
            .map(|b| serde_json::from_slice(&b).unwrap_or(Value::Null))
            .map_err(|e| e.code)
    }

    #[test]
    fn a_body_takes_the_subjects_namespace_or_is_refused() {
        assert_eq!(confined(TaskEndpoint::Get, r#"{"id": "a"}"#).unwrap()["namespace"], "demo");
        assert_eq!(
            confined(TaskEndpoint::Get, r#"{"namespace": "demo", "id": "a"}"#).unwrap()["namespace"],
            "demo"
        );
        assert_eq!(confined(TaskEndpoint::List, "").unwrap()["namespace"], "demo");
        assert_eq!(
            confined(TaskEndpoint::Get, r#"{"namespace": "billing", "id": "a"}"#),
            Err(ErrorCode::NamespaceMismatch)
        );
        assert_eq!(
            confined(TaskEndpoint::Put, r#"{"namespace": "billing"}"#),
            Err(ErrorCode::NamespaceMismatch)
        );
        let error = confine_body(TaskEndpoint::List, "demo", br#"{"namespace": "billing"}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("namespace"));
        // Inline previews: the spec is confined.
        assert_eq!(
            confined(TaskEndpoint::Next, r#"{"spec": {"namespace": "billing"}}"#),
            Err(ErrorCode::NamespaceMismatch)
        );
        assert_eq!(
            confined(TaskEndpoint::Next, r#"{"spec": {"id": "x"}}"#).unwrap()["spec"]["namespace"],
            "demo"
        );
        // Not an object: passed on unchanged for the decoder to refuse.
        assert_eq!(confine_body(TaskEndpoint::Get, "demo", b"{").unwrap(), b"{");
        assert_eq!(confined(TaskEndpoint::Get, "[1]").unwrap(), serde_json::json!([1]));
    }
}
