//! `sonde slow`: calls over a threshold with their callers' stacks, and a
//! flame graph of what they were doing while already slow. Shares its kernel
//! half (funclatency.bpf.c) and target syntax with `funclatency`.
//!
//! [`run_with`] goes through the lifecycle in order: `validate`, `load`,
//! `drain` the ring buffer of slow calls until the stop, `read_at_stop`
//! before anything is detached, then `detach`, `slow_calls` (their callers'
//! stacks), `flame_graph` (the samples, written to -o) and the typed
//! [`Summary`]. [`run`] prints with `print_json` or `print_text`.
use std::{
    cell::RefCell,
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, HashMap},
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use libbpf_rs::{RingBuffer, RingBufferBuilder};
use serde::Serialize;

use super::{
    detach, load_with_fallback, read_at_stop, skel::FunclatencySkel, targets::Probe, AtStop, KernelMechanism, Loaded,
    NotTimed, Probing, Scope, SlowCfg, FL_SAMPLES, FL_SAMPLES_OUTSIDE, FL_SLOW_LOST, FL_STACKS,
};
use crate::engine::caps::Caps;
use crate::engine::hist::human;
use crate::engine::{
    error::usage,
    features,
    pprof::Weight,
    record::percpu_sum,
    render::Format,
    run::{duration_arg, RunControl, Stop},
    stacks::{read_return_probe_stack, read_stack, read_user_stack, Images, RawSample, Stack, SymStats, Symbols},
    stacktool::{self, Finished, StackLoss},
    taskfilter::{self, Targets, TaskFilter},
    unwind::{self, UnwMaps, UnwindArgs},
};
use serde_json::{json, Value};

/// Most slow calls listed one by one: the slowest. Every slow call is
/// counted, and grouped into its call site.
const KEEP: usize = 10_000;

/// Most call sites (target, process and the stacks as the kernel keyed them)
/// a run groups slow calls into. A call at a site past them is counted
/// (`lost.sites_full`) but in no site.
const SITES_MAX: usize = 65_536;

