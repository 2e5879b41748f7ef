//! The `after` of a task spec: the task runs when runs of other tasks (its parents) end as its
//! rule says, once per nominal time of theirs (docs/dependencies.md).

use std::collections::BTreeSet;
use std::time::Duration;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::read::validate_id;
use super::schema;
use crate::error::ErrorCode;
use crate::field::{Obj, Problems, err, format_duration};

/// The most parents one task may wait for.
pub const MAX_PARENTS: usize = 1000;
/// How long a child waits for its parents by default, counted from the first parent's verdict.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(24 * 3600);
/// The longest `within`.
pub const MAX_WITHIN: Duration = Duration::from_secs(7 * 24 * 3600);
const MIN_WITHIN: Duration = Duration::from_secs(1);

/// A task's parents and the rule their runs must meet.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct AfterSpec {
    /// The parents: `<namespace>/<id>`, or `<id>` in the task's own namespace. 1 to 1000,
    /// each once, never the task itself.
    #[schemars(with = "Vec<String>", length(min = 1, max = 1000))]
    pub tasks: Vec<ParentRef>,
    /// Which verdict of a parent's run counts; default `succeeded`.
    #[schemars(default)]
    pub when: AfterWhen,
    /// `all` parents (fan-in) or `any` of them; default `all`.
    #[schemars(default)]
    pub mode: AfterMode,
    /// How long the child waits for the rest of its parents after the first verdict, 1s to 7d;
    /// default 1d. Past it, the wait ends with an `after.expired` event.
    #[schemars(with = "Option<schema::HumanDuration>")]
    pub within: Duration,
}

/// A parent task.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParentRef {
    pub namespace: String,
    pub id: String,
}

impl ParentRef {
    /// `<namespace>.<id>`, the parent's key in the tasks bucket.
    pub fn key(&self) -> String {
        format!("{}.{}", self.namespace, self.id)
    }
}

impl std::fmt::Display for ParentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

/// Which verdict of a parent's run satisfies the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum AfterWhen {
    /// The run succeeded.
    #[default]
    Succeeded,
    /// The run ended for good: succeeded, or dead-lettered after its retries.
    Completed,
    /// The run was dead-lettered after its retries.
    Failed,
}

/// How many parents must satisfy the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum AfterMode {
    /// Every parent, for the same nominal time.
    #[default]
    All,
    /// The first parent that does.
    Any,
}

const WHEN: &[(&str, AfterWhen)] = &[
    ("succeeded", AfterWhen::Succeeded),
    ("completed", AfterWhen::Completed),
    ("failed", AfterWhen::Failed),
];
const MODE: &[(&str, AfterMode)] = &[("all", AfterMode::All), ("any", AfterMode::Any)];
const FIELDS: &[&str] = &["tasks", "when", "mode", "within"];

impl AfterWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            AfterWhen::Succeeded => "succeeded",
            AfterWhen::Completed => "completed",
            AfterWhen::Failed => "failed",
        }
    }
}

impl AfterMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AfterMode::All => "all",
            AfterMode::Any => "any",
        }
    }
}

impl AfterSpec {
    /// Reads the `after` object of the task `namespace`/`id`, recording each of its problems;
    /// `None` when it has one.
    pub(crate) fn read(
        value: &Value,
        namespace: &str,
        id: Option<&str>,
        problems: &mut Problems,
    ) -> Option<AfterSpec> {
        let obj = problems.take(Obj::new(value, "after"))?;
        obj.deny_unknown(FIELDS, problems);
        let tasks = problems.take(obj.required("tasks").and_then(|_| obj.array("tasks")));
        let tasks = tasks.flatten().and_then(|tasks| read_parents(tasks, namespace, id, problems));
        let when = problems.take_opt(super::read::choice(&obj, "when", WHEN)).unwrap_or_default();
        let mode = problems.take_opt(super::read::choice(&obj, "mode", MODE)).unwrap_or_default();
        let within = problems.take(obj.duration("within")).map(|w| w.unwrap_or(DEFAULT_WITHIN));
        let within = within.and_then(|within| {
            let ok = (MIN_WITHIN..=MAX_WITHIN).contains(&within);
            let rule = err(ErrorCode::InvalidValue, "after.within", "must be from 1s to 7d");
            problems.take(if ok { Ok(within) } else { Err(rule) })
        });
        Some(AfterSpec { tasks: tasks?, when, mode, within: within? })
    }

    /// The canonical form: every field, parents as `<namespace>/<id>`.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "tasks": self.tasks.iter().map(ParentRef::to_string).collect::<Vec<_>>(),
            "when": self.when.as_str(),
            "mode": self.mode.as_str(),
            "within": format_duration(self.within),
        })
    }

    /// `within` as the spec spells it (`1d`, `2h 30m`).
    pub fn within_text(&self) -> String {
        format_duration(self.within)
    }

    /// Whether a parent's run that ended `verdict` satisfies the rule.
    pub fn satisfied_by(&self, verdict: crate::wire::RunStatus) -> bool {
        use crate::wire::RunStatus;
        match self.when {
            AfterWhen::Succeeded => verdict == RunStatus::Succeeded,
            AfterWhen::Failed => verdict == RunStatus::Dead,
            AfterWhen::Completed => matches!(verdict, RunStatus::Succeeded | RunStatus::Dead),
        }
    }
}

