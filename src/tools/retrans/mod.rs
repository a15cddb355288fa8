//! `sonde retrans`: every TCP retransmission with its cause, flow, state and
//! owning process; per event or counted in the kernel.
mod baseline;
pub mod collect;
mod names;

use std::{
    cell::RefCell,
    collections::BTreeMap,
    mem::MaybeUninit,
    net::IpAddr,
    rc::Rc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use clap::{Args, ValueEnum};
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, MapCore, OpenObject,
};
use serde_json::{json, Value};

pub use names::KINDS;

use crate::engine::caps::{cannot, Caps};
use crate::engine::{
    attach::{self, recursion_misses, with_fallbacks, Mechanism, Mechanisms},
    error::usage,
    features,
    flowfilter::{addr, ca_state, endpoint, tcp_state, FlowArgs, FlowFilter},
    output::{table, RunArgs, Sink},
    record::percpu_sum,
    record::{self, cstr},
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::{duration_arg, RunControl, Stop},
    slots::Slots,
    symbols::KernelSymbols,
    time::{clock_ns, epoch_secs, hms, mono_to_epoch},
};

crate::skeleton!("retrans");
crate::pod!(types::rt_event, types::rt_flow, types::rt_flow_stats, types::rt_group, types::rt_group_stats);
use skel::{types, RetransSkel, RetransSkelBuilder};

const KIND_MAX: usize = 7;
const STAT_SEGS: usize = KIND_MAX;
const STAT_LOST: usize = 2 * KIND_MAX;
const STAT_FLOW_FULL: usize = STAT_LOST + 1;
const STAT_OWNER_FULL: usize = STAT_LOST + 2;
const STAT_FILTERED: usize = STAT_LOST + 3;
const STAT_UNREADABLE: usize = STAT_LOST + 4;
const STAT_FILTERED_SEGS: usize = STAT_LOST + 5;
const STAT_UNSEEN_SEGS: usize = STAT_LOST + 6;
const STAT_GROUP_FULL: usize = STAT_LOST + 7;
const STAT_MAX: usize = STAT_LOST + 8;
const MAX_ERRNO: u32 = 256;
/// Slots of the failed-attempt map: errnos, then positive verdicts (retrans.h).
const ERR_SLOTS: u32 = MAX_ERRNO + 8;

/// A retransmission cause, as `--kind` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Kind {
    /// First retransmit after the retransmission timer fired.
    Rto,
    /// Tail loss probe that re-sent the last segment.
    Tlp,
    /// Fast retransmit or RACK (loss detected from ACKs).
    Fast,
    /// Retransmits while in Loss state after an RTO.
    LossRecovery,
    /// SYN retransmit of a connecting socket.
    Syn,
    /// SYN-ACK retransmit of a listener.
    Synack,
    /// Attempts that did not go out (needs --failed to print).
    Failed,
}

/// retrans's mechanisms in fallback order (`--mechanism` forces one; doctor
/// reports the first that loads).
pub const MECHANISMS: &Mechanisms = &[
    (Mechanism::TpBtf, "BTF-typed tracepoints"),
    (Mechanism::RawTp, "raw tracepoints"),
    (Mechanism::Tracepoint, "classic tracepoints (reads the trace record)"),
];

/// Trace TCP retransmissions with their cause, flow, state and owner.
///
/// Causes: RTO, TLP, fast/RACK, loss recovery, SYN, SYN-ACK. Uses the tcp:tcp_retransmit_skb and tcp:tcp_retransmit_synack tracepoints
/// (tp_btf, else raw_tp, else classic). Never reads /proc/net/tcp.
///
/// Retransmits the kernel made with no tracepoint run (some kernels skip
/// tracers while PID 1 is on the CPU: see `sonde doctor`) are found in the
/// sockets' own counters at their next state change (connect, close, ...)
/// and reported as unseen_segs, of no known kind.
///
/// OVERHEAD (bench/retrans/run, 80k SYN_SENT sockets, 23k SYN retransmits/s,
/// 2-core VM): streaming every event as JSON to a file 1.8-2.3% of one core,
/// 0 lost (a bpftrace printf one-liner: 4.9-5.6%); --count 0.1% while it runs,
/// and 0.49-0.54% (median of 5 runs) over a whole 10 s run including its end
/// report of 137k flows (read in place from 29 MB of slots it allocates in the
/// kernel), where the same run with no load costs 0.39-0.48%; in the kernel
/// 450-560 ns per event streaming, 670-690 ns with --count (bpftrace's:
/// 7,000-8,000 ns; an empty program: 58-63 ns). About 60% of it is the
/// socket's owner record, cold with 80k sockets (265-340 ns). Events reach the
/// output within 50 ms. At ordinary retransmit rates (< 1k/s) the cost is
/// negligible.
#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("One JSON object per line (events, then a summary)")))]
#[command(mut_arg("output", |a| a.help("Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt")))]
pub struct RetransArgs {
    /// Count in the kernel per flow and kind; print a table of the flows with
    /// the most retransmits at the end (see --top).
    #[arg(short = 'c', long)]
    pub count: bool,
    /// With --count, print the running table every INTERVAL (e.g. 5s).
    #[arg(short = 'i', long, value_parser = duration_arg, requires = "count")]
    pub interval: Option<Duration>,
    /// With --count, the table shows the N flows with the most retransmits
    /// and one line for the rest (0: every flow). --json lists every flow.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TOP, requires = "count")]
    pub top: usize,
    /// Which connections.
    #[command(flatten)]
    pub flow: FlowArgs,
    /// Only these causes (comma-separated or repeated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kind: Vec<Kind>,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Include the kernel stack of each retransmission.
    #[arg(long)]
    pub stack: bool,
    /// Also print attempts that did not go out (err != 0) as kind "failed".
    #[arg(long)]
    pub failed: bool,
    /// Force one attach mechanism instead of the best available.
    #[arg(long, value_parser = attach::parser(MECHANISMS))]
    pub mechanism: Option<Mechanism>,
    /// Ring buffer size per CPU in KiB (power of two; default: 8 MiB shared
    /// out over the CPUs, 256 KiB to 2 MiB each).
    #[arg(long, hide = true)]
    pub ringbuf_kib: Option<u32>,
    /// Bench only: run a baseline program instead (bench/retrans/run).
    #[arg(long, hide = true, value_enum)]
    pub bench_baseline: Option<baseline::Baseline>,
}

