//! The JSON Schema of the task spec (`docs/task-spec.schema.json`), generated from the spec
//! types' `JsonSchema` derives.
//!
//! The spec is read field by field (not through serde), so the derives carry `#[schemars(...)]`
//! attributes that say what the reader accepts: names, defaults, patterns and ranges. The few
//! shapes a derive cannot say are written here by hand: durations and instants (strings), and
//! the schedule (exactly one of four kinds, each with its own companions). Rules that span
//! values (`retry.max_interval >= retry.initial`, a cron expression's syntax, a zone's name)
//! stay with the registry, which names the field it refuses. As in the reader, `null` stands
//! for an absent field: an optional field may be `null`, a required one may not.

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::transform::{Transform, transform_subschemas};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

use super::{BreakerSpec, RetryPolicy, TaskSpec};
use crate::field::format_duration;
use crate::schedule::Schedule;

#[cfg(test)]
mod tests;

/// Where the schema lives in the repository, relative to the workspace root.
pub const SCHEMA_PATH: &str = "docs/task-spec.schema.json";

/// The task spec's JSON Schema (draft 2020-12), as written to [`SCHEMA_PATH`].
pub fn json_schema() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.transforms.push(Box::new(NullIsAbsent));
    settings.into_generator().into_root_schema_for::<TaskSpec>().to_value()
}

/// The schema as the repository keeps it: pretty-printed, with a final newline.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).expect("a schema serialises");
    text.push('\n');
    text
}

/// The reader takes `null` for absent: an optional field may be `null` (and gets its
/// default), a required one may not. Property by property, since only an object knows which
/// of its fields are required.
#[derive(Clone)]
struct NullIsAbsent;

impl Transform for NullIsAbsent {
    fn transform(&mut self, schema: &mut Schema) {
        transform_subschemas(self, schema);
        let required: Vec<Value> = match schema.get("required") {
            Some(Value::Array(required)) => required.clone(),
            _ => Vec::new(),
        };
        let Some(Value::Object(properties)) = schema.get_mut("properties") else { return };
        for (name, property) in properties.iter_mut() {
            if !required.contains(&Value::String(name.clone())) {
                allow_null(property);
            }
        }
    }
}

fn allow_null(property: &mut Value) {
    let null_type = json!({"type": "null"});
    let Some(object) = property.as_object_mut() else { return };
    let null_allowed =
        object.get("anyOf").and_then(Value::as_array).is_some_and(|any| any.contains(&null_type));
    if object.is_empty() || null_allowed {
        return;
    }
    match object.get_mut("type") {
        Some(Value::Array(types)) => {
            if !types.contains(&json!("null")) {
                types.push(json!("null"));
            }
        }
        Some(one) => {
            *one = json!([one.take(), "null"]);
            if let Some(Value::Array(choices)) = object.get_mut("enum") {
                choices.push(Value::Null);
            }
        }
        // A reference or a combination: the schema becomes one alternative, null the other,
        // and what describes the field stays outside.
        None => {
            let mut inner = std::mem::take(object);
            for keyword in ["description", "default", "title"] {
                if let Some(value) = inner.remove(keyword) {
                    object.insert(keyword.into(), value);
                }
            }
            object.insert("anyOf".into(), json!([inner, null_type]));
        }
    }
}

/// A duration field: a humantime string such as `90s`, `5m` or `1h 30m`.
pub(super) struct HumanDuration;

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A duration such as \"90s\", \"5m\" or \"1h 30m\": positive and at most 100 years. Numbers are refused (the unit would be a guess).",
            "type": "string",
            "pattern": "^\\s*([0-9]+\\s*[A-Za-zµ]+\\s*)+$",
            "examples": ["90s", "5m", "1h 30m"]
        })
    }
}

/// A bound of the task's fires (`start_at`, `end_at`): an instant or a wall time on the
/// schedule's zone.
pub(super) struct Bound;

impl JsonSchema for Bound {
    fn schema_name() -> Cow<'static, str> {
        "Bound".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An RFC 3339 instant with its offset (\"2027-01-01T00:00:00Z\"), or a wall time without one (\"2027-01-01T00:00:00\") read on the schedule's zone: in a spring-forward gap the transition instant, in an autumn fold the earlier instant. Kept to the millisecond, stored as UTC.",
            "type": "string",
            "minLength": 1,
            "examples": ["2027-01-01T00:00:00Z", "2027-01-01T00:00:00"]
        })
    }
}