/// Each parent `<namespace>/<id>` or `<id>`: valid names, none twice, not the task itself.
fn read_parents(
    tasks: &[Value],
    namespace: &str,
    id: Option<&str>,
    problems: &mut Problems,
) -> Option<Vec<ParentRef>> {
    if tasks.is_empty() || tasks.len() > MAX_PARENTS {
        problems.push(err(
            ErrorCode::InvalidValue,
            "after.tasks",
            format!("give 1 to {MAX_PARENTS} parents"),
        ));
        return None;
    }
    let mut parents = Vec::with_capacity(tasks.len());
    let mut seen = BTreeSet::new();
    let mut ok = true;
    for (i, task) in tasks.iter().enumerate() {
        let path = format!("after.tasks[{i}]");
        let Some(text) = task.as_str() else {
            problems.push(err(ErrorCode::InvalidType, &path, "must be a string: <namespace>/<id> or <id>"));
            ok = false;
            continue;
        };
        let (ns, task_id) = text.split_once('/').unwrap_or((namespace, text));
        let checked = validate_id(&path, ns).and_then(|()| validate_id(&path, task_id));
        if let Err(error) = checked {
            problems.push(error);
            ok = false;
            continue;
        }
        let parent = ParentRef { namespace: ns.to_owned(), id: task_id.to_owned() };
        if ns == namespace && Some(task_id) == id {
            problems.push(err(ErrorCode::InvalidValue, &path, "a task cannot wait for itself"));
            ok = false;
        } else if !seen.insert(parent.clone()) {
            problems.push(err(ErrorCode::InvalidValue, &path, format!("{parent} is named twice")));
            ok = false;
        }
        parents.push(parent);
    }
    ok.then_some(parents)
}

impl super::TaskSpec {
    /// Whether the task has `after` and a schedule of its own: its fires are held until its
    /// parents' runs of their nominal time meet its rule, and only those nominal times count.
    pub fn holds_fires_for_parents(&self) -> bool {
        self.after.is_some() && self.schedule != crate::schedule::Schedule::Parents
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RunStatus;

    fn read(value: Value) -> Result<AfterSpec, Vec<String>> {
        Problems::collect(|problems| AfterSpec::read(&value, "ns", Some("child"), problems)).map_err(
            |errors| {
                errors
                    .as_slice()
                    .iter()
                    .map(|e| format!("{}: {}", e.field.clone().unwrap_or_default(), e.message))
                    .collect()
            },
        )
    }

    #[test]
    fn parents_default_to_the_tasks_namespace_and_the_rule_to_all_succeeded() {
        let after = read(json!({"tasks": ["a", "other/b"]})).unwrap();
        assert_eq!(after.tasks[0], ParentRef { namespace: "ns".into(), id: "a".into() });
        assert_eq!(after.tasks[1].to_string(), "other/b");
        assert_eq!(
            (after.when, after.mode, after.within),
            (AfterWhen::Succeeded, AfterMode::All, DEFAULT_WITHIN)
        );
        assert_eq!(read(after.to_json()).unwrap(), after);
    }

    #[test]
    fn every_problem_is_named() {
        let problems = read(json!({
            "tasks": ["child", "a", "ns/a", 3, "bad name"],
            "when": "sometimes",
            "mode": "most",
            "within": "8d",
            "extra": 1
        }))
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "after.extra",
            "after.tasks[0]: a task cannot wait for itself",
            "after.tasks[2]: ns/a is named twice",
            "after.tasks[3]: must be a string",
            "after.tasks[4]",
            "after.when",
            "after.mode",
            "after.within: must be from 1s to 7d",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
        }
    }

    #[test]
    fn an_empty_list_is_refused() {
        assert!(read(json!({"tasks": []})).unwrap_err()[0].contains("give 1 to 1000 parents"));
    }

    #[test]
    fn verdicts_satisfy_the_rule_they_name() {
        let rule = |when| AfterSpec { when, ..read(json!({"tasks": ["a"]})).unwrap() };
        let cases = [
            (AfterWhen::Succeeded, RunStatus::Succeeded, true),
            (AfterWhen::Succeeded, RunStatus::Dead, false),
            (AfterWhen::Failed, RunStatus::Dead, true),
            (AfterWhen::Failed, RunStatus::Succeeded, false),
            (AfterWhen::Completed, RunStatus::Succeeded, true),
            (AfterWhen::Completed, RunStatus::Dead, true),
            (AfterWhen::Completed, RunStatus::Cancelled, false),
            (AfterWhen::Completed, RunStatus::Skipped, false),
        ];
        for (when, verdict, expected) in cases {
            assert_eq!(rule(when).satisfied_by(verdict), expected, "{when:?} {verdict:?}");
        }
    }
}
