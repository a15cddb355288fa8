//! `sonde serve`'s configuration: a TOML file (one documented schema). The
//! common keys have flags (see `ServeArgs`), which override them or add to
//! their lists, and pass the same checks.
//!
//! ```toml
//! listen = "127.0.0.1:9632"        # loopback by default; or "unix:/run/sonde.sock"
//! web_config = "/etc/sonde/web.yml" # exporter-toolkit format: TLS, basic auth
//! labels = ["cgroup"]               # per-cgroup series (pod UID, container ID)
//!
//! [retrans]                         # on by default
//! enabled = true
//! port = [443, 8080]                # filters as `sonde retrans` takes them
//! addr = ["10.0.0.0/8"]
//! netns = []
//! comm = ["nginx"]                  # owner thread names (up to 4)
//! cgroup = ""
//!
//! [cwnd]                            # on by default
//! enabled = true
//! port = []
//!
//! [drops]                           # on by default: sonde_packet_drops_total
//! enabled = true
//! reason = []                       # only these reasons (the kernel's names)
//! not_reason = ["NOT_SPECIFIED"]    # every reason but these
//! proto = []                        # tcp, udp, icmp, ... or numbers
//! netns = []
//! iface = []
//!
//! [funclatency]                     # off until targets are named
//! targets = ["syscall:read", "softirq:net_rx", "/usr/bin/app:handle_*"]
//! cgroup = ""
//! min = "1us"                       # histogram range: ~25 buckets
//! max = "10s"
//! quarters = false                  # 4 buckets per power of two
//!
//! [profiles]                        # /debug/pprof/{profile,offcpu,wakeup}
//! enabled = true
//! max_seconds = 60
//! frequency = 49
//! allow_uids = [0, 65532]           # without basic auth: local clients of these uids
//! allow_any = false                 # true: any client (only behind an authenticating proxy)
//!
//! [push]                            # off unless url is set
//! url = "http://pyroscope:4040/ingest"
//! interval = "60s"
//! seconds = 10
//! service_name = "sonde"
//! labels = { env = "prod" }
//! ```
use std::{collections::BTreeMap, path::Path, time::Duration};

use serde::Deserialize;

use crate::engine::{
    error::usage,
    flowfilter::{check_comm, MAX_COMMS},
    run::parse_duration,
};

/// The default port: free in Prometheus' default port allocations (9435 is
/// ebpf_exporter, 9436 mikrotik-exporter), and used by no known exporter.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9632";

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: Option<String>,
    /// exporter-toolkit web config file (TLS, basic auth).
    pub web_config: Option<String>,
    /// Extra label sets: "cgroup".
    #[serde(default)]
    pub labels: Vec<String>,
    /// retrans collector.
    #[serde(default)]
    pub retrans: NetCollector,
    /// cwnd collector.
    #[serde(default)]
    pub cwnd: NetCollector,
    /// drops collector.
    #[serde(default)]
    pub drops: DropsCollector,
    /// funclatency collector.
    #[serde(default)]
    pub funclatency: Funclatency,
    /// pprof endpoints.
    #[serde(default)]
    pub profiles: Profiles,
    /// Push of profiles.
    #[serde(default)]
    pub push: Push,
}

/// A TCP collector's switch and filters (no pid filter: pids churn).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetCollector {
    /// On by default.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Local or remote ports.
    #[serde(default)]
    pub port: Vec<u16>,
    /// Local or remote addresses or networks (CIDR).
    #[serde(default)]
    pub addr: Vec<String>,
    /// Network namespaces.
    #[serde(default)]
    pub netns: Vec<String>,
    /// Owner thread names (comm).
    #[serde(default)]
    pub comm: Vec<String>,
    /// Owner cgroup and the groups below it (v2, or a v1 controller's).
    #[serde(default)]
    pub cgroup: String,
}

impl Default for NetCollector {
    fn default() -> Self {
        Self {
            enabled: true,
            port: Vec::new(),
            addr: Vec::new(),
            netns: Vec::new(),
            comm: Vec::new(),
            cgroup: String::new(),
        }
    }
}

impl NetCollector {
    /// The filters as the tool's flags.
    pub fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        for p in &self.port {
            v.extend(["--port".to_string(), p.to_string()]);
        }
        for a in &self.addr {
            v.extend(["--addr".to_string(), a.clone()]);
        }
        for n in &self.netns {
            v.extend(["--netns".to_string(), n.clone()]);
        }
        for c in &self.comm {
            v.extend(["--comm".to_string(), c.clone()]);
        }
        if !self.cgroup.is_empty() {
            v.extend(["--cgroup".to_string(), self.cgroup.clone()]);
        }
        v
    }
}

