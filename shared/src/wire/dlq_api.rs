//! The dead-letter API's request (`jetsched.api.dlq.{list,get,replay,purge}`), as the registry
//! reads it and the CLI and console send it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;

/// One entry by `sequence`, or a filter (any of `queue`, `namespace`, `task_id`, and of what an
/// entry holds: `execution_id`, `error`, `since`, `until`, `through`), with paging, bulk-replay
/// rate, purge-all or the lane of replayed runs where the endpoint takes them. Only what is
/// set is sent; unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Entries of this dead run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Entries whose reason or an attempt's error contains this text (ignoring case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Entries dead-lettered at or after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub since: Option<DateTime<Utc>>,
    /// Entries dead-lettered before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub until: Option<DateTime<Utc>>,
    /// Entries at or below this sequence: what a list showed, not what arrived after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<u64>,
    /// Page size of `list`, entries of a bulk `replay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `list`: the sequence to continue from (`next_cursor` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
    /// Bulk replay: entries per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// Purge: everything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
    /// Replay: the lane of the new runs (default: each entry's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

impl DlqRequest {
    /// One entry, by its sequence in the dead-letter stream.
    pub fn entry(sequence: u64) -> DlqRequest {
        DlqRequest { sequence: Some(sequence), ..DlqRequest::default() }
    }

    /// Whether it names any filter: a subject's (`queue`, `namespace`, `task_id`) or an
    /// entry's content's.
    pub fn has_filter(&self) -> bool {
        self.queue.is_some()
            || self.namespace.is_some()
            || self.task_id.is_some()
            || self.has_content_filter()
    }

    /// Whether it filters on what entries hold (`execution_id`, `error`, `since`, `until`,
    /// `through`), which only reading each entry can tell.
    pub fn has_content_filter(&self) -> bool {
        self.execution_id.is_some()
            || self.error.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.through.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_sends_only_what_is_set_and_reads_back_strictly() {
        let request = DlqRequest { namespace: Some("ops".into()), limit: Some(1000), ..Default::default() };
        let sent = serde_json::to_value(&request).unwrap();
        assert_eq!(sent, serde_json::json!({"namespace": "ops", "limit": 1000}));
        assert_eq!(serde_json::from_value::<DlqRequest>(sent).unwrap(), request);
        assert!(request.has_filter());
        assert!(!DlqRequest::entry(4).has_filter());
        assert_eq!(serde_json::to_value(DlqRequest::entry(4)).unwrap(), serde_json::json!({"sequence": 4}));
        let all = DlqRequest { all: true, ..Default::default() };
        assert_eq!(serde_json::to_value(&all).unwrap(), serde_json::json!({"all": true}));
        assert!(serde_json::from_str::<DlqRequest>(r#"{"bogus": 1}"#).is_err());
        let content: DlqRequest =
            serde_json::from_str(r#"{"error": "quota", "since": "2026-12-05T10:00:00.000Z", "through": 9}"#)
                .unwrap();
        assert!(content.has_filter() && content.has_content_filter());
        assert_eq!(content.since.unwrap().timestamp_millis(), 1_796_464_800_000);
        assert!(!request.has_content_filter());
        assert_eq!(serde_json::from_str::<DlqRequest>("{}").unwrap(), DlqRequest::default());
    }
}