/// Calls slower than a threshold, and what they were doing while slow.
///
/// TARGET as for `funclatency` (BINARY:GLOB, syscall:GLOB, softirq:NAME,
/// kernel:GLOB). Every call longer than --over is reported with its latency,
/// thread and the stack it was called from (taken at its return: the
/// caller's stack; kernel functions keep the kernel and user stacks; for
/// softirqs the kernel stack that ran it). Meanwhile a timer samples, at
/// -F Hz per CPU, the stacks of threads that are inside a call already
/// older than --over (per CPU for softirqs), so the flame graph shows what
/// slow calls were doing on CPU once slow, and nothing of fast calls. Time a
/// slow call spends blocked shows in `sonde offcpu`.
///
/// Output: the slowest calls (--top), then the flame graph's top table, or
/// -o FILE (.folded .svg .html .pb.gz .json) rooted at `TARGET [process]`.
///
/// OVERHEAD: funclatency's per call, plus one map lookup per timer sample
/// and a stack walk per sample inside a slow call (walked from unwind tables
/// by default: ~3 us for 35 frames in BPF, see `sonde profile --help`).
#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("JSON lines: each slow call, each flame-graph stack, then a summary")))]
#[command(mut_arg("output", |a| a.help("Write the flame graph of slow calls here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)")))]
pub struct SlowArgs {
    /// Targets, filters and duration.
    #[command(flatten)]
    pub scope: Scope,
    /// Report calls longer than this (e.g. 100us, 5ms).
    #[arg(long, value_parser = duration_arg, required = true)]
    pub over: Duration,
    /// Samples per second per CPU while a call is slow.
    #[arg(short = 'F', long = "frequency", default_value_t = 999)]
    pub frequency: u64,
    /// Slowest calls listed (and rows of the top table).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Sample user stacks only.
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,
    /// Sample kernel stacks only.
    #[arg(long)]
    pub kernel_only: bool,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: UnwindArgs,
    /// Start this command and watch it and the processes it starts, from
    /// their first instruction; the run ends when they have all exited
    /// (after `--`: `sonde slow ./app:handle --over 5ms -- ./app`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// One call over the threshold.
pub struct SlowCall {
    /// Target name.
    pub target: String,
    /// Its latency.
    pub latency_ns: u64,
    /// Process, thread and thread name.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// Thread name.
    pub comm: String,
    /// The stack it was called from, root first.
    pub stack: Stack,
}

/// What was lost: stacks (as every stack tool counts them) and slow calls.
#[derive(Debug, Clone, Serialize)]
pub struct Lost {
    /// Stack counters.
    #[serde(flatten)]
    pub stacks: StackLoss,
    /// Slow calls dropped because the ring buffer was full.
    pub slow_calls: u64,
    /// Slow calls counted but in no call site: [`SITES_MAX`] sites were
    /// held already.
    pub sites_full: u64,
}

/// The last `--json` line of a run; the text summary is printed from it too.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    ty: &'static str,
    /// Time from attaching to the stop.
    pub duration_s: f64,
    /// The threshold.
    pub over_ns: u64,
    /// Calls timed, over every target.
    pub calls: u64,
    /// Calls over the threshold (all counted and grouped by call site; the
    /// 10,000 slowest listed one by one).
    pub slow_calls: u64,
    /// Slow calls listed one by one (`slow_call` lines).
    pub slow_calls_listed: u64,
    /// Call sites the slow calls were grouped into (`slow_site` lines).
    pub sites: u64,
    /// Calls still running at the stop.
    pub in_flight: u64,
    /// Those of them already past the threshold.
    pub in_flight_over: u64,
    /// Timer samples inside slow calls.
    pub samples: u64,
    /// Timer samples of threads not inside a slow call.
    pub samples_outside_slow_calls: u64,
    /// Unique stacks read from the kernel.
    pub unique_stacks: u64,
    /// What was lost.
    pub lost: Lost,
    /// Calls that were not timed.
    pub not_timed: NotTimed,
    /// Stacks truncated, over the slow calls' and the samples'.
    pub truncated_stacks: u64,
    /// Samples taken while the kernel entered or left a signal handler
    /// (a kernel frame `[signal delivery]` in place of the user stack), as
    /// every stack tool reports them.
    pub signal_delivery_samples: u64,
    /// Samples of cut stacks, by reason, as every stack tool reports them.
    pub truncated_by: std::collections::BTreeMap<&'static str, u64>,
    /// Perf maps refused or cut short, and their lines skipped, as every
    /// stack tool reports them.
    #[serde(flatten)]
    pub perf_maps: crate::engine::perfmap::Tally,
    /// Mapped files the symbolizer could not read, by reason, over the slow
    /// calls' and the samples' stacks.
    pub unsymbolized_files: std::collections::BTreeMap<&'static str, u64>,
    /// How user stacks were walked.
    pub unwind: crate::engine::unwind::Report,
    /// "fentry", "kprobe-multi" or "kprobe" when there are kernel functions (else null).
    pub kernel_mechanism: Option<&'static str>,
    /// Functions the kernel refused a probe on, not traced.
    pub unprobeable: Vec<String>,
    /// The command the run started (`-- CMD`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<stacktool::CommandSummary>,
}

/// What a run saw.
pub struct Outcome {
    /// The slowest calls kept, slowest first.
    pub calls: Vec<SlowCall>,
    /// Every slow call grouped by target and the stack it was called from,
    /// the site with the slowest call first.
    pub sites: Vec<Site>,
    /// Samples inside slow calls, rooted at `TARGET [process]`.
    pub stacks: Vec<Stack>,
    /// The summary.
    pub summary: Summary,
    /// Why it stopped.
    pub stop: Stop,
}

/// Slow calls of one target from one stack.
pub struct Site {
    /// The slowest of them.
    pub slowest: SlowCall,
    /// How many.
    pub calls: u64,
    /// Their total latency.
    pub sum_ns: u64,
}