/// Flows the `--count` table shows by default: a SYN storm leaves tens of
/// thousands, and the top ones are what a person reads.
pub const DEFAULT_TOP: usize = 20;

/// Everything the kernel half needs, validated before anything is loaded.
struct Config {
    flow: FlowFilter,
    kind_mask: u32,
    /// serve: no per-flow table, only the totals.
    flows_off: bool,
    /// serve: counts per owner cgroup and kind too.
    by_cgroup: bool,
}

fn validate(a: &RetransArgs) -> anyhow::Result<Config> {
    let flow = a.flow.validate()?;
    let mut kind_mask = 0u32;
    for k in &a.kind {
        kind_mask |= 1 << (*k as u32);
    }
    if a.kind.contains(&Kind::Failed) && !a.failed {
        return Err(usage("--kind failed needs --failed (failed attempts are not retransmissions)"));
    }
    Ok(Config { flow, kind_mask, flows_off: false, by_cgroup: false })
}

/// Loaded and attached BPF state; links detach when dropped (fd-based).
struct Loaded {
    skel: RetransSkel<'static>,
    links: Vec<Link>,
    /// Names of the attached retransmit/SYN-ACK handlers.
    handlers: Vec<String>,
    /// The per-CPU event rings (none in count mode).
    rings: Option<PerCpuRings>,
    /// --count: the flows' slots, mapped (none before 5.12, whose BPF has
    /// no compare-and-exchange: every flow is in the hash then).
    slots: Option<Slots<types::rt_flow_slot>>,
}

/// What a program of the object does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Sees retransmits (its kernel-skipped runs are missed events).
    Handler,
    /// Records socket owners in process context.
    Owner,
}

/// The one place that says which program of the object runs under `mech`
/// (`has_err`: the tracepoint has the `err` argument) and as what. Programs
/// not named here are never loaded; a unit test checks that every program
/// of the object is named.
fn role(name: &str, mech: Mechanism, has_err: bool) -> Option<Role> {
    use Mechanism::*;
    let typed = mech == TpBtf;
    let on = |c: bool, r: Role| c.then_some(r);
    match name {
        "btf_retrans_err" => on(typed && has_err, Role::Handler),
        "btf_retrans" => on(typed && !has_err, Role::Handler),
        "btf_synack" => on(typed, Role::Handler),
        "raw_retrans_err" => on(mech == RawTp && has_err, Role::Handler),
        "raw_retrans" => on(mech == RawTp && !has_err, Role::Handler),
        "raw_synack" => on(mech == RawTp, Role::Handler),
        "tp_retrans" | "tp_synack" => on(mech == Tracepoint, Role::Handler),
        // Owners: in socket storage with typed pointers, in a hash map otherwise.
        "btf_set_state" => on(typed, Role::Owner),
        "btf_sendmsg" => on(typed && features::btf_has_type("btf_trace_tcp_sendmsg_locked"), Role::Owner),
        "tp_set_state" => on(!typed, Role::Owner),
        "tp_accept4" => on(!typed && features::tracepoint_exists("syscalls", "sys_exit_accept4"), Role::Owner),
        "tp_accept" => on(!typed && features::tracepoint_exists("syscalls", "sys_exit_accept"), Role::Owner),
        _ => None,
    }
}

/// Events the kernel never gave to our handlers: it skips a tracing program
/// on a CPU where the program is already running (a softirq retransmit
/// interrupting one being handled in process context).
fn missed(l: &Loaded) -> u64 {
    l.skel
        .object()
        .progs()
        .filter(|p| l.handlers.iter().any(|h| p.name() == h.as_str()))
        .map(|p| recursion_misses(&p))
        .sum()
}

