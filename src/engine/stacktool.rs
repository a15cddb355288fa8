//! What every stack tool (profile, offcpu, ...) does around its BPF program:
//! check the outputs before attaching, poll while snapshotting processes that
//! show up in the counts, then symbolize once and write every output.
use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::{Duration, Instant},
};

use libbpf_rs::MapCore;

use super::{
    error::usage,
    output::table,
    pprof::Weight,
    render::{self, Format},
    ringbuf::poll_until_stop,
    run::{RunControl, Stop},
    stacks::{read_samples, Images, Stack, StackMaps, SymStats, Symbols},
    taskfilter::Targets,
    unwind,
};

/// Slots of `enum stk_stat` (`src/bpf/stacks.h`, STK_STAT_MAX) at the end of
/// every stack tool's stats map.
pub const STACK_STATS: u32 = 4;

/// What the kernel half (`src/bpf/stacks.h`) counts about stacks it could not
/// keep: `enum stk_stat`, the slots from `base` on in a tool's per-CPU stats.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StackLoss {
    /// Stacks that lost their hash bucket to another stack.
    pub collisions: u64,
    /// Kernel stacks not captured.
    #[serde(rename = "kernel_stack_errors")]
    pub kernel_errors: u64,
    /// User stacks not captured.
    #[serde(rename = "user_stack_errors")]
    pub user_errors: u64,
    /// Counts lost because the count map was full.
    pub counts_full: u64,
}

impl StackLoss {
    /// Reads the four slots from `base` of the per-CPU array `stats`.
    pub fn read(stats: &dyn MapCore, base: u32) -> anyhow::Result<Self> {
        let st = |i: u32| super::record::percpu_sum(stats, base + i);
        Ok(StackLoss { collisions: st(0)?, kernel_errors: st(1)?, user_errors: st(2)?, counts_full: st(3)? })
    }
}

/// Checks every `-o` before anything is attached: a known extension and a
/// path we can write (exit 2 otherwise).
pub fn check_outputs(paths: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, Format)>> {
    let mut outs = Vec::new();
    for p in paths {
        let f = Format::of(p)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .map_err(|e| usage(format!("-o {}: {e}; pick a writable path", p.display())))?;
        outs.push((p.clone(), f));
    }
    Ok(outs)
}

