//! `sonde cwnd`: the congestion window of each sending TCP connection over
//! time, and for every send after idle whether the kernel restarted slow
//! start (RFC 5681 4.1, net.ipv4.tcp_slow_start_after_idle) and if not, why.
use std::{
    cell::RefCell,
    collections::BTreeMap,
    mem::MaybeUninit,
    path::Path,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{
    skel::{OpenSkel, Skel, SkelBuilder},
    Link, OpenObject,
};
use serde::Serialize;

use crate::engine::caps::{cannot, Caps};
use crate::engine::{
    attach::{self, recursion_misses, with_fallbacks, Mechanism, Mechanisms},
    chart::{Chart, Marker, Series},
    error::{env, usage},
    features,
    flowfilter::{ca_state, endpoint, FlowArgs, FlowFilter, FlowJson},
    output::{table, Formats, RunArgs, Sink},
    record::percpu_sum,
    record::{self, cstr},
    ringbuf::{self, poll_until_stop, PerCpuRings},
    run::{duration_arg, RunControl, Stop},
    time::{clock_ns, epoch_secs, hms, mono_to_epoch},
};
use serde_json::{json, Value};

crate::skeleton!("cwnd");
crate::pod!(types::cw_event, types::cw_idle_key);

pub mod collect;
use skel::{types, CwndSkel, CwndSkelBuilder};

const CW_IDLE_SEND: u8 = 1;
const STAT_MAX: usize = 11;
/// tcp_sock's ssthresh before the first loss: "infinite".
const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;

/// cwnd's mechanisms in fallback order (`--mechanism` forces one; doctor
/// reports the first that loads).
pub const MECHANISMS: &Mechanisms = &[
    (Mechanism::TpBtf, "tp_btf tcp:tcp_probe + tp_btf tcp:tcp_sendmsg_locked, state in socket storage"),
    (Mechanism::Fentry, "tp_btf tcp:tcp_probe + fentry tcp_sendmsg_locked (kernels without the tracepoint)"),
    (Mechanism::RawTp, "raw_tp tcp:tcp_probe + raw_tp tcp:tcp_sendmsg_locked, state in a hash map"),
    (Mechanism::Kprobe, "raw_tp tcp:tcp_probe + kprobe tcp_sendmsg_locked, state in a hash map"),
];

/// Congestion window per TCP connection over time, and slow-start restarts
/// after idle.
///
/// Slow start after idle (RFC 5681 4.1): for every send after the connection
/// was idle longer than its RTO, whether the kernel restarted slow start
/// ("restart", with the cwnd before and after) or not, and why not (the
/// congestion control has its own cong_control hook, as bbr does; the sysctl
/// net.ipv4.tcp_slow_start_after_idle is 0; data still in flight).
///
/// Samples come from the tcp:tcp_probe tracepoint (every received segment,
/// before it is processed): one when cwnd, ssthresh or the congestion state
/// changed, at most one per --every per connection. Idle sends are judged
/// where a send queues a new skb (tp_btf tcp_sendmsg_locked; fentry or
/// kprobe on tcp_sendmsg_locked where that tracepoint is missing) by the
/// kernel's own test, and confirmed by the cwnd the next observation shows.
///
/// OVERHEAD (bench/cwnd/run: one bulk transfer at full loopback speed, the
/// busiest case, 2-core VM): ~85 ns in the kernel per received segment and
/// per queued skb (430k program runs/s); the transfer ran 5-6% slower
/// (6,839 -> 6,527 MB/s streaming every change as JSON, 0 lost; 6,430 MB/s
/// with --every 10ms); sonde itself 0.25-0.5% of a core. Sockets that only
/// receive cost one lookup per segment.
#[derive(Debug, Args, Default, Clone)]
#[command(mut_arg("json", |a| a.help("One JSON object per line (samples, idle sends, then a summary)")))]
#[command(mut_arg("output", |a| a.help("Write to this file: .json (JSON lines), .txt, or a chart of cwnd over time per connection with idle sends marked: .svg or .html")))]
pub struct CwndArgs {
    /// Which connections.
    #[command(flatten)]
    pub flow: FlowArgs,
    /// At most one sample per connection per INTERVAL (e.g. 10ms); default:
    /// every change of cwnd, ssthresh or congestion state.
    #[arg(long, value_parser = duration_arg)]
    pub every: Option<Duration>,
    /// Also report sends after at least this long with nothing in flight,
    /// even when shorter than the RTO (reason idle_under_rto); default: only
    /// sends idle longer than the RTO, the ones the kernel may restart.
    #[arg(long, value_parser = crate::engine::run::duration_or_zero_arg)]
    pub min_idle: Option<Duration>,
    /// Print only idle sends (samples still go to the chart and summary).
    #[arg(long)]
    pub idle_only: bool,
    /// -d, --json, -o.
    #[command(flatten)]
    pub run: RunArgs,
    /// Force one attach mechanism instead of the best available.
    #[arg(long, value_parser = attach::parser(MECHANISMS))]
    pub mechanism: Option<Mechanism>,
}

/// What `-o` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Json,
    Svg,
    Html,
}

