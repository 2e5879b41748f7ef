//! The admin HTTP server every service runs: `/metrics` (Prometheus text), `/healthz` (the
//! process is alive) and `/readyz` (every readiness check of the service passes).
//!
//! The listener is bound in `build` (port 0 allowed) and served in `run`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How often, and how long at most, the `jetstream` check asks JetStream for account info.
const JETSTREAM_PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
const JETSTREAM_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Named readiness checks. A service marks each check ready or not; `/readyz` is 200 only
/// when every registered check is ready.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    checks: Arc<Mutex<BTreeMap<&'static str, bool>>>,
    client: Arc<Mutex<Option<async_nats::Client>>>,
    /// How many times the `jetstream` check passed again after failing.
    returns: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness::default()
    }

    /// Registers (or updates) a check.
    pub fn set(&self, check: &'static str, ready: bool) {
        self.checks.lock().expect("readiness lock").insert(check, ready);
    }

    /// Adds the check `nats_connected`, read live from the client's connection state.
    pub fn watch_connection(&self, client: async_nats::Client) {
        *self.client.lock().expect("readiness lock") = Some(client);
    }

    /// Adds the check `jetstream`, probed every second by an account info request: false while
    /// JetStream does not answer (a server that disabled it on a full disk, a node cut off
    /// from the cluster's meta leader), logged when it changes, and counted in
    /// [`Readiness::jetstream_returns`] each time it answers again. The probe ends once every
    /// other handle of this readiness is dropped.
    pub fn watch_jetstream(&self, js: async_nats::jetstream::Context) {
        self.set("jetstream", false);
        let checks = Arc::downgrade(&self.checks);
        let returns = Arc::downgrade(&self.returns);
        tokio::spawn(async move {
            let mut was = None;
            loop {
                let answer = tokio::time::timeout(JETSTREAM_PROBE_TIMEOUT, js.query_account()).await;
                let error = match answer {
                    Ok(Ok(_)) => None,
                    Ok(Err(error)) => Some(error.to_string()),
                    Err(_) => Some(format!("no answer within {JETSTREAM_PROBE_TIMEOUT:?}")),
                };
                let Some(checks) = checks.upgrade() else { return };
                let ready = error.is_none();
                checks.lock().expect("readiness lock").insert("jetstream", ready);
                drop(checks);
                match (was, error) {
                    (Some(true) | None, Some(error)) => {
                        tracing::warn!(%error, "JetStream unavailable: not ready")
                    }
                    (Some(false), None) => {
                        tracing::info!("JetStream available again: ready");
                        if let Some(returns) = returns.upgrade() {
                            returns.send_modify(|n| *n += 1);
                        }
                    }
                    _ => {}
                }
                was = Some(ready);
                tokio::time::sleep(JETSTREAM_PROBE_EVERY).await;
            }
        });
    }

    /// Changes each time the `jetstream` check passes again after failing: what was opened on
    /// JetStream before (a watch, a consumer) may have been lost with it, and a client's own
    /// recovery of it may lag (a re-creation request sent while JetStream did not answer waits
    /// out its timeout before the next one).
    pub fn jetstream_returns(&self) -> tokio::sync::watch::Receiver<u64> {
        self.returns.subscribe()
    }

    pub fn is_ready(&self) -> bool {
        let checks = self.snapshot();
        !checks.is_empty() && checks.values().all(|ready| *ready)
    }

    pub fn snapshot(&self) -> BTreeMap<&'static str, bool> {
        let mut checks = self.checks.lock().expect("readiness lock").clone();
        if let Some(client) = self.client.lock().expect("readiness lock").as_ref() {
            let connected = client.connection_state() == async_nats::connection::State::Connected;
            checks.insert("nats_connected", connected);
        }
        checks
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
}

/// A bound, not yet serving, admin listener.
pub struct AdminServer {
    listener: TcpListener,
    state: AdminState,
}

impl AdminServer {
    pub async fn bind(
        addr: SocketAddr,
        registry: Registry,
        readiness: Readiness,
    ) -> anyhow::Result<AdminServer> {
        let listener =
            TcpListener::bind(addr).await.with_context(|| format!("bind admin listener {addr}"))?;
        Ok(AdminServer { listener, state: AdminState { registry, readiness } })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .context("admin server")
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut buffer = Vec::new();
    match TextEncoder::new().encode(&state.registry.gather(), &mut buffer) {
        Ok(()) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, TextEncoder::new().format_type().to_string())], buffer)
        }
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_string())],
            error.to_string().into_bytes(),
        ),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let checks = state.readiness.snapshot();
    let ready = !checks.is_empty() && checks.values().all(|ready| *ready);
    let body = serde_json::json!({ "ready": ready, "checks": checks }).to_string();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}
