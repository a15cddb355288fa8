//! `sonde drops`: every packet this host's kernel drops, with the kernel's
//! reason (read from its BTF), where it dropped it, the interface and
//! network namespace, the addresses and ports, and the owning socket's
//! process; per drop or counted in the kernel, beside the kernel's own
//! counters.
pub mod collect;
pub mod counters;
pub mod reasons;
pub mod tcdrop;

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    mem::MaybeUninit,
    net::IpAddr,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, MapFlags, OpenObject,
};
use serde_json::{json, Value};

use crate::engine::caps::{cannot, Caps};
use crate::engine::{
    attach::{self, with_fallbacks, Mechanism, Mechanisms},
    error::usage,
    features,
    flowfilter::{addr, FlowArgs, FlowFilter},
    output::{table, RunArgs, Sink},
    record::{self, cstr, percpu_sum},
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::{duration_arg, RunControl, Stop},
    slots::Slots,
    symbols::KernelSymbols,
    time::{epoch_secs, hms, mono_to_epoch},
};
use counters::Snapshot;
use reasons::Reasons;

crate::skeleton!("drops");
crate::pod!(types::dr_event, types::dr_key, types::sonde_owner);
use skel::{types, DropsSkel, DropsSkelBuilder};

/// `DR_NO_REASON`: the kernel passes no reason (before 5.17).
pub const NO_REASON: u32 = u32::MAX;
/// `DR_R_NOOP`: a QDISC_DROP by the noop qdisc (an inactive queue).
pub const NOOP: u32 = 0x4000_0000;
const F_OWNER: u8 = 1;
const F_L4: u8 = 4;
const F_NO_IP: u8 = 8;
const S_FILTERED: u32 = 2;
const S_LOST: u32 = 3;
const S_RATE_LIMITED: u32 = 4;
const S_COUNT_FULL: u32 = 5;
const S_OWNER_FULL: u32 = 6;
const S_NO_HEADER: u32 = 7;
const MAX_IFACES: usize = 4;
const MAX_PROTOS: usize = 8;
const MAX_REASONS: usize = 1024;
/// Owners handed to the kernel at start (its table's size).
const MAX_OWNERS: usize = 65536;

/// drops's mechanisms in fallback order.
pub const MECHANISMS: &Mechanisms = &[
    (Mechanism::TpBtf, "BTF-typed tracepoint"),
    (Mechanism::RawTp, "raw tracepoint"),
    (Mechanism::Tracepoint, "classic tracepoint (reads the trace record)"),
];

/// Show every packet the kernel drops, with its reason, place, flow and owner.
///
/// Uses the skb:kfree_skb tracepoint, through which the kernel passes every
/// packet it drops with the place (a kernel function) and, since Linux 5.17,
/// its reason; since 6.11 also the receiving socket. Reason names come from
/// the running kernel's BTF (no table compiled in), subsystem reasons
/// included where their module is loaded. The owner is the process of the
/// socket the drop names, never the task on the CPU (drops run in
/// softirq). Drops the kernel frees with no specific reason (NOT_SPECIFIED)
/// are told apart by their place. Before 5.17 there is no reason: every
/// packet kfree_skb frees is shown by its place, and some of those are not
/// drops. At the end, per network namespace watched (--netns, else this
/// one), each reason's count beside the kernel's own counter for it
/// (UdpNoPorts, UdpRcvbufErrors, TcpExtIPReversePathFilter, nftables rule
/// counters, qdisc drops, ...) and the drops no tracer sees (NIC ring
/// misses, the softnet backlog).
///
/// OVERHEAD (bench/drops/run: 420-450k drops/s, UDP to a closed port, the
/// most this 2-core VM makes; two runs): --count 95-97 ns per drop in the
/// kernel, 0.41-0.45x a bpftrace one-liner counting by reason (216-233 ns;
/// a program that returns at once costs 58-63 ns on either hook), and no
/// measurable CPU in user space; the flood kept 94-98% of its rate
/// (bpftrace: 86-89%). Streaming at the default --rate 1000: 150 ns per
/// drop, 0.2-0.3% of a core; every drop (--rate 0): 296-307 ns and 26-28%
/// of a core at 350k drops/s, none lost. With kernels before 6.2 (no typed
/// reads of packet headers) add about 40 ns per drop.
#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("One JSON object per line (drops, then a summary)")))]
#[command(mut_arg("output", |a| a.help("Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt")))]
pub struct DropsArgs {
    /// Count in the kernel by reason, place, namespace, interface and
    /// protocol; print the table of the most frequent at the end (see --top).
    #[arg(short = 'c', long)]
    pub count: bool,
    /// With --count, print the running table every INTERVAL (e.g. 5s).
    #[arg(short = 'i', long, value_parser = duration_arg, requires = "count")]
    pub interval: Option<Duration>,
    /// With --count, the table shows the N most frequent rows and one line
    /// for the rest (0: every row).
    #[arg(long, value_name = "N", default_value_t = 20, requires = "count")]
    pub top: usize,
    /// Only drops of this reason (the kernel's name without
    /// SKB_DROP_REASON_; repeatable or comma-separated).
    #[arg(long, value_name = "NAME", value_delimiter = ',', conflicts_with = "not_reason")]
    pub reason: Vec<String>,
    /// Every drop but those of this reason (repeatable or comma-separated).
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub not_reason: Vec<String>,
    /// Only this IP protocol: tcp, udp, icmp, icmpv6 or a number
    /// (repeatable or comma-separated, up to 8).
    #[arg(long, value_name = "PROTO", value_delimiter = ',')]
    pub proto: Vec<String>,
    /// Only drops on this interface, by name (repeatable, up to 4).
    #[arg(long, value_name = "NAME")]
    pub iface: Vec<String>,
    /// Which packets: ports, addresses, address family, the owner's process,
    /// thread name or cgroup, network namespaces.
    #[command(flatten)]
    pub flow: FlowArgs,
    /// Include the kernel stack of each drop.
    #[arg(long)]
    pub stack: bool,
    /// Drops shown per second per CPU at most (a burst of as many at once);
    /// the rest are counted, not shown. 0: every one.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub rate: u64,
    /// Force one attach mechanism instead of the best available.
    #[arg(long, value_parser = attach::parser(MECHANISMS))]
    pub mechanism: Option<Mechanism>,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Ring buffer size per CPU in KiB (power of two).
    #[arg(long, hide = true)]
    pub ringbuf_kib: Option<u32>,
    /// bench/drops: attach programs that return at once (the floor of a
    /// program on this tracepoint).
    #[arg(long, hide = true)]
    pub bench_empty: bool,
}

