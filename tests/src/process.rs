//! Real-process tests: run a workspace binary (a service) and crash, freeze or stop it.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// Path of the workspace binary `name` built next to the running test executable
/// (`target/<profile>/<name>`, found from `target/<profile>/deps/<test>-<hash>`).
///
/// Panics when it is missing: `cargo test`/`cargo nextest run` build test executables, not
/// every package's binaries, so build them first with `cargo build --workspace --bins`
/// (`.ci/run` does).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("path of the running test executable");
    let mut dir = exe.parent().expect("test executable has a parent dir").to_path_buf();
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir.pop();
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "binary {} not found: build the workspace binaries first with \
         `cargo build --workspace --bins` (same profile as the tests)",
        path.display()
    );
    path
}

/// `VmRSS` and `VmHWM` (peak) of process `pid`, in KiB (zeros when it is gone).
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A child process running a workspace binary. Its stdout and stderr go to a log file (never
/// inherited, so the test runner does not wait for them); killed (SIGKILL) on Drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    log_path: PathBuf,
    _dir: TempDir,
}

impl ChildProcess {
    /// A `Command` for workspace binary `name`, for adding args and env (e.g. `NATS_URL`)
    /// before [`ChildProcess::spawn_command`].
    pub fn command(name: &str) -> Command {
        Command::new(workspace_bin(name))
    }

    /// Spawns workspace binary `name` with `args`.
    pub fn spawn<I, S>(name: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Self::command(name);
        command.args(args);
        Self::spawn_command(name, command)
    }

    /// Spawns a prepared command; `name` labels the log. Stdio is redirected to the log file.
    pub fn spawn_command(name: &str, mut command: Command) -> Self {
        let dir = tempfile::Builder::new().prefix("jetsched-proc-").tempdir().expect("create temp dir");
        let log_path = dir.path().join(format!("{name}.log"));
        let log = OpenOptions::new().create(true).append(true).open(&log_path).expect("open process log");
        let log_err = log.try_clone().expect("clone log handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {name} ({command:?}): {error}"));
        Self { name: name.to_owned(), child, status: None, log_path, _dir: dir }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote to stdout and stderr so far.
    pub fn output(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Whether the process has not exited (a stopped process still runs).
    pub fn is_running(&mut self) -> bool {
        self.try_status().is_none()
    }

    /// SIGKILL, then reap. A crash: no shutdown code runs. Idempotent.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(status) = self.try_status() {
            return status;
        }
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait for killed process");
        self.status = Some(status);
        status
    }

    /// SIGSTOP: the process freezes (a stalled leader, a GC pause) but keeps its sockets.
    pub fn sigstop(&mut self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT: resumes a stopped process.
    pub fn sigcont(&mut self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM: asks for a graceful shutdown; follow with [`ChildProcess::wait_exit`].
    pub fn sigterm(&mut self) {
        self.signal(Signal::SIGTERM);
    }

    /// SIGINT (Ctrl-C).
    pub fn sigint(&mut self) {
        self.signal(Signal::SIGINT);
    }

    /// Waits up to `timeout` for the process to exit; `None` if it still runs then.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap_or_else(|error| panic!("poll {}: {error}", self.name));
        }
        self.status
    }

    fn signal(&mut self, signal: Signal) {
        if self.try_status().is_some() {
            panic!("cannot send {signal} to {}: it already exited\n{}", self.name, self.output());
        }
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"));
        kill(pid, signal).unwrap_or_else(|error| panic!("send {signal} to {}: {error}", self.name));
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            // A stopped process dies of SIGKILL as well.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- output of {} ({}) -----\n{}", self.name, self.log_path.display(), self.output());
        }
        if let Some(dir) = std::env::var_os("JETSCHED_KEEP_LOGS") {
            let to = Path::new(&dir).join(format!("{}-{}.log", self.name, self.child.id()));
            let _ = fs::copy(&self.log_path, to);
        }
    }
}