/// What cwnd writes, by `-o`'s ending.
const FORMATS: &Formats<Format> = &[
    (".json", Format::Json),
    (".txt", Format::Text),
    (".log", Format::Text),
    (".svg", Format::Svg),
    (".html", Format::Html),
];

fn format_of(a: &CwndArgs) -> anyhow::Result<Format> {
    Ok(match a.run.output("cwnd", FORMATS)? {
        None | Some((_, Format::Text)) if a.run.json => Format::Json,
        None => Format::Text,
        Some((_, f)) => f,
    })
}

/// How cwnd runs on this kernel (`sonde doctor`): tcp:tcp_probe for samples,
/// the send path for idle restarts, by the first of [`MECHANISMS`] whose
/// programs load here.
pub fn doctor(cx: &Caps) -> Value {
    let send_tp = features::btf_has_type("btf_trace_tcp_sendmsg_locked");
    let probe_tp = features::tracepoint_exists("tcp", "tcp_probe") || features::btf_has_type("btf_trace_tcp_probe");
    if !probe_tp {
        return cannot("kernel has no tcp:tcp_probe tracepoint (added in 4.16)");
    }
    // tp_btf and fentry keep state in socket storage (the load checks it).
    let storage = features::sk_storage_in_tracing().is_ok();
    let loads = |m: Mechanism| match m {
        Mechanism::TpBtf => send_tp && cx.ok("tp_btf") && storage,
        Mechanism::Fentry => cx.ok("tp_btf") && cx.ok("fentry") && storage,
        Mechanism::RawTp => send_tp && cx.ok("raw_tp"),
        Mechanism::Kprobe => cx.ok("raw_tp") && cx.ok("kprobe"),
        Mechanism::Tracepoint => false,
    };
    match MECHANISMS.iter().find(|(m, _)| loads(*m)) {
        Some((m, detail)) => json!({"usable": true, "mechanism": m.to_string(), "detail": detail}),
        None => cannot(format!(
            "no way to see sends: {} and neither fentry nor kprobes attach (see above)",
            if send_tp {
                "tcp:tcp_sendmsg_locked loads by neither tp_btf nor raw_tp"
            } else {
                "no tcp:tcp_sendmsg_locked tracepoint"
            }
        )),
    }
}

/// Jiffies per second of the running kernel (CONFIG_HZ), for idle times and
/// RTOs, which the kernel keeps in jiffies: from the kernel config, else
/// measured from /proc/timer_list over 200 ms.
pub fn kernel_hz() -> anyhow::Result<u32> {
    let from_config =
        |text: &str| text.lines().find_map(|l| l.strip_prefix("CONFIG_HZ=").and_then(|v| v.trim().parse::<u32>().ok()));
    if let Ok(f) = std::fs::File::open("/proc/config.gz") {
        let mut s = String::new();
        if std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(f), &mut s).is_ok() {
            if let Some(hz) = from_config(&s) {
                return Ok(hz);
            }
        }
    }
    let rel = features::uname_release();
    if let Some(hz) = std::fs::read_to_string(format!("/boot/config-{rel}")).ok().as_deref().and_then(from_config) {
        return Ok(hz);
    }
    let jiffies = || -> Option<u64> {
        let t = std::fs::read_to_string("/proc/timer_list").ok()?;
        t.lines().find_map(|l| l.strip_prefix("jiffies: ").and_then(|v| v.trim().parse().ok()))
    };
    let t0 = Instant::now();
    let j0 = jiffies().ok_or_else(|| env("cannot tell this kernel's HZ: no CONFIG_HZ in /proc/config.gz or /boot/config-*, and /proc/timer_list is unreadable"))?;
    std::thread::sleep(Duration::from_millis(200));
    let j1 = jiffies().unwrap_or(j0);
    let hz = (j1 - j0) as f64 / t0.elapsed().as_secs_f64();
    // The nearest of the values Kconfig offers.
    Ok(*[100u32, 250, 300, 1000].iter().min_by_key(|&&c| (c as f64 - hz).abs() as u64).unwrap())
}

