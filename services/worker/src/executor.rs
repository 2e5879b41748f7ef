//! Executors: what an attempt does, by the spec's `executor.kind`, ending in an [`Outcome`].
//!
//! No executor acts with more than its task's namespace was given: a `nats` request stays out
//! of the reserved subject spaces and goes out on the namespace's own connection when it has
//! credentials; an `http` request reaches internal networks only where `--http-allow` lets the
//! namespace; a `shell` program starts only when `--shell-allow` lists it for the namespace.

mod attempt;
pub(crate) mod handler;
pub(crate) mod http;
pub(crate) mod nats;
pub(crate) mod shell;

use std::time::Duration;

use jetsched_shared::spec::Executor;

use tracing::Instrument;

use crate::spans;
use crate::verdict::Outcome;

pub(crate) use self::attempt::{Attempt, CANCEL_GRACE, Scope};
pub use self::handler::{Handler, Handlers, RunContext};

/// Every executor, built once per worker.
pub(crate) struct Executors {
    pub(crate) http: http::HttpExecutor,
    pub(crate) nats: nats::NatsExecutor,
    pub(crate) shell: shell::ShellExecutor,
    pub(crate) handlers: Handlers,
}

impl Executors {
    /// Runs one attempt within the spec's timeout. Each executor enforces the timeout itself
    /// (the shell one must kill the process group); this adds a backstop.
    pub(crate) async fn execute(&self, attempt: &Attempt<'_>) -> Outcome {
        match spans::executor(&attempt.dispatch.spec.executor) {
            None => self.execute_within(attempt).await,
            Some((span, trace)) => {
                let attempt = Attempt { cancel: attempt.cancel.clone(), trace, ..*attempt };
                let outcome = self.execute_within(&attempt).instrument(span.clone()).await;
                if !matches!(outcome, Outcome::Ok { .. }) {
                    span.record("otel.status_code", "ERROR");
                }
                outcome
            }
        }
    }

    async fn execute_within(&self, attempt: &Attempt<'_>) -> Outcome {
        let timeout = attempt.dispatch.spec.timeout;
        // A trigger's payload takes the place of the spec's body or payload.
        let given = attempt.dispatch.payload.as_ref();
        let run = async {
            match &attempt.dispatch.spec.executor {
                Executor::Http { method, url, headers, body } => {
                    self.http.execute(attempt, method, url, headers, given.or(body.as_ref()), timeout).await
                }
                Executor::Nats { subject, payload, headers } => {
                    self.nats.execute(attempt, subject, given.or(payload.as_ref()), headers, timeout).await
                }
                Executor::Shell { command, env, cwd } => {
                    self.shell.execute(attempt, command, env, cwd.as_deref(), timeout).await
                }
                Executor::Handler { name, payload } => {
                    self.handlers.execute(attempt, name, given.or(payload.as_ref()), timeout).await
                }
            }
        };
        // A cancelled attempt: an HTTP request is aborted and a NATS request abandoned at once
        // (their futures dropped); a handler and a shell program get `CANCEL_GRACE` to end.
        let grace = match &attempt.dispatch.spec.executor {
            Executor::Http { .. } | Executor::Nats { .. } => Duration::ZERO,
            Executor::Shell { .. } | Executor::Handler { .. } => CANCEL_GRACE + Duration::from_millis(500),
        };
        let cancelled = async {
            attempt.cancel.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            biased;
            outcome = tokio::time::timeout(timeout + Duration::from_secs(5), run) => match outcome {
                Ok(outcome) => outcome,
                Err(_) => Outcome::retry(format!("timed out after {timeout:?}")),
            },
            () = cancelled => Outcome::retry("cancelled while running"),
        }
    }
}
