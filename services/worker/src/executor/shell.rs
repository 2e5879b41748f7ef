//! The `shell` executor: starts `command` as argv (no shell, no interpolation) — only when
//! the worker's `--shell-allow` list lets the task's namespace start the program (an entry
//! `NAMESPACE=PROGRAM` for one namespace, a bare `PROGRAM` for all); otherwise the attempt is a
//! permanent failure, so a spec never becomes remote code execution on a worker that did not
//! opt in, nor one team's program another team's.
//!
//! The process gets the spec's `env`, the execution headers as `JETSCHED_EXECUTION_ID`,
//! `JETSCHED_TASK`, `JETSCHED_NOMINAL_TIME`, `JETSCHED_ATTEMPT`, `JETSCHED_TRIGGER`, a trigger's
//! payload as JSON in `JETSCHED_PAYLOAD` (when the trigger gave one) and a
//! default `PATH` — never the worker's own environment, which holds its NATS credentials.
//! The process runs in a process group of its own; on timeout (or shutdown) the whole group
//! is killed; when the run is cancelled, the group is sent `SIGTERM`, then `SIGKILL` after a
//! grace period. Exit 0 succeeds; a program that cannot be started, or exits 126/127 (not
//! executable, not found), is permanent; other exits and signals are retryable. The last
//! `output_limit` bytes of stdout and stderr are recorded.

use jetsched_shared::wire::MAX_RESULT_BYTES;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use jetsched_shared::names;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::attempt::{Attempt, CANCEL_GRACE, Scope, tail};
use crate::verdict::Outcome;

/// `PATH` of the started process unless the spec's `env` sets one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The `--shell-allow` setting: the programs every namespace may start, and each listed
/// namespace's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShellAllow {
    every: BTreeSet<String>,
    by_namespace: BTreeMap<String, BTreeSet<String>>,
}

impl ShellAllow {
    pub(crate) fn insert(&mut self, scope: Scope, program: &str) {
        let programs = match scope {
            Scope::Every => &mut self.every,
            Scope::Namespace(namespace) => self.by_namespace.entry(namespace).or_default(),
        };
        programs.insert(program.to_string());
    }

    /// No program for any namespace: the executor is off.
    pub(crate) fn is_empty(&self) -> bool {
        self.every.is_empty() && self.by_namespace.is_empty()
    }

    /// Whether `namespace`'s tasks may start `program`.
    pub(crate) fn permits(&self, namespace: &str, program: &str) -> bool {
        self.every.contains(program) || self.by_namespace.get(namespace).is_some_and(|p| p.contains(program))
    }
}

pub(crate) struct ShellExecutor {
    allow: ShellAllow,
    output_limit: usize,
}

impl ShellExecutor {
    pub(crate) fn new(allow: ShellAllow, output_limit: usize) -> ShellExecutor {
        ShellExecutor { allow, output_limit }
    }