/// The drops collector's switch and filters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropsCollector {
    /// On by default.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Only these reasons.
    #[serde(default)]
    pub reason: Vec<String>,
    /// Every reason but these.
    #[serde(default)]
    pub not_reason: Vec<String>,
    /// IP protocols.
    #[serde(default)]
    pub proto: Vec<String>,
    /// Network namespaces.
    #[serde(default)]
    pub netns: Vec<String>,
    /// Interfaces.
    #[serde(default)]
    pub iface: Vec<String>,
}

impl Default for DropsCollector {
    fn default() -> Self {
        Self {
            enabled: true,
            reason: Vec::new(),
            not_reason: Vec::new(),
            proto: Vec::new(),
            netns: Vec::new(),
            iface: Vec::new(),
        }
    }
}

impl DropsCollector {
    /// The filters as `sonde drops`'s flags.
    pub fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (flag, list) in [
            ("--reason", &self.reason),
            ("--not-reason", &self.not_reason),
            ("--proto", &self.proto),
            ("--netns", &self.netns),
            ("--iface", &self.iface),
        ] {
            for x in list {
                v.extend([flag.to_string(), x.clone()]);
            }
        }
        v
    }
}

/// Latency histograms.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Funclatency {
    /// Targets as `sonde funclatency` names them.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Only calls of tasks in this cgroup or below it.
    #[serde(default)]
    pub cgroup: String,
    /// Lowest bucket boundary.
    #[serde(default = "min_default")]
    pub min: String,
    /// Highest bucket boundary.
    #[serde(default = "max_default")]
    pub max: String,
    /// All four buckets per power of two.
    #[serde(default)]
    pub quarters: bool,
}

impl Default for Funclatency {
    fn default() -> Self {
        Self { targets: Vec::new(), cgroup: String::new(), min: min_default(), max: max_default(), quarters: false }
    }
}

/// The pprof endpoints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profiles {
    /// On by default.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Cap on `?seconds=`.
    #[serde(default = "max_seconds_default")]
    pub max_seconds: u64,
    /// CPU samples per second.
    #[serde(default = "frequency_default")]
    pub frequency: u64,
    /// Without basic auth, profiles go only to clients on this host whose
    /// socket belongs to one of these uids.
    #[serde(default = "allow_uids_default")]
    pub allow_uids: Vec<u32>,
    /// Profiles to any client (an authenticating proxy in front).
    #[serde(default)]
    pub allow_any: bool,
}

impl Default for Profiles {
    fn default() -> Self {
        Self {
            enabled: true,
            max_seconds: max_seconds_default(),
            frequency: frequency_default(),
            allow_uids: allow_uids_default(),
            allow_any: false,
        }
    }
}

/// Push of CPU profiles to a Pyroscope-compatible /ingest.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Push {
    /// The /ingest URL (http only; put a TLS proxy in front).
    pub url: Option<String>,
    /// Time between pushes.
    pub interval: Option<String>,
    /// Length of each profile.
    pub seconds: Option<u64>,
    /// `service_name` label.
    pub service_name: Option<String>,
    /// More labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}
fn min_default() -> String {
    "1us".into()
}
fn max_default() -> String {
    "10s".into()
}
fn allow_uids_default() -> Vec<u32> {
    vec![0]
}
fn max_seconds_default() -> u64 {
    60
}
fn frequency_default() -> u64 {
    49
}

/// Reads and checks `path`: a problem is one line naming the file, the line
/// and what is wrong.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("config {}: {e}; give a readable TOML file", path.display())))?;
    parse(&text).map_err(|e| usage(format!("config {}: {e}", path.display())))
}

/// Parses and checks config text.
pub fn parse(text: &str) -> Result<Config, String> {
    let c: Config = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let msg = e.message().replace('\n', " ");
        match line {
            Some(l) => format!("line {l}: {msg}"),
            None => msg,
        }
    })?;
    c.check()?;
    Ok(c)
}

