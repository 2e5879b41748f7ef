//! Network namespaces for partition tests: a hub namespace holding a bridge (the test's
//! vantage point), one namespace per node wired to it by a veth pair, and iptables rules in a
//! chain of their own in each node namespace to partition, drop and heal. Everything is
//! removed on Drop (processes in the namespaces are killed), and leftovers of dead test
//! processes are swept when a new lab is made.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context as _, bail};

/// Every namespace of a lab is named `<PREFIX><pid>-<n>-<role>`.
const PREFIX: &str = "jsn";

/// The iptables chain holding a lab's rules in each node namespace (flushed to heal).
const CHAIN: &str = "NEMESIS";

/// Labs made by this process so far (the `<n>` of their names).
static LABS: AtomicUsize = AtomicUsize::new(0);

/// The hub's address on the bridge; node `i` has `10.77.0.(11 + i)`. Each lab has its own
/// namespaces, so every lab uses the same private addresses without clashing.
const HUB_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// A hub and `n` node namespaces.
#[derive(Debug)]
pub struct NetLab {
    hub: String,
    nodes: Vec<String>,
}

impl NetLab {
    /// Why labs cannot be made here (not root, no `ip netns`, no iptables), or `None`.
    pub fn unavailable() -> Option<String> {
        // Tests of one process probe at the same time: each with a name of its own.
        let probe = format!("{PREFIX}{}-{}-probe", std::process::id(), LABS.fetch_add(1, Ordering::Relaxed));
        let result = (|| -> anyhow::Result<()> {
            run("ip", &["netns", "add", &probe])?;
            let iptables = run("ip", &["netns", "exec", &probe, "iptables", "-S"]);
            let _ = run("ip", &["netns", "del", &probe]);
            iptables.map(|_| ())
        })();
        result
            .err()
            .map(|error| format!("network namespaces or iptables unavailable (root needed): {error:#}"))
    }

    /// Whether the test `what` must be skipped because labs cannot be made here; says so on
    /// stderr when it must. Turns test logs on (see [`crate::init_test_logging`]).
    pub fn skip(what: &str) -> bool {
        crate::init_test_logging();
        let why = NetLab::unavailable();
        if let Some(why) = &why {
            eprintln!("SKIPPED {what}: {why}");
        }
        why.is_some()
    }

    /// Makes a hub and `nodes` node namespaces, after sweeping leftovers of dead tests.
    pub fn create(nodes: usize) -> anyhow::Result<Self> {
        sweep();
        let base = format!("{PREFIX}{}-{}", std::process::id(), LABS.fetch_add(1, Ordering::Relaxed));
        // Made before anything else, so Drop removes whatever part of the lab exists.
        let mut lab = Self { hub: format!("{base}-hub"), nodes: Vec::new() };
        run("ip", &["netns", "add", &lab.hub])?;
        let hub = lab.hub.clone();
        run("ip", &["-n", &hub, "link", "set", "lo", "up"])?;
        run("ip", &["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &hub, "addr", "add", &format!("{HUB_IP}/24"), "dev", "br0"])?;
        run("ip", &["-n", &hub, "link", "set", "br0", "up"])?;
        for i in 0..nodes {
            let ns = format!("{base}-n{}", i + 1);
            run("ip", &["netns", "add", &ns])?;
            lab.nodes.push(ns.clone());
            let veth = format!("v{i}");
            run(
                "ip",
                &[
                    "link", "add", "name", &veth, "netns", &hub, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ],
            )?;
            run("ip", &["-n", &hub, "link", "set", &veth, "master", "br0", "up"])?;
            run("ip", &["-n", &ns, "addr", "add", &format!("{}/24", lab.node_ip(i)), "dev", "eth0"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            lab.iptables(i, &["-N", CHAIN])?;
            lab.iptables(i, &["-I", "INPUT", "-j", CHAIN])?;
        }
        Ok(lab)
    }

    /// Name of the hub namespace (the test reaches nodes from there).
    pub fn hub(&self) -> &str {
        &self.hub
    }

    /// Name of node `i`'s namespace.
    pub fn node_ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// Address of node `i` on the bridge.
    pub fn node_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, 11 + u8::try_from(i).expect("a handful of nodes"))
    }

    /// Number of node namespaces.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the lab has no node namespace.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Drops every packet from a node of `from` to a node of `to`; with `both`, the reverse
    /// direction as well. Undone by [`NetLab::heal`].
    pub fn partition(&self, from: &[usize], to: &[usize], both: bool) -> anyhow::Result<()> {
        for &a in from {
            for &b in to {
                self.iptables(b, &["-A", CHAIN, "-s", &self.node_ip(a).to_string(), "-j", "DROP"])?;
                if both {
                    self.iptables(a, &["-A", CHAIN, "-s", &self.node_ip(b).to_string(), "-j", "DROP"])?;
                }
            }
        }
        Ok(())
    }

    /// Drops packets of TCP port `port` on node `i`'s loopback (a service's link to its node
    /// through a proxy listening there), both directions: every packet, or each with
    /// `probability`. Undone by [`NetLab::heal`].
    pub fn drop_port(&self, i: usize, port: u16, probability: Option<f64>) -> anyhow::Result<()> {
        let port = port.to_string();
        for direction in ["--dport", "--sport"] {
            let mut rule = vec!["-A", CHAIN, "-i", "lo", "-p", "tcp", direction, &port];
            let probability = probability.map(|p| p.to_string());
            if let Some(p) = &probability {
                rule.extend(["-m", "statistic", "--mode", "random", "--probability", p]);
            }
            rule.extend(["-j", "DROP"]);
            self.iptables(i, &rule)?;
        }
        Ok(())
    }

    /// Removes every rule [`NetLab::partition`] and [`NetLab::drop_port`] added.
    pub fn heal(&self) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            self.iptables(i, &["-F", CHAIN])?;
        }
        Ok(())
    }

    /// A command running `program` inside node `i`'s namespace (`ip netns exec` execs it, so
    /// the child's pid is the program's).
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.nodes[i]]).arg(program);
        command
    }

    fn iptables(&self, i: usize, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["netns", "exec", &self.nodes[i], "iptables", "-w"];
        all.extend_from_slice(args);
        run("ip", &all).map(|_| ())
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain([&self.hub]) {
            remove(ns);
        }
    }
}

/// Runs `program args`, failing with its stderr when it does not exit 0.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program).args(args).output().with_context(|| format!("run {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Kills every process in namespace `ns` and deletes it (its veth ends and rules go with it).
fn remove(ns: &str) {
    if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    let _ = run("ip", &["netns", "del", ns]);
}

/// Removes the namespaces (and the processes in them) and unmounts the small disks left by
/// test processes that no longer run (a crash, a kill -9 of the test runner).
pub fn sweep() {
    let Ok(list) = run("ip", &["netns", "list"]) else { return };
    for name in list.lines().filter_map(|line| line.split_whitespace().next()) {
        if let Some(pid) = owner(name, PREFIX)
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            remove(name);
        }
    }
    crate::disk::sweep();
}

/// The pid in a name `<prefix><pid>-...`.
pub(crate) fn owner(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}
