//! A deliberate stall of the soak's `nats-server`: SIGSTOP at set times after the start and
//! SIGCONT a set time later, so that what a server pause (a long GC, a slow disk, the first
//! deletions at a stream's cap) leaves behind in the services shows in the soak's samples:
//! publishes and acks pile up in the clients while the server is frozen, then arrive at once.

use std::process::Command;
use std::time::{Duration, Instant};

/// SIGCONT on Drop: a soak stopped while the server is frozen never leaves it stopped.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = signal(self.0, "CONT");
    }
}

fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status()?;
    anyhow::ensure!(status.success(), "kill -{name} {pid} failed");
    Ok(())
}

/// Freezes process `pid` at each of `at` (seconds after `started`, in order) for `length`.
/// Returns the freezes done, as seconds after `started` (start, end).
pub(crate) async fn freezes(pid: u32, started: Instant, at: &[u64], length: Duration) -> Vec<(f64, f64)> {
    let mut done = Vec::new();
    for &second in at {
        tokio::time::sleep_until((started + Duration::from_secs(second)).into()).await;
        if let Err(error) = signal(pid, "STOP") {
            eprintln!("soak: freezing nats-server failed: {error:#}");
            break;
        }
        let resume = Resume(pid);
        let from = started.elapsed().as_secs_f64();
        eprintln!("soak: t={from:>5.0}s nats-server frozen for {} ms", length.as_millis());
        tokio::time::sleep(length).await;
        drop(resume);
        let to = started.elapsed().as_secs_f64();
        eprintln!("soak: t={to:>5.0}s nats-server resumed");
        done.push((from, to));
    }
    done
}