impl Config {
    /// The checks the file and the flags both meet.
    pub fn check(&self) -> Result<(), String> {
        for l in &self.labels {
            if l != "cgroup" {
                return Err(format!("labels: unknown label set '{l}'; the one there is: cgroup"));
            }
        }
        for (name, n) in [("retrans", &self.retrans), ("cwnd", &self.cwnd)] {
            if n.comm.len() > MAX_COMMS {
                return Err(format!("{name}.comm: at most {MAX_COMMS} names; use cgroup for a group of processes"));
            }
            for c in &n.comm {
                check_comm(c).map_err(|e| format!("{name}.comm: {e}"))?;
            }
        }
        let f = &self.funclatency;
        let (min, max) = (dur(&f.min, "funclatency.min")?, dur(&f.max, "funclatency.max")?);
        if max > Duration::from_secs(86_400 * 365) {
            return Err(format!("funclatency.max {}: at most a year", f.max));
        }
        if min >= max {
            return Err(format!("funclatency: min {} is not below max {}", f.min, f.max));
        }
        if self.profiles.max_seconds == 0 || self.profiles.max_seconds > 600 {
            return Err(format!("profiles.max_seconds {}: pick 1 to 600", self.profiles.max_seconds));
        }
        if self.profiles.frequency == 0 || self.profiles.frequency > 1000 {
            return Err(format!("profiles.frequency {}: pick 1 to 1000", self.profiles.frequency));
        }
        // The interval is checked even without a URL (a flag may set it alone).
        if let Some(i) = &self.push.interval {
            dur(i, "push.interval (--push-interval)")?;
        }
        if let Some(u) = &self.push.url {
            if !u.starts_with("http://") {
                return Err(format!(
                    "push.url (--push-url) {u}: only http:// URLs (put a TLS proxy in front for https)"
                ));
            }
            let secs = self.push.seconds.unwrap_or(10);
            let every = dur(self.push.interval.as_deref().unwrap_or("60s"), "push.interval")?;
            if every > Duration::from_secs(86_400) {
                return Err("push.interval: at most 24h".into());
            }
            if secs == 0 || Duration::from_secs(secs) > every || secs > self.profiles.max_seconds {
                return Err(format!(
                    "push.seconds {secs}: pick 1 up to the interval ({}) and profiles.max_seconds ({})",
                    humantime::format_duration(every),
                    self.profiles.max_seconds
                ));
            }
        }
        Ok(())
    }

    /// The histogram range in ns.
    pub fn range_ns(&self) -> (u64, u64) {
        let f = &self.funclatency;
        let ns = |s: &str| dur(s, "").map(|d| d.as_nanos() as u64).unwrap_or(1);
        (ns(&f.min), ns(&f.max))
    }
}

fn dur(s: &str, key: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| format!("{key}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_mistakes_name_their_line() {
        let doc = include_str!("config.rs");
        let example: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start().to_string() + "\n")
            .collect();
        let c = parse(&example).unwrap();
        assert_eq!(c.retrans.port, vec![443, 8080]);
        assert_eq!(c.funclatency.targets.len(), 3);
        assert_eq!(c.push.labels.get("env").map(String::as_str), Some("prod"));
        let e = parse("listen = \"x\"\n[retrans]\nenabeld = true\n").unwrap_err();
        assert!(e.starts_with("line 3:") && e.contains("enabeld"), "{e}");
        let e = parse("[funclatency]\nmin = \"1s\"\nmax = \"1ms\"\n").unwrap_err();
        assert!(e.contains("not below"), "{e}");
        assert!(parse("labels = [\"pid\"]\n").unwrap_err().contains("unknown label set"));
        assert!(parse("[profiles]\nmax_seconds = 0\n").is_err());
        assert!(parse("").unwrap().retrans.enabled, "on by default");
        assert!(c.retrans.argv().ends_with(&["--comm".to_string(), "nginx".to_string()]));
    }

    #[test]
    fn comm_filters_are_checked_before_anything_loads() {
        let c = parse("[cwnd]\ncomm = [\"nginx\", \"envoy\"]\n").unwrap();
        assert_eq!(c.cwnd.argv(), ["--comm", "nginx", "--comm", "envoy"]);
        let e = parse("[retrans]\ncomm = [\"a-name-the-kernel-cuts\"]\n").unwrap_err();
        assert!(e.starts_with("retrans.comm:") && e.contains("'a-name-the-kern'"), "{e}");
        let e = parse("[cwnd]\ncomm = [\"a\", \"b\", \"c\", \"d\", \"e\"]\n").unwrap_err();
        assert!(e.contains("at most 4"), "{e}");
        assert!(parse("[cwnd]\ncomm = [\"\"]\n").is_err());
    }
}
