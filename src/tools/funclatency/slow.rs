//! `sonde slow`: calls over a threshold with their callers' stacks, and a
//! flame graph of what they were doing while already slow. Shares its kernel
//! half (funclatency.bpf.c) and target syntax with `funclatency`.
use std::{cell::RefCell, path::PathBuf, rc::Rc, time::Duration};

use anyhow::Context;
use clap::Args;
use libbpf_rs::RingBufferBuilder;

use super::{
    in_flight, load_with_fallback, Scope, SlowCfg, FL_SAMPLES, FL_SAMPLES_OUTSIDE, FL_SLOW_LOST, FL_STACKS,
    FL_THREADS_FULL, FL_TOO_DEEP, FL_UNMATCHED,
};
use crate::engine::hist::human;
use crate::engine::{
    error::usage,
    features,
    perf::percpu_sum,
    pprof::Weight,
    run::{duration_arg, RunControl, Stop},
    stacks::{read_stack, read_walked, RawSample, Stack, StackMaps, SymStats, Symbols},
    stacktool::{self, StackLoss},
    unwind::{self, UnwindArgs},
};

/// Most slow calls kept for the list (all are counted).
const KEEP: usize = 100_000;

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
    /// Write the flame graph of slow calls here (repeatable).
    #[arg(short = 'o', long = "output")]
    pub output: Vec<PathBuf>,
    /// Slowest calls listed (and rows of the top table).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Sample user stacks only.
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,
    /// Sample kernel stacks only.
    #[arg(long)]
    pub kernel_only: bool,
    /// JSON lines: each slow call, each flame-graph stack, then a summary.
    #[arg(long)]
    pub json: bool,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: UnwindArgs,
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

/// What a run saw.
pub struct Outcome {
    /// The slowest calls kept, slowest first.
    pub calls: Vec<SlowCall>,
    /// Samples inside slow calls, rooted at `TARGET [process]`.
    pub stacks: Vec<Stack>,
    /// Summary JSON.
    pub summary: serde_json::Value,
    /// Why it stopped.
    pub stop: Stop,
}

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