/// A call site's `--json` line.
#[derive(Serialize)]
struct SiteLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    target: &'a str,
    calls: u64,
    avg_ns: u64,
    max_ns: u64,
    pid: u32,
    tid: u32,
    comm: &'a str,
    stack: Vec<String>,
}

/// A slow call's `--json` line.
#[derive(Serialize)]
struct SlowCallLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    target: &'a str,
    latency_ns: u64,
    pid: u32,
    tid: u32,
    comm: &'a str,
    stack: Vec<String>,
}

#[derive(Clone)]
struct Event {
    latency_ns: u64,
    pid: u32,
    tid: u32,
    idx: u32,
    ustack: i32,
    kstack: i32,
    uhash: u64,
    comm: String,
}

fn parse(d: &[u8]) -> Option<Event> {
    // struct fl_slow_event
    if d.len() < 64 {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(d[o..o + 4].try_into().unwrap());
    let end = d[36..52].iter().position(|&c| c == 0).unwrap_or(16);
    Some(Event {
        latency_ns: u64::from_ne_bytes(d[8..16].try_into().unwrap()),
        pid: u32_at(16),
        tid: u32_at(20),
        idx: u32_at(24),
        ustack: u32_at(28) as i32,
        kstack: u32_at(32) as i32,
        uhash: u64::from_ne_bytes(d[56..64].try_into().unwrap()),
        comm: String::from_utf8_lossy(&d[36..36 + end]).into_owned(),
    })
}

/// Where a slow call came from, as the kernel handed it over (stack ids
/// stay valid: the stack map never reuses one).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SiteKey {
    idx: u32,
    pid: u32,
    ustack: i32,
    kstack: i32,
    uhash: u64,
}

/// The slow calls of one [`SiteKey`].
struct SiteAgg {
    count: u64,
    sum_ns: u64,
    slowest: Event,
}

/// Slow calls from the ring buffer: the [`KEEP`] slowest, how many there
/// were, and all of them by call site.
#[derive(Default)]
struct Seen {
    /// Every slow call's site (up to [`SITES_MAX`]).
    sites: HashMap<SiteKey, SiteAgg>,
    /// Slow calls at sites past [`SITES_MAX`].
    sites_full: u64,
    /// Min-heap on (latency, arrival): the fastest kept call is on top, to
    /// make room for a slower one once [`KEEP`] are kept.
    kept: BinaryHeap<Reverse<Ranked>>,
    total: u64,
    arrivals: u64,
    /// Processes of calls kept since the last tick (their maps are noted
    /// while they run, for symbolizing at the end).
    new_pids: BTreeSet<u32>,
}

/// A kept call, ordered by latency, then by arrival.
struct Ranked(u64, u64, Event);

impl PartialEq for Ranked {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ranked {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(o.0, o.1))
    }
}

impl Seen {
    /// Counts a slow call and keeps it if it is among the [`KEEP`] slowest.
    fn add(&mut self, e: Event) {
        self.total += 1;
        self.arrivals += 1;
        let key = SiteKey { idx: e.idx, pid: e.pid, ustack: e.ustack, kstack: e.kstack, uhash: e.uhash };
        let n = self.sites.len();
        match self.sites.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let a = o.get_mut();
                a.count += 1;
                a.sum_ns += e.latency_ns;
                if e.latency_ns > a.slowest.latency_ns {
                    a.slowest = e.clone();
                }
            }
            std::collections::hash_map::Entry::Vacant(v) if n < SITES_MAX => {
                self.new_pids.insert(e.pid);
                v.insert(SiteAgg { count: 1, sum_ns: e.latency_ns, slowest: e.clone() });
            }
            std::collections::hash_map::Entry::Vacant(_) => self.sites_full += 1,
        }
        if self.kept.len() >= KEEP {
            match self.kept.peek() {
                Some(Reverse(min)) if min.0 < e.latency_ns => {
                    self.kept.pop();
                }
                _ => return,
            }
        }
        self.new_pids.insert(e.pid);
        self.kept.push(Reverse(Ranked(e.latency_ns, self.arrivals, e)));
    }
}

