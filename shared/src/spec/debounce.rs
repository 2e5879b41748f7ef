//! The `debounce` of a task spec: triggers that come within `period` of each other collapse into
//! one run with the last trigger's payload, started no later than `max_wait` after the first.

use std::time::Duration;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::schema;
use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err, format_duration};

/// How a task's triggers are debounced (docs/spec.md, "Debounce").
#[derive(Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DebounceSpec {
    /// Quiet time after the last trigger before the run starts: 1s to 24h.
    #[schemars(with = "schema::HumanDuration")]
    pub period: Duration,
    /// The run starts no later than this after the window's first trigger: at least `period`,
    /// at most 7d (default ten periods, at most 7d).
    #[schemars(with = "Option<schema::HumanDuration>")]
    pub max_wait: Duration,
}

const FIELDS: &[&str] = &["period", "max_wait"];
const MIN_PERIOD: Duration = Duration::from_secs(1);
const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

impl DebounceSpec {
    /// Reads the `debounce` object, recording each of its problems; `None` when it has one.
    pub(crate) fn read(value: &Value, problems: &mut Problems) -> Option<DebounceSpec> {
        let obj = problems.take(Obj::new(value, "debounce"))?;
        obj.deny_unknown(FIELDS, problems);
        let period = problems.take(obj.required("period").and_then(|_| obj.duration("period")));
        let period = period.flatten().and_then(|period| {
            let ok = (MIN_PERIOD..=MAX_PERIOD).contains(&period);
            let rule = err(ErrorCode::InvalidValue, &obj.path("period"), "must be from 1s to 24h");
            problems.take(if ok { Ok(period) } else { Err(rule) })
        });
        let given = problems.take(obj.duration("max_wait"));
        let (period, given) = (period?, given?);
        let max_wait = given.unwrap_or((period * 10).min(MAX_WAIT));
        if max_wait < period || max_wait > MAX_WAIT {
            let text = format!("must be from debounce.period ({}) to 7d", format_duration(period));
            problems.push(err(ErrorCode::InvalidValue, &obj.path("max_wait"), text));
            return None;
        }
        Some(DebounceSpec { period, max_wait })
    }

    /// The canonical form: both fields.
    pub(crate) fn to_json(self) -> Value {
        json!({"period": format_duration(self.period), "max_wait": format_duration(self.max_wait)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::TaskSpec;

    fn parse(debounce: Value) -> Result<Option<DebounceSpec>, Vec<String>> {
        let spec = json!({"id": "t", "schedule": {"every": "1h"}, "executor": {"kind": "nats", "subject": "x"}, "debounce": debounce});
        TaskSpec::parse(spec.to_string().as_bytes())
            .map(|spec| spec.debounce)
            .map_err(|errors| errors.as_slice().iter().map(|e| e.field.clone().unwrap_or_default()).collect())
    }

    #[test]
    fn a_debounce_has_a_period_and_a_bounded_max_wait() {
        let two = Duration::from_secs(2);
        assert_eq!(
            parse(json!({"period": "2s"})),
            Ok(Some(DebounceSpec { period: two, max_wait: two * 10 }))
        );
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(
            parse(json!({"period": "24h"})),
            Ok(Some(DebounceSpec { period: day, max_wait: MAX_WAIT }))
        );
        assert_eq!(
            parse(json!({"period": "2s", "max_wait": "2s"})),
            Ok(Some(DebounceSpec { period: two, max_wait: two }))
        );
        assert_eq!(parse(json!({"period": "2s", "max_wait": "1s"})), Err(vec!["debounce.max_wait".into()]));
        assert_eq!(parse(json!({"period": "500ms"})), Err(vec!["debounce.period".into()]));
        assert_eq!(parse(json!({"period": "2s", "max_wait": "8d"})), Err(vec!["debounce.max_wait".into()]));
        assert_eq!(
            parse(json!({"max_wait": "1m", "x": 1})),
            Err(vec!["debounce.x".into(), "debounce.period".into()])
        );
        assert_eq!(parse(json!("2s")), Err(vec!["debounce".into()]));
        let spec = DebounceSpec { period: two, max_wait: Duration::from_secs(90) };
        assert_eq!(parse(spec.to_json()), Ok(Some(spec)), "the canonical form reads back");
    }
}
