//! Services started in-process for a test: [`App`] builds one (registry, scheduler, worker,
//! alerter) through its own `build` / `run` pair, knows its admin address, and stops it.
//!
//! ```no_run
//! # async fn demo(server: jetsched_tests::NatsServer) {
//! use jetsched_tests::App;
//! let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
//! assert!(registry.admin_get("/readyz").await.is_ok());
//! let served = registry.metric(r#"jetsched_api_requests_total{endpoint="get",outcome="ok"}"#).await;
//! assert_eq!(served, None, "no request yet");
//! registry.stop().await;
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`App::stop`] waits for a service to finish its graceful shutdown.
pub const STOP_WAIT: Duration = Duration::from_secs(20);

/// A service running in-process on a task of the test's runtime.
///
/// [`App::stop`] cancels it and waits for a clean end (panicking otherwise). Dropping it
/// cancels it too; on a multi-thread runtime Drop also waits (up to [`STOP_WAIT`]) for the
/// run to end, while on the default current-thread test runtime it cannot block, so the
/// service finishes its shutdown on its own while the test goes on.
#[derive(Debug)]
pub struct App {
    name: String,
    admin: SocketAddr,
    shutdown: CancellationToken,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl App {
    /// Builds and runs a registry; panics when `build` fails. (Each `build` future is boxed: a
    /// service's start-up is a large future, and a test starting several inline would overflow
    /// its thread's stack in a debug build.)
    pub async fn registry(config: jetsched_registry::Config) -> App {
        let service = Box::pin(jetsched_registry::build(config))
            .await
            .unwrap_or_else(|e| panic!("registry builds: {e:#}"));
        App::spawn("registry", service.admin_addr(), |shutdown| service.run(shutdown))
    }

    /// Builds and runs a scheduler replica; panics when `build` fails.
    pub async fn scheduler(config: jetsched_scheduler::Config) -> App {
        let service = Box::pin(jetsched_scheduler::build(config))
            .await
            .unwrap_or_else(|e| panic!("scheduler builds: {e:#}"));
        App::spawn("scheduler", service.admin_addr(), |shutdown| service.run(shutdown))
    }

    /// Builds and runs a worker with the embedded `handlers`; panics when `build` fails.
    pub async fn worker(config: jetsched_worker::Config, handlers: jetsched_worker::Handlers) -> App {
        let service = Box::pin(jetsched_worker::build(config, handlers))
            .await
            .unwrap_or_else(|e| panic!("worker builds: {e:#}"));
        App::spawn("worker", service.admin_addr(), |shutdown| service.run(shutdown))
    }

    /// Builds and runs an alerter; panics when `build` fails.
    pub async fn alerter(config: jetsched_alerter::Config) -> App {
        let service = Box::pin(jetsched_alerter::build(config))
            .await
            .unwrap_or_else(|e| panic!("alerter builds: {e:#}"));
        App::spawn("alerter", service.admin_addr(), |shutdown| service.run(shutdown))
    }

    /// Runs an already built service: `run` gets the shutdown token (for a service built by
    /// the test itself, e.g. with credentials or a custom connection). `name` labels panics.
    pub fn spawn<F>(name: &str, admin: SocketAddr, run: impl FnOnce(CancellationToken) -> F) -> App
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(run(shutdown.clone()));
        App { name: name.to_owned(), admin, shutdown, handle: Some(handle) }
    }

    /// The admin listener's address (`/metrics`, `/healthz`, `/readyz`).
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// `GET path` on the admin listener; panics when the listener does not answer.
    pub async fn admin_get(&self, path: &str) -> AdminReply {
        admin_get(self.admin, path)
            .await
            .unwrap_or_else(|e| panic!("{} admin GET {path} on {}: {e}", self.name, self.admin))
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.admin_get("/metrics").await.body
    }

    /// The value of one series of `/metrics` (see [`metric_value`]).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics().await, series)
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        self.admin_get("/readyz").await.is_ok()
    }

    /// Asks the service to stop without waiting (see [`App::stop`] to wait).
    pub fn cancel(&self) {
        self.shutdown.cancel();
    }

    /// Whether the service's run has returned (stopped or failed).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Cancels the service and waits up to [`STOP_WAIT`] for a clean end; returns how long
    /// the shutdown took. Panics on a timeout, a panic or an error from `run`.
    pub async fn stop(self) -> Duration {
        self.stop_within(STOP_WAIT).await
    }

    /// [`App::stop`] with a limit of its own.
    pub async fn stop_within(self, limit: Duration) -> Duration {
        let started = Instant::now();
        let name = self.name.clone();
        self.shutdown.cancel();
        self.join(limit).await.unwrap_or_else(|e| panic!("{name} stops cleanly: {e:#}"));
        started.elapsed()
    }

    /// Waits up to `limit` for `run` to return on its own (without cancelling) and returns its
    /// result: for a service expected to fail. Panics on a timeout or a panic.
    pub async fn join(mut self, limit: Duration) -> anyhow::Result<()> {
        let handle = self.handle.take().expect("an App is joined once");
        match tokio::time::timeout(limit, handle).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => panic!("{} panicked: {join}", self.name),
            Err(_) => panic!("{} did not return within {limit:?}", self.name),
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.shutdown.cancel();
        let Some(handle) = self.handle.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread && !std::thread::panicking()
        {
            tokio::task::block_in_place(|| {
                let _ = runtime.block_on(tokio::time::timeout(STOP_WAIT, handle));
            });
        }
    }
}

/// An admin listener's answer.
#[derive(Debug, Clone)]
pub struct AdminReply {
    pub status: u16,
    pub body: String,
}

impl AdminReply {
    /// Whether the status is 200.
    pub fn is_ok(&self) -> bool {
        self.status == 200
    }
}

/// `GET path` on an admin listener at `addr` (an in-process [`App`] or a real process), as
/// HTTP/1.0 so the server closes the connection after the reply.
pub async fn admin_get(addr: SocketAddr, path: &str) -> std::io::Result<AdminReply> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status line in {raw:?}")))?;
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
    Ok(AdminReply { status, body })
}

/// The value of the metric line whose name and labels are exactly `series` as exposed
/// (`jetsched_dlq_depth` or `jetsched_alerts_raised_total{rule="run_dead"}`).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        if name == series { value.trim().parse().ok() } else { None }
    })
}

#[cfg(test)]
mod tests {
    use super::metric_value;

    #[test]
    fn metric_value_matches_the_whole_series_only() {
        let text = "# HELP x\njetsched_dlq_depth 3\njetsched_dlq_depth_bytes 9\nrule_total{rule=\"a\"} 2\n";
        assert_eq!(metric_value(text, "jetsched_dlq_depth"), Some(3.0));
        assert_eq!(metric_value(text, "jetsched_dlq_depth_bytes"), Some(9.0));
        assert_eq!(metric_value(text, "rule_total{rule=\"a\"}"), Some(2.0));
        assert_eq!(metric_value(text, "jetsched_dlq"), None);
    }
}