/// Loaded and attached BPF state; links detach when dropped (fd-based).
struct Loaded {
    skel: CwndSkel<'static>,
    _links: Vec<Link>,
    rings: PerCpuRings,
    /// The attached programs.
    names: [&'static str; 3],
}

/// The programs each mechanism runs: (tcp_probe, send path, destroy).
fn programs(m: Mechanism) -> [&'static str; 3] {
    match m {
        Mechanism::Fentry => ["btf_probe", "fentry_send", "btf_destroy"],
        Mechanism::RawTp => ["raw_probe", "raw_send", "raw_destroy"],
        Mechanism::Kprobe => ["raw_probe", "kprobe_send", "raw_destroy"],
        _ => ["btf_probe", "btf_send", "btf_destroy"],
    }
}

/// What a load reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Events (the tool).
    Events,
    /// serve: idle sends counted per congestion control and reason in the
    /// kernel, no events, and no tcp_probe program.
    Counts,
    /// serve --labels cgroup: as `Counts`, and per owner cgroup.
    CountsByCgroup,
}

fn load(a: &CwndArgs, flow: &FlowFilter, hz: u32, mech: Mechanism, mode: Mode) -> anyhow::Result<Loaded> {
    let count_only = mode != Mode::Events;
    let has_tp = features::btf_has_type("btf_trace_tcp_sendmsg_locked");
    if matches!(mech, Mechanism::TpBtf | Mechanism::RawTp) && !has_tp {
        anyhow::bail!("this kernel has no tcp:tcp_sendmsg_locked tracepoint");
    }
    if matches!(mech, Mechanism::TpBtf | Mechanism::Fentry) {
        // Their per-connection state lives in socket storage.
        features::sk_storage_in_tracing().map_err(|e| anyhow::anyhow!(e))?;
    }
    if mech == Mechanism::Kprobe && !features::has_kprobes() {
        anyhow::bail!("kprobes are not compiled into this kernel (no CONFIG_KPROBES)");
    }
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = CwndSkelBuilder::default().open(storage).context("opening BPF object")?;
    let ncpus = PerCpuRings::size_outer(&mut open.maps.sonde_rings)?;
    let ring_bytes = ringbuf::ring_bytes_per_cpu(ncpus, None);
    let ro = open.maps.rodata_data.as_deref_mut().expect("rodata present");
    crate::set_flow_rodata!(&mut *ro, flow);
    let hashed = matches!(mech, Mechanism::RawTp | Mechanism::Kprobe);
    ro.use_hash = hashed;
    ro.every_ns = a.every.map(|d| d.as_nanos() as u64).unwrap_or(0);
    ro.min_idle_j = a.min_idle.map(|d| ((d.as_nanos() * hz as u128) / 1_000_000_000).max(1) as u32).unwrap_or(0);
    ro.rb_wake_bytes = ringbuf::wake_bytes(ring_bytes as u64);
    ro.count_only = count_only;
    ro.by_cgroup = mode == Mode::CountsByCgroup;
    if mode != Mode::CountsByCgroup {
        open.maps.idle_counts.set_max_entries(256)?;
    }
    if !hashed {
        open.maps.conns.set_max_entries(1)?;
    }
    let mut wanted = programs(mech);
    if count_only {
        wanted[0] = "";
    }
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        prog.set_autoload(wanted.contains(&name.as_str()));
    }
    let skel = open.load().with_context(|| format!("loading {mech} programs"))?;
    let rings = PerCpuRings::create(&skel.maps.sonde_rings, ring_bytes)?;
    let mut links = Vec::new();
    for prog in skel.object().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        if wanted.contains(&name.as_str()) {
            links.push(prog.attach().with_context(|| format!("attaching {name}"))?);
        }
    }
    Ok(Loaded { skel, _links: links, rings, names: wanted })
}

/// Why an idle send did or did not restart slow start (cwnd.h's order).
const REASONS: [&str; 5] = ["idle_over_rto", "sysctl_off", "data_in_flight", "cong_control", "idle_under_rto"];
const CONFIRMED_BY: [&str; 3] = ["send", "ack", "close"];