fn load(a: &RetransArgs, cfg: &Config, mech: Mechanism) -> anyhow::Result<Loaded> {
    if mech == Mechanism::TpBtf {
        // Owners of typed sockets live in socket storage.
        features::sk_storage_in_tracing().map_err(|e| anyhow::anyhow!(e))?;
    }
    // The open object must outlive the skeleton: give each attempt its own.
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = RetransSkelBuilder::default().open(storage).context("opening BPF object")?;

    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.want_stack = a.stack;
    ro.count_mode = a.count;
    ro.want_failed = a.failed;
    ro.kind_mask = cfg.kind_mask;
    ro.flows_off = cfg.flows_off;
    ro.by_cgroup = cfg.by_cgroup;
    crate::set_flow_rodata!(&mut *ro, &cfg.flow);
    if cfg.flows_off {
        open.maps.flows.set_max_entries(1)?;
    }
    // --count's flows go to slots user space reads in place; they need
    // compare-and-exchange (5.12).
    let has_fetch = features::has_atomic_fetch();
    let use_slots = a.count && !cfg.flows_off && has_fetch;
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.use_slots = use_slots;
    ro.slot_mask = SLOTS as u32 - 1;
    if use_slots {
        open.maps.flow_slots.set_max_entries(SLOTS as u32)?;
        // Behind the slots the hash takes only flows whose neighbourhood
        // is full: a smaller one is made, and walked at the end, faster.
        open.maps.flows.set_max_entries(SPILL as u32)?;
    }
    if !cfg.by_cgroup {
        open.maps.groups.set_max_entries(1)?;
    }

    let ncpus = PerCpuRings::size_outer(&mut open.maps.sonde_rings)?;
    let ring_bytes = ringbuf::ring_bytes_per_cpu(ncpus, a.ringbuf_kib);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    ro.rb_wake_bytes = ringbuf::wake_bytes(ring_bytes as u64);
    if mech == Mechanism::TpBtf {
        // Owners live in socket storage: the hash map is not used.
        open.maps.owners.set_max_entries(1)?;
    }

    let has_err = features::tracepoint_btf_args("tcp_retransmit_skb").is_some_and(|n| n >= 3);
    let mut roles = BTreeMap::new();
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let r = role(&name, mech, has_err);
        prog.set_autoload(r.is_some());
        if let Some(r) = r {
            roles.insert(name, r);
        }
        if !has_fetch {
            features::poison_atomic_fetch(&mut prog).context("preparing the programs for a kernel before 5.12")?;
        }
    }
    let skel = open.load().with_context(|| format!("loading {mech} programs"))?;
    let slots = if use_slots { Some(Slots::map(&skel.maps.flow_slots, SLOTS)?) } else { None };
    // Rings before links: an event with no ring yet would be lost.
    let rings = if a.count { None } else { Some(PerCpuRings::create(&skel.maps.sonde_rings, ring_bytes)?) };
    let mut links = Vec::new();
    for prog in skel.object().progs_mut() {
        if roles.contains_key(prog.name().to_string_lossy().as_ref()) {
            links.push(prog.attach().with_context(|| format!("attaching {}", prog.name().to_string_lossy()))?);
        }
    }
    let handlers = roles.into_iter().filter(|(_, r)| *r == Role::Handler).map(|(n, _)| n).collect();
    Ok(Loaded { skel, links, handlers, rings, slots })
}

/// Per-kind and per-error totals, summed over CPUs.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    counts: [u64; KIND_MAX],
    segs: [u64; KIND_MAX],
    lost: u64,
    missed: u64,
    flow_full: u64,
    owner_full: u64,
    filtered: u64,
    filtered_segs: u64,
    /// Events --netns filtered out, by the namespace they were in.
    filtered_netns: BTreeMap<String, u64>,
    unreadable: u64,
    unseen_segs: u64,
    failed: BTreeMap<String, u64>,
}

fn read_totals(skel: &RetransSkel<'_>) -> anyhow::Result<Totals> {
    read_totals_with(skel, true)
}

/// `all_errs` false: the per-error map (264 per-CPU lookups) is read only
/// when the kernel counted failed attempts itself (count mode without
/// --failed, as serve runs: every failure is in the FAILED slot then).
fn read_totals_with(skel: &RetransSkel<'_>, all_errs: bool) -> anyhow::Result<Totals> {
    let mut t = Totals::default();
    let mut stat = [0u64; STAT_MAX];
    for (i, s) in stat.iter_mut().enumerate() {
        *s = percpu_sum(&skel.maps.stats, i as u32)?;
    }
    t.counts.copy_from_slice(&stat[..KIND_MAX]);
    t.segs.copy_from_slice(&stat[STAT_SEGS..STAT_SEGS + KIND_MAX]);
    t.lost = stat[STAT_LOST];
    t.flow_full = stat[STAT_FLOW_FULL];
    t.owner_full = stat[STAT_OWNER_FULL];
    t.filtered = stat[STAT_FILTERED];
    t.filtered_segs = stat[STAT_FILTERED_SEGS];
    for k in skel.maps.filtered_netns.keys() {
        if let (Ok(ns), Some(v)) =
            (<[u8; 4]>::try_from(&k[..]), skel.maps.filtered_netns.lookup(&k, libbpf_rs::MapFlags::ANY)?)
        {
            t.filtered_netns
                .insert(u32::from_ne_bytes(ns).to_string(), u64::from_ne_bytes(v[..8].try_into().unwrap_or_default()));
        }
    }
    t.unreadable = stat[STAT_UNREADABLE];
    t.unseen_segs = stat[STAT_UNSEEN_SEGS];
    for e in (1..ERR_SLOTS).filter(|_| all_errs || t.counts[KIND_MAX - 1] > 0) {
        let n = percpu_sum(&skel.maps.errs, e)?;
        if n > 0 {
            let err = if e < MAX_ERRNO { -(e as i32) } else { (e - MAX_ERRNO) as i32 };
            t.failed.insert(names::err_name(err), n);
        }
    }
    Ok(t)
}

fn summary_json(t: &Totals, mech: Mechanism, elapsed: Duration) -> Value {
    let mut counts = serde_json::Map::new();
    let mut segs_by = serde_json::Map::new();
    for (k, name) in KINDS.iter().enumerate().take(KIND_MAX - 1) {
        counts.insert((*name).into(), json!(t.counts[k]));
        segs_by.insert((*name).into(), json!(t.segs[k]));
    }
    json!({
        "type": "summary",
        "counts": counts,
        "segs": t.segs[..KIND_MAX - 1].iter().sum::<u64>(),
        "segs_by_kind": segs_by,
        "failed": t.failed,
        "failed_segs": t.segs[KIND_MAX - 1],
        "lost": t.lost,
        "missed": t.missed,
        "unreadable": t.unreadable,
        "unseen_segs": t.unseen_segs,
        "filtered": t.filtered,
        "filtered_segs": t.filtered_segs,
        "filtered_netns": t.filtered_netns,
        "map_full": {"flows": t.flow_full, "owners": t.owner_full},
        "mechanism": mech.to_string(),
        "duration_s": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
    })
}

