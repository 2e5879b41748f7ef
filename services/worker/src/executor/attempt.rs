//! What an executor is handed for one attempt ([`Attempt`]: the dispatch, the attempt number,
//! its cancellation and trace context), the execution headers every request carries, the
//! namespace [`Scope`] of per-namespace executor settings, and the bounded excerpts of output
//! an outcome keeps.

use jetsched_shared::names::task_key;
use jetsched_shared::wire::{
    Dispatch, HDR_ATTEMPT, HDR_EXECUTION_ID, HDR_NOMINAL_TIME, HDR_PARENTS, HDR_TASK, HDR_TRIGGER,
    format_time,
};
use tokio_util::sync::CancellationToken;

use crate::spans::Propagated;

/// How long a cancelled attempt of an embedded handler or a shell program is given to end by
/// itself (the handler's token is fired, the program's process group is sent `SIGTERM`)
/// before it is dropped (the handler aborted, the group sent `SIGKILL`).
pub(crate) const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// The execution headers every executor request carries (HTTP and NATS; a shell
    /// program's environment): and for a run its parents started, their runs and results.
    pub(crate) fn header_pairs(&self) -> Vec<(&'static str, String)> {
        let d = self.dispatch;
        let mut pairs = vec![
            (HDR_EXECUTION_ID, d.execution_id.clone()),
            (HDR_TASK, task_key(&d.namespace, &d.task_id)),
            (HDR_NOMINAL_TIME, format_time(d.nominal_time)),
            (HDR_ATTEMPT, self.attempt.to_string()),
            (HDR_TRIGGER, d.trigger.as_str().to_string()),
        ];
        if !d.parents.is_empty()
            && let Ok(parents) = serde_json::to_string(&d.parents)
        {
            pairs.push((HDR_PARENTS, parents));
        }
        pairs
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