/// The -o files and their formats.
type Outs = Vec<(PathBuf, Format)>;

/// Step 1: checks the arguments and the -o files, and resolves the targets.
fn validate(a: &SlowArgs) -> anyhow::Result<(Outs, TaskFilter, Vec<Probe>)> {
    if a.frequency == 0 || a.frequency > 10_000 {
        return Err(usage(format!("-F {}: pick 1 to 10000 samples per second", a.frequency)));
    }
    if !a.command.is_empty() && !a.scope.pid.is_empty() {
        return Err(usage("-- CMD watches the command it starts: give it without -p"));
    }
    let outs = stacktool::check_outputs(&a.scope.run.output)?;
    let (tf, probes) = a.scope.resolve()?;
    Ok((outs, tf, probes))
}

/// Step 2: loads and attaches funclatency's kernel half with the sampler,
/// by the first way the kernel allows.
fn load(a: &SlowArgs, tf: &TaskFilter, probes: &[Probe]) -> anyhow::Result<Loaded> {
    features::require_tracing_privileges()?;
    stacktool::raise_open_files();
    let cfg = SlowCfg {
        over_ns: a.over.as_nanos() as u64,
        hz: a.frequency,
        want_kernel: !a.user_only,
        want_user: !a.kernel_only,
        unwind: unwind::Plan::new(&a.unwind)?,
    };
    load_with_fallback(&a.scope.pid, tf, probes, &a.scope, Some(&cfg))
}

/// The ring buffer of slow calls, gathered into the returned [`Seen`].
fn ring<'a>(
    skel: &'a FunclatencySkel<'_>,
    session: &unwind::Session,
) -> anyhow::Result<(Rc<RefCell<Seen>>, RingBuffer<'a>)> {
    let seen: Rc<RefCell<Seen>> = Rc::default();
    let sink = seen.clone();
    let mut rb = RingBufferBuilder::new();
    rb.add(&skel.maps.slow_events, move |d: &[u8]| {
        if let Some(e) = parse(d) {
            sink.borrow_mut().add(e);
        }
        0
    })?;
    // Processes that exec or start wake the poll to load their tables.
    session.wake_on(&mut rb, &skel.maps.unw_wake)?;
    Ok((seen, rb.build().context("setting up the ring buffer")?))
}