fn summary_text(t: &Totals, mech: Mechanism, elapsed: Duration) -> String {
    let mut rows = Vec::new();
    for (k, name) in KINDS.iter().enumerate().take(KIND_MAX - 1) {
        rows.push(vec![name.to_string(), t.counts[k].to_string(), t.segs[k].to_string()]);
    }
    let total: u64 = t.counts[..KIND_MAX - 1].iter().sum();
    let total_segs: u64 = t.segs[..KIND_MAX - 1].iter().sum();
    rows.push(vec!["total".into(), total.to_string(), total_segs.to_string()]);
    let mut s = format!("\nSummary ({:.1}s, {mech}):\n", elapsed.as_secs_f64());
    s.push_str(&table(&["KIND", "EVENTS", "SEGS"], &rows));
    let failed: Vec<String> = t.failed.iter().map(|(e, n)| format!("{e} {n}")).collect();
    s.push_str(&format!(
        "\nfailed attempts (not retransmissions): {}\nlost events: {} (ring buffer full) + {} (missed: kernel skipped the program on a busy CPU) + {} (unreadable socket)  map full: flows {} owners {}",
        if failed.is_empty() { "none".to_string() } else { failed.join(", ") },
        t.lost,
        t.missed,
        t.unreadable,
        t.flow_full,
        t.owner_full
    ));
    if t.filtered > 0 {
        s.push_str(&format!("\nfiltered out: {} events ({} segments)", t.filtered, t.filtered_segs));
    }
    if t.unseen_segs > 0 {
        s.push_str(&format!(
            "\nunseen: {} segments the kernel retransmitted on traced sockets with no tracepoint run (found in the sockets' own counters)",
            t.unseen_segs
        ));
        if features::init_hides_tracing() {
            s.push_str("\nhint: this kernel skips tracing programs while PID 1 is on the CPU (see `sonde doctor`); retransmits in softirqs that interrupt it reach no tracer");
        }
    }
    if t.lost > 0 {
        s.push_str("\nhint: events were lost; use --count, filters, or a larger ring buffer");
    }
    s
}

/// One `--json` event line (schema in the README). Serialized straight from
/// this struct: building a `serde_json::Value` per event cost a third of the
/// user-space time at 20k events/s.
#[derive(serde::Serialize)]
struct EventLine {
    #[serde(rename = "type")]
    ty: &'static str,
    time: f64,
    kind: &'static str,
    err: i32,
    segs: u32,
    family: u8,
    saddr: IpAddr,
    sport: u16,
    daddr: IpAddr,
    dport: u16,
    netns: u32,
    state: &'static str,
    ca_state: &'static str,
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
    /// Add to bpf_ktime_get_ns() (CLOCK_MONOTONIC) to get wall-clock ns.
    mono_to_epoch: i128,
    ksyms: Option<KernelSymbols>,
    header_done: bool,
    error: Option<std::io::Error>,
    /// Events of the current drain: the rings are per CPU, so they are put
    /// in time order before printing.
    pending: Vec<types::rt_event>,
    /// Events read and their segments, per kind: the kernel's totals leave
    /// out the events it hands to user space (see `emit` in retrans.bpf.c).
    read_counts: [u64; KIND_MAX],
    read_segs: [u64; KIND_MAX],
}

impl Printer {
    fn new(sink: Sink, json: bool, stacks: bool) -> Self {
        Printer {
            sink,
            json,
            mono_to_epoch: mono_to_epoch(),
            ksyms: stacks.then(KernelSymbols::default),
            header_done: false,
            error: None,
            pending: Vec::new(),
            read_counts: [0; KIND_MAX],
            read_segs: [0; KIND_MAX],
        }
    }

    fn event(&mut self, data: &[u8]) {
        // The stack at the end is sent only with --stack.
        let base = std::mem::size_of::<types::rt_event>() - 32 * 8;
        let Some(e) = record::decode_prefix::<types::rt_event>(data, base) else { return };
        if let Some(k) = self.read_counts.get_mut(e.flow.kind as usize) {
            *k += 1;
            self.read_segs[e.flow.kind as usize] += u64::from(e.segs);
        }
        self.pending.push(e);
    }

    /// Prints the events of this drain in time order.
    fn print_pending(&mut self) {
        let mut evs = std::mem::take(&mut self.pending);
        evs.sort_by_key(|e| e.ts_ns);
        for e in &evs {
            let r = if self.json { self.json_event(e) } else { self.text_event(e) };
            if let Err(err) = r {
                self.error.get_or_insert(err);
            }
        }
        evs.clear();
        self.pending = evs;
    }

    fn stack(&self, e: &types::rt_event) -> Vec<String> {
        let n = (e.nr_kstack as usize / 8).min(32);
        match (&self.ksyms, n) {
            (Some(k), n) if n > 0 => k.names(&e.kstack[..n]),
            _ => Vec::new(),
        }
    }

    fn json_event(&mut self, e: &types::rt_event) -> std::io::Result<()> {
        let f = &e.flow;
        let owned = e.has_owner != 0;
        let line = EventLine {
            ty: "retrans",
            time: epoch_secs(e.ts_ns, self.mono_to_epoch),
            kind: KINDS.get(f.kind as usize).copied().unwrap_or("unknown"),
            err: e.err,
            segs: e.segs,
            family: if f.family == 2 { 4 } else { 6 },
            saddr: addr(f.family, &f.saddr),
            sport: f.sport,
            daddr: addr(f.family, &f.daddr),
            dport: f.dport,
            netns: f.netns,
            state: tcp_state(e.state),
            ca_state: ca_state(e.ca_state),
            pid: owned.then_some(e.owner.pid),
            comm: owned.then(|| cstr(&e.owner.comm)),
            cgroup: owned.then_some(e.owner.cgroup),
            stack: self.ksyms.is_some().then(|| self.stack(e)),
        };
        self.sink.json(&line)
    }

