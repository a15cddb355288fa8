//! Network namespaces for labs and tests: create, join from a thread, shape
//! with nftables, read the namespace's own MIB counters, always clean up.
use std::{
    fs::File,
    io::Write,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{bail, Context};

/// Prefix of every namespace sonde creates; `sonde-<pid>-<n>-<role>`.
pub const PREFIX: &str = "sonde-";

/// Runs a command and fails with its stderr when it fails.
pub fn sh(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd).args(args).output().with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace that is deleted when dropped.
pub struct Netns {
    /// Name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates the namespace with loopback up.
    pub fn create(name: &str) -> anyhow::Result<Self> {
        sh("ip", &["netns", "add", name])?;
        let ns = Self { name: name.to_string() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n NAME ARGS...`
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        sh("ip", &a)
    }

    /// Runs a program inside the namespace.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["netns", "exec", self.name.as_str()];
        a.extend_from_slice(args);
        sh("ip", &a)
    }

    /// Sets a sysctl inside the namespace (`net.ipv4.tcp_syn_retries`, ...).
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")]).map(|_| ())
    }

    /// Loads an nftables ruleset (text for `nft -f -`) inside the namespace.
    pub fn nft(&self, ruleset: &str) -> anyhow::Result<()> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft (install nftables)")?;
        child.stdin.take().unwrap().write_all(ruleset.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("nft in {}: {}", self.name, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// Removes every nftables rule in the namespace.
    pub fn nft_flush(&self) -> anyhow::Result<()> {
        self.exec(&["nft", "flush", "ruleset"]).map(|_| ())
    }

    fn file(&self) -> anyhow::Result<File> {
        File::open(format!("/run/netns/{}", self.name)).with_context(|| format!("opening namespace {}", self.name))
    }

    /// Moves the calling thread into this namespace. Use on a thread of its own.
    pub fn enter(&self) -> anyhow::Result<()> {
        crate::engine::mib::enter(&self.file()?, &self.name)
    }

    /// Runs `f` on a thread inside the namespace and returns its result.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        crate::engine::mib::run_in(&self.file()?, &self.name, f)
    }

    /// Spawns a detached thread inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<anyhow::Result<T>> {
        let name = self.name.clone();
        std::thread::spawn(move || {
            Netns { name }.enter_no_drop()?;
            Ok(f())
        })
    }

    fn enter_no_drop(self) -> anyhow::Result<()> {
        let r = self.enter();
        std::mem::forget(self);
        r
    }

    /// This namespace's SNMP and netstat counters (`TcpRetransSegs`,
    /// `TcpExtTCPLossProbes`, ...), read from inside it.
    pub fn mib(&self) -> anyhow::Result<Mib> {
        self.run(read_mib)?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).stderr(Stdio::null()).status();
    }
}

pub use crate::engine::mib::{read_mib, Mib};

/// Two namespaces joined by a veth pair, with IPv4 and IPv6 addresses.
pub struct Pair {
    /// Client side.
    pub a: Netns,
    /// Server side.
    pub b: Netns,
    /// IPv4 of a and b.
    pub a4: String,
    /// IPv4 of b.
    pub b4: String,
    /// IPv6 of a.
    pub a6: String,
    /// IPv6 of b.
    pub b6: String,
    /// The IPv4 /24 both live in (for `--addr`).
    pub net4: String,
    /// The IPv6 /64 both live in.
    pub net6: String,
    /// a's end of the veth pair.
    pub va: String,
    /// b's end.
    pub vb: String,
    _lease: SubnetLease,
}

/// One of 250 subnet numbers, reserved across processes by a file
/// `/run/sonde/subnet-N` holding the owner's pid (taken over when that pid is
/// gone), so concurrent labs and tests never share addresses.
struct SubnetLease {
    n: u32,
    path: std::path::PathBuf,
}

impl SubnetLease {
    fn take(start: u32) -> anyhow::Result<Self> {
        let dir = std::path::Path::new("/run/sonde");
        std::fs::create_dir_all(dir)?;
        let me = std::process::id();
        for i in 0..250 {
            let n = (start + i) % 250 + 1;
            let path = dir.join(format!("subnet-{n}"));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    use std::io::Write;
                    writeln!(f, "{me}")?;
                    return Ok(SubnetLease { n, path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let owner = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok());
                    if owner.is_some_and(|p| !crate::engine::pid_exists(p)) {
                        let _ = std::fs::remove_file(&path);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!(
            "all 250 lab subnets are in use (/run/sonde/subnet-*); end other sonde labs or remove stale files"
        )
    }
}

impl Drop for SubnetLease {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Pair {
    /// Creates `sonde-<pid>-<n>-a` and `-b`. Each pair gets its own subnet
    /// (10.213.N.0/24, fd53:<n>::/64) so concurrent pairs never mix.
    pub fn new() -> anyhow::Result<Self> {
        remove_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let lease = SubnetLease::take(pid.wrapping_mul(7).wrapping_add(n))?;
        let sub = lease.n;
        let base = format!("{PREFIX}{pid}-{n}");
        let a = Netns::create(&format!("{base}-a"))?;
        let b = Netns::create(&format!("{base}-b"))?;
        let (va, vb) = (format!("sa{pid}x{n}"), format!("sb{pid}x{n}"));
        let (va, vb) = (va[..va.len().min(15)].to_string(), vb[..vb.len().min(15)].to_string());
        sh("ip", &["link", "add", &va, "netns", &a.name, "type", "veth", "peer", "name", &vb, "netns", &b.name])?;
        let p = Pair {
            a4: format!("10.213.{sub}.1"),
            b4: format!("10.213.{sub}.2"),
            a6: format!("fd53:{sub:x}::1"),
            b6: format!("fd53:{sub:x}::2"),
            net4: format!("10.213.{sub}.0/24"),
            net6: format!("fd53:{sub:x}::/64"),
            a,
            b,
            va: va.clone(),
            vb: vb.clone(),
            _lease: lease,
        };
        for (ns, dev, v4, v6) in [(&p.a, &va, &p.a4, &p.a6), (&p.b, &vb, &p.b4, &p.b6)] {
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", dev])?;
            ns.ip(&["-6", "addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"])?;
            ns.ip(&["link", "set", dev, "up"])?;
        }
        Ok(p)
    }

    /// This pair's subnet number N (10.213.N.0/24), unique among running
    /// pairs: labs use it to name further links.
    pub fn subnet(&self) -> u32 {
        self._lease.n
    }

    /// Summed MIB counters of both namespaces.
    pub fn mib(&self) -> anyhow::Result<Mib> {
        Ok(self.a.mib()?.add(&self.b.mib()?))
    }
}

/// Deletes namespaces left by sonde processes that no longer exist (SIGKILL).
pub fn remove_stale() {
    let Ok(rd) = std::fs::read_dir("/run/netns") else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !crate::engine::pid_exists(pid) {
            drop(Netns { name });
        }
    }
}

/// Fails with a one-line environment error naming the first of `tools`
/// (ip, nft, tc: what the network labs run) not on PATH.
pub fn require_tools(tools: &[&str]) -> anyhow::Result<()> {
    for tool in tools {
        if sh("which", &[tool]).is_err() {
            return Err(crate::engine::error::env(format!("`{tool}` is missing; install iproute2 and nftables")));
        }
    }
    Ok(())
}
