//! The dead-letter API's request (`jetsched.api.dlq.{list,get,replay,purge}`), as the registry
//! reads it and the CLI and console send it.

use serde::{Deserialize, Serialize};

/// One entry by `sequence`, or a filter (any of `queue`, `namespace`, `task_id`), with paging,
/// bulk-replay rate, purge-all or the lane of replayed runs where the endpoint takes them.
/// Only what is set is sent; unknown fields are refused.
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

    /// Whether it names any of `queue`, `namespace`, `task_id`.
    pub fn has_filter(&self) -> bool {
        self.queue.is_some() || self.namespace.is_some() || self.task_id.is_some()
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
        assert_eq!(serde_json::from_str::<DlqRequest>("{}").unwrap(), DlqRequest::default());
    }
}