/// Everything the kernel half needs, validated before anything is loaded.
pub struct Config {
    flow: FlowFilter,
    /// 0: every reason; 1: only `reason_set`; 2: all but.
    reason_mode: u32,
    reason_set: Vec<u32>,
    ifaces: Vec<String>,
    protos: Vec<u8>,
    /// serve: counts per owner cgroup.
    pub by_cgroup: bool,
}

/// An IP protocol as `--proto` takes it.
fn proto_arg(s: &str) -> anyhow::Result<u8> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "icmpv6" | "ipv6-icmp" => 58,
        "udplite" => 136,
        "sctp" => 132,
        "gre" => 47,
        "esp" => 50,
        n => n.parse::<u8>().map_err(|_| {
            usage(format!("--proto {s}: not a protocol; give tcp, udp, icmp, icmpv6 or a number from 0 to 255"))
        })?,
    })
}

/// A protocol's name (its number where it has no common one).
pub fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        136 => "udplite".into(),
        132 => "sctp".into(),
        47 => "gre".into(),
        50 => "esp".into(),
        2 => "igmp".into(),
        0 => "hopopt".into(),
        n => n.to_string(),
    }
}

/// The protocol column: the IP protocol, or the link-layer type of a
/// packet that is not IP.
fn proto_of(ethertype: u16, l4: u8, no_ip: bool) -> String {
    if no_ip || !(ethertype == 0x0800 || ethertype == 0x86dd) {
        return match ethertype {
            0x0806 => "arp".into(),
            0 => "-".into(),
            e => format!("eth{e:#06x}"),
        };
    }
    proto_name(l4)
}