/// Runs slow; `ready` is called once everything is attached.
pub fn run_with(a: &SlowArgs, ctl: &RunControl, ready: impl FnOnce()) -> anyhow::Result<Outcome> {
    if a.frequency == 0 || a.frequency > 10_000 {
        return Err(usage(format!("-F {}: pick 1 to 10000 samples per second", a.frequency)));
    }
    let outs = stacktool::check_outputs(&a.output)?;
    let (tf, probes) = a.scope.resolve()?;
    features::require_tracing_privileges()?;
    stacktool::raise_open_files();
    let plan = unwind::Plan::new(&a.unwind)?;
    let cfg = SlowCfg {
        over_ns: a.over.as_nanos() as u64,
        hz: a.frequency,
        want_kernel: !a.user_only,
        want_user: !a.kernel_only,
        unwind: plan,
    };
    let mut loaded = load_with_fallback(&a.scope.pid, &tf, &probes, &a.scope, Some(&cfg))?;
    ctl.start_clock();
    let attached = std::time::Instant::now();
    let skel = &loaded.skel;
    let um = crate::unw_maps!(skel);
    let events: Rc<RefCell<(Vec<Event>, u64)>> = Rc::default();
    let sink = events.clone();
    let mut rb = RingBufferBuilder::new();
    rb.add(&skel.maps.slow_events, move |d: &[u8]| {
        if let Some(e) = parse(d) {
            let mut s = sink.borrow_mut();
            s.1 += 1;
            if s.0.len() < KEEP {
                s.0.push(e);
            }
        }
        0
    })?;
    let rb = rb.build().context("setting up the ring buffer")?;
    ready();
    let seen = events.clone();
    let mut observed = 0usize;
    let (stop, mut images) = stacktool::run_until_stop(
        &skel.maps.stk_counts,
        ctl,
        a.scope.duration,
        Some(&rb),
        (&mut loaded.session, &um),
        || {
            // As in funclatency: a thread that exits inside a call would keep
            // it in flight, old enough to look slow to the sampler.
            super::prune_dead_threads(&skel.maps.stacks);
            let s = seen.borrow();
            let pids: Vec<u32> = s.0[observed.min(s.0.len())..].iter().map(|e| e.pid).collect();
            observed = s.0.len();
            pids
        },
        || Ok(format!("sonde slow: {} calls over {}", seen.borrow().1, human(a.over.as_nanos() as u64))),
    )?;
    let n = probes.len();
    let flight = in_flight(skel, &probes)?;
    let hists = crate::engine::hist::read_percpu(&skel.maps.hists, n)?;
    let elapsed = attached.elapsed();
    // Counted at the stop: detaching makes returns without entries.
    let st = |slot| percpu_sum(&skel.maps.stats, slot);
    let not_timed = serde_json::json!({"too_deep": st(FL_TOO_DEEP)?, "threads_full": st(FL_THREADS_FULL)?, "unmatched_returns": st(FL_UNMATCHED)?});
    let kernel_mechanism = loaded.kernel.map(super::KernelMechanism::name);
    let unprobeable = std::mem::take(&mut loaded.unprobeable);
    super::detach(loaded.links);
    let _ = rb.consume();
    let loss = StackLoss::read(&skel.maps.stats, FL_STACKS)?;
    let unwind = loaded.session.report(&um)?;

    // The slow calls, slowest first, with their callers' stacks.
    let (mut evs, slow_total) = std::mem::take(&mut *events.borrow_mut());
    evs.sort_by_key(|e| std::cmp::Reverse(e.latency_ns));
    let raws: Vec<RawSample> = evs
        .iter()
        .map(|e| {
            let (ustack, walk) = match read_walked(&skel.maps.unw_walked, e.uhash)? {
                Some((pcs, w)) => (pcs, Some(w)),
                None => (read_stack(&skel.maps.stk_traces, e.ustack)?, None),
            };
            Ok(RawSample {
                pid: e.pid,
                tid: e.tid,
                comm: e.comm.clone(),
                kstack: read_stack(&skel.maps.stk_traces, e.kstack)?,
                ustack,
                walk,
                count: 1,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    for e in &evs {
        images.observe(e.pid);
    }
    let mut sym = SymStats::default();
    let entry_stacks = Symbols::default().stacks(&raws, &mut images, &mut sym);
    let calls: Vec<SlowCall> = evs
        .iter()
        .zip(entry_stacks)
        .map(|(e, stack)| SlowCall {
            target: probes.get(e.idx as usize).map(|p| p.name.clone()).unwrap_or_default(),
            latency_ns: e.latency_ns,
            pid: e.pid,
            tid: e.tid,
            comm: e.comm.clone(),
            stack,
        })
        .collect();

    // The samples, rooted at their target.
    let names: Vec<String> = probes.iter().map(|p| p.name.clone()).collect();
    let relabel = |s: &mut Stack| {
        let t = names.get((s.tid as usize).wrapping_sub(1)).cloned().unwrap_or_else(|| "?".into());
        s.process = format!("{t} [{}]", s.process);
        s.tid = 0;
    };
    let f = stacktool::finish(
        &skel.maps.stk_counts,
        StackMaps { traces: &skel.maps.stk_traces, walked: &skel.maps.unw_walked },
        images,
        &stacktool::Outputs {
            outs: &outs,
            title: format!("sonde slow --over {}, {:.1} s", human(a.over.as_nanos() as u64), elapsed.as_secs_f64()),
            count_name: "samples",
            divisor: 1,
            weight: Weight::Samples { period_ns: (1e9 / a.frequency as f64) as i64 },
            elapsed,
            comment: format!("sonde slow --over {:?} -F {}", a.over, a.frequency),
            relabel: Some(&relabel),
        },
    )?;
    let over_ns = a.over.as_nanos() as u64;
    let in_flight_slow: u64 = flight.iter().filter(|(c, age)| *c > 0 && *age >= over_ns).map(|(c, _)| *c).sum();
    let mut lost = loss.json_fields();
    lost.insert("slow_calls".into(), st(FL_SLOW_LOST)?.into());
    let summary = serde_json::json!({
        "type": "summary", "duration_s": elapsed.as_secs_f64(), "over_ns": over_ns, "kernel_mechanism": kernel_mechanism, "unprobeable": unprobeable,
        "calls": hists.iter().map(|h| h.count).sum::<u64>(), "slow_calls": slow_total,
        "in_flight": flight.iter().map(|f| f.0).sum::<u64>(), "in_flight_over": in_flight_slow,
        "samples": st(FL_SAMPLES)?, "samples_outside_slow_calls": st(FL_SAMPLES_OUTSIDE)?,
        "unique_stacks": f.unique, "lost": lost,
        "not_timed": not_timed,
        "truncated_stacks": f.sym.truncated_stacks + sym.truncated_stacks,
    });
    let mut summary = summary;
    if let (Some(o), serde_json::Value::Object(u)) = (summary.as_object_mut(), stacktool::unwind_json(&f, &unwind)) {
        o.extend(u);
    }
    Ok(Outcome { calls, stacks: f.stacks, summary, stop })
}

fn names(s: &Stack) -> Vec<String> {
    s.frames.iter().map(|f| f.name.clone()).collect()
}

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &SlowArgs) -> anyhow::Result<i32> {
    let ctl = RunControl::new(a.scope.duration)?;
    let out = run_with(a, &ctl, || {
        eprintln!("sonde: watching for calls over {}; Ctrl-C ends and reports", human(a.over.as_nanos() as u64))
    })?;
    let s = &out.summary;
    if a.json {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::io::stdout().lock());
        for c in &out.calls {
            let j = serde_json::json!({"type": "slow_call", "target": c.target, "latency_ns": c.latency_ns, "pid": c.pid, "tid": c.tid, "comm": c.comm, "stack": names(&c.stack)});
            writeln!(w, "{j}")?;
        }
        crate::engine::render::json_lines(&mut w, &out.stacks)?;
        writeln!(w, "{s}")?;
        w.flush()?;
        return Ok(out.stop.exit_code());
    }
    super::unprobeable_note(s);
    crate::outln!(
        "{} calls over {} of {} calls; {} samples inside them",
        s["slow_calls"],
        human(s["over_ns"].as_u64().unwrap_or(0)),
        s["calls"],
        s["samples"]
    )?;
    // Grouped by target and call site, slowest first.
    let mut sites: Vec<(String, Vec<String>, Vec<&SlowCall>)> = Vec::new();
    for c in &out.calls {
        let n = names(&c.stack);
        match sites.iter_mut().find(|x| x.0 == c.target && x.1 == n) {
            Some(x) => x.2.push(c),
            None => sites.push((c.target.clone(), n, vec![c])),
        }
    }
    if !sites.is_empty() {
        crate::outln!("{:>9} {:>9} {:>7}  TARGET  (slowest: pid/tid comm)  CALLED FROM", "MAX", "AVG", "CALLS")?;
    }
    for (target, n, cs) in sites.iter().take(a.top) {
        let max = cs[0];
        let avg = cs.iter().map(|c| c.latency_ns).sum::<u64>() / cs.len() as u64;
        let tail = &n[n.len().saturating_sub(8)..];
        crate::outln!(
            "{:>9} {:>9} {:>7}  {target}  ({}/{} {})  {}{}",
            human(max.latency_ns),
            human(avg),
            cs.len(),
            max.pid,
            max.tid,
            max.comm,
            if n.len() > 8 { "...;" } else { "" },
            tail.join(";")
        )?;
    }
    if a.output.is_empty() && !out.stacks.is_empty() {
        crate::outln!()?;
        stacktool::print_top(&out.stacks, a.top, "SAMPLES", |v| v.to_string())?;
    }
    eprintln!(
        "{} still running past the threshold at the end; lost: {} slow calls (ring full); {} samples outside slow calls",
        s["in_flight_over"], s["lost"]["slow_calls"], s["samples_outside_slow_calls"]
    );
    Ok(out.stop.exit_code())
}