    fn text_event(&mut self, e: &types::rt_event) -> std::io::Result<()> {
        if !self.header_done {
            self.header_done = true;
            self.sink.line(&format!(
                "{:<12} {:>7} {:<15} {:<13} {:>4} {:<11} {:<8} {}",
                "TIME(UTC)", "PID", "COMM", "KIND", "SEGS", "STATE", "CA", "LOCAL -> REMOTE"
            ))?;
        }
        let f = &e.flow;
        let (pid, c) =
            if e.has_owner != 0 { (e.owner.pid.to_string(), cstr(&e.owner.comm)) } else { ("-".into(), "-".into()) };
        let kind = KINDS.get(f.kind as usize).copied().unwrap_or("unknown");
        let mut line = format!(
            "{:<12} {:>7} {:<15} {:<13} {:>4} {:<11} {:<8} {} -> {}",
            hms((e.ts_ns as i128 + self.mono_to_epoch) as u64),
            pid,
            c,
            kind,
            e.segs,
            tcp_state(e.state),
            ca_state(e.ca_state),
            endpoint(f.family, &f.saddr, f.sport),
            endpoint(f.family, &f.daddr, f.dport),
        );
        if e.err != 0 {
            line.push_str(&format!("  err={}", names::err_name(e.err)));
        }
        self.sink.line(&line)?;
        for s in self.stack(e) {
            self.sink.line(&format!("        {s}"))?;
        }
        Ok(())
    }
}

/// One row of the --count table.
#[derive(Clone)]
struct FlowRow {
    flow: types::rt_flow,
    stats: types::rt_flow_stats,
}

/// --count's flow slots (a power of two: the programs mask with SLOTS - 1).
const SLOTS: usize = 262144;
/// --count's flow hash behind the slots (flows whose slots are all taken).
const SPILL: usize = 65536;

/// Each flow of the table, unsorted: the slots read in place, then the
/// hash in batches. A flow two CPUs claimed at once lies in two slots
/// within its probes: the last rows read are held back until no later slot
/// can be a copy, and copies are added up.
fn each_flow(l: &Loaded, mut f: impl FnMut(FlowRow)) -> anyhow::Result<()> {
    if let Some(slots) = &l.slots {
        use std::mem::offset_of;
        let (count, segs) = (
            offset_of!(types::rt_flow_slot, stats) + offset_of!(types::rt_flow_stats, count),
            offset_of!(types::rt_flow_slot, stats) + offset_of!(types::rt_flow_stats, segs),
        );
        let mut held: std::collections::VecDeque<FlowRow> =
            std::collections::VecDeque::with_capacity(RT_SLOT_PROBES + 1);
        slots.each_published(offset_of!(types::rt_flow_slot, state), |s, word| {
            let (n, sg) = (word(count), word(segs));
            match held.iter_mut().find(|r| same_flow(&r.flow, &s.key)) {
                Some(r) => {
                    r.stats.count += n;
                    r.stats.segs += sg;
                }
                None => {
                    let mut stats = s.stats;
                    (stats.count, stats.segs) = (n, sg);
                    held.push_back(FlowRow { flow: s.key, stats });
                    if held.len() > RT_SLOT_PROBES {
                        f(held.pop_front().expect("more than RT_SLOT_PROBES held"));
                    }
                }
            }
        });
        held.into_iter().for_each(&mut f);
    }
    record::for_each_entry(&l.skel.maps.flows, |k, v| {
        if let (Some(flow), Some(stats)) =
            (record::decode::<types::rt_flow>(k), record::decode::<types::rt_flow_stats>(v))
        {
            f(FlowRow { flow, stats });
        }
    })
}

/// The `--count` flows as `print_flows` shows them. A table keeps only its
/// `top` rows and the sums of the rest as it reads (100k flows make no
/// 100k rows); JSON and `--top 0` list every flow.
fn report_flows(sink: &mut Sink, json_out: bool, l: &Loaded, top: usize) -> anyhow::Result<()> {
    if json_out || top == 0 {
        let mut rows = Vec::new();
        each_flow(l, |r| rows.push(r))?;
        print_flows(sink, json_out, &mut rows, top)?;
        return Ok(());
    }
    let mut t = Top::new(top);
    each_flow(l, |r| t.add(r))?;
    let (shown, rest) = t.finish();
    print_table(sink, &shown, &rest)?;
    Ok(())
}

/// A row ordered so that a max-heap's top is the least busy (`busiest`).
struct LeastBusy(FlowRow);

impl PartialEq for LeastBusy {
    fn eq(&self, o: &Self) -> bool {
        busiest(&self.0, &o.0).is_eq()
    }
}
impl Eq for LeastBusy {}
impl PartialOrd for LeastBusy {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for LeastBusy {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        busiest(&self.0, &o.0)
    }
}

/// The `n` busiest rows of a stream and the sums of the others.
struct Top {
    n: usize,
    kept: std::collections::BinaryHeap<LeastBusy>,
    rest: Rest,
}

impl Top {
    fn new(n: usize) -> Top {
        // Reserved for a usual --top only: a huge one grows as rows come.
        Top { n, kept: std::collections::BinaryHeap::with_capacity(n.min(4096) + 1), rest: Rest::default() }
    }

    fn add(&mut self, r: FlowRow) {
        self.kept.push(LeastBusy(r));
        if self.kept.len() > self.n {
            let out = self.kept.pop().expect("more than n kept");
            self.rest.add(&out.0);
        }
    }

    /// The kept rows, busiest first, and the rest.
    fn finish(self) -> (Vec<FlowRow>, Rest) {
        (self.kept.into_sorted_vec().into_iter().map(|r| r.0).collect(), self.rest)
    }
}

