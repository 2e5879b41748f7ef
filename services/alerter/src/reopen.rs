//! A stream the alerter follows that may end or fail to open (the lease watch, the leader
//! events' ordered consumer): it owns the stream, its readiness check and the deadline of the
//! next attempt to reopen it. An error item is counted and logged, and the stream goes on.

use std::fmt::Display;
use std::time::Duration;

use futures::{Stream, StreamExt};
use jetsched_shared::admin::Readiness;
use tokio::time::{Instant, sleep_until};

use crate::metrics::Metrics;

/// Pause before reopening a stream that ended or could not be opened.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// What [`Reopening::next`] brings.
pub(crate) enum Next<T> {
    Item(T),
    /// The stream is gone and its reopening is due: open it and hand it to
    /// [`Reopening::opened`].
    Reopen,
}

pub(crate) struct Reopening<S> {
    /// Readiness check and `jetsched_alerter_errors_total` label.
    what: &'static str,
    stream: Option<S>,
    reopen_at: Instant,
    readiness: Readiness,
    metrics: Metrics,
}

impl<S, T, E> Reopening<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: Display,
{
    /// Follows `stream`, or reopens it after a pause when it could not be opened.
    pub(crate) fn new(what: &'static str, stream: Option<S>, readiness: Readiness, metrics: Metrics) -> Self {
        let mut reopening = Reopening { what, stream: None, reopen_at: Instant::now(), readiness, metrics };
        reopening.opened(stream);
        reopening
    }

    pub(crate) fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    /// The outcome of an attempt to (re)open: followed from now on, or tried again later.
    pub(crate) fn opened(&mut self, stream: Option<S>) {
        self.readiness.set(self.what, stream.is_some());
        if stream.is_none() {
            self.metrics.errors.with_label_values(&[self.what]).inc();
            self.reopen_at = Instant::now() + REOPEN_AFTER;
        }
        self.stream = stream;
    }

    /// The next item, or the moment to reopen the stream. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Next<T> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                sleep_until(self.reopen_at).await;
                return Next::Reopen;
            };
            match stream.next().await {
                Some(Ok(item)) => return Next::Item(item),
                Some(Err(error)) => {
                    self.metrics.errors.with_label_values(&[self.what]).inc();
                    tracing::warn!(%error, stream = self.what, "stream error; continuing");
                }
                None => {
                    tracing::warn!(stream = self.what, "stream ended; reopening");
                    self.stream = None;
                    self.readiness.set(self.what, false);
                    self.reopen_at = Instant::now() + REOPEN_AFTER;
                }
            }
        }
    }
}