/// Raises the open-files soft limit to the hard limit. Stack tools hold every
/// mapped file of every sampled process open until the end (for processes
/// that exit); funclatency holds a link (a kprobe also a perf event) per
/// probe, and a few hundred kernel functions pass the usual 1024.
pub fn raise_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain get/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The processes of a map whose keys begin with a process id (`struct
/// stk_key`, and keys that start with one), sorted, each once.
pub fn pids_in(counts: &dyn MapCore) -> Vec<u32> {
    let mut v: Vec<u32> =
        counts.keys().filter(|k| k.len() >= 4).map(|k| u32::from_ne_bytes(k[..4].try_into().unwrap())).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Waits for the stop while loading the unwind tables the walk asked for
/// (`unw`, every 50 ms), and every 250 ms snapshotting processes that appeared in
/// `counts` (so they can be symbolized after they exit). On a terminal,
/// `status()` is shown on stderr once a second with the time left. With a
/// ring buffer `rb`, its events are handled as they come. `tick()` runs
/// every 250 ms, for the tool's own upkeep, and names more processes to
/// snapshot (e.g. those the events were about), and the run stops once
/// every target (`targets`) has exited.
#[allow(clippy::too_many_arguments)]
pub fn run_until_stop(
    counts: &dyn MapCore,
    ctl: &RunControl,
    duration: Option<Duration>,
    rb: Option<&libbpf_rs::RingBuffer<'_>>,
    unw: (&mut unwind::Session, &unwind::UnwMaps<'_>),
    targets: (&mut Targets, &dyn MapCore),
    mut tick: impl FnMut() -> Vec<u32>,
    mut status: impl FnMut() -> anyhow::Result<String>,
) -> anyhow::Result<(Stop, Images)> {
    // -d counts from here, once everything is attached: loading can take
    // seconds (hundreds of probes, or a slow machine), and must not eat the run.
    ctl.start_clock();
    let (targets, tf_pids) = targets;
    let (session, um) = unw;
    // `-- CMD` runs from here: everything is attached and set to follow it.
    if let Some(l) = &mut targets.launched {
        l.release()?;
    }
    let start = Instant::now();
    let mut images = Images::default();
    let tty = std::io::stderr().is_terminal();
    let mut last = Instant::now();
    // Tables are loaded as soon as a process asks (a new process, or one
    // that exec'd: `rb` carries `unw_wake`, see Session::wake_on), else
    // within 50 ms; its samples until then are walked by frame pointers.
    // The rest of the upkeep runs every 250 ms.
    let mut ticks = 0u32;
    let stop = poll_until_stop(rb, ctl, Some(Duration::from_millis(50)), |due| {
        if due || session.due() {
            // A process that exec'd runs a new image: snapshot it now; one
            // whose code was (re)loaded is snapshot again, so that a short
            // process is named from the libraries it loaded, though it
            // exits before the next periodic look.
            let l = session.tick(um);
            for &pid in &l.execs {
                images.observe_image(pid, session.generation(pid));
            }
            for pid in l.loaded.into_iter().filter(|p| !l.execs.contains(p)) {
                images.observe_loaded(pid, session.generation(pid));
            }
            ticks += due as u32;
        }
        ctl.look_at(session.next_look());
        if due && ticks % 5 == 0 {
            for pid in pids_in(counts).into_iter().chain(tick()) {
                images.keep_up(pid, session.generation(pid));
            }
            if targets.all_gone(tf_pids) {
                ctl.request_stop();
            }
        }
        if tty && last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let left = duration
                .map(|d| format!(", {:.0}s left", d.saturating_sub(start.elapsed()).as_secs_f64()))
                .unwrap_or_default();
            eprint!("\r{}{left}   ", status()?);
        }
        Ok(())
    })?;
    if tty {
        eprintln!();
    }
    // Code objects met since the last tick, named while their processes live.
    let names = session.finish_names(um);
    images.set_lang(names, session.frames());
    Ok((stop, images))
}

/// What became of the command a run started (`-- CMD`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommandSummary {
    /// The command line.
    pub command: String,
    /// Its exit status (128 + the signal that ended it), or none: it still
    /// ran when the run ended (-d, a signal).
    pub exit_status: Option<i32>,
    /// Processes watched: the command and those it (and they) started.
    pub processes: u64,
    /// Processes it started that were not watched: the kernel's table of
    /// them was full.
    pub processes_not_followed: u64,
}

impl CommandSummary {
    /// Of the run's targets, `tf_pids` and `tf_lost` the kernel half's.
    pub fn of(t: &Targets, tf_pids: &dyn MapCore, tf_lost: &dyn MapCore) -> Option<CommandSummary> {
        let l = t.launched.as_ref()?;
        let lost = tf_lost
            .lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
            .ok()
            .flatten()
            .and_then(|v| super::record::decode::<u64>(&v))
            .unwrap_or(0);
        Some(CommandSummary {
            command: l.what.clone(),
            exit_status: l.status(),
            processes: tf_pids.keys().count() as u64,
            processes_not_followed: lost,
        })
    }

    /// The summary's line.
    pub fn text(&self) -> String {
        let how = match self.exit_status {
            Some(s) if s > 128 => format!("ended by signal {}", s - 128),
            Some(s) => format!("exited with status {s}"),
            None => "still ran at the end".to_string(),
        };
        let mut s = format!("command `{}` {how}; {} processes watched", self.command, self.processes);
        if self.processes_not_followed > 0 {
            s.push_str(&format!(
                ", {} it started not watched (the table of watched processes was full)",
                self.processes_not_followed
            ));
        }
        s
    }
}