/// The flows a table leaves out: how many, their retransmits and segments,
/// and their failed attempts apart.
#[derive(Default, Debug, PartialEq)]
struct Rest {
    flows: u64,
    count: u64,
    segs: u64,
    failed: u64,
}

impl Rest {
    fn add(&mut self, r: &FlowRow) {
        self.flows += 1;
        if r.flow.kind as usize == KIND_MAX - 1 {
            self.failed += r.stats.count;
        } else {
            self.count += r.stats.count;
            self.segs += r.stats.segs;
        }
    }
}

/// `RT_SLOT_PROBES`: a flow's copies lie this close together.
const RT_SLOT_PROBES: usize = 8;

fn same_flow(a: &types::rt_flow, b: &types::rt_flow) -> bool {
    (a.saddr, a.daddr, a.sport, a.dport, a.family, a.kind, a.netns)
        == (b.saddr, b.daddr, b.sport, b.dport, b.family, b.kind, b.netns)
}

/// Most retransmits first (then segments).
fn busiest(a: &FlowRow, b: &FlowRow) -> std::cmp::Ordering {
    b.stats.count.cmp(&a.stats.count).then(b.stats.segs.cmp(&a.stats.segs))
}

/// The `--count` table (the first `top` rows and a line for the rest; 0:
/// every row) or, with `json_out`, every row as a JSON line.
fn print_flows(sink: &mut Sink, json_out: bool, rows: &mut [FlowRow], top: usize) -> std::io::Result<()> {
    let shown = if top == 0 || json_out { rows.len() } else { top.min(rows.len()) };
    // Only the rows shown are sorted (80k flows, 20 shown).
    if shown < rows.len() {
        rows.select_nth_unstable_by(shown, busiest);
    }
    rows[..shown].sort_by(busiest);
    if json_out {
        for r in rows {
            let f = &r.flow;
            let o = r.stats.has_owner != 0;
            sink.json(&json!({
                "type": "flow",
                "kind": KINDS.get(f.kind as usize).copied().unwrap_or("unknown"),
                "count": r.stats.count,
                "segs": r.stats.segs,
                "family": if f.family == 2 { 4 } else { 6 },
                "saddr": addr(f.family, &f.saddr).to_string(),
                "sport": f.sport,
                "daddr": addr(f.family, &f.daddr).to_string(),
                "dport": f.dport,
                "netns": f.netns,
                "state": tcp_state(r.stats.state),
                "pid": if o { json!(r.stats.owner.pid) } else { json!(null) },
                "comm": if o { json!(cstr(&r.stats.owner.comm)) } else { json!(null) },
            }))?;
        }
        return Ok(());
    }
    let mut rest = Rest::default();
    rows[shown..].iter().for_each(|r| rest.add(r));
    print_table(sink, &rows[..shown], &rest)
}

/// The `--count` table of `shown` (sorted) and a line for the `rest`.
fn print_table(sink: &mut Sink, shown: &[FlowRow], rest: &Rest) -> std::io::Result<()> {
    let body: Vec<Vec<String>> = shown
        .iter()
        .map(|r| {
            let f = &r.flow;
            let o = r.stats.has_owner != 0;
            vec![
                endpoint(f.family, &f.saddr, f.sport),
                endpoint(f.family, &f.daddr, f.dport),
                KINDS.get(f.kind as usize).copied().unwrap_or("unknown").to_string(),
                r.stats.count.to_string(),
                r.stats.segs.to_string(),
                tcp_state(r.stats.state).to_string(),
                if o { r.stats.owner.pid.to_string() } else { "-".into() },
                if o { cstr(&r.stats.owner.comm) } else { "-".into() },
            ]
        })
        .collect();
    sink.line(&table(&["LOCAL", "REMOTE", "KIND", "COUNT", "SEGS", "LAST_STATE", "PID", "COMM"], &body))?;
    if let Some(line) = rest_line(rest) {
        sink.line(&line)?;
    }
    Ok(())
}

/// The line that stands for the flows the table leaves out: how many, and
/// their retransmits and segments (failed attempts apart), so the rows and
/// this line add up to the summary's totals.
fn rest_line(rest: &Rest) -> Option<String> {
    if rest.flows == 0 {
        return None;
    }
    let n = |n: u64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut line = format!(
        "... and {} more {}: {} ({})",
        rest.flows,
        if rest.flows == 1 { "flow" } else { "flows" },
        n(rest.count, "retransmit"),
        n(rest.segs, "segment")
    );
    if rest.failed > 0 {
        line.push_str(&format!(", {}", n(rest.failed, "failed attempt")));
    }
    Some(line)
}

/// What a finished run saw, for labs and callers that compare with MIB counters.
pub struct Outcome {
    /// Per-kind totals.
    pub totals: Totals,
    /// Why it stopped.
    pub stop: Stop,
}

impl Totals {
    /// Events of one kind (index into [`KINDS`]).
    pub fn count(&self, kind: usize) -> u64 {
        self.counts[kind]
    }
    /// Segments of one kind.
    pub fn segs(&self, kind: usize) -> u64 {
        self.segs[kind]
    }
    /// Lost events: ring buffer full.
    pub fn lost(&self) -> u64 {
        self.lost
    }
    /// Events the kernel never ran our program for (recursion on one CPU).
    pub fn missed(&self) -> u64 {
        self.missed
    }
    /// Events whose socket could not be read as a TCP socket (never counted).
    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }
    /// Segments the kernel retransmitted on traced sockets with no
    /// tracepoint run: found later in the sockets' own counters.
    pub fn unseen_segs(&self) -> u64 {
        self.unseen_segs
    }
    /// Retransmits sonde knows it did not count: with any, sonde can only be
    /// short of the kernel's counters.
    pub fn uncounted(&self) -> u64 {
        self.missed + self.unreadable
    }
    /// Failed attempts by errno name.
    pub fn failed(&self) -> &BTreeMap<String, u64> {
        &self.failed
    }
}

