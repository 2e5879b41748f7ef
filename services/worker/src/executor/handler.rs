//! Embedded Rust handlers: the public [`Handler`] trait, the [`Handlers`] registry a program
//! fills before building its worker, and the executor that calls them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use jetsched_shared::wire::Trigger;
use tokio_util::sync::CancellationToken;

use super::attempt::Attempt;
use crate::verdict::Outcome;

/// What a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// Idempotency key: the same for every attempt of a run.
    pub execution_id: String,
    pub namespace: String,
    pub task_id: String,
    pub nominal_time: DateTime<Utc>,
    pub trigger: Trigger,
    /// 1-based delivery count.
    pub attempt: u32,
    /// The trigger's payload when the run was triggered with one, otherwise the spec's
    /// `executor.payload`.
    pub payload: Option<serde_json::Value>,
    /// The attempt's time limit (the spec's `timeout`); the future is dropped after it.
    pub timeout: Duration,
    /// Cancelled when the worker stops waiting (the run cancelled, shutdown grace over,
    /// timeout): finish quickly. A cancelled run's handler has `CANCEL_GRACE` (5 s) before it is
    /// aborted.
    pub cancel: CancellationToken,
    /// W3C `traceparent` of the run (the handler's span when spans are exported): a handler
    /// that calls further services passes it on.
    pub traceparent: Option<String>,
    /// W3C `tracestate` that goes with it, when there is one.
    pub tracestate: Option<String>,
    /// A run its parents started (`after`): their runs, with the results they kept.
    pub parents: Vec<jetsched_shared::wire::ParentRun>,
}

/// A named handler an embedding program registers. Implemented for every
/// `Fn(RunContext) -> impl Future<Output = Outcome>`, so a closure or an `async fn` will do.
pub trait Handler: Send + Sync + 'static {
    fn call(&self, run: RunContext) -> BoxFuture<'static, Outcome>;
}

impl<F, Fut> Handler for F
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn call(&self, run: RunContext) -> BoxFuture<'static, Outcome> {
        Box::pin(self(run))
    }
}

/// Handlers by name (the spec's `executor.name`). Cheap to clone.
#[derive(Clone, Default)]
pub struct Handlers {
    map: Arc<HashMap<String, Arc<dyn Handler>>>,
}

impl Handlers {
    pub fn new() -> Handlers {
        Handlers::default()
    }

    /// Adds (or replaces) the handler `name`.
    pub fn register(mut self, name: impl Into<String>, handler: impl Handler) -> Handlers {
        Arc::make_mut(&mut self.map).insert(name.into(), Arc::new(handler));
        self
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.map.keys().cloned().collect();
        names.sort();
        names
    }

    /// Why a run naming `name` cannot run here: which handlers this worker has, or that it
    /// has none (a worker started without embedded handlers, such as the plain binary).
    fn missing(&self, name: &str) -> String {
        match self.names().as_slice() {
            [] => format!("no handler {name:?} is registered on this worker: it has no handlers"),
            names => {
                format!("no handler {name:?} is registered on this worker (it has: {})", names.join(", "))
            }
        }
    }

    pub(crate) async fn execute(
        &self,
        attempt: &Attempt<'_>,
        name: &str,
        payload: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Outcome {
        let Some(handler) = self.map.get(name) else {
            return Outcome::permanent(self.missing(name));
        };
        let d = attempt.dispatch;
        let cancel = attempt.cancel.child_token();
        let run = RunContext {
            execution_id: d.execution_id.clone(),
            namespace: d.namespace.clone(),
            task_id: d.task_id.clone(),
            nominal_time: d.nominal_time,
            trigger: d.trigger,
            attempt: attempt.attempt,
            payload: payload.cloned(),
            timeout,
            cancel: cancel.clone(),
            traceparent: attempt.trace.traceparent.clone(),
            tracestate: attempt.trace.tracestate.clone(),
            parents: d.parents.clone(),
        };
        // Spawned so that a panicking handler is a failed attempt, not a dead worker.
        let task = tokio::spawn(handler.call(run));
        // Aborts the handler when this future is dropped (grace period over).
        let abort = AbortOnDrop(task.abort_handle());
        let outcome = match tokio::time::timeout(timeout, task).await {
            Ok(Ok(outcome)) if attempt.cancel.is_cancelled() && !matches!(outcome, Outcome::Ok { .. }) => {
                Outcome::retry(format!("handler {name:?} stopped: the run was cancelled"))
            }
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) if error.is_panic() => Outcome::retry(format!("handler {name:?} panicked")),
            Ok(Err(error)) => Outcome::retry(format!("handler {name:?} was cancelled: {error}")),
            Err(_) => {
                abort.0.abort();
                Outcome::retry(format!("handler {name:?} timed out after {timeout:?}"))
            }
        };
        cancel.cancel();
        outcome
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_handler_names_the_ones_there_are_or_says_there_are_none() {
        assert_eq!(
            Handlers::new().missing("nightly"),
            "no handler \"nightly\" is registered on this worker: it has no handlers"
        );
        let some = Handlers::new()
            .register("a", |_| async { Outcome::ok() })
            .register("b", |_| async { Outcome::ok() });
        assert!(some.missing("nightly").ends_with("(it has: a, b)"), "{}", some.missing("nightly"));
    }
}