/// A send after idle, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct IdleSend {
    #[serde(rename = "type")]
    ty: &'static str,
    /// Wall-clock seconds of the send.
    pub time: f64,
    /// The connection and its owner.
    #[serde(flatten)]
    pub flow: FlowJson,
    /// Congestion control name.
    pub cc: String,
    /// Whether it has its own cong_control hook (bbr does).
    pub cong_control: bool,
    /// net.ipv4.tcp_slow_start_after_idle in the socket's namespace.
    pub sysctl: u8,
    /// Whether the kernel restarted slow start.
    pub restart: bool,
    /// Machine-readable reason (REASONS).
    pub reason: &'static str,
    /// The reason in words.
    pub why: String,
    /// Time since the last data was sent, ms.
    pub idle_ms: f64,
    /// The connection's RTO, ms.
    pub rto_ms: f64,
    /// Packets out at the send.
    pub packets_out: u32,
    /// cwnd before the send's first new skb.
    pub cwnd_before: u32,
    /// cwnd the next observation showed.
    pub cwnd_after: u32,
    /// ssthresh before (None: infinite).
    pub ssthresh_before: Option<u32>,
    /// ssthresh after (None: infinite).
    pub ssthresh_after: Option<u32>,
    /// Smoothed RTT at confirmation, µs.
    pub srtt_us: u32,
    /// Maximum segment size, bytes.
    pub mss: u32,
    /// What showed cwnd_after: "send" (a later skb of the send), "ack" or "close".
    pub confirmed_by: &'static str,
}

/// One sample line.
#[derive(Serialize)]
struct SampleLine {
    #[serde(rename = "type")]
    ty: &'static str,
    time: f64,
    #[serde(flatten)]
    flow: FlowJson,
    cc: String,
    cwnd: u32,
    ssthresh: Option<u32>,
    srtt_us: u32,
    rttvar_us: u32,
    inflight: u32,
    packets_out: u32,
    snd_wnd: u32,
    mss: u32,
    ca_state: &'static str,
}

/// What the run saw of one connection (summary rows).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConnSummary {
    /// Socket cookie.
    pub cookie: u64,
    /// `addr:port` local.
    pub local: String,
    /// `addr:port` remote.
    pub remote: String,
    /// Owner pid, when known.
    pub pid: Option<u32>,
    /// Owner comm.
    pub comm: Option<String>,
    /// Congestion control.
    pub cc: String,
    /// Samples emitted.
    pub samples: u64,
    /// Idle sends reported.
    pub idle_sends: u64,
    /// Of which restarted slow start.
    pub restarts: u64,
    /// Smallest, largest and last cwnd sampled.
    pub cwnd_min: u32,
    /// See cwnd_min.
    pub cwnd_max: u32,
    /// See cwnd_min.
    pub cwnd_last: u32,
    /// The last sample's (time s since start, cwnd) points, for the chart.
    #[serde(skip)]
    points: Vec<(f64, f64)>,
    #[serde(skip)]
    marks: Vec<Marker>,
}

/// Counters from the kernel half.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Received segments seen on sending sockets we trace.
    pub observations: u64,
    /// Samples emitted.
    pub samples: u64,
    /// Observations without a change.
    pub unchanged: u64,
    /// Changes not emitted because of --every.
    pub rate_limited: u64,
    /// Send-path points evaluated.
    pub sends: u64,
    /// Idle sends reported.
    pub idle_sends: u64,
    /// Of which restarts.
    pub restarts: u64,
    /// Observations of sockets the filters exclude.
    pub filtered: u64,
    /// Events lost: ring buffer full.
    pub lost: u64,
    /// Hits the kernel skipped (recursion on a CPU).
    pub missed: u64,
    /// Sockets with no room for state (map full).
    pub conn_full: u64,
    /// Sockets not readable as tcp_sock.
    pub unreadable: u64,
}

fn read_totals(l: &Loaded) -> anyhow::Result<Totals> {
    let mut s = [0u64; STAT_MAX];
    for (i, v) in s.iter_mut().enumerate() {
        *v = percpu_sum(&l.skel.maps.stats, i as u32)?;
    }
    let missed = l
        .skel
        .object()
        .progs()
        .filter(|p| l.names.contains(&p.name().to_string_lossy().as_ref()))
        .map(|p| recursion_misses(&p))
        .sum();
    Ok(Totals {
        observations: s[0],
        samples: s[1],
        unchanged: s[2],
        rate_limited: s[3],
        sends: s[4],
        idle_sends: s[5],
        restarts: s[6],
        filtered: s[7],
        lost: s[8],
        conn_full: s[9],
        unreadable: s[10],
        missed,
    })
}

fn flow_json(e: &types::cw_event) -> FlowJson {
    let f = &e.flow;
    FlowJson::new(
        e.cookie,
        f.family,
        &f.saddr,
        f.sport,
        &f.daddr,
        f.dport,
        f.netns,
        (e.has_owner != 0).then_some((e.owner.pid, &e.owner.comm)),
    )
}

/// A value, or "-" for none.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn ssthresh(v: u32) -> Option<u32> {
    (v < INFINITE_SSTHRESH).then_some(v)
}

fn ms(j: u32, hz: u32) -> f64 {
    (j as f64 * 1000.0 / hz as f64 * 10.0).round() / 10.0
}

