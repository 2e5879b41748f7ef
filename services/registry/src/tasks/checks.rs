//! Checks of a spec against what is stored before `put` writes it: the calendars it names
//! exist in its namespace; its `after` names existing parents of its own namespace (unless
//! the operator allows others) and closes no cycle.

use jetsched_shared::cas;
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::names::{calendar_key, task_key};
use jetsched_shared::spec::TaskSpec;

use super::TaskStore;
use crate::failure::Failure;

/// How long a `put` with `after` waits for a starting registry's dependency graph.
const GRAPH_LOAD: std::time::Duration = std::time::Duration::from_secs(10);

impl TaskStore {
    /// Refuses a spec naming calendars its namespace does not have, naming each.
    pub(super) async fn check_calendars(&self, spec: &TaskSpec) -> Result<(), Failure> {
        let mut problems = Vec::new();
        for (i, calendar) in spec.calendars.iter().enumerate() {
            let key = calendar_key(&spec.namespace, &calendar.name);
            let entry = self
                .calendars
                .entry(&key)
                .await
                .map_err(|e| Failure::unavailable("read calendars bucket", e))?;
            if cas::live(entry).is_none() {
                problems.push(ApiError::at(
                    ErrorCode::InvalidValue,
                    format!("calendars[{i}].name"),
                    format!("no calendar {:?} in namespace {:?}", calendar.name, spec.namespace),
                ));
            }
        }
        match ApiErrors::from_vec(problems) {
            Some(errors) => Err(errors.into()),
            None => Ok(()),
        }
    }

    /// The children waiting on the task `namespace`/`id` (`<namespace>/<id>`).
    pub(super) fn waiting_children(&self, namespace: &str, id: &str) -> Vec<String> {
        self.after
            .as_ref()
            .map(|after| after.graph().waiting_on(&task_key(namespace, id)))
            .unwrap_or_default()
    }

    /// Refuses an `after` naming parents of other namespaces (unless the operator allows it),
    /// parents that do not exist, or closing a cycle; every problem named. A valid child gets
    /// the verdicts consumer before it is stored.
    pub(super) async fn check_after(&self, spec: &TaskSpec) -> Result<(), Failure> {
        let Some(after) = &spec.after else { return Ok(()) };
        let mut problems = Vec::new();
        for (i, parent) in after.tasks.iter().enumerate() {
            let field = format!("after.tasks[{i}]");
            if parent.namespace != spec.namespace && !self.after_across_namespaces {
                problems.push(ApiError::at(
                    ErrorCode::NamespaceMismatch,
                    field,
                    format!(
                        "{parent} is in another namespace: a task waits only for tasks of its own \
                         namespace ({}) unless the registry runs with --after-across-namespaces",
                        spec.namespace
                    ),
                ));
                continue;
            }
            if self.entry(&parent.key()).await?.is_none() {
                problems.push(ApiError::at(ErrorCode::InvalidValue, field, format!("no task {parent}")));
            }
        }
        // The graph a cycle is looked for in holds every stored task once it is loaded.
        if let Some(engine) = &self.after
            && tokio::time::timeout(GRAPH_LOAD, engine.graph().loaded()).await.is_err()
        {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                "the dependency graph is still loading; retry",
            )
            .into());
        }
        if let Some(engine) = &self.after
            && let Some(cycle) = engine.graph().cycle_through(spec)
        {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "after.tasks",
                format!("a cycle: {} (each waits for the next)", cycle.join(" → ")),
            ));
        }
        if let Some(errors) = ApiErrors::from_vec(problems) {
            return Err(errors.into());
        }
        if let Some(engine) = &self.after {
            engine
                .ensure_verdicts_consumer()
                .await
                .map_err(|e| Failure::unavailable("create the consumer of parents' verdicts", e))?;
        }
        Ok(())
    }
}