/// Checks the arguments against the running kernel's reasons.
pub fn validate(a: &DropsArgs, reasons: &Reasons) -> anyhow::Result<Config> {
    let flow = a.flow.validate()?;
    let names = |v: &[String], flag: &str| -> anyhow::Result<Vec<u32>> {
        if !v.is_empty() && !reasons.known {
            return Err(usage(format!(
                "{flag}: this kernel gives no drop reasons (they came in Linux 5.17); filter on the JSON's \"location\""
            )));
        }
        v.iter()
            .map(|n| {
                reasons.value(n).ok_or_else(|| {
                    usage(format!(
                        "{flag} {n}: not a drop reason of this kernel; its reasons are {}",
                        reasons.names().join(", ")
                    ))
                })
            })
            .collect()
    };
    let inc = names(&a.reason, "--reason")?;
    let exc = names(&a.not_reason, "--not-reason")?;
    if inc.len() + exc.len() > MAX_REASONS {
        return Err(usage(format!("at most {MAX_REASONS} reasons")));
    }
    if a.iface.len() > MAX_IFACES {
        return Err(usage(format!("at most {MAX_IFACES} --iface filters; trace all and filter the JSON on \"iface\"")));
    }
    for i in &a.iface {
        if i.is_empty() || i.len() > 15 || i.contains('/') {
            return Err(usage(format!(
                "--iface {i}: not an interface name (1 to 15 characters, as `ip link` shows them)"
            )));
        }
    }
    if a.proto.len() > MAX_PROTOS {
        return Err(usage(format!("at most {MAX_PROTOS} --proto filters")));
    }
    let protos = a.proto.iter().map(|p| proto_arg(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let (reason_mode, reason_set) = if !inc.is_empty() {
        (1, inc)
    } else if !exc.is_empty() {
        (2, exc)
    } else {
        (0, Vec::new())
    };
    Ok(Config { flow, reason_mode, reason_set, ifaces: a.iface.clone(), protos, by_cgroup: false })
}

impl Config {
    /// Whether filters other than --netns leave drops out.
    fn filters_beyond_netns(&self) -> bool {
        let f = &self.flow;
        self.reason_mode != 0
            || !self.ifaces.is_empty()
            || !self.protos.is_empty()
            || !f.ports.is_empty()
            || !f.cidrs.is_empty()
            || f.family != 0
            || !f.pids.is_empty()
            || !f.comms.is_empty()
            || f.cgroup.is_some()
    }
}

/// Loaded and attached BPF state; links detach when dropped (fd-based).
pub struct Loaded {
    /// The skeleton.
    pub skel: DropsSkel<'static>,
    links: Vec<Link>,
    rings: Option<PerCpuRings>,
    slots: Slots<types::dr_slot>,
}

/// Which program runs under `mech` with a tracepoint of `nargs` arguments.
fn role(name: &str, mech: Mechanism, nargs: usize) -> bool {
    use Mechanism::*;
    let n = nargs.min(4);
    match name {
        "drop_btf4" => mech == TpBtf && n == 4,
        "drop_btf3" => mech == TpBtf && n == 3,
        "drop_btf2" => mech == TpBtf && n == 2,
        "drop_raw4" => mech == RawTp && n == 4,
        "drop_raw3" => mech == RawTp && n == 3,
        "drop_raw2" => mech == RawTp && n == 2,
        "drop_tp" => mech == Tracepoint,
        "owner_socket" => features::tracepoint_exists("syscalls", "sys_exit_socket"),
        "owner_accept4" => features::tracepoint_exists("syscalls", "sys_exit_accept4"),
        "owner_accept" => features::tracepoint_exists("syscalls", "sys_exit_accept"),
        "owner_bind" => features::tracepoint_exists("syscalls", "sys_enter_bind"),
        "owner_connect" => features::tracepoint_exists("syscalls", "sys_enter_connect"),
        _ => false,
    }
}

/// The kfree_skb tracepoint's arguments on this kernel (2 before 5.17, 3,
/// 4 since 6.11), from its BTF or its trace record's fields.
fn kfree_skb_args() -> usize {
    features::tracepoint_btf_args("kfree_skb").unwrap_or_else(|| {
        if features::tracepoint_has_field("skb", "kfree_skb", "rx_sk") {
            4
        } else if features::tracepoint_has_field("skb", "kfree_skb", "reason") {
            3
        } else {
            2
        }
    })
}

/// Loads and attaches the drop programs and the owner hooks.
pub fn load(a: Option<&DropsArgs>, cfg: &Config, mech: Mechanism, count: bool) -> anyhow::Result<Loaded> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = DropsSkelBuilder::default().open(storage).context("opening BPF object")?;
    let stack = a.is_some_and(|a| a.stack);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.count_mode = count;
    ro.want_stack = stack;
    ro.bench_empty = a.is_some_and(|a| a.bench_empty);
    // Where a split kfree_skb leaves `location` (see drops.bpf.c).
    if let Some((lo, hi)) = crate::engine::symbols::kernel_function_range("kfree_skb") {
        (ro.kfree_lo, ro.kfree_hi) = (lo, hi);
    }
    ro.by_cgroup = cfg.by_cgroup;
    ro.reason_mode = cfg.reason_mode;
    let rate = a.map(|a| a.rate).unwrap_or(0);
    if let Some(ns) = 1_000_000_000u64.checked_div(rate) {
        ro.rate_ns = ns.max(1);
        ro.burst = rate;
    }
    ro.n_ifaces = cfg.ifaces.len() as u32;
    for (i, n) in cfg.ifaces.iter().enumerate() {
        for (d, b) in ro.ifaces[i].iter_mut().zip(n.bytes()) {
            *d = b as _;
        }
    }
    ro.n_protos = cfg.protos.len() as u32;
    for (i, p) in cfg.protos.iter().enumerate() {
        ro.protos[i] = *p;
    }
    crate::set_flow_rodata!(&mut *ro, &cfg.flow);
    if stack {
        open.maps.kstacks.set_max_entries(16384)?;
    }
    let ncpus = PerCpuRings::size_outer(&mut open.maps.sonde_rings)?;
    // Slots need compare-and-exchange (5.12); without, every drop is
    // counted in the hash.
    let use_slots = features::has_atomic_fetch();
    open.maps.rodata_data.as_deref_mut().expect("rodata present").use_slots = use_slots;
    open.maps.slots.set_max_entries((ncpus * SLOTS) as u32)?;
    let ring_bytes = ringbuf::ring_bytes_per_cpu(ncpus, a.and_then(|a| a.ringbuf_kib));
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.rb_wake_bytes = ringbuf::wake_bytes(ring_bytes as u64);
    let nargs = kfree_skb_args();
    let mut on = Vec::new();
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let r = role(&name, mech, nargs);
        prog.set_autoload(r);
        if r {
            on.push(name);
        }
        if !use_slots {
            features::poison_atomic_fetch(&mut prog).context("preparing the programs for a kernel before 5.12")?;
        }
    }
    let skel = open.load().with_context(|| format!("loading the {mech} program"))?;
    let slots = Slots::map(&skel.maps.slots, ncpus * SLOTS)?;
    for r in &cfg.reason_set {
        skel.maps.reason_set.update(&r.to_ne_bytes(), &[1], MapFlags::ANY)?;
    }
    preload_owners(&skel, cfg.flow.cgroup.as_ref());
    let rings = if count { None } else { Some(PerCpuRings::create(&skel.maps.sonde_rings, ring_bytes)?) };
    let mut links = Vec::new();
    for prog in skel.object().progs_mut() {
        if on.iter().any(|n| n.as_str() == prog.name().to_string_lossy()) {
            links.push(prog.attach().with_context(|| format!("attaching {}", prog.name().to_string_lossy()))?);
        }
    }
    Ok(Loaded { skel, links, rings, slots })
}

/// Slots per CPU (`DR_SLOTS`).
const SLOTS: usize = 256;