/// Turns ring-buffer records into lines and per-connection state.
struct Printer {
    sink: Sink,
    format: Format,
    idle_only: bool,
    hz: u32,
    mono_to_epoch: i128,
    start_mono_ns: u64,
    header_done: bool,
    error: Option<std::io::Error>,
    pending: Vec<types::cw_event>,
    conns: BTreeMap<u64, ConnSummary>,
    idle_sends: Vec<IdleSend>,
    /// Whether `idle_sends` is kept (for the caller) or left empty.
    keep_idle_sends: bool,
    /// Chart points kept (each connection's series is thinned when drawn).
    points: usize,
    points_dropped: u64,
    /// Whether points and idle-send marks are kept: only for a chart
    /// (`-o .svg/.html`), so a long streaming run holds no history.
    chart: bool,
    /// Connections not summarized (the map of summaries was full), and the
    /// summary their events go to meanwhile.
    summaries_dropped: u64,
    spare: ConnSummary,
}

/// Connections summarized per run at most (a few hundred bytes each).
const MAX_CONN_SUMMARIES: usize = 100_000;

/// Idle sends kept for the run's outcome (labs and tests read them) at most;
/// a streaming run reports every one as it comes.
const MAX_KEPT_IDLE_SENDS: usize = 100_000;

/// Chart points kept in memory at most (about 16 bytes each).
const MAX_POINTS: usize = 4_000_000;

impl Printer {
    fn event(&mut self, data: &[u8]) {
        let Some(e) = record::decode::<types::cw_event>(data) else { return };
        self.pending.push(e);
    }

    fn print_pending(&mut self) {
        let mut evs = std::mem::take(&mut self.pending);
        evs.sort_by_key(|e| if e.r#type == CW_IDLE_SEND { e.idle.ts_ns } else { e.ts_ns });
        for e in &evs {
            if let Err(err) = self.handle(e) {
                self.error.get_or_insert(err);
            }
        }
        evs.clear();
        self.pending = evs;
    }

    fn since_start(&self, mono_ns: u64) -> f64 {
        mono_ns.saturating_sub(self.start_mono_ns) as f64 / 1e9
    }

    fn conn(&mut self, e: &types::cw_event) -> &mut ConnSummary {
        let f = &e.flow;
        let owned = e.has_owner != 0;
        if self.conns.len() >= MAX_CONN_SUMMARIES && !self.conns.contains_key(&e.cookie) {
            self.summaries_dropped += 1;
            self.spare = ConnSummary::default();
            return &mut self.spare;
        }
        let c = self.conns.entry(e.cookie).or_insert_with(|| ConnSummary {
            cookie: e.cookie,
            local: endpoint(f.family, &f.saddr, f.sport),
            remote: endpoint(f.family, &f.daddr, f.dport),
            cwnd_min: u32::MAX,
            ..Default::default()
        });
        if owned {
            c.pid = Some(e.owner.pid);
            c.comm = Some(cstr(&e.owner.comm));
        }
        let cc = cstr(&e.cc);
        if !cc.is_empty() {
            c.cc = cc;
        }
        c
    }

    fn handle(&mut self, e: &types::cw_event) -> std::io::Result<()> {
        if e.r#type == CW_IDLE_SEND {
            return self.idle(e);
        }
        let t = self.since_start(e.ts_ns);
        let keep = self.chart && self.points < MAX_POINTS;
        let dropped = self.chart && !keep;
        let c = self.conn(e);
        c.samples += 1;
        c.cwnd_min = c.cwnd_min.min(e.cwnd);
        c.cwnd_max = c.cwnd_max.max(e.cwnd);
        c.cwnd_last = e.cwnd;
        let cc = c.cc.clone();
        if keep {
            c.points.push((t, e.cwnd as f64));
            self.points += 1;
        } else if dropped {
            self.points_dropped += 1;
        }
        if self.idle_only {
            return Ok(());
        }
        match self.format {
            Format::Json => self.sink.json(&SampleLine {
                ty: "sample",
                time: epoch_secs(e.ts_ns, self.mono_to_epoch),
                flow: flow_json(e),
                cc,
                cwnd: e.cwnd,
                ssthresh: ssthresh(e.ssthresh),
                srtt_us: e.srtt_us,
                rttvar_us: e.rttvar_us,
                inflight: e.inflight,
                packets_out: e.packets_out,
                snd_wnd: e.snd_wnd,
                mss: e.mss,
                ca_state: ca_state(e.ca_state),
            }),
            Format::Text => {
                self.header()?;
                let line = format!(
                    "{} cwnd {:>5}  ssthresh {:>5}  srtt {:>6} us  inflight {:>5}  {}",
                    self.line_start(e.ts_ns, e, "sample"),
                    e.cwnd,
                    or_dash(ssthresh(e.ssthresh)),
                    e.srtt_us,
                    e.inflight,
                    ca_state(e.ca_state),
                );
                self.sink.line(&line)
            }
            _ => Ok(()),
        }
    }

