//! Which dead letters a request's content filters select (`execution_id`, `error`, `since`,
//! `until`, `through`): what only reading each entry can tell, after the subject filter (queue,
//! namespace, task) chose the entries to read.

use chrono::{DateTime, Utc};
use jetsched_shared::wire::DlqRequest;
use serde_json::Value;

/// Entries read at most by one request that filters on content: a page of matches can end
/// early (with a cursor to continue from) rather than read the whole stream in one reply.
pub(super) const MAX_EXAMINED: usize = 10_000;

/// Whether the stored entry (its JSON, or text when it is not JSON) passes the request's
/// content filters; an entry that cannot tell (no `dead_at`) fails a time filter.
pub(super) fn selects(request: &DlqRequest, entry: &Value) -> bool {
    let text = |key: &str| entry.get(key).and_then(Value::as_str);
    if let Some(execution) = &request.execution_id
        && text("execution_id") != Some(execution.as_str())
    {
        return false;
    }
    if let Some(wanted) = &request.error {
        let wanted = wanted.to_lowercase();
        let contains = |s: Option<&str>| s.is_some_and(|s| s.to_lowercase().contains(&wanted));
        let in_attempts = entry.get("attempts").and_then(Value::as_array).is_some_and(|attempts| {
            attempts.iter().any(|a| contains(a.get("error").and_then(Value::as_str)))
        });
        if !contains(text("reason")) && !in_attempts && !contains(entry.as_str()) {
            return false;
        }
    }
    if request.since.is_some() || request.until.is_some() {
        let Some(dead_at) =
            text("dead_at").and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.with_timezone(&Utc))
        else {
            return false;
        };
        if request.since.is_some_and(|since| dead_at < since)
            || request.until.is_some_and(|until| dead_at >= until)
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_filters_read_the_reason_attempts_time_and_execution() {
        let entry = json!({"execution_id": "e1", "reason": "retries exhausted", "dead_at": "2026-12-05T10:00:00.000Z",
                           "attempts": [{"error": "HTTP 503 from Billing"}]});
        let request = |json: Value| serde_json::from_value::<DlqRequest>(json).unwrap();
        assert!(selects(&request(json!({})), &entry));
        assert!(selects(&request(json!({"error": "billing"})), &entry), "an attempt's error, any case");
        assert!(selects(&request(json!({"error": "EXHAUSTED"})), &entry), "the reason");
        assert!(!selects(&request(json!({"error": "quota"})), &entry));
        assert!(selects(&request(json!({"execution_id": "e1"})), &entry));
        assert!(!selects(&request(json!({"execution_id": "e2"})), &entry));
        assert!(
            selects(&request(json!({"since": "2026-12-05T10:00:00.000Z"})), &entry),
            "since is inclusive"
        );
        assert!(!selects(&request(json!({"until": "2026-12-05T10:00:00.000Z"})), &entry), "until is not");
        assert!(!selects(&request(json!({"since": "2026-12-05T10:00:00.001Z"})), &entry));
        assert!(!selects(&request(json!({"since": "2026-12-05T09:00:00.000Z"})), &json!("not json")));
    }
}
