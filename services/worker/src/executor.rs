//! Executors: what an attempt does, by the spec's `executor.kind`, and the [`Outcome`] that
//! encodes the ack decision.
//!
//! No executor acts with more than its task's namespace was given: a `nats` request stays out
//! of the reserved subject spaces and goes out on the namespace's own connection when it has
//! credentials; an `http` request reaches internal networks only where `--http-allow` lets the
//! namespace; a `shell` program starts only when `--shell-allow` lists it for the namespace.

pub(crate) mod handler;
pub(crate) mod http;
pub(crate) mod nats;
pub(crate) mod shell;

use std::time::Duration;

use jetsched_shared::names::task_key;
use jetsched_shared::spec::Executor;
use jetsched_shared::wire::{
    Dispatch, HDR_ATTEMPT, HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_TASK, HDR_TRIGGER, format_time,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::spans::{self, Propagated};

pub use self::handler::{Handler, Handlers, RunContext};

/// How an attempt ended. Encodes the ack decision: `Ok` → ack; `Retry` → `Nak` with the
/// backoff delay (or `after`, capped at the policy's `max_interval`) while attempts remain;
/// `Permanent` → dead letter, then `Term`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok { detail: Option<String> },
    Retry { error: String, after: Option<Duration> },
    Permanent { error: String },
}

impl Outcome {
    pub fn ok() -> Outcome {
        Outcome::Ok { detail: None }
    }

    pub fn retry(error: impl Into<String>) -> Outcome {
        Outcome::Retry { error: error.into(), after: None }
    }

    pub fn permanent(error: impl Into<String>) -> Outcome {
        Outcome::Permanent { error: error.into() }
    }
}

/// Which namespaces an entry of a per-namespace executor setting (`--shell-allow`,
/// `--http-allow`) applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// `*=...` (or, for `--shell-allow`, a bare program).
    Every,
    /// `NAMESPACE=...`.
    Namespace(String),
}

/// One attempt handed to an executor.
pub(crate) struct Attempt<'a> {
    pub(crate) dispatch: &'a Dispatch,
    pub(crate) attempt: u32,
    /// Cancelled when the attempt must stop (shutdown grace over).
    pub(crate) cancel: CancellationToken,
    /// Trace context passed on to the downstream (`traceparent`, `tracestate`).
    pub(crate) trace: Propagated,
}

impl Attempt<'_> {
    /// The execution headers every executor request carries (HTTP and NATS).
    pub(crate) fn header_pairs(&self) -> [(&'static str, String); 5] {
        let d = self.dispatch;
        [
            (HDR_EXECUTION_ID, d.execution_id.clone()),
            (HDR_TASK, task_key(&d.namespace, &d.task_id)),
            (HDR_NOMINAL_TIME, format_time(d.nominal_time)),
            (HDR_ATTEMPT, self.attempt.to_string()),
            (HDR_TRIGGER, d.trigger.as_str().to_string()),
        ]
    }
}

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
        let run = async {
            match &attempt.dispatch.spec.executor {
                Executor::Http { method, url, headers, body } => {
                    self.http.execute(attempt, method, url, headers, body.as_ref(), timeout).await
                }
                Executor::Nats { subject, payload, headers } => {
                    self.nats.execute(attempt, subject, payload.as_ref(), headers, timeout).await
                }
                Executor::Shell { command, env, cwd } => {
                    self.shell.execute(attempt, command, env, cwd.as_deref(), timeout).await
                }
                Executor::Handler { name, payload } => {
                    self.handlers.execute(attempt, name, payload.as_ref(), timeout).await
                }
            }
        };
        match tokio::time::timeout(timeout + Duration::from_secs(5), run).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::retry(format!("timed out after {timeout:?}")),
        }
    }
}

/// The last `limit` bytes of `bytes` as text (lossy), prefixed with `…` when cut.
pub(crate) fn tail(bytes: &[u8], limit: usize) -> String {
    if bytes.len() <= limit {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    format!("…{}", String::from_utf8_lossy(&bytes[bytes.len() - limit..]))
}

/// The first `limit` bytes of `bytes` as text (lossy), followed by `…` when cut.
pub(crate) fn head(bytes: &[u8], limit: usize) -> String {
    if bytes.len() <= limit {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    format!("{}…", String::from_utf8_lossy(&bytes[..limit]))
}