/// Step 3: drains the ring buffer until the stop, noting the processes
/// whose stacks will be symbolized.
fn drain(
    a: &SlowArgs,
    ctl: &RunControl,
    skel: &FunclatencySkel<'_>,
    unw: (&mut unwind::Session, &UnwMaps<'_>),
    rb: &RingBuffer<'_>,
    seen: &RefCell<Seen>,
    targets: &mut Targets,
) -> anyhow::Result<(Stop, Images)> {
    stacktool::run_until_stop(
        &skel.maps.stk_counts,
        ctl,
        a.scope.run.duration,
        Some(rb),
        unw,
        (targets, &skel.maps.tf_pids),
        || {
            // As in funclatency: a thread that exits inside a call would keep
            // it in flight, old enough to look slow to the sampler.
            super::prune_dead_threads(&skel.maps.stacks);
            std::mem::take(&mut seen.borrow_mut().new_pids).into_iter().collect()
        },
        || Ok(format!("sonde slow: {} calls over {}", seen.borrow().total, human(a.over.as_nanos() as u64))),
    )
}

/// Step 4: the slow calls, in the order given, with their callers' stacks.
fn slow_calls(
    skel: &FunclatencySkel<'_>,
    probes: &[Probe],
    evs: Vec<Event>,
    images: &mut Images,
) -> anyhow::Result<(Vec<SlowCall>, SymStats)> {
    // Kernel functions by kprobe: their stacks are taken in the return
    // probe (arm64 before 5.15 hands it no pc: see read_return_probe_stack).
    // Looked up only for those: parsing /proc/kallsyms twice took most of a
    // short run of user-function probes.
    let kernel = probes.iter().any(|p| matches!(p.kind, super::targets::ProbeKind::Kernel(_)));
    let trampoline = if kernel {
        ["kretprobe_trampoline", "__kretprobe_trampoline"]
            .into_iter()
            .find_map(crate::engine::symbols::kernel_function_range)
            .map_or(0, |r| r.0)
    } else {
        0
    };
    let raws: Vec<RawSample> = evs
        .iter()
        .map(|e| {
            let (ustack, walk, lang) = match read_user_stack(crate::stack_maps!(skel), -1, e.uhash)? {
                (pcs, Some(w), lang) => (pcs, Some(w), lang),
                _ => (read_stack(&skel.maps.stk_traces, e.ustack)?, None, None),
            };
            Ok(RawSample {
                pid: e.pid,
                tid: e.tid,
                comm: e.comm.clone(),
                kstack: read_return_probe_stack(&skel.maps.stk_traces, e.kstack, trampoline)?,
                ustack,
                walk,
                lang,
                in_signal: false,
                count: 1,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    for e in &evs {
        images.observe(e.pid);
    }
    let mut sym = SymStats::default();
    let entry_stacks = Symbols::default().stacks(&raws, images, &mut sym);
    let calls = evs
        .into_iter()
        .zip(entry_stacks)
        .map(|(e, stack)| SlowCall {
            target: probes.get(e.idx as usize).map(|p| p.name.clone()).unwrap_or_default(),
            latency_ns: e.latency_ns,
            pid: e.pid,
            tid: e.tid,
            comm: e.comm,
            stack,
        })
        .collect();
    Ok((calls, sym))
}

/// The sites' slowest calls, symbolized and in the order of `aggs`, merged
/// where the names come out the same (one function called from one place
/// under two stack ids, or by two processes of one program).
fn group_sites(calls: Vec<SlowCall>, aggs: &[SiteAgg]) -> Vec<Site> {
    let mut out: Vec<Site> = Vec::new();
    let mut at: HashMap<(String, Vec<String>), usize> = HashMap::new();
    for (c, a) in calls.into_iter().zip(aggs) {
        let key = (c.target.clone(), names(&c.stack));
        match at.get(&key) {
            Some(&i) => {
                out[i].calls += a.count;
                out[i].sum_ns += a.sum_ns;
            }
            None => {
                at.insert(key, out.len());
                out.push(Site { calls: a.count, sum_ns: a.sum_ns, slowest: c });
            }
        }
    }
    out
}

/// Step 5: the samples inside slow calls, rooted at their target, written
/// to the -o files.
fn flame_graph(
    a: &SlowArgs,
    outs: &[(PathBuf, Format)],
    skel: &FunclatencySkel<'_>,
    probes: &[Probe],
    images: Images,
    elapsed: Duration,
) -> anyhow::Result<Finished> {
    let names: Vec<String> = probes.iter().map(|p| p.name.clone()).collect();
    let relabel = |s: &mut Stack| {
        let t = names.get((s.tid as usize).wrapping_sub(1)).cloned().unwrap_or_else(|| "?".into());
        s.process = format!("{t} [{}]", s.process);
        s.tid = 0;
    };
    stacktool::finish(
        &skel.maps.stk_counts,
        crate::stack_maps!(skel),
        images,
        &stacktool::Outputs {
            outs,
            title: format!("sonde slow --over {}, {:.1} s", human(a.over.as_nanos() as u64), elapsed.as_secs_f64()),
            count_name: "samples",
            divisor: 1,
            weight: Weight::Samples { period_ns: (1e9 / a.frequency as f64) as i64 },
            elapsed,
            comment: format!("sonde slow --over {:?} -F {}", a.over, a.frequency),
            relabel: Some(&relabel),
        },
    )
}

/// Everything the summary is made of, read at the stop.
struct Totals {
    at_stop: AtStop,
    slow_total: u64,
    sites_full: u64,
    listed: usize,
    sites: usize,
    loss: StackLoss,
    unwind: unwind::Report,
    /// Stacks truncated among the slow calls'.
    call_sym: SymStats,
}

/// Step 6: the summary, with the sample and lost counts read now (after
/// detaching).
fn summary(
    a: &SlowArgs,
    skel: &FunclatencySkel<'_>,
    t: Totals,
    f: &Finished,
    probing: Probing,
) -> anyhow::Result<Summary> {
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let over_ns = a.over.as_nanos() as u64;
    let flight = &t.at_stop.flight;
    let lost = Lost { stacks: t.loss, slow_calls: st(FL_SLOW_LOST)?, sites_full: t.sites_full };
    Ok(Summary {
        ty: "summary",
        duration_s: t.at_stop.elapsed.as_secs_f64(),
        over_ns,
        calls: t.at_stop.hists.iter().map(|h| h.count).sum(),
        slow_calls: t.slow_total,
        slow_calls_listed: t.listed as u64,
        sites: t.sites as u64,
        in_flight: flight.iter().map(|f| f.0).sum(),
        in_flight_over: flight.iter().filter(|(c, age)| *c > 0 && *age >= over_ns).map(|(c, _)| *c).sum(),
        samples: st(FL_SAMPLES)?,
        samples_outside_slow_calls: st(FL_SAMPLES_OUTSIDE)?,
        unique_stacks: f.unique,
        lost,
        not_timed: t.at_stop.not_timed,
        truncated_stacks: f.sym.truncated_stacks + t.call_sym.truncated_stacks,
        signal_delivery_samples: f.sym.signal_samples,
        truncated_by: f.sym.truncated_by.clone(),
        perf_maps: f.sym.perf_maps.clone(),
        unsymbolized_files: {
            let mut m = f.sym.unsymbolized_files.clone();
            for (k, n) in &t.call_sym.unsymbolized_files {
                *m.entry(k).or_default() += n;
            }
            m
        },
        unwind: t.unwind.clone(),
        kernel_mechanism: probing.kernel.map(KernelMechanism::name),
        unprobeable: probing.unprobeable,
        command: f.command.clone(),
    })
}

/// Runs slow; `ready` is called once everything is attached.
pub fn run_with(a: &SlowArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    let (outs, mut tf, probes) = validate(a)?;
    crate::engine::symbols::prefetch_signal_register_ranges();
    let launched = taskfilter::launch(&a.command, &mut tf)?;
    let mut loaded = load(a, &tf, &probes)?;
    let mut targets = Targets::new(&tf, launched);
    let attached = Instant::now();
    let skel = &loaded.skel;
    let um = crate::unw_maps!(skel);
    let (seen, rb) = ring(skel, &loaded.session)?;
    ready();
    let (stop, mut images) = drain(a, ctl, skel, (&mut loaded.session, &um), &rb, &seen, &mut targets)?;
    let at_stop = read_at_stop(skel, &probes, attached)?;
    detach(loaded.links);
    let _ = rb.consume();
    let loss = StackLoss::read(&skel.maps.stats, FL_STACKS)?;
    let unwind = loaded.session.report(&um)?;
    let Seen { kept, total: slow_total, sites, sites_full, .. } = std::mem::take(&mut *seen.borrow_mut());
    // The listed calls and each site's slowest, symbolized in one pass.
    let mut evs: Vec<Event> = kept.into_sorted_vec().into_iter().map(|Reverse(Ranked(_, _, e))| e).collect();
    let listed = evs.len();
    let mut aggs: Vec<SiteAgg> = sites.into_values().collect();
    aggs.sort_by_key(|s| Reverse(s.slowest.latency_ns));
    evs.extend(aggs.iter().map(|s| s.slowest.clone()));
    let (mut calls, call_sym) = slow_calls(skel, &probes, evs, &mut images)?;
    let sites = group_sites(calls.split_off(listed), &aggs);
    drop(aggs);
    let mut f = flame_graph(a, &outs, skel, &probes, images, at_stop.elapsed)?;
    f.command = stacktool::CommandSummary::of(&targets, &skel.maps.tf_pids, &skel.maps.tf_lost);
    let totals = Totals { at_stop, slow_total, sites_full, listed, sites: sites.len(), loss, unwind, call_sym };
    let summary = summary(a, skel, totals, &f, loaded.probing)?;
    Ok(Outcome { calls, sites, stacks: f.stacks, summary, stop })
}

fn names(s: &Stack) -> Vec<String> {
    s.frames.iter().map(|f| f.name.clone()).collect()
}

/// How slow runs on this kernel (`sonde doctor`): funclatency's probes plus a perf-event sampler.
pub fn doctor(cx: &Caps) -> Value {
    let mut slow = super::doctor(cx);
    if slow["usable"] == json!(true) {
        let sampler = if cx.ok("perf_event") {
            "; sampler: perf_event cpu-clock"
        } else {
            "; no perf_event sampling: no flame graph of slow calls"
        };
        slow["detail"] = json!(format!("{}{sampler}", slow["detail"].as_str().unwrap_or("")));
    }
    cx.with_unwind(slow)
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &SlowArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.scope.run.duration)?;
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: watching for calls over {}; Ctrl-C ends and reports", human(a.over.as_nanos() as u64))
    })?;
    if a.scope.run.json {
        print_json(&out)?;
    } else {
        print_text(a, &out)?;
    }
    Ok(out.stop.exit_code())
}

/// A line per slow call, per call site, then the flame-graph stacks, then
/// the summary.
fn print_json(out: &Outcome) -> anyhow::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
    for c in &out.calls {
        let line = SlowCallLine {
            ty: "slow_call",
            target: &c.target,
            latency_ns: c.latency_ns,
            pid: c.pid,
            tid: c.tid,
            comm: &c.comm,
            stack: names(&c.stack),
        };
        serde_json::to_writer(&mut w, &line)?;
        writeln!(w)?;
    }
    for s in &out.sites {
        let c = &s.slowest;
        let line = SiteLine {
            ty: "slow_site",
            target: &c.target,
            calls: s.calls,
            avg_ns: s.sum_ns.checked_div(s.calls).unwrap_or(0),
            max_ns: c.latency_ns,
            pid: c.pid,
            tid: c.tid,
            comm: &c.comm,
            stack: names(&c.stack),
        };
        serde_json::to_writer(&mut w, &line)?;
        writeln!(w)?;
    }
    crate::engine::render::json_lines(&mut w, &out.stacks)?;
    serde_json::to_writer(&mut w, &out.summary)?;
    writeln!(w)?;
    w.flush()?;
    Ok(())
}

/// The counts, the slowest call sites and the flame graph's top table; what
/// was still running or lost to stderr.
fn print_text(a: &SlowArgs, out: &Outcome) -> anyhow::Result<()> {
    let s = &out.summary;
    super::unprobeable_note(&s.unprobeable);
    crate::outln!(
        "{} calls over {} of {} calls; {} samples inside them",
        s.slow_calls,
        human(s.over_ns),
        s.calls,
        s.samples
    )?;
    print_sites(&out.sites, a.top)?;
    if a.scope.run.output.is_empty() && !out.stacks.is_empty() {
        crate::outln!()?;
        stacktool::print_top(&out.stacks, a.top, "SAMPLES", |v| v.to_string())?;
    }
    eprintln!(
        "{} still running past the threshold at the end; lost: {} slow calls (ring full); {} samples outside slow calls",
        s.in_flight_over, s.lost.slow_calls, s.samples_outside_slow_calls
    );
    if let Some(line) = stacktool::signal_delivery_line(s.signal_delivery_samples, "samples") {
        eprintln!("{line}");
    }
    if let Some(line) = s.perf_maps.text() {
        eprintln!("{line}");
    }
    if let Some(c) = &s.command {
        eprintln!("{}", c.text());
    }
    Ok(())
}

/// The `top` slowest call sites: every slow call grouped by target and the
/// stack it was called from, the site of the slowest call first.
fn print_sites(sites: &[Site], top: usize) -> anyhow::Result<()> {
    if !sites.is_empty() {
        crate::outln!("{:>9} {:>9} {:>7}  TARGET  (slowest: pid/tid comm)  CALLED FROM", "MAX", "AVG", "CALLS")?;
    }
    for s in sites.iter().take(top) {
        let max = &s.slowest;
        let target = &max.target;
        let n = names(&max.stack);
        let tail = &n[n.len().saturating_sub(8)..];
        crate::outln!(
            "{:>9} {:>9} {:>7}  {target}  ({}/{} {})  {}{}",
            human(max.latency_ns),
            human(s.sum_ns.checked_div(s.calls).unwrap_or(0)),
            s.calls,
            max.pid,
            max.tid,
            max.comm,
            if n.len() > 8 { "...;" } else { "" },
            tail.join(";")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(latency_ns: u64, pid: u32) -> Event {
        Event { latency_ns, pid, tid: pid, idx: 0, ustack: -1, kstack: -1, uhash: 0, comm: String::new() }
    }

    /// Past KEEP calls, a slower call replaces the fastest kept one and a
    /// faster one is only counted: the list is the slowest, not the first.
    #[test]
    fn keeps_the_slowest_calls_not_the_first() {
        let mut s = Seen::default();
        for i in 0..KEEP as u64 {
            s.add(ev(1_000_000 + i, 1));
        }
        s.new_pids.clear();
        s.add(ev(5, 2)); // faster than all kept: not listed, but its site is new
        s.add(ev(9_000_000_000, 3)); // the slowest of the run
        assert_eq!(s.total, KEEP as u64 + 2);
        assert_eq!(s.kept.len(), KEEP);
        assert_eq!(s.new_pids.iter().copied().collect::<Vec<_>>(), vec![2, 3], "both to symbolize");
        let lat: Vec<u64> = s.kept.into_sorted_vec().into_iter().map(|Reverse(r)| r.0).collect();
        // into_sorted_vec of Reverse: slowest first.
        assert_eq!(lat[0], 9_000_000_000);
        assert_eq!(*lat.last().unwrap(), 1_000_001, "the fastest kept call was replaced");
    }

    /// Every slow call lands in its site, listed or not: counts, sums and
    /// the slowest per site are exact; calls at sites past SITES_MAX are
    /// counted as such.
    #[test]
    fn every_slow_call_is_counted_in_its_site() {
        let mut s = Seen::default();
        let n = 3 * KEEP as u64;
        for i in 0..n {
            let mut e = ev(1_000 + i, 1);
            e.ustack = (i % 3) as i32;
            s.add(e);
        }
        assert_eq!(s.kept.len(), KEEP);
        assert_eq!(s.sites.len(), 3);
        for (k, a) in &s.sites {
            let mine: Vec<u64> = (0..n).filter(|i| (i % 3) as i32 == k.ustack).map(|i| 1_000 + i).collect();
            assert_eq!(a.count, mine.len() as u64);
            assert_eq!(a.sum_ns, mine.iter().sum::<u64>());
            assert_eq!(a.slowest.latency_ns, *mine.last().unwrap());
        }
        let mut s = Seen::default();
        for i in 0..SITES_MAX as u64 + 5 {
            let mut e = ev(1_000, 1);
            e.kstack = i as i32;
            s.add(e);
        }
        assert_eq!((s.sites.len(), s.sites_full, s.total), (SITES_MAX, 5, SITES_MAX as u64 + 5));
    }
}