    /// The columns every text line starts with: time, owner, flow, event.
    fn line_start(&self, ts_ns: u64, e: &types::cw_event, event: &str) -> String {
        let f = &e.flow;
        let owned = e.has_owner != 0;
        format!(
            "{:<12} {:>7} {:<12} {:<45} {event:<9}",
            hms((ts_ns as i128 + self.mono_to_epoch) as u64),
            or_dash(owned.then_some(e.owner.pid)),
            or_dash(owned.then(|| cstr(&e.owner.comm))),
            format!("{} -> {}", endpoint(f.family, &f.saddr, f.sport), endpoint(f.family, &f.daddr, f.dport)),
        )
    }

    fn header(&mut self) -> std::io::Result<()> {
        if self.header_done {
            return Ok(());
        }
        self.header_done = true;
        self.sink.line(&format!(
            "{:<12} {:>7} {:<12} {:<45} {:<9} {}",
            "TIME(UTC)", "PID", "COMM", "LOCAL -> REMOTE", "EVENT", "DETAIL"
        ))
    }

    fn idle(&mut self, e: &types::cw_event) -> std::io::Result<()> {
        let i = &e.idle;
        let cc = cstr(&e.cc);
        let reason = REASONS.get(i.reason as usize).copied().unwrap_or("unknown");
        let (idle_ms, rto_ms) = (ms(i.idle_j, self.hz), ms(i.rto_j, self.hz));
        let why = match i.reason {
            0 => {
                format!("idle {idle_ms} ms > RTO {rto_ms} ms, and {cc} has no cong_control hook: slow start restarted")
            }
            1 => "net.ipv4.tcp_slow_start_after_idle is 0 in this namespace".to_string(),
            2 => format!("{} packets still in flight", i.packets_out),
            3 => format!("{cc} has its own cong_control hook, which skips the RFC 5681 restart"),
            _ => format!("idle {idle_ms} ms <= RTO {rto_ms} ms"),
        };
        let s = IdleSend {
            ty: "idle_send",
            time: epoch_secs(i.ts_ns, self.mono_to_epoch),
            flow: flow_json(e),
            cc,
            cong_control: i.cong_control != 0,
            sysctl: i.sysctl,
            restart: i.reason == 0,
            reason,
            why,
            idle_ms,
            rto_ms,
            packets_out: i.packets_out,
            cwnd_before: i.cwnd,
            cwnd_after: e.cwnd,
            ssthresh_before: ssthresh(i.ssthresh),
            ssthresh_after: ssthresh(e.ssthresh),
            srtt_us: e.srtt_us,
            mss: e.mss,
            confirmed_by: CONFIRMED_BY.get(e.confirmed_by as usize).copied().unwrap_or("unknown"),
        };
        let t = self.since_start(i.ts_ns);
        let chart = self.chart;
        let c = self.conn(e);
        c.idle_sends += 1;
        if s.restart {
            c.restarts += 1;
        }
        if chart {
            c.marks.push(Marker {
                x: t,
                y_from: s.cwnd_before as f64,
                y_to: s.cwnd_after as f64,
                strong: s.restart,
                label: if s.restart {
                    format!(
                        "restart: {} idle {} ms > RTO {} ms, cwnd {} -> {}",
                        s.cc, s.idle_ms, s.rto_ms, s.cwnd_before, s.cwnd_after
                    )
                } else {
                    format!("no restart ({}): {}; cwnd {} -> {}", s.reason, s.why, s.cwnd_before, s.cwnd_after)
                },
            });
        }
        match self.format {
            Format::Json => self.sink.json(&s)?,
            Format::Text => {
                self.header()?;
                let what = if s.restart { "RESTART".to_string() } else { format!("no-restart: {}", s.reason) };
                let line = format!(
                    "{} {what} [{}] idle {} ms, RTO {} ms, cwnd {} -> {}, ssthresh {} -> {}; {}",
                    self.line_start(i.ts_ns, e, "idle_send"),
                    s.cc,
                    s.idle_ms,
                    s.rto_ms,
                    s.cwnd_before,
                    s.cwnd_after,
                    or_dash(s.ssthresh_before),
                    or_dash(s.ssthresh_after),
                    s.why,
                );
                self.sink.line(&line)?;
            }
            _ => {}
        }
        if self.keep_idle_sends && self.idle_sends.len() < MAX_KEPT_IDLE_SENDS {
            self.idle_sends.push(s);
        }
        Ok(())
    }
}