/// Symbolized stacks and what it took.
pub struct Finished {
    /// The stacks, root first.
    pub stacks: Vec<Stack>,
    /// Unique stacks read from the kernel.
    pub unique: u64,
    /// Symbolization figures.
    pub sym: SymStats,
    /// Time to symbolize and write every output.
    pub render_time: Duration,
    /// The command the run started, if it did (set by the tool).
    pub command: Option<CommandSummary>,
}

/// Where and how a stack tool writes its results.
pub struct Outputs<'a> {
    /// Files and their formats (from [`check_outputs`]).
    pub outs: &'a [(PathBuf, Format)],
    /// Heads the flame graphs.
    pub title: String,
    /// What a count is ("samples", "us").
    pub count_name: &'a str,
    /// What a count weighs, for pprof.
    pub weight: Weight,
    /// The kernel half counts in units this many times smaller than
    /// `count_name` (offcpu sums nanoseconds, shown in microseconds, so no
    /// rounding accumulates per period); 1: as counted.
    pub divisor: u64,
    /// Length of the run.
    pub elapsed: Duration,
    /// For `go tool pprof -comments`.
    pub comment: String,
    /// Rewrites each stack before it is rendered (e.g. its root).
    pub relabel: Option<&'a dyn Fn(&mut Stack)>,
}

/// Reads the counts, symbolizes and writes every output.
pub fn finish(counts: &dyn MapCore, maps: StackMaps<'_>, images: Images, o: &Outputs<'_>) -> anyhow::Result<Finished> {
    finish_with(images, o, |syms, images, sym| {
        let mut raw = read_samples(counts, maps)?;
        let unique = raw.len() as u64;
        raw.iter_mut().for_each(|s| s.count /= o.divisor.max(1));
        raw.retain(|s| s.count > 0);
        Ok((syms.stacks(&raw, images, sym), unique))
    })
}

/// wakeup: blocked stacks joined to their wakers' like BCC's offwaketime:
/// blocked stack root first, a `--` frame, then the waker's stack leaf first
/// and the waker's comm on top. A blocked period nobody woke (preempted) gets
/// `[no waker]`; one counted without its waker's stack, `[waker not walked]`.
pub fn finish_wakeup(
    counts: &dyn MapCore,
    maps: StackMaps<'_>,
    images: Images,
    o: &Outputs<'_>,
) -> anyhow::Result<Finished> {
    use super::stacks::{Frame, FrameKind};
    finish_with(images, o, |syms, images, sym| {
        let mut pairs = super::stacks::read_wake_pairs(counts, maps)?;
        pairs.iter_mut().for_each(|(b, w, _)| {
            b.count /= o.divisor.max(1);
            w.count = b.count;
        });
        pairs.retain(|(b, _, _)| b.count > 0);
        let walked: Vec<bool> = pairs.iter().map(|p| p.2).collect();
        let (blocked, wakers): (Vec<_>, Vec<_>) = pairs.into_iter().map(|(b, w, _)| (b, w)).unzip();
        let b = syms.stacks(&blocked, images, sym);
        let mut wsym = SymStats::default();
        let w = syms.stacks(&wakers, images, &mut wsym);
        // A waker's stack cut short cuts the joined stack short too.
        sym.unknown_frames += wsym.unknown_frames;
        sym.truncated_stacks += wsym.truncated_stacks;
        sym.truncated_samples += wsym.truncated_samples;
        for (k, n) in wsym.truncated_by {
            *sym.truncated_by.entry(k).or_default() += n;
        }
        for (k, n) in wsym.unsymbolized_files {
            *sym.unsymbolized_files.entry(k).or_default() += n;
        }
        let sep = |name: &str| Frame {
            name: name.into(),
            file: None,
            line: None,
            kind: FrameKind::Unknown,
            module: std::rc::Rc::from("[sonde]"),
            inlined: false,
        };
        let stacks = b
            .into_iter()
            .zip(w.into_iter().zip(wakers.iter().zip(walked)))
            .map(|(mut s, (ws, (wr, walked)))| {
                s.frames.push(sep("--"));
                if !walked {
                    s.frames.push(sep("[waker not walked]"));
                } else if wr.kstack.is_empty() && wr.ustack.is_empty() {
                    s.frames.push(sep("[no waker]"));
                } else if ws
                    .frames
                    .iter()
                    .any(|f| f.kind == FrameKind::Kernel && crate::engine::symbols::is_interrupt_entry(&f.name))
                {
                    // Woken from interrupt context: the task that was
                    // interrupted (its comm, its user stack) had no part in it.
                    s.frames.extend(ws.frames.into_iter().rev().filter(|f| f.kind == FrameKind::Kernel));
                    s.frames.push(sep("[interrupt] (waker)"));
                } else {
                    s.frames.extend(ws.frames.into_iter().rev());
                    s.frames.push(sep(&format!("{} (waker)", wr.comm)));
                }
                s
            })
            .collect::<Vec<Stack>>();
        let n = stacks.len() as u64;
        Ok((stacks, n))
    })
}