/// Who owns a socket, as /proc shows it.
#[derive(Debug, Clone)]
struct ProcOwner {
    pid: u32,
    comm: String,
    cgroup: u64,
}

/// Every process's sockets, by inode (at most [`MAX_OWNERS`]): the first
/// process found holding each.
fn proc_sockets() -> HashMap<u64, ProcOwner> {
    use crate::engine::procfd::{holders, Kind};
    let held = holders(|k, _| k == Kind::Socket, &std::collections::HashSet::new(), MAX_OWNERS);
    let mut cgroups: HashMap<u32, u64> = HashMap::new();
    held.by_inode
        .into_iter()
        .filter_map(|((_, ino), v)| {
            let h = v.into_iter().next()?;
            let cgroup = *cgroups.entry(h.pid).or_insert_with(|| crate::engine::cgroup::of_pid(h.pid).unwrap_or(0));
            Some((ino, ProcOwner { pid: h.pid, comm: h.comm, cgroup }))
        })
        .collect()
}

/// Hands the kernel the owners of the sockets that exist now (the hooks
/// see only sockets made after the start), with whether each is in the
/// `--cgroup` group (`cgroup`) now.
fn preload_owners(skel: &DropsSkel<'_>, cgroup: Option<&crate::engine::cgroup::CgroupTarget>) {
    let in_group = cgroup.map(|c| c.processes());
    for (ino, o) in proc_sockets() {
        let mut v = types::sonde_owner {
            pid: o.pid,
            tid: o.pid,
            cgroup: o.cgroup,
            in_cgroup: in_group.as_ref().is_some_and(|g| g.contains(&o.pid)) as u8,
            ..Default::default()
        };
        for (d, b) in v.comm[..15].iter_mut().zip(o.comm.bytes()) {
            *d = b as _;
        }
        let v = crate::engine::record::bytes_of(&v);
        if skel.maps.owners.update(&ino.to_ne_bytes(), v, MapFlags::NO_EXIST).is_err() {
            break;
        }
    }
}

/// The kernel's counts and the summary's counters, summed over CPUs.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// kfree_skb events that were drops (all frees without reasons).
    pub events: u64,
    /// ... that passed the filters.
    pub drops: u64,
    /// ... that did not.
    pub filtered: u64,
    /// Streamed drops the ring had no room for.
    pub lost: u64,
    /// Streamed drops over --rate: counted, not shown.
    pub rate_limited: u64,
    /// Drops the count table had no room for.
    pub count_full: u64,
    /// Socket owners not recorded: the table was full.
    pub owner_full: u64,
    /// Drops whose network header could not be read.
    pub no_header: u64,
    /// Drops the kernel skipped the program for (it was already running on the CPU).
    pub missed: u64,
}

fn read_totals(l: &Loaded, rows: &[Row]) -> anyhow::Result<Totals> {
    let s = |i| percpu_sum(&l.skel.maps.stats, i);
    let (filtered, count_full) = (s(S_FILTERED)?, s(S_COUNT_FULL)?);
    let drops = rows.iter().map(|r| r.n).sum::<u64>() + count_full;
    Ok(Totals {
        events: drops + filtered,
        drops,
        filtered,
        lost: s(S_LOST)?,
        rate_limited: s(S_RATE_LIMITED)?,
        count_full,
        owner_full: s(S_OWNER_FULL)?,
        no_header: s(S_NO_HEADER)?,
        missed: 0,
    })
}

/// One row of the count table: a key and its drops.
#[derive(Debug, Clone)]
pub struct Row {
    /// The kernel's key.
    pub key: types::dr_key,
    /// Drops.
    pub n: u64,
}

/// The count table, most drops first.
pub fn read_counts(l: &Loaded) -> anyhow::Result<Vec<Row>> {
    let map = &l.skel.maps.counts;
    // By the key's bytes: a key may be in several CPUs' slots and the hash.
    let mut by: HashMap<[u8; std::mem::size_of::<types::dr_key>()], Row> = HashMap::new();
    let mut add = |key: types::dr_key, n: u64| {
        // SAFETY: dr_key is plain old data (no padding the kernel leaves
        // unset: its `pad` is written as 0).
        let bytes: [u8; std::mem::size_of::<types::dr_key>()] = unsafe { std::mem::transmute(key) };
        by.entry(bytes).or_insert(Row { key, n: 0 }).n += n;
    };
    for k in map.keys() {
        let Some(key) = record::decode::<types::dr_key>(&k) else { continue };
        let Some(vals) = map.lookup_percpu(&k, MapFlags::ANY)? else { continue };
        add(key, vals.iter().map(|v| record::decode::<u64>(v).unwrap_or(0)).sum());
    }
    l.slots.each_published(std::mem::offset_of!(types::dr_slot, state), |s, word| {
        add(s.key, word(std::mem::offset_of!(types::dr_slot, n)))
    });
    let mut rows: Vec<Row> = by.into_values().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.n));
    Ok(rows)
}

/// sonde's counts by reason, protocol and IP version; drops whose reason
/// does not tell them apart (NOT_SPECIFIED, UNKNOWN before 5.17) by the
/// function that freed them too.
fn by_reason(rows: &[Row], namer: &mut Namer) -> counters::ByReason {
    let mut by = counters::ByReason::new();
    for r in rows {
        let k = &r.key;
        let fam = match k.ethertype {
            0x0800 => 4,
            0x86dd => 6,
            _ => 0,
        };
        let mut name = namer.reasons.name(k.reason);
        if name == "UNKNOWN" || name == "NOT_SPECIFIED" {
            let place = namer.place(k.location);
            name = format!("{name}@{}", place.split('+').next().unwrap_or(&place));
        }
        *by.entry((k.netns, name, k.l4, fam)).or_default() += r.n;
    }
    by
}