/// What a finished run saw, for labs and tests.
pub struct Outcome {
    /// Every idle send, in time order (the first 100,000; none unless the
    /// caller of [`run_with`] asked to keep them).
    pub idle_sends: Vec<IdleSend>,
    /// Per connection.
    pub conns: Vec<ConnSummary>,
    /// Kernel-side counters.
    pub totals: Totals,
    /// The send-path mechanism used.
    pub mechanism: Mechanism,
    /// Why it stopped.
    pub stop: Stop,
}

fn summary_text(t: &Totals, conns: &[ConnSummary], mech: Mechanism, elapsed: Duration, dropped: u64) -> String {
    let rows: Vec<Vec<String>> = conns
        .iter()
        .map(|c| {
            vec![
                format!("{:x}", c.cookie),
                c.local.clone(),
                c.remote.clone(),
                or_dash(c.pid),
                or_dash(c.comm.as_deref()),
                c.cc.clone(),
                c.samples.to_string(),
                c.idle_sends.to_string(),
                c.restarts.to_string(),
                if c.samples > 0 { format!("{}/{}/{}", c.cwnd_min, c.cwnd_max, c.cwnd_last) } else { "-".into() },
            ]
        })
        .collect();
    let mut s = format!("\nSummary ({:.1}s, {mech}):\n", elapsed.as_secs_f64());
    s.push_str(&table(
        &["SK", "LOCAL", "REMOTE", "PID", "COMM", "CC", "SAMPLES", "IDLE_SENDS", "RESTARTS", "CWND MIN/MAX/LAST"],
        &rows,
    ));
    s.push_str(&format!(
        "\nobservations {} (unchanged {}, rate-limited {}), samples {}, sends evaluated {}, idle sends {}, restarts {}, filtered {}\nlost events: {} (ring buffer full) + {} (missed: kernel skipped the program on a busy CPU)  map full: conns {}  unreadable {}{}",
        t.observations, t.unchanged, t.rate_limited, t.samples, t.sends, t.idle_sends, t.restarts, t.filtered, t.lost, t.missed, t.conn_full, t.unreadable,
        if dropped > 0 { format!("  chart points dropped {dropped}") } else { String::new() }
    ));
    if t.lost > 0 {
        s.push_str("\nhint: events were lost; use --every, --idle-only or filters");
    }
    s
}

