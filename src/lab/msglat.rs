//! `sonde lab msglat`: seed 004's harness. A sender, a message broker that
//! relays each message and a receiver, on loopback in a namespace; the
//! end-to-end time T of each message from the sender's and receiver's
//! clocks. Four broker configurations, interleaved over rounds: no logging,
//! logging receive and send times into an in-process array, logging them to
//! a file, and no logging but traced by `sonde msglat`; where the socket
//! hooks run, also a floor row (empty programs on their two tracepoints).
//! The table gives T and the overhead per message over the baseline, with
//! the ratio to the memory-log overhead, and the T2 distribution sonde
//! measured. The three processes share one CPU by default, so every hop is
//! a local wake-up and T is the work on the path: on a VM, cross-CPU
//! wake-ups make T swing by microseconds between rounds.
use std::{
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use clap::Args;
use serde::Serialize;

use super::netns::{remove_stale, Netns, PREFIX};
use super::{install, median};
use crate::{
    engine::{
        cli,
        error::{env, usage},
        features,
        hist::human,
        output::table,
        run::{duration_arg, RunControl},
    },
    tools::msglat::{run_with, Hooks, MsglatArgs},
};

/// The harness, built static by build.rs.
const MSGBENCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/msgbench"));
const IN_PORT: u16 = 7400;
const OUT_PORT: u16 = 7401;

/// Options of `sonde lab msglat`.
#[derive(Debug, Args, Clone)]
pub struct MsglatLabArgs {
    /// Messages per run.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Time between two messages from the sender.
    #[arg(long, value_parser = duration_arg, default_value = "60us")]
    pub spacing: Duration,
    /// Message size in bytes (at least 16: the id and the send time).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Rounds of the configurations, interleaved.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Hold every Nth message DELAY in the broker (0: none; for tests).
    #[arg(long, default_value_t = 0)]
    pub delay_every: u64,
    /// How long to hold those messages.
    #[arg(long, value_parser = duration_arg, default_value = "200us")]
    pub delay: Duration,
    /// The broker drops this message (its index; for tests).
    #[arg(long)]
    pub drop_at: Option<u64>,
    /// Pair in FIFO order instead of by id.
    #[arg(long)]
    pub fifo: bool,
    /// Where msglat hooks (see `sonde msglat --help`).
    #[arg(long, value_enum)]
    pub hooks: Option<Hooks>,
    /// Only the sonde configuration (no baseline rows).
    #[arg(long)]
    pub sonde_only: bool,
    /// The CPU the sender, broker and receiver share (default: the last one
    /// this process may use; sonde's own threads keep off it when there is
    /// another).
    #[arg(long, conflicts_with = "spread")]
    pub cpu: Option<usize>,
    /// Let the scheduler place the three processes, as the paper's harness
    /// did (much noisier on a VM: each hop is then a cross-CPU wake-up).
    #[arg(long)]
    pub spread: bool,
    /// Run the sender, broker and receiver under SCHED_FIFO, so that no
    /// normal task (CPU hogs on a busy host) preempts a message on its way:
    /// T2 is then the broker's work and built-in hold only (the tests).
    #[arg(long)]
    pub realtime: bool,
    /// Print the findings as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// One run's end-to-end times, from the harness.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunT {
    /// Configuration.
    pub config: String,
    /// Messages sent.
    pub sent: u64,
    /// Messages back at the receiver.
    pub received: u64,
    /// Mean T, ns.
    pub mean_ns: f64,
    /// Median T, ns.
    pub p50_ns: f64,
    /// 99th percentile, ns.
    pub p99_ns: f64,
    /// The broker's CPU time per message relayed, ns (its own clock:
    /// CLOCK_PROCESS_CPUTIME_ID, the scheduler's exact runtime).
    pub broker_cpu_ns: f64,
    /// The sender's and receiver's CPU time per message, ns.
    pub pair_cpu_ns: f64,
}

fn parse_pair(config: &str, out: &str) -> anyhow::Result<RunT> {
    let f: Vec<&str> = out.split_whitespace().collect();
    let num = |k: &str| -> anyhow::Result<f64> {
        let i = f.iter().position(|w| *w == k).ok_or_else(|| anyhow::anyhow!("harness output lacks {k}: {out}"))?;
        Ok(f.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(0.0))
    };
    Ok(RunT {
        config: config.to_string(),
        sent: num("sent")? as u64,
        received: num("received")? as u64,
        mean_ns: num("mean_ns")?,
        p50_ns: num("p50_ns")?,
        p99_ns: num("p99_ns")?,
        broker_cpu_ns: 0.0,
        pair_cpu_ns: num("cpu_ns")? / num("sent")?.max(1.0),
    })
}

/// The broker, killed however the run ends, and its output.
struct Broker(Child, BufReader<std::process::ChildStdout>);

impl Broker {
    /// Its CPU time per message, once it has relayed the last one and exited
    /// (it ends when the sender shuts its connection).
    fn cpu_per_message(&mut self) -> anyhow::Result<f64> {
        let mut line = String::new();
        self.1.read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let num =
            |k: &str| f.iter().position(|w| *w == k).and_then(|i| f.get(i + 1)).and_then(|v| v.parse::<f64>().ok());
        match (num("messages"), num("cpu_ns")) {
            (Some(n), Some(c)) if n > 0.0 => Ok(c / n),
            _ => anyhow::bail!("the broker did not report its CPU time: {line:?}"),
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a properly sized out-parameter for the kernel to fill.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: c < CPU_SETSIZE, so CPU_ISSET reads inside the set.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as above; CPU_SET stays within the set for c < CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: c is a CPU the kernel reported, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: set is a valid, fully initialised cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `ip netns exec ...` of the harness, pinned to the harness CPU if any,
/// under SCHED_FIFO with `--realtime`.
fn harness(ns: &Netns, bin: &Path, cpu: Option<usize>, realtime: bool) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.name]).arg(bin);
    if let Some(cpu) = cpu {
        // SAFETY: only sched_setaffinity between fork and exec.
        unsafe { c.pre_exec(move || set_affinity(&[cpu])) };
    }
    if realtime {
        super::realtime_command(&mut c);
    }
    c
}

fn broker(
    ns: &Netns,
    bin: &Path,
    a: &MsglatLabArgs,
    cpu: Option<usize>,
    log: &str,
    logfile: &Path,
) -> anyhow::Result<Broker> {
    let mut c = harness(ns, bin, cpu, a.realtime)
        .args(["broker", &IN_PORT.to_string(), &OUT_PORT.to_string(), &a.size.to_string(), log])
        .args([
            a.delay_every.to_string(),
            a.delay.as_micros().to_string(),
            a.drop_at.map(|d| d as i64).unwrap_or(-1).to_string(),
        ])
        .arg(logfile)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    out.read_line(&mut line)?;
    anyhow::ensure!(line.starts_with("listening"), "the broker did not start: {line}");
    Ok(Broker(c, out))
}

fn pair(ns: &Netns, bin: &Path, a: &MsglatLabArgs, cpu: Option<usize>, config: &str) -> anyhow::Result<RunT> {
    let out = harness(ns, bin, cpu, a.realtime)
        .args([
            "pair",
            &IN_PORT.to_string(),
            &OUT_PORT.to_string(),
            &a.messages.to_string(),
            &a.spacing.as_micros().to_string(),
            &a.size.to_string(),
        ])
        .output()?;
    anyhow::ensure!(out.status.success(), "the harness failed: {}", String::from_utf8_lossy(&out.stderr));
    parse_pair(config, &String::from_utf8_lossy(&out.stdout))
}

/// Runs the lab; returns the exit status.
pub fn run(a: &MsglatLabArgs) -> anyhow::Result<i32> {
    let (cpu, hooks) = check(a)?;
    features::require_tracing_privileges()?;
    // sonde's own threads (the tracer's user side, the lab) keep off the
    // harness CPU; threads started from now on inherit this.
    if let Some(c) = cpu {
        let rest: Vec<usize> = allowed_cpus()?.into_iter().filter(|&x| x != c).collect();
        if !rest.is_empty() {
            set_affinity(&rest)?;
        }
    }
    remove_stale();
    let ns = Netns::create(&format!("{PREFIX}{}-msglat", std::process::id()))?;
    let dir = std::env::temp_dir().join(format!("sonde-lab-msglat-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = super::RemoveDir(dir.clone());
    let bin = install(&dir, "msgbench", MSGBENCH)?;
    eprintln!(
        "lab: sender -> broker -> receiver on loopback in {}; {} messages of {} bytes, {:?} apart; {} round(s); {}{}",
        ns.name,
        a.messages,
        a.size,
        a.spacing,
        a.rounds,
        match cpu {
            Some(c) => format!("all three on CPU {c}"),
            None => "placed by the scheduler".into(),
        },
        if a.realtime { ", under SCHED_FIFO" } else { "" }
    );
    let configs: &[&str] = match (a.sonde_only, hooks) {
        (true, _) => &["sonde"],
        (false, Hooks::Sockets) => &["none", "mem", "file", "floor", "sonde"],
        (false, _) => &["none", "mem", "file", "sonde"],
    };
    let m = measure(a, &Setup { ns: &ns, bin: &bin, dir: &dir, cpu, hooks }, configs)?;
    if a.json {
        print_json(configs, &m)?;
    } else {
        print_text(a, configs, &m)?;
    }
    Ok(0)
}

/// Checks the options; the CPU the harness runs on (None: spread) and the hooks.
fn check(a: &MsglatLabArgs) -> anyhow::Result<(Option<usize>, Hooks)> {
    if a.messages == 0 || a.rounds == 0 {
        return Err(usage("--messages and --rounds must be at least 1"));
    }
    if a.size < 16 {
        return Err(usage(format!(
            "--size {}: a message holds its id and send time, 16 bytes; give 16 or more",
            a.size
        )));
    }
    if a.spacing < Duration::from_micros(1) {
        return Err(usage("--spacing must be at least 1us"));
    }
    let allowed = allowed_cpus()?;
    let cpu = match (a.spread, a.cpu) {
        (true, _) => None,
        (false, Some(c)) if !allowed.contains(&c) => {
            return Err(usage(format!(
                "--cpu {c}: not a CPU this process may run on ({allowed:?}); pick one of those or use --spread"
            )))
        }
        (false, Some(c)) => Some(c),
        (false, None) => allowed.last().copied(),
    };
    let hooks = Hooks::pick(a.hooks)?;
    if a.realtime {
        std::thread::spawn(super::realtime).join().map_err(|_| anyhow::anyhow!("checking SCHED_FIFO"))?.map_err(
            |e| env(format!("--realtime: SCHED_FIFO refused ({e}): it needs CAP_SYS_NICE and real-time time in this cgroup; or drop --realtime")),
        )?;
    }
    Ok((cpu, hooks))
}

/// Where the lab runs: its namespace, the harness binary, its directory, CPU and hooks.
struct Setup<'a> {
    ns: &'a Netns,
    bin: &'a Path,
    dir: &'a Path,
    cpu: Option<usize>,
    hooks: Hooks,
}

/// What the rounds measured.
struct Measured {
    /// Every untraced and traced run of the rounds.
    runs: Vec<RunT>,
    /// The last traced run's outcome.
    sonde: crate::tools::msglat::Outcome,
    /// In-kernel cost from the extra run with bpf_stats: ns and program runs in
    /// all, messages matched, and an empty program's ns per run.
    bpf_ns: u64,
    bpf_runs: u64,
    matched: u64,
    null_per_run: f64,
    /// The CPU the harness ran on (None: placed by the scheduler).
    cpu: Option<usize>,
}

/// The rounds, then one more sonde run with kernel.bpf_stats_enabled=1 for
/// the in-kernel cost (the statistics' own clock reads would inflate T, so
/// the table's sonde rows run without them).
fn measure(a: &MsglatLabArgs, at: &Setup, configs: &[&str]) -> anyhow::Result<Measured> {
    let logfile = at.dir.join("broker.log");
    let mut runs: Vec<RunT> = Vec::new();
    let mut last_sonde = None;
    let (mut bpf_ns, mut bpf_runs, mut matched, mut null_per_run) = (0u64, 0u64, 0u64, 0.0);
    let plan: Vec<(u32, &str)> =
        (0..a.rounds).flat_map(|r| configs.iter().map(move |&c| (r, c))).chain([(a.rounds, "sonde-stats")]).collect();
    for &(round, c) in &plan {
        eprintln!("lab: round {} of {}: {c}", (round + 1).min(a.rounds), a.rounds);
        let stats = c == "sonde-stats";
        let traced = c.starts_with("sonde") || c == "floor";
        let log = if traced { "none" } else { c };
        let mut b = broker(at.ns, at.bin, a, at.cpu, log, &logfile)?;
        if !traced {
            let mut t = pair(at.ns, at.bin, a, at.cpu, c)?;
            t.broker_cpu_ns = b.cpu_per_message()?;
            runs.push(t);
            continue;
        }
        let (out, mut t) = traced_run(a, at, &b, round, c)?;
        t.broker_cpu_ns = b.cpu_per_message()?;
        if stats {
            bpf_ns = out.bpf_ns;
            bpf_runs = out.bpf_runs;
            matched = out.hist.count;
            null_per_run = if out.null_runs > 0 { out.null_ns as f64 / out.null_runs as f64 } else { 0.0 };
        } else {
            runs.push(t);
            if c == "sonde" {
                last_sonde = Some(out);
            }
        }
    }
    let sonde = last_sonde.expect("the sonde configuration ran");
    Ok(Measured { runs, sonde, bpf_ns, bpf_runs, matched, null_per_run, cpu: at.cpu })
}

/// One run of the harness through broker `b` while `sonde msglat` traces it
/// (configuration `c`: "sonde", "floor" or "sonde-stats").
fn traced_run(
    a: &MsglatLabArgs,
    at: &Setup,
    b: &Broker,
    round: u32,
    c: &str,
) -> anyhow::Result<(crate::tools::msglat::Outcome, RunT)> {
    let stats = c == "sonde-stats";
    let stats_was = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    if stats {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    }
    let ctl = RunControl::new(None)?;
    let hooks = clap::ValueEnum::to_possible_value(&at.hooks).map(|v| v.get_name().to_string()).unwrap_or_default();
    let output = at.dir.join(format!("msglat-{c}-{round}.json"));
    let mut argv = vec!["-p".to_string(), b.0.id().to_string(), "--hooks".into(), hooks, "-o".into()];
    argv.push(output.to_string_lossy().into_owned());
    for (on, flag) in [(a.fifo, "--fifo"), (stats, "--calibrate"), (c == "floor", "--floor")] {
        if on {
            argv.push(flag.into());
        }
    }
    let margs: MsglatArgs = cli::parse("msglat", argv)?;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let r = std::thread::scope(|s| {
        let (ns, bin, ctl, cpu) = (at.ns, at.bin, &ctl, at.cpu);
        let work = s.spawn(move || -> anyhow::Result<RunT> {
            rx.recv().map_err(|_| anyhow::anyhow!("tracing did not start"))?;
            let t = pair(ns, bin, a, cpu, c);
            ctl.request_stop();
            t
        });
        let out = run_with(&margs, ctl, || {
            let _ = tx.send(());
        });
        ctl.request_stop();
        let w = work.join().map_err(|_| anyhow::anyhow!("harness panicked"))?;
        Ok::<_, anyhow::Error>((out?, w?))
    });
    if stats {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_was.trim());
    }
    r
}

impl Measured {
    /// The median over rounds of `f` for configuration `c`.
    fn med(&self, c: &str, f: fn(&RunT) -> f64) -> f64 {
        median(&self.runs.iter().filter(|r| r.config == c).map(f).collect::<Vec<_>>())
    }

    /// Per round, a configuration's figure minus the baseline's in the same
    /// round (they ran back to back).
    fn diffs(&self, c: &str, f: fn(&RunT) -> f64) -> Vec<f64> {
        let of = |cfg: &str| self.runs.iter().filter(|r| r.config == cfg).map(f).collect::<Vec<_>>();
        of(c).iter().zip(&of("none")).map(|(x, b)| x - b).collect()
    }

    /// The overhead: the median of [`Measured::diffs`].
    fn over(&self, c: &str, f: fn(&RunT) -> f64) -> f64 {
        median(&self.diffs(c, f))
    }

    /// The overhead with its range over rounds.
    fn spread(&self, a: &MsglatLabArgs, c: &str, f: fn(&RunT) -> f64) -> String {
        if a.sonde_only {
            return "-".into();
        }
        let d = self.diffs(c, f);
        let (lo, hi) =
            (d.iter().cloned().fold(f64::INFINITY, f64::min), d.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
        format!("{:+.0} ({lo:+.0} .. {hi:+.0})", median(&d))
    }

    /// The overhead as a multiple of logging into memory.
    fn vs_mem(&self, a: &MsglatLabArgs, c: &str, f: fn(&RunT) -> f64) -> String {
        let m = self.over("mem", f);
        if a.sonde_only || c == "none" || m.abs() < 1.0 {
            "-".into()
        } else {
            format!("{:.2}x", self.over(c, f) / m)
        }
    }

    /// In-kernel ns per message, program runs per message, and ns per message
    /// without the statistics' own clock reads.
    fn bpf_per_message(&self) -> (f64, f64, f64) {
        let per_msg = if self.matched > 0 { self.bpf_ns as f64 / self.matched as f64 } else { 0.0 };
        let runs = if self.matched > 0 { self.bpf_runs as f64 / self.matched as f64 } else { 0.0 };
        (per_msg, runs, (per_msg - runs * self.null_per_run).max(0.0))
    }
}

const T_OF: fn(&RunT) -> f64 = |r| r.p50_ns;
const CPU_OF: fn(&RunT) -> f64 = |r| r.broker_cpu_ns + r.pair_cpu_ns;

fn print_json(configs: &[&str], m: &Measured) -> anyhow::Result<()> {
    let (per_msg_bpf, runs_per_msg, per_msg_net) = m.bpf_per_message();
    let by =
        |f: fn(&RunT) -> f64| configs.iter().map(|&c| (c, m.over(c, f))).collect::<std::collections::BTreeMap<_, _>>();
    crate::outln!(
        "{}",
        serde_json::json!({
            "type": "lab", "lab": "msglat", "runs": m.runs, "cpu": m.cpu,
            "baseline_p50_ns": m.med("none", |r| r.p50_ns),
            "overhead_p50_ns": by(T_OF),
            "overhead_cpu_ns": by(CPU_OF),
            "overhead_broker_cpu_ns": by(|r| r.broker_cpu_ns),
            "sonde_bpf_ns_per_message": per_msg_bpf.round(),
            "sonde_bpf_runs_per_message": runs_per_msg,
            "bpf_stats_ns_per_run": m.null_per_run,
            "sonde_bpf_net_ns_per_message": per_msg_net.round(),
            "sonde": m.sonde.summary,
        })
    )?;
    Ok(())
}

fn print_text(a: &MsglatLabArgs, configs: &[&str], m: &Measured) -> anyhow::Result<()> {
    let name = |c: &str| -> String {
        match c {
            "none" => "broker, no logging",
            "mem" => "broker logs times into memory",
            "file" => "broker logs times to a file",
            "floor" => "sonde's tracepoints, empty programs",
            _ => "broker traced by sonde msglat",
        }
        .into()
    };
    let t_rows: Vec<Vec<String>> = configs
        .iter()
        .map(|&c| {
            vec![
                name(c),
                format!("{:.0}", m.med(c, |r| r.p50_ns)),
                format!("{:.0}", m.med(c, |r| r.mean_ns)),
                format!("{:.0}", m.med(c, |r| r.p99_ns)),
                m.spread(a, c, T_OF),
                m.vs_mem(a, c, T_OF),
            ]
        })
        .collect();
    let cpu_rows: Vec<Vec<String>> = configs
        .iter()
        .map(|&c| {
            vec![
                name(c),
                format!("{:.0}", m.med(c, |r| r.broker_cpu_ns)),
                m.spread(a, c, |r| r.broker_cpu_ns),
                format!("{:.0}", m.med(c, |r| r.pair_cpu_ns)),
                m.spread(a, c, |r| r.pair_cpu_ns),
                m.spread(a, c, CPU_OF),
                m.vs_mem(a, c, CPU_OF),
            ]
        })
        .collect();
    let (per_msg_bpf, runs_per_msg, per_msg_net) = m.bpf_per_message();
    let null_per_run = m.null_per_run;
    let hooks = m.sonde.summary.hooks;
    let hooks_name = clap::ValueEnum::to_possible_value(&hooks).map(|v| v.get_name().to_string()).unwrap_or_default();
    let h = &m.sonde.hist;
    crate::outln!("\nEnd-to-end T per message (sender -> broker -> receiver), medians over {} round(s):", a.rounds)?;
    crate::outln!(
        "{}",
        table(
            &[
                "CONFIGURATION",
                "T p50 ns",
                "T mean ns",
                "T p99 ns",
                "OVERHEAD ns (p50; range over rounds)",
                "VS MEMORY LOG"
            ],
            &t_rows
        )
    )?;
    crate::outln!("\nCPU time per message (each process's own exact clock), medians over {} round(s):", a.rounds)?;
    crate::outln!(
        "{}",
        table(
            &[
                "CONFIGURATION",
                "BROKER ns",
                "OVERHEAD (range)",
                "SENDER+RECEIVER ns",
                "OVERHEAD (range)",
                "TOTAL OVERHEAD ns (range)",
                "VS MEMORY LOG"
            ],
            &cpu_rows
        )
    )?;
    crate::outln!(
        "\nsonde in the kernel (a separate run with bpf_stats): {per_msg_bpf:.0} ns per message over {runs_per_msg:.1} program runs per message; {per_msg_net:.0} ns without the statistics' own cost ({null_per_run:.0} ns per run, an empty program's) (--hooks {hooks_name}: {})",
        match hooks {
            Hooks::Raw => "every syscall on the host runs two; the broker's read and write do the work",
            Hooks::Sockets => "socket calls only: the sender's send, the broker's receive and send, the receiver's receive",
            Hooks::Syscalls => "the sender's write, the broker's read and write, the receiver's read",
        }
    )?;
    crate::outln!(
        "T2 (broker receive -> send) as sonde measured it, last run: {} messages, p50 {} p90 {} p99 {} max {}; unmatched: {} receives, {} sends",
        h.count,
        human(h.quantile_ns(0.5)),
        human(h.quantile_ns(0.9)),
        human(h.quantile_ns(0.99)),
        human(h.max_ns),
        m.sonde.unmatched_recv,
        m.sonde.unmatched_send
    )?;
    crate::out!("{}", h.render())?;
    Ok(())
}