/// The namespaces' counters, each read between two readings of sonde's
/// counts (None where a namespace's counters are not readable).
fn bracket(watched: &[u32], l: &Loaded, namer: &mut Namer) -> anyhow::Result<Vec<(u32, Option<counters::Bracketed>)>> {
    let mut out = Vec::new();
    for &n in watched {
        let before = read_counts(l)?;
        let snap = Snapshot::read(n).ok();
        let after = read_counts(l)?;
        out.push((
            n,
            snap.map(|snap| counters::Bracketed {
                snap,
                before: by_reason(&before, namer),
                after: by_reason(&after, namer),
            }),
        ));
    }
    Ok(out)
}

/// Names what the user sees: reasons, kernel places, interfaces.
pub struct Namer {
    /// The kernel's drop reasons.
    pub reasons: Reasons,
    ksyms: KernelSymbols,
    places: HashMap<u64, String>,
    /// (netns, ifindex) → name, from the counters' link lists.
    pub ifnames: HashMap<(u32, u32), String>,
    owners: Option<HashMap<u64, ProcOwner>>,
    owners_at: Option<Instant>,
}

impl Namer {
    /// Names the interfaces a reading of the counters lists (names known
    /// already stay).
    fn learn_ifnames(&mut self, reading: &[(u32, Option<counters::Bracketed>)]) {
        for (n, s) in reading.iter().filter_map(|(n, s)| Some((n, s.as_ref()?))) {
            for l in &s.snap.links {
                self.ifnames.entry((*n, l.ifindex)).or_insert_with(|| l.name.clone());
            }
        }
    }

    /// For the running kernel.
    pub fn new(reasons: Reasons) -> Namer {
        Namer {
            reasons,
            ksyms: KernelSymbols::default(),
            places: HashMap::new(),
            ifnames: HashMap::new(),
            owners: None,
            owners_at: None,
        }
    }

    /// `function+0xoff` of a kernel address.
    pub fn place(&mut self, a: u64) -> String {
        if let Some(p) = self.places.get(&a) {
            return p.clone();
        }
        let p = self.ksyms.names(&[a]).pop().unwrap_or_else(|| format!("{a:#x}"));
        self.places.insert(a, p.clone());
        p
    }

    /// The owner of socket inode `ino` as /proc shows it (read again at
    /// most once a second).
    fn owner(&mut self, ino: u64) -> Option<ProcOwner> {
        if ino == 0 {
            return None;
        }
        let fresh = self.owners_at.is_some_and(|t| t.elapsed() < Duration::from_secs(1));
        if let Some(o) = self.owners.as_ref().and_then(|m| m.get(&ino)) {
            return Some(o.clone());
        }
        if !fresh {
            self.owners = Some(proc_sockets());
            self.owners_at = Some(Instant::now());
            return self.owners.as_ref().and_then(|m| m.get(&ino)).cloned();
        }
        None
    }

    fn iface(&self, netns: u32, ifindex: u32) -> String {
        if ifindex == 0 {
            return "-".into();
        }
        self.ifnames.get(&(netns, ifindex)).cloned().unwrap_or_else(|| format!("if{ifindex}"))
    }
}

/// TCP flags as tcpdump writes them (S, A, F, R, P, U, E, W).
fn tcp_flags(f: u8) -> String {
    let mut s = String::new();
    for (bit, c) in [(1, 'F'), (2, 'S'), (4, 'R'), (8, 'P'), (16, 'A'), (32, 'U'), (64, 'E'), (128, 'W')] {
        if f & bit != 0 {
            s.push(c);
        }
    }
    s
}

/// One `--json` drop (schema in the README).
#[derive(serde::Serialize)]
struct DropLine {
    #[serde(rename = "type")]
    ty: &'static str,
    time: f64,
    reason: String,
    reason_code: Option<u32>,
    location: String,
    iface: Option<String>,
    ifindex: u32,
    netns: u32,
    protocol: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    family: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    saddr: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daddr: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sport: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dport: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tcp_flags: Option<String>,
    pid: Option<u32>,
    comm: Option<String>,
    cgroup: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stack: Option<Vec<String>>,
}

/// Turns ring-buffer records into lines.
struct Printer {
    sink: Sink,
    json: bool,
    mono_to_epoch: i128,
    header_done: bool,
    error: Option<std::io::Error>,
    pending: Vec<types::dr_event>,
    namer: Namer,
}

impl Printer {
    fn event(&mut self, data: &[u8]) {
        if let Some(e) = record::decode::<types::dr_event>(data) {
            self.pending.push(e);
        }
    }

    fn print_pending(&mut self, skel: &DropsSkel<'_>) {
        let mut evs = std::mem::take(&mut self.pending);
        evs.sort_by_key(|e| e.ts);
        for e in &evs {
            if let Err(err) = self.one(e, skel) {
                self.error.get_or_insert(err);
            }
        }
    }

