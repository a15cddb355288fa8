//! A network namespace's own counters (the MIBs of /proc/net/snmp,
//! /proc/net/netstat and /proc/net/snmp6), and running code inside a
//! namespace named by its inode.
use std::{collections::HashMap, fs::File, os::fd::AsRawFd};

use anyhow::{bail, Context};

/// MIB counters by `<Group><Name>`, e.g. `TcpRetransSegs`, `UdpNoPorts`,
/// `Udp6NoPorts`.
#[derive(Debug, Clone, Default)]
pub struct Mib(pub HashMap<String, i64>);

impl Mib {
    /// A counter, 0 when this kernel does not have it.
    pub fn get(&self, k: &str) -> i64 {
        self.0.get(k).copied().unwrap_or(0)
    }

    /// Whether this kernel has the counter.
    pub fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }

    /// `self - before` for every counter.
    pub fn delta(&self, before: &Mib) -> Mib {
        Mib(self.0.iter().map(|(k, v)| (k.clone(), v - before.get(k))).collect())
    }

    /// Element-wise sum (two namespaces of one lab).
    pub fn add(&self, other: &Mib) -> Mib {
        let mut m = self.0.clone();
        for (k, v) in &other.0 {
            *m.entry(k.clone()).or_default() += v;
        }
        Mib(m)
    }
}

/// Reads the calling thread's namespace counters.
pub fn read_mib() -> anyhow::Result<Mib> {
    let mut m = HashMap::new();
    for f in ["snmp", "netstat"] {
        let text = std::fs::read_to_string(format!("/proc/thread-self/net/{f}"))?;
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let [keys, vals] = pair else { continue };
            let (Some((g, ks)), Some((_, vs))) = (keys.split_once(':'), vals.split_once(':')) else {
                continue;
            };
            for (k, v) in ks.split_whitespace().zip(vs.split_whitespace()) {
                if let Ok(v) = v.parse::<i64>() {
                    m.insert(format!("{g}{k}"), v);
                }
            }
        }
    }
    // snmp6: one "Name value" a line (absent without IPv6).
    if let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/snmp6") {
        for l in text.lines() {
            let mut it = l.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Ok(v) = v.parse::<i64>() {
                    m.insert(k.to_string(), v);
                }
            }
        }
    }
    Ok(Mib(m))
}

/// A file that names the network namespace of inode `ino`: a name under
/// /run/netns, else a process's /proc/PID/ns/net.
pub fn netns_file(ino: u32) -> Option<File> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::read_dir("/run/netns").into_iter().flatten().flatten().map(|e| e.path());
    let procs = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .map(|e| e.path().join("ns/net"));
    named.chain(procs).find_map(|p| {
        let md = std::fs::metadata(&p).ok()?;
        (md.ino() as u32 == ino).then(|| File::open(&p).ok()).flatten()
    })
}

/// The inode of the calling thread's network namespace.
pub fn own_netns() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").ok().map(|m| m.ino() as u32)
}

/// Runs `f` on a thread inside the network namespace of inode `ino` (the
/// calling thread's own when it is that one) and returns its result.
pub fn in_netns<T: Send>(ino: u32, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    if own_netns() == Some(ino) {
        return Ok(f());
    }
    let file =
        netns_file(ino).with_context(|| format!("no process or /run/netns name holds network namespace {ino}"))?;
    run_in(&file, &ino.to_string(), f)
}

/// Moves the calling thread into the network namespace `file` names
/// (`name` in errors). Use on a thread of its own.
pub fn enter(file: &File, name: &str) -> anyhow::Result<()> {
    // SAFETY: file is an open namespace file for the duration of the call.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("entering network namespace {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread of its own inside the network namespace `file`
/// names (`name` in errors) and returns its result.
pub fn run_in<T: Send>(file: &File, name: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<T> {
            enter(file, name)?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("a thread in network namespace {name} panicked"))?
    })
}