/// The schedule: exactly one of `cron` (with `timezone`), `every` (with `anchor`), `at` and
/// `after`. Hand-written: the reader picks the kind by the key present.
impl JsonSchema for Schedule {
    fn schema_name() -> Cow<'static, str> {
        "Schedule".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let duration = generator.subschema_for::<HumanDuration>();
        let instant = json!({
            "description": "An RFC 3339 instant with its offset, such as \"2026-03-01T09:00:00Z\"; kept to the millisecond.",
            "type": "string",
            "format": "date-time"
        });
        json_schema!({
            "description": "When the task fires: exactly one of cron, every, at and after.",
            "oneOf": [
                {
                    "title": "cron",
                    "type": "object",
                    "properties": {
                        "cron": {
                            "description": "A cron expression with seconds (6 or 7 fields, L W # allowed) or a descriptor such as @daily.",
                            "type": "string",
                            "minLength": 1
                        },
                        "timezone": {
                            "description": "The IANA zone whose wall clock the expression reads (default UTC).",
                            "type": "string",
                            "minLength": 1,
                            "default": "UTC"
                        }
                    },
                    "required": ["cron"],
                    "additionalProperties": false
                },
                {
                    "title": "every",
                    "type": "object",
                    "properties": {
                        "every": {"description": "The interval, a whole number of milliseconds.", "allOf": [duration]},
                        "anchor": {"description": "Fires at anchor + k * every (default the Unix epoch).", "allOf": [instant]}
                    },
                    "required": ["every"],
                    "additionalProperties": false
                },
                {
                    "title": "at",
                    "type": "object",
                    "properties": {"at": instant},
                    "required": ["at"],
                    "additionalProperties": false
                },
                {
                    "title": "after",
                    "type": "object",
                    "properties": {"after": {"description": "A delay from registration.", "allOf": [duration]}},
                    "required": ["after"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

/// Schema-level rules between fields of the spec: a `paused_reason` only on a paused task;
/// at least one of `schedule` and `after` (a task with parents may also have a schedule: its
/// fires then wait for its parents' runs of the same nominal time).
pub(super) fn task_spec_rules(schema: &mut Schema) {
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| name != "schedule");
    }
    schema.insert("anyOf".into(), json!([{"required": ["schedule"]}, {"required": ["after"]}]));
    schema.insert(
        "dependentSchemas".into(),
        json!({
            "paused_reason": {"properties": {"paused": {"const": true}}, "required": ["paused"]}
        }),
    );
}

/// At least one of the jitter's two fields.
pub(super) fn jitter_rules(schema: &mut Schema) {
    schema.insert("minProperties".into(), json!(1));
}

// The defaults the reader fills in, as the spec spells them (`default` keywords of the schema).
pub(super) fn one() -> u32 {
    1
}
pub(super) fn default_name() -> &'static str {
    "default"
}
pub(super) fn post() -> &'static str {
    "POST"
}
pub(super) fn empty_map() -> Value {
    json!({})
}
pub(super) fn timeout() -> String {
    format_duration(super::DEFAULT_TIMEOUT)
}
pub(super) fn catchup_window() -> String {
    format_duration(super::DEFAULT_CATCHUP_WINDOW)
}
pub(super) fn misfire() -> &'static str {
    super::MisfirePolicy::default().as_str()
}
pub(super) fn overlap() -> &'static str {
    super::OverlapPolicy::default().as_str()
}
pub(super) fn on_open() -> &'static str {
    super::OnOpen::default().as_str()
}
pub(super) fn retry() -> Value {
    RetryPolicy::default().to_json()
}
pub(super) fn retry_initial() -> String {
    format_duration(RetryPolicy::default().initial)
}
pub(super) fn retry_max_interval() -> String {
    format_duration(RetryPolicy::default().max_interval)
}
pub(super) fn breaker_window() -> String {
    format_duration(BreakerSpec::default().window)
}
pub(super) fn breaker_open_for() -> String {
    format_duration(BreakerSpec::default().open_for)
}
pub(super) fn breaker_max_open_for() -> String {
    format_duration(BreakerSpec::default().max_open_for)
}