/// Writes the chart; the connections' points and marks move into it (up to
/// MAX_POINTS of them: not copied).
fn write_chart(
    path: &Path,
    format: Format,
    conns: &mut [ConnSummary],
    t: &Totals,
    elapsed: Duration,
) -> anyhow::Result<()> {
    let series: Vec<Series> = conns
        .iter_mut()
        .filter(|c| !c.points.is_empty() || !c.marks.is_empty())
        .map(|c| Series {
            name: format!("{} -> {} {} {}", c.local, c.remote, c.cc, c.comm.clone().unwrap_or_default()),
            points: std::mem::take(&mut c.points),
            markers: std::mem::take(&mut c.marks),
        })
        .collect();
    let chart = Chart {
        title: format!(
            "cwnd per connection ({:.1} s; {} idle sends, {} restarts)",
            elapsed.as_secs_f64(),
            t.idle_sends,
            t.restarts
        ),
        x_label: "seconds since start".into(),
        y_label: "cwnd (packets)".into(),
        series,
    };
    let text = if format == Format::Svg { chart.svg() } else { chart.html() };
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Runs `sonde cwnd`; `ready` is called once everything is attached.
/// `keep_idle_sends`: return the idle sends in [`Outcome::idle_sends`] (the
/// labs read them); the CLI streams them and keeps none, so a long run's
/// memory stays flat.
pub fn run_with(
    a: &CwndArgs,
    ctl: &RunControl,
    keep_idle_sends: bool,
    ready: impl FnOnce(),
) -> anyhow::Result<Outcome> {
    let flow = a.flow.validate()?;
    let format = format_of(a)?;
    features::require_tracing_privileges()?;
    let hz = kernel_hz()?;
    let sink = open_sink(a, format)?;
    let order = attach::order(MECHANISMS, a.mechanism);
    let (loaded, mech, _fails) =
        with_fallbacks("tcp:tcp_probe and the TCP send path", &order, |m| load(a, &flow, hz, m, Mode::Events))?;
    ctl.start_clock();
    let start = Instant::now();
    let start_mono_ns = (clock_ns(libc::CLOCK_MONOTONIC)) as u64;
    ready();

    let printer = Rc::new(RefCell::new(Printer {
        sink,
        format,
        idle_only: a.idle_only,
        hz,
        mono_to_epoch: mono_to_epoch(),
        start_mono_ns,
        header_done: false,
        error: None,
        pending: Vec::new(),
        conns: BTreeMap::new(),
        idle_sends: Vec::new(),
        keep_idle_sends,
        points: 0,
        points_dropped: 0,
        chart: matches!(format, Format::Svg | Format::Html),
        summaries_dropped: 0,
        spare: ConnSummary::default(),
    }));
    let p2 = printer.clone();
    let rb = loaded.rings.reader(move |d: &[u8]| p2.borrow_mut().event(d))?;
    let stop = poll_until_stop(Some(&rb), ctl, None, |_| {
        let mut p = printer.borrow_mut();
        p.print_pending();
        p.sink.flush()?;
        Ok(())
    })?;
    drop(rb);
    let mut p = printer.borrow_mut();
    p.print_pending();
    let totals = read_totals(&loaded)?;
    let elapsed = start.elapsed();
    if let Some(e) = p.error.take() {
        return Err(anyhow::Error::new(e).context("writing events"));
    }
    let mut conns: Vec<ConnSummary> = std::mem::take(&mut p.conns).into_values().collect();
    let dropped = p.points_dropped;
    let summary = Summary {
        kind: "summary",
        connections: &conns,
        totals: &totals,
        observations: totals.observations,
        samples: totals.samples,
        idle_sends: totals.idle_sends,
        restarts: totals.restarts,
        lost: totals.lost,
        missed: totals.missed,
        map_full: MapFull { conns: totals.conn_full, summaries: p.summaries_dropped },
        chart_points_dropped: dropped,
        mechanism: mech,
        hz,
        duration_s: (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
    };
    match format {
        Format::Json => p.sink.json(&summary)?,
        Format::Text => p.sink.line(&summary_text(&totals, &conns, mech, elapsed, dropped))?,
        Format::Svg | Format::Html => {
            let path = a.run.path().expect("chart formats come from -o");
            write_chart(path, format, &mut conns, &totals, elapsed)?;
            let s = summary_text(&totals, &conns, mech, elapsed, dropped);
            eprintln!("{s}\nsonde: wrote {}", path.display());
        }
    }
    p.sink.flush()?;
    Ok(Outcome { idle_sends: std::mem::take(&mut p.idle_sends), conns, totals, mechanism: mech, stop })
}

/// Where cwnd writes: the `-o` file or stdout for text and JSON (they
/// stream); a chart is written at the end, so its file is only created now
/// (an unwritable path fails before anything is attached) and the sink is stdout.
fn open_sink(a: &CwndArgs, format: Format) -> anyhow::Result<Sink> {
    match format {
        Format::Svg | Format::Html => {
            if let Some(p) = a.run.path() {
                std::fs::File::create(p)
                    .map_err(|e| usage(format!("-o {}: cannot write it ({e}); pick a writable path", p.display())))?;
            }
            Sink::open(None)
        }
        _ => Sink::open(a.run.path()),
    }
}

/// cwnd's `{"type":"summary",...}` line (schema in the README).
#[derive(Serialize)]
struct Summary<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    connections: &'a [ConnSummary],
    totals: &'a Totals,
    observations: u64,
    samples: u64,
    idle_sends: u64,
    restarts: u64,
    lost: u64,
    missed: u64,
    map_full: MapFull,
    chart_points_dropped: u64,
    mechanism: Mechanism,
    hz: u32,
    duration_s: f64,
}

/// The summary's `"map_full"` object.
#[derive(Serialize)]
struct MapFull {
    conns: u64,
    /// Events of connections first seen after [`MAX_CONN_SUMMARIES`] had a
    /// summary: counted in the totals, their connections not listed.
    summaries: u64,
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &CwndArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.run.duration)?;
    let out = run_with(a, &ctl, false, || {
        eprintln!("sonde: tracing TCP congestion windows and idle restarts; Ctrl-C ends with a summary");
    })?;
    Ok(out.stop.exit_code())
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use libbpf_rs::skel::SkelBuilder;

    use super::*;

    /// The stats map has exactly the slots STAT_MAX, copied from cwnd.h, says
    /// (no root needed: the object is opened, not loaded).
    #[test]
    fn stats_map_size_matches_the_slot_constants() {
        let mut storage = MaybeUninit::uninit();
        let open = skel::CwndSkelBuilder::default().open(&mut storage).expect("open the object");
        assert_eq!(open.maps.stats.max_entries() as usize, STAT_MAX);
    }
}