/// How retrans runs on this kernel (`sonde doctor`).
pub fn doctor(cx: &Caps) -> Value {
    let hooks = [
        ("tcp:tcp_retransmit_skb", features::tracepoint_exists("tcp", "tcp_retransmit_skb")),
        ("tcp:tcp_retransmit_synack", features::tracepoint_exists("tcp", "tcp_retransmit_synack")),
        ("sock:inet_sock_set_state", features::tracepoint_exists("sock", "inet_sock_set_state")),
        ("syscalls:sys_exit_accept4", features::tracepoint_exists("syscalls", "sys_exit_accept4")),
    ];
    if !hooks[0].1 {
        return cannot("kernel has no tcp:tcp_retransmit_skb tracepoint (added in 4.15)");
    }
    // tp_btf keeps owners in socket storage: usable only where tracing
    // programs have it (what the tool's load checks first).
    let storage = features::sk_storage_in_tracing();
    let usable = |m: Mechanism| cx.ok(m.name()) && (m != Mechanism::TpBtf || storage.is_ok());
    let Some((m, _)) = MECHANISMS.iter().copied().find(|(m, _)| usable(*m)) else {
        return cannot("neither tp_btf, raw_tp nor classic tracepoints load");
    };
    let err_arg = features::tracepoint_btf_args("tcp_retransmit_skb").is_some_and(|n| n >= 3)
        || features::tracepoint_has_field("tcp", "tcp_retransmit_skb", "err");
    json!({
        "usable": true,
        "mechanism": m.to_string(),
        "failed_attempts": if err_arg { "reported (tracepoint has err)" } else { "not visible (tracepoint without err)" },
        "detail": if err_arg { "failed attempts reported: the tracepoint has err" } else { "failed attempts not visible: the tracepoint has no err" },
        "owner_hooks": hooks.iter().filter(|h| h.1).map(|h| h.0).collect::<Vec<_>>(),
        "sendmsg_owner": features::btf_has_type("btf_trace_tcp_sendmsg_locked"),
        "not_tp_btf": storage.err(),
    })
}

/// Runs `sonde retrans`; `ready` is called once everything is attached.
pub fn run_with(a: &RetransArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    let cfg = validate(a)?;
    let out = a.run.output("retrans", &[(".json", true), (".txt", false), (".log", false)])?;
    let json_out = a.run.json || out.is_some_and(|(_, json)| json);
    features::require_tracing_privileges()?;
    let sink = Sink::open(a.run.path())?;

    let order = attach::order(MECHANISMS, a.mechanism);
    let (mut loaded, mech, _fails) = with_fallbacks("tcp:tcp_retransmit_skb", &order, |m| load(a, &cfg, m))?;
    let start = Instant::now();
    ready();

    let printer = Rc::new(RefCell::new(Printer::new(sink, json_out, a.stack)));

    let rb = match &loaded.rings {
        Some(r) => {
            let p = printer.clone();
            Some(r.reader(move |data: &[u8]| p.borrow_mut().event(data))?)
        }
        None => None,
    };

    let stop = poll_until_stop(rb.as_ref(), ctl, a.interval, |due| {
        let mut p = printer.borrow_mut();
        p.print_pending();
        if !due {
            p.sink.flush()?;
            return Ok(());
        }
        if !p.json {
            let now = (clock_ns(libc::CLOCK_REALTIME)) as u64;
            p.sink.line(&format!("\n{} UTC, {:.0}s in:", hms(now), start.elapsed().as_secs_f64()))?;
        }
        let j = p.json;
        report_flows(&mut p.sink, j, &loaded, a.top)?;
        p.sink.flush()?;
        Ok(())
    })?;
    // The totals count events user space read: detach, let programs still
    // running finish, and read what is left, so none comes after.
    let missed = missed(&loaded);
    drop(std::mem::take(&mut loaded.links));
    if let (Some(rings), Some(rb)) = (&loaded.rings, &rb) {
        rings.wait_for_programs(&loaded.skel.maps.sonde_rings)?;
        rb.consume().context("reading the ring buffers")?;
    }
    drop(rb);
    let mut p = printer.borrow_mut();
    p.print_pending();
    let totals = report(a, &loaded, &mut p, missed, mech, start.elapsed())?;
    Ok(Outcome { totals, stop })
}

/// The totals (the kernel's counts plus the events user space read) and
/// what ends a run: the `--count` table and the summary.
fn report(
    a: &RetransArgs,
    l: &Loaded,
    p: &mut Printer,
    missed: u64,
    mech: Mechanism,
    elapsed: Duration,
) -> anyhow::Result<Totals> {
    let mut totals = read_totals(&l.skel)?;
    for k in 0..KIND_MAX {
        totals.counts[k] += p.read_counts[k];
        totals.segs[k] += p.read_segs[k];
    }
    totals.missed = missed;
    if let Some(e) = p.error.take() {
        return Err(anyhow::Error::new(e).context("writing events"));
    }
    if a.count {
        let j = p.json;
        report_flows(&mut p.sink, j, l, a.top)?;
    }
    if p.json {
        p.sink.json(&summary_json(&totals, mech, elapsed))?;
    } else {
        p.sink.line(&summary_text(&totals, mech, elapsed))?;
    }
    p.sink.flush()?;
    Ok(totals)
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &RetransArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    if let Some(b) = a.bench_baseline {
        return baseline::run(b, &ctl);
    }
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: tracing TCP retransmissions; Ctrl-C ends with a summary");
    })?;
    Ok(out.stop.exit_code())
}