fn finish_with(
    mut images: Images,
    o: &Outputs<'_>,
    make: impl FnOnce(&mut Symbols, &mut Images, &mut SymStats) -> anyhow::Result<(Vec<Stack>, u64)>,
) -> anyhow::Result<Finished> {
    let t0 = Instant::now();
    let mut syms = Symbols::default();
    let mut sym = SymStats::default();
    let (mut stacks, unique) = make(&mut syms, &mut images, &mut sym)?;
    sym.perf_maps = images.perf_maps();
    if let Some(r) = o.relabel {
        stacks.iter_mut().for_each(r);
    }
    let meta = render::Meta {
        title: o.title.clone(),
        count_name: o.count_name.into(),
        pprof: super::pprof::Meta {
            weight: o.weight,
            time_nanos: (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(o.elapsed))
            .as_nanos() as i64,
            duration_nanos: o.elapsed.as_nanos() as i64,
            build_ids: syms.build_ids(),
            comment: o.comment.clone(),
        },
    };
    for (p, f) in o.outs {
        render::write(p, *f, &stacks, &meta)?;
        eprintln!("sonde: wrote {}", p.display());
    }
    Ok(Finished { unique, stacks, sym, render_time: t0.elapsed(), command: None })
}

/// The top functions by self and total weight, `fmt` formatting a weight.
pub fn print_top(stacks: &[Stack], n: usize, weight_header: &str, fmt: impl Fn(u64) -> String) -> std::io::Result<()> {
    let (rows, all) = render::top(stacks);
    let pct = |v: u64| format!("{:.1}%", 100.0 * v as f64 / all.max(1) as f64);
    let body: Vec<Vec<String>> = rows
        .iter()
        .take(n)
        .map(|r| vec![pct(r.self_count), pct(r.total_count), fmt(r.self_count), r.name.clone()])
        .collect();
    crate::outln!("{}", table(&["SELF", "TOTAL", weight_header, "FUNCTION"], &body))
}

