//! Runs cancelled on request ([`Cancels`]), followed with one watch of the cancels bucket, so a
//! delivery learns whether its run is cancelled without a KV read, and an attempt under way
//! hears of its cancel at once.
//!
//! Why markers in a bucket every worker follows, rather than a compare-and-set on the run
//! record alone: under deferred or lazy run records (the default) a run's first attempt starts
//! without any record write, so a record written by the registry could not stop it. The
//! registry writes the marker first, then settles the record with compare-and-set (a held or
//! retrying run becomes `cancelled`; a run without a record gets a `cancelled` record). A
//! worker registers each attempt here before it runs and checks the markers under the same
//! lock the watch applies them with: either the marker is there first (the run ends
//! `cancelled` without running), or the attempt is registered first and the marker, when it
//! comes, fires the attempt's token (the run is stopped cooperatively and ends `cancelled`).
//! No run is both started unawares and reported cancelled before it started: a record found
//! `cancelled` is never run either.
//!
//! Markers age out with the bucket (`max_age` = the run records' TTL); deleted or purged keys
//! are forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_nats::jetstream::kv;
use jetsched_shared::follow;
use jetsched_shared::wire::CancelMarker;
use prometheus::IntCounter;
use tokio_util::sync::CancellationToken;

/// The cancel markers known, and the attempts running here.
#[derive(Default)]
struct State {
    /// `<execution_id>` → the reason recorded.
    markers: HashMap<String, String>,
    /// `<execution_id>` → the token of the attempt running here.
    running: HashMap<String, CancellationToken>,
}

/// Cancel markers, followed into memory.
pub(crate) struct Cancels {
    kv: kv::Store,
    state: Mutex<State>,
    /// Counts errors of the watch (`jetsched_worker_errors_total{what="cancel_watch"}`).
    errors: IntCounter,
}

/// An attempt registered while it runs; unregistered when dropped.
pub(crate) struct Running<'a> {
    cancels: &'a Cancels,
    execution_id: String,
    /// Fired when the run is cancelled (at once when it was already).
    pub(crate) token: CancellationToken,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.cancels.lock().running.remove(&self.execution_id);
    }
}

impl Cancels {
    pub(crate) fn new(kv: kv::Store, errors: IntCounter) -> Cancels {
        Cancels { kv, state: Mutex::new(State::default()), errors }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reason of the cancel of `execution_id`, if it was cancelled.
    pub(crate) fn reason(&self, execution_id: &str) -> Option<String> {
        let state = self.lock();
        if state.markers.is_empty() {
            return None;
        }
        state.markers.get(execution_id).cloned()
    }

    /// Registers an attempt of `execution_id` about to run, its token a child of `parent`: the
    /// token is fired by the run's cancel, at once when the marker is already here.
    pub(crate) fn register(&self, execution_id: &str, parent: &CancellationToken) -> Running<'_> {
        let token = parent.child_token();
        let mut state = self.lock();
        if state.markers.contains_key(execution_id) {
            token.cancel();
        }
        state.running.insert(execution_id.to_string(), token.clone());
        drop(state);
        Running { cancels: self, execution_id: execution_id.to_string(), token }
    }

    /// Opens the watch and loads the markers ([`follow::load`]); returns the watch to follow.
    pub(crate) async fn load(&self) -> anyhow::Result<kv::Watch> {
        let started = Instant::now();
        let watch = follow::load(&self.kv, |entry| self.apply(entry)).await?;
        let markers = self.lock().markers.len();
        tracing::info!(markers, elapsed = ?started.elapsed(), "cancel markers loaded");
        Ok(watch)
    }

    /// Follows the bucket until `stop` ([`follow::follow`]).
    pub(crate) async fn follow(self: Arc<Self>, watch: kv::Watch, stop: CancellationToken) {
        follow::follow(self.kv.clone(), watch, stop, |entry| self.apply(entry), self.errors.clone()).await;
    }

    /// Applies a watch entry: a marker is kept (and fires the token of an attempt of its run
    /// running here); a deleted or purged one is forgotten.
    fn apply(&self, entry: &kv::Entry) {
        let mut state = self.lock();
        if entry.operation != kv::Operation::Put {
            state.markers.remove(&entry.key);
            return;
        }
        let reason = match serde_json::from_slice::<CancelMarker>(&entry.value) {
            Ok(marker) => marker.reason,
            Err(error) => {
                tracing::warn!(%error, key = entry.key, "cancel marker does not decode; cancelling anyway");
                "cancelled".to_string()
            }
        };
        if let Some(token) = state.running.get(&entry.key) {
            tracing::info!(execution_id = entry.key, "run cancelled while running: stopping it");
            token.cancel();
        }
        state.markers.insert(entry.key.clone(), reason);
    }
}