    pub(crate) async fn execute(
        &self,
        attempt: &Attempt<'_>,
        command: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&str>,
        timeout: Duration,
    ) -> Outcome {
        let Some(program) = command.first() else { return Outcome::permanent("empty command") };
        if self.allow.is_empty() {
            return Outcome::permanent(
                "the shell executor is disabled on this worker (start it with --shell-allow <program>)",
            );
        }
        let namespace = attempt.dispatch.namespace.as_str();
        if !self.allow.permits(namespace, program) {
            return Outcome::permanent(format!(
                "{program:?} is not on this worker's --shell-allow list for namespace {namespace:?}"
            ));
        }
        let mut cmd = Command::new(program);
        // The worker's own environment (NATS credentials among it) is not inherited.
        cmd.args(&command[1..])
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .envs(env)
            .envs(attempt.header_pairs().iter().map(|(name, value)| (env_name(name), value.clone())))
            .envs(attempt.trace.pairs().map(|(name, value)| (name.to_ascii_uppercase(), value)))
            .envs(attempt.dispatch.payload.as_ref().map(|payload| (names::PAYLOAD_ENV, payload.to_string())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(error) => return Outcome::permanent(format!("cannot start {program:?}: {error}")),
        };
        let group = child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw);
        // Kills the group whatever way this future ends (timeout, shutdown, drop).
        let _group_guard = KillGroup(group);
        let limit = self.output_limit;
        // Standard output is read up to one byte past the largest result kept, so a short
        // output is the run's result whole.
        let stdout = tokio::spawn(read_tail(child.stdout.take(), limit.max(MAX_RESULT_BYTES + 1)));
        let stderr = tokio::spawn(read_tail(child.stderr.take(), limit));

        let mut status = tokio::select! {
            status = child.wait() => Some(status),
            _ = tokio::time::sleep(timeout) => None,
            _ = attempt.cancel.cancelled() => None,
        };
        if status.is_none() && attempt.cancel.is_cancelled() {
            // Cancelled: the group is asked to end (SIGTERM), then killed after the grace.
            signal_group(group, Signal::SIGTERM);
            status = tokio::time::timeout(CANCEL_GRACE, child.wait()).await.ok();
        }
        // Leftovers of the group (background children holding the pipes) die with the run.
        kill_group(group);
        if status.is_none() {
            let _ = child.wait().await;
        }
        let out = stdout.await.unwrap_or_default();
        let err = stderr.await.unwrap_or_default();
        let output = format!("stdout: {}\nstderr: {}", tail(&out, limit), tail(&err, limit));
        let succeeded = matches!(&status, Some(Ok(status)) if status.success());
        if attempt.cancel.is_cancelled() && !succeeded {
            return Outcome::retry(format!("stopped (cancelled or shutting down)\n{output}"));
        }
        match status {
            None => Outcome::retry(format!("timed out after {timeout:?}; process group killed\n{output}")),
            Some(Err(error)) => Outcome::retry(format!("waiting for {program:?}: {error}")),
            Some(Ok(status)) if status.success() => Outcome::Ok {
                detail: Some(format!("exit 0\n{output}")),
                result: (out.len() <= MAX_RESULT_BYTES).then(|| out.clone()),
            },
            Some(Ok(status)) => match status.code() {
                Some(code @ (126 | 127)) => Outcome::permanent(format!("exit {code}\n{output}")),
                Some(code) => Outcome::retry(format!("exit {code}\n{output}")),
                None => Outcome::retry(format!("killed by a signal ({status})\n{output}")),
            },
        }
    }
}

/// `Jetsched-Execution-Id` → `JETSCHED_EXECUTION_ID`.
fn env_name(header: &str) -> String {
    header.replace('-', "_").to_ascii_uppercase()
}

fn kill_group(group: Option<Pid>) {
    signal_group(group, Signal::SIGKILL);
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group
        && let Err(error) = killpg(group, signal)
        && error != nix::errno::Errno::ESRCH
    {
        tracing::warn!(%error, group = group.as_raw(), %signal, "signal process group");
    }
}

struct KillGroup(Option<Pid>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // The group may be gone already (ESRCH is ignored); a leftover grandchild is not.
        kill_group(self.0);
    }
}

/// Reads `reader` to the end, keeping the last `limit` bytes (bounded memory).
async fn read_tail(reader: Option<impl AsyncRead + Unpin>, limit: usize) -> Vec<u8> {
    let Some(mut reader) = reader else { return Vec::new() };
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * limit.max(1) {
                    kept.drain(..kept.len() - limit);
                }
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_allowed_per_namespace_or_for_all() {
        let mut allow = ShellAllow::default();
        assert!(allow.is_empty());
        allow.insert(Scope::Every, "date");
        allow.insert(Scope::Namespace("billing".into()), "/usr/local/bin/invoice");
        assert!(!allow.is_empty());
        let cases = [
            ("billing", "date", true),
            ("ops", "date", true),
            ("billing", "/usr/local/bin/invoice", true),
            ("ops", "/usr/local/bin/invoice", false),
            ("billing", "invoice", false),
            ("billing", "sh", false),
        ];
        for (namespace, program, want) in cases {
            assert_eq!(allow.permits(namespace, program), want, "{namespace} {program}");
        }
    }
}