/// Stack lines and then `summary` as JSON lines on stdout.
pub fn print_json(stacks: &[Stack], summary: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    render::json_lines(&mut out, stacks)?;
    serde_json::to_writer(&mut out, summary)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// What every stack tool's summary says about how its stacks were symbolized
/// and walked (flattened into the tool's summary).
#[derive(Debug, serde::Serialize)]
pub struct StackSummary {
    /// Stacks cut short.
    pub truncated_stacks: u64,
    /// Samples taken while the kernel rewrote the thread's user registers
    /// to enter or leave a signal handler: a kernel frame
    /// `[signal delivery]` in place of the user stack (not cut short: there
    /// was no stack to walk).
    pub signal_delivery_samples: u64,
    /// Frames no symbol was found for.
    pub unknown_frames: u64,
    /// Samples (or weight) of cut stacks, by reason.
    pub truncated_by: std::collections::BTreeMap<&'static str, u64>,
    /// Perf maps refused or cut short, and their lines skipped.
    #[serde(flatten)]
    pub perf_maps: super::perfmap::Tally,
    /// Mapped files the symbolizer could not read, by reason (`unreadable`,
    /// `malformed`, `symbolizer_panicked`; `dwarf_skipped`, `dwarf_panicked`:
    /// named from their symbol tables only, because their DWARF would
    /// inflate without bound, could not be read, or made the symbolizer
    /// panic).
    pub unsymbolized_files: std::collections::BTreeMap<&'static str, u64>,
    /// How user stacks were walked.
    pub unwind: unwind::Report,
    /// Language runtimes' frames (`--frames`).
    pub language_frames: LangSummary,
    /// The command the run started (`-- CMD`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandSummary>,
}

/// The summary's `language_frames`: what was read of language runtimes.
#[derive(Debug, serde::Serialize)]
pub struct LangSummary {
    /// Samples (weight) whose stack names language functions.
    pub samples: u64,
    /// Language frames (in unique stacks) whose code object was not named.
    pub unnamed_frames: u64,
    /// Unique stacks whose interpreter-loop frames and language frames did
    /// not pair up one to one.
    pub unpaired_stacks: u64,
    /// Runtimes found, the kernel walk's counts, code objects named.
    #[serde(flatten)]
    pub report: super::runtime::Report,
}

impl LangSummary {
    /// The summary's text line(s); empty when no runtime was met.
    pub fn text(&self, unit: &str) -> String {
        let r = &self.report;
        if r.processes.is_empty() && r.walks.walks == 0 {
            return String::new();
        }
        let procs: Vec<String> = r
            .processes
            .iter()
            .map(|p| match &p.why {
                None => format!("{} {}", p.pid, p.runtime),
                Some(why) => format!("{} {} NOT READ ({why})", p.pid, p.runtime),
            })
            .collect();
        let cut: Vec<String> = r.walks.cut.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let unnamed: Vec<String> = r.unnamed.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let mut s = format!(
            "language frames (--frames {}): {} {unit} name language functions; processes: {}; runtime walks: {}, {} complete{}; {} code objects named in {:.0} ms{}; {} frames unnamed, {} stacks unpaired",
            serde_json::to_value(r.frames).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
            self.samples,
            if procs.is_empty() { "none".to_string() } else { procs.join(", ") },
            r.walks.walks,
            r.walks.complete,
            if cut.is_empty() { String::new() } else { format!(", cut short: {}", cut.join(", ")) },
            r.named,
            r.naming_ms,
            if unnamed.is_empty() { String::new() } else { format!(" ({} not: {})", r.unnamed.values().sum::<u64>(), unnamed.join(", ")) },
            self.unnamed_frames,
            self.unpaired_stacks,
        );
        if let Some(n) = r.partly_named.get("code_not_found") {
            s.push_str(&format!(
                "; {n} JavaScript frames named by their function alone (the code they ran, replaced on the stack or thrown away, was not found)"
            ));
        }
        if r.walks.jit_unknown + r.walks.jit_bad > 0 {
            s.push_str(&format!(
                "; JIT code: {} walks ended at a pc no code blob held (freed or being written), {} frames without a readable method",
                r.walks.jit_unknown, r.walks.jit_bad
            ));
        }
        if r.walks.store_full + r.walks.seen_full > 0 {
            s.push_str(&format!(
                "
language frame limits hit: {} stacks kept without their language frames, {} code objects not handed over",
                r.walks.store_full, r.walks.seen_full
            ));
        }
        s
    }
}

impl StackSummary {
    /// The figures of a finished run.
    pub fn of(f: &Finished, unw: &unwind::Report) -> Self {
        StackSummary {
            truncated_stacks: f.sym.truncated_stacks,
            signal_delivery_samples: f.sym.signal_samples,
            unknown_frames: f.sym.unknown_frames,
            truncated_by: f.sym.truncated_by.clone(),
            perf_maps: f.sym.perf_maps.clone(),
            unsymbolized_files: f.sym.unsymbolized_files.clone(),
            unwind: unw.clone(),
            language_frames: LangSummary {
                samples: f.sym.lang_samples,
                unnamed_frames: f.sym.lang_unnamed_frames,
                unpaired_stacks: f.sym.lang_unpaired_stacks,
                report: unw.runtimes.clone(),
            },
            command: f.command.clone(),
        }
    }
}

/// The summary line about samples taken in the kernel's signal delivery
/// ([`SymStats::signal_samples`](super::stacks::SymStats)), when there were
/// any; `unit` as in [`sym_summary`].
pub fn signal_delivery_line(samples: u64, unit: &str) -> Option<String> {
    (samples > 0).then(|| {
        format!(
            "{samples} {unit} taken while the kernel entered or left a signal handler: a kernel frame [signal delivery] in place of the user stack"
        )
    })
}

/// The summary lines every stack tool prints about symbolization and, with
/// `unw`, about how user stacks were walked.
pub fn sym_summary(f: &Finished, unit: &str, unw: Option<&unwind::Report>) -> String {
    let by: Vec<String> = f.sym.truncated_by.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut s = format!(
        "truncated user stacks: {} ({} {unit}{}); unknown frames: {}; symbolized {} user and {} kernel addresses in {} ms",
        f.sym.truncated_stacks,
        f.sym.truncated_samples,
        if by.is_empty() { String::new() } else { format!(": {}", by.join(", ")) },
        f.sym.unknown_frames,
        f.sym.user_addrs,
        f.sym.kernel_addrs,
        f.render_time.as_millis()
    );
    if let Some(line) = signal_delivery_line(f.sym.signal_samples, unit) {
        s.push('\n');
        s.push_str(&line);
    }
    if let Some(line) = f.sym.perf_maps.text() {
        s.push('\n');
        s.push_str(&line);
    }
    if let Some(c) = &f.command {
        s.push('\n');
        s.push_str(&c.text());
    }
    if !f.sym.unsymbolized_files.is_empty() {
        let by: Vec<String> = f.sym.unsymbolized_files.iter().map(|(k, n)| format!("{n} {k}")).collect();
        s.push_str(&format!(
            "\nmapped files the symbolizer could not read (frames [unknown]; dwarf_*: named from symbol tables only): {}",
            by.join(", ")
        ));
    }
    if let Some(u) = unw {
        s.push('\n');
        s.push_str(&u.text());
        let lang = StackSummary::of(f, u).language_frames.text(unit);
        if !lang.is_empty() {
            s.push('\n');
            s.push_str(&lang);
        }
    }
    if f.sym.truncated_by.contains_key("frame_pointers") {
        match unw {
            Some(u) if !u.tables && u.fallback.is_none() => {
                s.push_str("\nhint: [truncated] stacks come from code built without frame pointers; --unwind auto walks them from unwind tables")
            }
            Some(u) if u.tables && u.walks.while_loading > 0 => s.push_str(&format!(
                "\nhint: {} stacks were taken by frame pointers while their process's unwind tables loaded (a run without -p, --tid, --cgroup or --comm loads them as processes first appear); with one of those, tables load before sampling starts",
                u.walks.while_loading
            )),
            _ => s.push_str("\nhint: [truncated] stacks come from code built without frame pointers; rebuild with -fno-omit-frame-pointer (C/C++) or -C force-frame-pointers=yes (Rust)"),
        }
    }
    s
}
