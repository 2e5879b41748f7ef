//! Requests and replies of the calendar API (`<prefix>.api.calendar.{put,get,list,delete}`).
//!
//! `put` takes the calendar document itself as its body, with the same compare-and-set headers
//! as a task's `put`; the other endpoints take a small JSON body.

use serde::{Deserialize, Serialize};

use crate::calendar::Calendar;

fn default_namespace() -> String {
    "default".to_string()
}

/// `get` and `delete`: one calendar, `{"namespace": "billing", "name": "de-holidays"}`
/// (namespace `default` when left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarRef {
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub name: String,
}

/// `list`: every calendar, or a namespace's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarListRequest {
    #[serde(default)]
    pub namespace: Option<String>,
}

/// A stored calendar and its revision: the reply of `put` and `get`, and each calendar of
/// `list`. `used_by` (on `get`) names the tasks (`task <namespace>/<id>`) and calendars
/// (`calendar <namespace>/<name>`) that refer to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalendarReply {
    pub calendar: Calendar,
    pub revision: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by: Option<Vec<String>>,
}

/// Reply of `list`, in key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalendarListReply {
    pub calendars: Vec<CalendarReply>,
}

/// Reply of `delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarDeleteReply {
    pub namespace: String,
    pub name: String,
    pub deleted: bool,
}
