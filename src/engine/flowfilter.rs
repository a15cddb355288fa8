//! TCP flows for the socket tools (retrans, cwnd): the filter flags they
//! share (`--port`, `--addr`, `-4/-6`, `-p`, `--comm`, `--cgroup`, `--netns`), their
//! validation, the values the kernel half (src/bpf/flow.h) reads, and how a
//! flow is printed.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use clap::Args;
use ipnet::IpNet;

use super::{cgroup::CgroupTarget, error::usage, netns::netns_inode};

/// Limits of the kernel half's filter lists (flow.h).
pub const MAX_PORTS: usize = 8;
/// See [`MAX_PORTS`].
pub const MAX_CIDRS: usize = 8;
/// See [`MAX_PORTS`].
pub const FLOW_MAX_PIDS: usize = 16;
/// See [`MAX_PORTS`].
pub const MAX_NETNS: usize = 8;
/// See [`MAX_PORTS`].
pub const MAX_COMMS: usize = 4;
/// The kernel keeps a task's name in 16 bytes with its NUL.
pub const COMM_MAX: usize = 15;

/// Which connections a socket tool looks at.
#[derive(Debug, Args, Clone, Default)]
pub struct FlowArgs {
    /// Only flows with this local or remote port (repeatable, up to 8).
    #[arg(long, value_parser = port_arg)]
    pub port: Vec<u16>,
    /// Only flows with an end in this address or CIDR, v4 or v6 (repeatable, up to 8).
    #[arg(long, value_parser = cidr_arg)]
    pub addr: Vec<IpNet>,
    /// IPv4 only.
    #[arg(short = '4', long = "ipv4", conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 only.
    #[arg(short = '6', long = "ipv6")]
    pub ipv6: bool,
    /// Only sockets owned by this process (repeatable, up to 16).
    #[arg(short = 'p', long = "pid")]
    pub pid: Vec<u32>,
    /// Only sockets owned by a task of this name (repeatable, up to 4):
    /// the comm of the thread that connected, listened or accepted, as
    /// `ps -L` shows it (at most 15 bytes).
    #[arg(long, value_name = "NAME")]
    pub comm: Vec<String>,
    /// Only sockets owned by a process in this cgroup or below it: a cgroup
    /// v2 directory, or a cgroup v1 controller's (/sys/fs/cgroup/cpu/...).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Only sockets in this network namespace (repeatable, up to 8): a name
    /// from `ip netns list`, /run/netns/NAME, /proc/PID/ns/net or an inode.
    #[arg(long)]
    pub netns: Vec<String>,
}

/// Parses a `--port` value: 1 to 65535.
pub fn port_arg(s: &str) -> Result<u16, String> {
    match s.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
        _ => Err(format!("'{s}' is not a TCP port; give a number from 1 to 65535")),
    }
}

fn cidr_arg(s: &str) -> Result<IpNet, String> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n);
    }
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(a));
    }
    Err(format!("'{s}' is not an address or CIDR; write it like 10.0.0.0/8, 192.0.2.7 or 2001:db8::/32"))
}

/// The validated filters, as the kernel half takes them.
#[derive(Debug, Clone, Default)]
pub struct FlowFilter {
    /// Ports, either end.
    pub ports: Vec<u16>,
    /// Networks, either end.
    pub cidrs: Vec<IpNet>,
    /// 0 (both), 2 (AF_INET) or 10 (AF_INET6).
    pub family: u16,
    /// Owner processes.
    pub pids: Vec<u32>,
    /// Owner thread names.
    pub comms: Vec<String>,
    /// Owners in this cgroup or below it (None: any).
    pub cgroup: Option<CgroupTarget>,
    /// Namespace inodes.
    pub netns: Vec<u32>,
}

impl FlowArgs {
    /// Checks the limits and resolves cgroup and namespaces; usage errors
    /// (exit 2) name the flag and the fix.
    pub fn validate(&self) -> anyhow::Result<FlowFilter> {
        if self.port.len() > MAX_PORTS {
            return Err(usage(format!(
                "at most {MAX_PORTS} --port filters; use fewer or trace all and filter the JSON"
            )));
        }
        if self.addr.len() > MAX_CIDRS {
            return Err(usage(format!("at most {MAX_CIDRS} --addr filters; merge them into wider CIDRs")));
        }
        if self.pid.len() > FLOW_MAX_PIDS {
            return Err(usage(format!("at most {FLOW_MAX_PIDS} --pid filters; use --cgroup for a group of processes")));
        }
        for p in &self.pid {
            if !super::pid_exists(*p) {
                return Err(usage(format!("--pid {p}: no such process; check the pid with `pgrep`")));
            }
        }
        if self.netns.len() > MAX_NETNS {
            return Err(usage(format!(
                "at most {MAX_NETNS} --netns filters; trace all and filter the JSON on \"netns\""
            )));
        }
        if self.comm.len() > MAX_COMMS {
            return Err(usage(format!("at most {MAX_COMMS} --comm filters; use --cgroup for a group of processes")));
        }
        for c in &self.comm {
            check_comm(c)?;
        }
        let cgroup = self.cgroup.as_deref().map(CgroupTarget::resolve).transpose()?;
        let family = if self.ipv4 {
            2
        } else if self.ipv6 {
            10
        } else {
            0
        };
        let netns = self.netns.iter().map(|n| netns_inode(n)).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(FlowFilter {
            ports: self.port.clone(),
            cidrs: self.addr.clone(),
            family,
            pids: self.pid.clone(),
            comms: self.comm.clone(),
            cgroup,
            netns,
        })
    }
}

