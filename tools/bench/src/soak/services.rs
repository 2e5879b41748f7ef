//! The soak's service processes: started with their admin listeners on free ports (again on
//! another port when one was taken meanwhile), waited for until ready, checked alive, killed
//! on Drop; their logs kept in a directory that outlives a failed soak.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::system::{http_get, service_bin, service_env};

/// A service process: killed and reaped on Drop; output in `log`.
pub(super) struct Service {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) admin: SocketAddr,
    log: PathBuf,
    /// How it was started: `(url, binary, extra arguments)`, to start it again on another
    /// admin port when its port was taken between being picked and being bound.
    launch: (String, String, Vec<String>),
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The processes and their log directory: the directory is removed on Drop unless `keep`
/// (set until the soak completes, so a failed soak leaves its logs).
pub(super) struct Services {
    pub(super) procs: Vec<Service>,
    dir: PathBuf,
    pub(super) keep: bool,
}

impl Drop for Services {
    fn drop(&mut self) {
        self.procs.clear();
        if self.keep {
            eprintln!("soak: service logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Services {
    /// No process yet; logs go to `dir`, kept unless the soak clears `keep`.
    pub(super) fn new(dir: PathBuf) -> Services {
        Services { procs: Vec::new(), dir, keep: true }
    }

    pub(super) fn spawn(
        &mut self,
        url: &str,
        bin: &str,
        instance: &str,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        let launch = (url.to_string(), bin.to_string(), extra.iter().map(|a| a.to_string()).collect());
        let service = self.start(instance, launch)?;
        self.procs.push(service);
        Ok(())
    }

    fn start(&self, instance: &str, launch: (String, String, Vec<String>)) -> anyhow::Result<Service> {
        let (url, bin, extra) = &launch;
        let admin = jetsched_tests::free_addr();
        let log = self.dir.join(format!("{instance}.log"));
        let out = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new(service_bin(bin)?)
            .envs(service_env())
            .env("NATS_URL", url)
            .env("RUST_LOG", "warn")
            .args(["--instance-id", instance, "--admin-addr", &admin.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawn {bin}"))?;
        Ok(Service { name: instance.to_string(), child, admin, log, launch })
    }

    /// Starts process `i` again on another admin port when it exited because its port was
    /// taken (by another process, between the pick and the bind); true when it did.
    fn restart_if_port_taken(&mut self, i: usize) -> anyhow::Result<bool> {
        let p = &mut self.procs[i];
        if p.child.try_wait()?.is_none() || !tail(&p.log).contains("bind admin listener") {
            return Ok(false);
        }
        eprintln!("soak: {} could not bind {}; starting it on another port", p.name, p.admin);
        let (name, launch) = (p.name.clone(), p.launch.clone());
        self.procs[i] = self.start(&name, launch)?;
        Ok(true)
    }

    /// Fails when a process has exited (with the tail of its log).
    pub(super) fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.child.try_wait()? {
                bail!("{} exited ({status}); log tail:\n{}", p.name, tail(&p.log));
            }
        }
        Ok(())
    }

    pub(super) async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..self.procs.len() {
            let mut restarts = 0;
            loop {
                let admin = self.procs[i].admin;
                if http_get(admin, "/readyz").await.is_ok_and(|r| r.contains("\"ready\":true")) {
                    break;
                }
                if restarts < 3 && self.restart_if_port_taken(i)? {
                    restarts += 1;
                    continue;
                }
                self.check_alive()?;
                if Instant::now() > deadline {
                    bail!("{} not ready within 60 s", self.procs[i].name);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