    fn one(&mut self, e: &types::dr_event, skel: &DropsSkel<'_>) -> std::io::Result<()> {
        let reason = self.namer.reasons.name(e.reason);
        let place = self.namer.place(e.location);
        let ip = e.flags & F_NO_IP == 0 && e.family != 0;
        let l4 = e.flags & F_L4 != 0;
        let proto = proto_of(e.ethertype, e.l4, !ip);
        let fam = e.family as u16;
        let (pid, comm, cgroup) = if e.flags & F_OWNER != 0 {
            (Some(e.pid), Some(cstr(&e.comm)), Some(e.cgroup))
        } else if let Some(o) = self.namer.owner(e.sock_ino) {
            (Some(o.pid), Some(o.comm), Some(o.cgroup))
        } else {
            (None, None, None)
        };
        let ifname = cstr(&e.ifname);
        let iface = if e.ifindex == 0 {
            None
        } else if ifname.is_empty() {
            Some(self.namer.iface(e.netns, e.ifindex))
        } else {
            Some(ifname)
        };
        let stack = (e.kstack >= 0).then(|| {
            let ips = skel
                .maps
                .kstacks
                .lookup(&(e.kstack as u32).to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|b| {
                    b.chunks_exact(8)
                        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                        .take_while(|&a| a != 0)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            ips.iter().map(|&a| self.namer.place(a)).collect::<Vec<_>>()
        });
        if self.json {
            let line = DropLine {
                ty: "drop",
                time: epoch_secs(e.ts, self.mono_to_epoch),
                reason,
                reason_code: (e.reason != NO_REASON).then_some(e.reason & !NOOP),
                location: place,
                iface,
                ifindex: e.ifindex,
                netns: e.netns,
                protocol: proto,
                family: ip.then_some(if fam == 2 { 4 } else { 6 }),
                saddr: ip.then(|| addr(fam, &e.saddr)),
                daddr: ip.then(|| addr(fam, &e.daddr)),
                sport: l4.then_some(e.sport),
                dport: l4.then_some(e.dport),
                tcp_flags: (l4 && e.l4 == 6).then(|| tcp_flags(e.tcp_flags)),
                pid,
                comm,
                cgroup,
                stack,
            };
            return self.sink.json(&line);
        }
        if !self.header_done {
            self.header_done = true;
            self.sink.line(&format!(
                "{:<12} {:<22} {:<30} {:<8} {:<10} {:<6} {:<45} {}",
                "TIME(UTC)", "REASON", "LOCATION", "IFACE", "NETNS", "PROTO", "SOURCE -> DESTINATION", "OWNER"
            ))?;
        }
        let flow = if !ip {
            "-".to_string()
        } else {
            let end = |a: &[u8; 16], p: u16| match (addr(fam, a), l4) {
                (IpAddr::V4(v), true) => format!("{v}:{p}"),
                (IpAddr::V6(v), true) => format!("[{v}]:{p}"),
                (x, false) => x.to_string(),
            };
            let mut f = format!("{} -> {}", end(&e.saddr, e.sport), end(&e.daddr, e.dport));
            if l4 && e.l4 == 6 {
                f.push_str(&format!(" [{}]", tcp_flags(e.tcp_flags)));
            }
            f
        };
        let owner = match (pid, comm) {
            (Some(p), Some(c)) => format!("{p} {c}"),
            _ => "-".into(),
        };
        self.sink.line(&format!(
            "{:<12} {:<22} {:<30} {:<8} {:<10} {:<6} {:<45} {}",
            hms((e.ts as i128 + self.mono_to_epoch) as u64),
            reason,
            place,
            iface.unwrap_or_else(|| "-".into()),
            e.netns,
            proto,
            flow,
            owner
        ))?;
        for s in stack.unwrap_or_default() {
            self.sink.line(&format!("        {s}"))?;
        }
        Ok(())
    }
}

/// The count table (the first `top` rows and a line for the rest), or
/// every row as a JSON line.
fn print_counts(sink: &mut Sink, json_out: bool, rows: &[Row], top: usize, namer: &mut Namer) -> std::io::Result<()> {
    if json_out {
        for r in rows {
            let k = &r.key;
            sink.json(&json!({
                "type": "count",
                "reason": namer.reasons.name(k.reason),
                "location": namer.place(k.location),
                "netns": k.netns,
                "ifindex": k.ifindex,
                "iface": (k.ifindex != 0).then(|| namer.iface(k.netns, k.ifindex)),
                "protocol": proto_of(k.ethertype, k.l4, false),
                "drops": r.n,
            }))?;
        }
        return Ok(());
    }
    let shown = if top == 0 { rows.len() } else { top.min(rows.len()) };
    let body: Vec<Vec<String>> = rows[..shown]
        .iter()
        .map(|r| {
            let k = &r.key;
            vec![
                namer.reasons.name(k.reason),
                namer.place(k.location),
                k.netns.to_string(),
                namer.iface(k.netns, k.ifindex),
                proto_of(k.ethertype, k.l4, false),
                r.n.to_string(),
            ]
        })
        .collect();
    sink.line(&table(&["REASON", "LOCATION", "NETNS", "IFACE", "PROTO", "DROPS"], &body))?;
    if rows.len() > shown {
        let rest: u64 = rows[shown..].iter().map(|r| r.n).sum();
        sink.line(&format!("... and {} more rows: {rest} drops", rows.len() - shown))?;
    }
    Ok(())
}

/// What a finished run saw.
pub struct Outcome {
    /// The kernel's totals.
    pub totals: Totals,
    /// Drops by (netns, reason name, IP protocol, family 4/6/0).
    pub by_reason: counters::ByReason,
    /// The counters' comparison, per namespace watched.
    pub relations: Vec<counters::Relation>,
    /// Why it stopped.
    pub stop: Stop,
}

/// How drops runs on this kernel (`sonde doctor`).
pub fn doctor(cx: &Caps) -> Value {
    if !features::tracepoint_exists("skb", "kfree_skb") && features::tracepoint_btf_args("kfree_skb").is_none() {
        return cannot("kernel has no skb:kfree_skb tracepoint");
    }
    let Some((m, _)) = MECHANISMS.iter().copied().find(|(m, _)| cx.ok(m.name())) else {
        return cannot("neither tp_btf, raw_tp nor classic tracepoints load");
    };
    let n = kfree_skb_args();
    let reasons = Reasons::load();
    json!({
        "usable": true,
        "mechanism": m.to_string(),
        "reasons": if reasons.known { json!(reasons.names().len()) } else { json!(null) },
        "receiving_socket": n >= 4,
        "detail": match n {
            0..=2 => "this kernel passes no drop reasons (they came with Linux 5.17): every packet kfree_skb frees is shown by the kernel function that freed it, and some are not drops".to_string(),
            3 => format!("{} drop reasons from the kernel's BTF; the receiving socket is not passed (Linux 6.11+): owners from the packet's socket", reasons.names().len()),
            _ => format!("{} drop reasons from the kernel's BTF, with the receiving socket", reasons.names().len()),
        },
    })
}

/// Runs `sonde drops`.
pub fn run(a: &DropsArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    let out = run_with(a, &ctl, |r: &Reasons| {
        eprintln!(
            "sonde: tracing packet drops{}; Ctrl-C ends with a summary",
            if r.known { "" } else { " (this kernel gives no reasons: every kfree_skb, by place)" }
        );
    })?;
    Ok(out.stop.exit_code())
}

/// Runs `sonde drops`; `ready` is called once everything is attached.
pub fn run_with(a: &DropsArgs, ctl: &RunControl, ready: impl FnOnce(&Reasons)) -> anyhow::Result<Outcome> {
    let reasons = Reasons::load();
    let cfg = validate(a, &reasons)?;
    let out = a.run.output("drops", &[(".json", true), (".txt", false), (".log", false)])?;
    let json_out = a.run.json || out.is_some_and(|(_, json)| json);
    features::require_tracing_privileges()?;
    let sink = Sink::open(a.run.path())?;
    // The namespaces whose counters are compared: --netns's, else ours.
    let watched: Vec<u32> = if cfg.flow.netns.is_empty() {
        crate::engine::mib::own_netns().into_iter().collect()
    } else {
        cfg.flow.netns.clone()
    };
    let order = attach::order(MECHANISMS, a.mechanism);
    let (mut loaded, mech, _fails) = with_fallbacks("skb:kfree_skb", &order, |m| load(Some(a), &cfg, m, a.count))?;
    let mut namer = Namer::new(reasons);
    // The counters are read once sonde counts, so that every drop after
    // this reading is on both sides.
    let before = bracket(&watched, &loaded, &mut namer)?;
    let start = Instant::now();
    ready(&namer.reasons);
    namer.learn_ifnames(&before);
    let printer = Rc::new(RefCell::new(Printer {
        sink,
        json: json_out,
        mono_to_epoch: mono_to_epoch(),
        header_done: false,
        error: None,
        pending: Vec::new(),
        namer,
    }));
    let rb = match &loaded.rings {
        Some(r) => {
            let p = printer.clone();
            Some(r.reader(move |data: &[u8]| p.borrow_mut().event(data))?)
        }
        None => None,
    };
    let skel = &loaded.skel;
    let stop = poll_until_stop(rb.as_ref(), ctl, a.interval, |due| {
        let mut p = printer.borrow_mut();
        p.print_pending(skel);
        if let Some(e) = p.error.take() {
            return Err(e.into());
        }
        if due {
            let rows = read_counts(&loaded)?;
            if !p.json {
                p.sink.line(&format!("\n{:.0}s in:", start.elapsed().as_secs_f64()))?;
            }
            let (j, top) = (p.json, a.top);
            let Printer { sink, namer, .. } = &mut *p;
            print_counts(sink, j, &rows, top, namer)?;
        }
        p.sink.flush()?;
        Ok(())
    })?;
    // ... and again before it stops counting.
    let after = bracket(&watched, &loaded, &mut printer.borrow_mut().namer)?;
    // Interfaces made during the run, named from the second reading.
    printer.borrow_mut().namer.learn_ifnames(&after);
    let missed: u64 = loaded
        .skel
        .object()
        .progs()
        .filter(|p| p.name().to_string_lossy().starts_with("drop_"))
        .map(|p| attach::recursion_misses(&p))
        .sum();
    drop(std::mem::take(&mut loaded.links));
    if let (Some(rings), Some(rb)) = (&loaded.rings, &rb) {
        rings.wait_for_programs(&loaded.skel.maps.sonde_rings)?;
        rb.consume().context("reading the ring buffers")?;
    }
    drop(rb);
    let mut p = printer.borrow_mut();
    p.print_pending(&loaded.skel);
    if let Some(e) = p.error.take() {
        return Err(e.into());
    }
    let rows = read_counts(&loaded)?;
    let mut totals = read_totals(&loaded, &rows)?;
    totals.missed = missed;
    if a.count {
        if !p.json {
            p.sink.line("")?;
        }
        let j = p.json;
        let Printer { sink, namer, .. } = &mut *p;
        print_counts(sink, j, &rows, a.top, namer)?;
    }
    let by_reason = by_reason(&rows, &mut p.namer);
    let how = counters::Compare { reasons_known: p.namer.reasons.known, filtered: cfg.filters_beyond_netns() };
    let mut relations = Vec::new();
    for ((n, b), (_, a2)) in before.iter().zip(after.iter()) {
        if let (Some(b), Some(a2)) = (b, a2) {
            relations.extend(counters::relations(*n, b, a2, how));
        }
    }
    let elapsed = start.elapsed();
    if p.json {
        let reasons_json: BTreeMap<String, u64> = by_reason.iter().fold(BTreeMap::new(), |mut m, ((_, r, _, _), n)| {
            *m.entry(r.clone()).or_default() += n;
            m
        });
        let invisible: Vec<Value> = after
            .iter()
            .zip(before.iter())
            .filter_map(|((n, a2), (_, b))| Some(counters::invisible_json(*n, &b.as_ref()?.snap, &a2.as_ref()?.snap)))
            .collect();
        let known = p.namer.reasons.known;
        p.sink.json(&json!({
            "type": "summary",
            "mechanism": mech.to_string(),
            "reasons_known": known,
            "drops": totals.drops,
            "events": totals.events,
            "filtered": totals.filtered,
            "lost": totals.lost,
            "rate_limited": totals.rate_limited,
            "missed": totals.missed,
            "map_full": {"counts": totals.count_full, "owners": totals.owner_full},
            "no_header": totals.no_header,
            "by_reason": reasons_json,
            "counters": relations.iter().map(|r| r.json()).collect::<Vec<_>>(),
            "counters_filtered": how.filtered,
            "out_of_view": invisible,
            "duration_s": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        }))?;
    } else {
        let mut s = format!("\nSummary ({:.1}s, {mech}):\n", elapsed.as_secs_f64());
        let mut per: BTreeMap<String, u64> = BTreeMap::new();
        for ((_, r, _, _), n) in &by_reason {
            *per.entry(r.clone()).or_default() += n;
        }
        let mut body: Vec<Vec<String>> = per.iter().map(|(r, n)| vec![r.clone(), n.to_string()]).collect();
        body.sort_by(|a, b| b[1].parse::<u64>().unwrap_or(0).cmp(&a[1].parse::<u64>().unwrap_or(0)));
        s.push_str(&table(&["REASON", "DROPS"], &body));
        s.push_str(&format!(
            "\ndrops: {} ({} filtered out); not shown: {} over --rate, {} lost (ring full), {} missed (the kernel skipped the program on a busy CPU); map full: counts {} owners {}",
            totals.drops, totals.filtered, totals.rate_limited, totals.lost, totals.missed, totals.count_full, totals.owner_full
        ));
        let noop: u64 = per.iter().filter(|(r, _)| r.ends_with(reasons::NOOP_SUFFIX)).map(|(_, n)| n).sum();
        if noop > 0 {
            s.push_str(&format!(
                "\nQDISC_DROP/noop: {noop} packets sent while an interface's queue was inactive (the interface down or without carrier yet, or its qdisc being replaced): the built-in noop qdisc freed them, and no tc counter counts them"
            ));
        }
        if how.filtered {
            s.push_str("\nfilters beyond --netns are in effect: sonde's counts below are of the drops they pass, at most the kernel's");
        }
        if !p.namer.reasons.known {
            s.push_str("\nthis kernel passes no drop reasons (they came with Linux 5.17): every packet kfree_skb freed is shown by the function that freed it, and some of those are not drops");
        }
        for (n, b) in &before {
            let a2 = after.iter().find(|x| x.0 == *n).and_then(|x| x.1.as_ref());
            match (b, a2) {
                (Some(b), Some(a2)) => {
                    let (b, a2) = (&b.snap, &a2.snap);
                    let rel: Vec<&counters::Relation> = relations.iter().filter(|r| r.netns == *n).collect();
                    s.push_str(&format!("\n\nkernel counters in network namespace {n}, over the run:\n"));
                    s.push_str(&counters::relation_table(&rel));
                    s.push('\n');
                    s.push_str(counters::invisible_text(b, a2).trim_end());
                }
                _ => s.push_str(&format!("\n\nkernel counters in network namespace {n}: not readable")),
            }
        }
        p.sink.line(&s)?;
    }
    p.sink.flush()?;
    Ok(Outcome { totals, by_reason, relations, stop })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_has_a_role_and_one_drop_handler_runs() {
        for mech in [Mechanism::TpBtf, Mechanism::RawTp, Mechanism::Tracepoint] {
            for n in 2..=5 {
                let handlers =
                    ["drop_btf4", "drop_btf3", "drop_btf2", "drop_raw4", "drop_raw3", "drop_raw2", "drop_tp"]
                        .iter()
                        .filter(|p| role(p, mech, n))
                        .count();
                assert_eq!(handlers, 1, "{mech} with {n} arguments");
            }
        }
    }

    #[test]
    fn protocols_and_flags_read_as_people_write_them() {
        assert_eq!(proto_arg("UDP").unwrap(), 17);
        assert_eq!(proto_arg("253").unwrap(), 253);
        assert!(proto_arg("udpx").is_err());
        assert_eq!(proto_of(0x0800, 17, false), "udp");
        assert_eq!(proto_of(0x0806, 0, true), "arp");
        assert_eq!(tcp_flags(0x12), "SA");
    }
}