/// A `--comm` value: a name the kernel can hold whole, or the match would
/// never hit.
pub fn check_comm(c: &str) -> anyhow::Result<()> {
    if c.is_empty() || c.contains('\0') {
        return Err(usage(format!("--comm '{}': give a task name as `ps -L -o comm` shows it", c.escape_debug())));
    }
    if c.len() > COMM_MAX {
        let cut = String::from_utf8_lossy(&c.as_bytes()[..COMM_MAX]).into_owned();
        return Err(usage(format!(
            "--comm '{c}' is longer than the kernel keeps ({COMM_MAX} bytes); use '{cut}', the name the kernel shows"
        )));
    }
    Ok(())
}

impl FlowFilter {
    /// A network as flow.h's `struct sonde_cidr` holds it: (family, prefix, address bytes).
    pub fn cidr_parts(n: &IpNet) -> (u16, u16, [u8; 16]) {
        let mut addr = [0u8; 16];
        let family = match n.network() {
            IpAddr::V4(v4) => {
                addr[..4].copy_from_slice(&v4.octets());
                2
            }
            IpAddr::V6(v6) => {
                addr.copy_from_slice(&v6.octets());
                10
            }
        };
        (family, n.prefix_len() as u16, addr)
    }
}

/// Sets flow.h's read-only filter globals in a skeleton's rodata (each
/// skeleton has its own Rust types for them, hence a macro).
#[macro_export]
macro_rules! set_flow_rodata {
    ($ro:expr, $f:expr) => {{
        let (ro, f) = ($ro, $f);
        ro.family_filter = f.family;
        ro.n_ports = f.ports.len() as u32;
        for (i, p) in f.ports.iter().enumerate() {
            ro.ports[i] = *p;
        }
        ro.n_cidrs = f.cidrs.len() as u32;
        for (i, n) in f.cidrs.iter().enumerate() {
            let (family, prefix, addr) = $crate::engine::flowfilter::FlowFilter::cidr_parts(n);
            ro.cidrs[i].family = family;
            ro.cidrs[i].prefix = prefix;
            ro.cidrs[i].addr = addr;
        }
        ro.n_pids = f.pids.len() as u32;
        for (i, p) in f.pids.iter().enumerate() {
            ro.pids[i] = *p;
        }
        $crate::set_cgroup_filter!(&mut *ro, f.cgroup.as_ref());
        ro.n_netns = f.netns.len() as u32;
        for (i, n) in f.netns.iter().enumerate() {
            ro.netns_ids[i] = *n;
        }
        ro.n_comms = f.comms.len() as u32;
        for (i, c) in f.comms.iter().enumerate() {
            for (d, b) in ro.comms[i].iter_mut().zip(c.bytes()) {
                *d = b as _;
            }
        }
    }};
}

/// An address of a flow (`family` 2 or 10).
pub fn addr(family: u16, b: &[u8; 16]) -> IpAddr {
    if family == 2 {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*b))
    }
}

/// `a.b.c.d:port` or `[v6]:port`.
pub fn endpoint(family: u16, a: &[u8; 16], port: u16) -> String {
    match addr(family, a) {
        IpAddr::V4(v) => format!("{v}:{port}"),
        IpAddr::V6(v) => format!("[{v}]:{port}"),
    }
}

/// TCP state names (include/net/tcp_states.h).
pub fn tcp_state(s: u8) -> &'static str {
    match s {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}

/// Congestion-control states (enum tcp_ca_state).
pub fn ca_state(s: u8) -> &'static str {
    match s {
        0 => "open",
        1 => "disorder",
        2 => "cwr",
        3 => "recovery",
        4 => "loss",
        _ => "unknown",
    }
}

/// A flow and its owner as the socket tools print them in JSON (flattened
/// into each event line).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FlowJson {
    /// Socket cookie (`ss -e` prints it as sk:<hex>).
    pub cookie: u64,
    /// 4 or 6.
    pub family: u8,
    /// Local address.
    pub saddr: IpAddr,
    /// Local port.
    pub sport: u16,
    /// Remote address.
    pub daddr: IpAddr,
    /// Remote port.
    pub dport: u16,
    /// Network namespace inode.
    pub netns: u32,
    /// Owner pid, when known.
    pub pid: Option<u32>,
    /// Owner comm, when known.
    pub comm: Option<String>,
}

impl FlowJson {
    /// From the kernel half's flow fields (`family` 2 or 10) and owner.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cookie: u64,
        family: u16,
        saddr: &[u8; 16],
        sport: u16,
        daddr: &[u8; 16],
        dport: u16,
        netns: u32,
        owner: Option<(u32, &[i8; 16])>,
    ) -> Self {
        FlowJson {
            cookie,
            family: if family == 2 { 4 } else { 6 },
            saddr: addr(family, saddr),
            sport,
            daddr: addr(family, daddr),
            dport,
            netns,
            pid: owner.map(|o| o.0),
            comm: owner.map(|o| super::record::cstr(o.1)),
        }
    }
}