/// Milliseconds since the epoch, for labels.
pub fn now_epoch_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` flows of kind `kind` with counts n, n-1, ..., 1, each with twice
    /// its count in segments.
    fn rows(n: u64, kind: usize) -> Vec<FlowRow> {
        (0..n)
            .map(|i| FlowRow {
                flow: types::rt_flow { family: 2, sport: 1000 + i as u16, kind: kind as u8, ..Default::default() },
                stats: types::rt_flow_stats { count: n - i, segs: 2 * (n - i), ..Default::default() },
            })
            .collect()
    }

    fn table_of(rows: &[FlowRow], json: bool, top: usize) -> Vec<String> {
        let p = std::env::temp_dir().join(format!("sonde-flows-{}-{json}-{top}", std::process::id()));
        let mut sink = Sink::open(Some(&p)).unwrap();
        // Unsorted, as each_flow gives them: the smallest first. A table
        // with a top streams through Top, as report_flows does.
        let mut rows: Vec<FlowRow> = rows.iter().rev().cloned().collect();
        if json || top == 0 {
            print_flows(&mut sink, json, &mut rows, top).unwrap();
        } else {
            let mut t = Top::new(top);
            rows.into_iter().for_each(|r| t.add(r));
            let (shown, rest) = t.finish();
            print_table(&mut sink, &shown, &rest).unwrap();
        }
        sink.flush().unwrap();
        drop(sink);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_count_table_shows_the_top_flows_and_a_line_for_the_rest() {
        let all = rows(10, 4);
        let t = table_of(&all, false, 3);
        assert_eq!(t.len(), 1 + 3 + 1, "{t:?}");
        assert!(t[0].starts_with("LOCAL"));
        let counts: Vec<&str> = t[1..4].iter().map(|l| l.split_whitespace().nth(3).unwrap()).collect();
        assert_eq!(counts, ["10", "9", "8"]);
        // 7 + 6 + ... + 1 = 28 retransmits, 56 segments: with the rows, 55 and 110.
        assert_eq!(t[4], "... and 7 more flows: 28 retransmits (56 segments)");
        // 0, or a top as large as the table: every row and no rest line.
        assert_eq!(table_of(&all, false, 0).len(), 11);
        assert_eq!(table_of(&all, false, 10).len(), 11);
        // One left out: singular.
        assert_eq!(table_of(&all, false, 9)[10], "... and 1 more flow: 1 retransmit (2 segments)");
        // --json keeps every flow whatever the top.
        assert_eq!(table_of(&all, true, 3).len(), 10);
        // Failed attempts are not retransmits: named apart.
        let mut mixed = rows(4, 4);
        mixed.extend(rows(2, KIND_MAX - 1));
        assert_eq!(
            table_of(&mixed, false, 2)[3],
            "... and 4 more flows: 3 retransmits (6 segments), 3 failed attempts"
        );
    }

    /// The streamed top rows and rest are those of sorting every row, in
    /// any order of arrival (the oracle: a full sort).
    #[test]
    fn the_streamed_top_is_the_sorted_table() {
        // 500 flows, distinct (count, segs), in a scrambled order.
        let all: Vec<FlowRow> = (0..500u64)
            .map(|i| (i * 7919) % 500)
            .map(|k| FlowRow {
                flow: types::rt_flow { family: 2, sport: k as u16, kind: (k % 3) as u8 + 3, ..Default::default() },
                stats: types::rt_flow_stats { count: 1 + k / 4, segs: k, ..Default::default() },
            })
            .collect();
        for top in [1, 20, 499, 500, 600] {
            let mut sorted = all.clone();
            sorted.sort_by(busiest);
            let n = top.min(sorted.len());
            let mut want = Rest::default();
            sorted[n..].iter().for_each(|r| want.add(r));
            let mut t = Top::new(top);
            all.iter().cloned().for_each(|r| t.add(r));
            let (shown, rest) = t.finish();
            let key = |r: &FlowRow| (r.flow.sport, r.stats.count, r.stats.segs);
            assert_eq!(shown.iter().map(key).collect::<Vec<_>>(), sorted[..n].iter().map(key).collect::<Vec<_>>());
            assert_eq!(rest, want, "top {top}");
        }
    }

    /// Every program of the object runs under some mechanism: `role` is the
    /// only list of them, so a program added to retrans.bpf.c but not to
    /// `role` would silently never load.
    /// The stats map has exactly the slots the STAT_* constants copied from
    /// retrans.h name (no root needed: the object is opened, not loaded).
    #[test]
    fn stats_map_size_matches_the_slot_constants() {
        let mut storage = MaybeUninit::uninit();
        let open = RetransSkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries() as usize, STAT_MAX);
        assert_eq!(open.maps.errs.max_entries(), ERR_SLOTS);
    }

    #[test]
    fn every_program_has_a_role() {
        let mut storage = MaybeUninit::uninit();
        let open = RetransSkelBuilder::default().open(&mut storage).expect("open the object");
        let mut names = Vec::new();
        for p in open.open_object().progs() {
            let n = p.name().to_string_lossy().into_owned();
            let used = [Mechanism::TpBtf, Mechanism::RawTp, Mechanism::Tracepoint]
                .iter()
                .any(|&m| [true, false].iter().any(|&e| role(&n, m, e).is_some()));
            assert!(used, "program {n} is never loaded: add it to role()");
            names.push(n);
        }
        assert!(names.len() >= 13, "{names:?}");
        // One handler for retransmits and one for SYN-ACKs under each mechanism.
        for m in [Mechanism::TpBtf, Mechanism::RawTp, Mechanism::Tracepoint] {
            for e in [true, false] {
                let h = names.iter().filter(|n| role(n, m, e) == Some(Role::Handler)).count();
                assert_eq!(h, 2, "{m} err={e}");
            }
        }
    }
}
