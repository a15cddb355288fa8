//! The `sonde` command line: parses arguments and runs one tool or lab.
use std::process::ExitCode;

use clap::{error::ErrorKind, Parser, Subcommand};
use sonde::{
    engine::error::{closed_stdout, exit_code},
    lab, tools,
};

/// sonde: why is this service slow, where are its packets lost (eBPF).
#[derive(Parser, Debug)]
#[command(name = "sonde", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// What this kernel allows and which mechanism each tool uses.
    Doctor(tools::doctor::DoctorArgs),
    Retrans(tools::retrans::RetransArgs),
    Cwnd(tools::cwnd::CwndArgs),
    Profile(tools::profile::ProfileArgs),
    Offcpu(tools::offcpu::OffcpuArgs),
    /// Who wakes waiting threads: blocked stacks joined to their wakers' stacks.
    #[command(long_about = "Who wakes waiting threads: each blocked period (as in `offcpu`, same options) joined to \
the stack that woke the thread, taken at sched_waking in the waker's context. Rendered like BCC's offwaketime: \
blocked stack root first, a `--` frame, the waker's stack leaf first, `COMM (waker)` on top; a wake-up from a hardware \
interrupt context keeps only its kernel stack (`[interrupt] (waker)`), a preempted period ends in `[no waker]`.\n\n\
With sampling (--sample-below), the keep-or-leave decision for a period is made at its wake-up, so a period \
left out costs no waker stack walk either. One left out that then waits long for a CPU gets a second chance at its \
end (counted with chance min(length, T) / T in all, as in offcpu, weighing max(length, T)); counted that way it \
ends in `[waker not walked]`.\n\n\
OVERHEAD: offcpu's (see `sonde offcpu --help`) plus one lookup per wake-up of a traced thread, and a stack walk \
for the wake-ups of kept periods. bench/offcpu/run, pipe ping-pong, all tasks traced: 181-436 ns per switch in \
BPF, 3.7% fewer round trips at ~125k switches/s, 8-17% at 400k-800k switches/s.")]
    Wakeup(tools::offcpu::OffcpuArgs),
    Funclatency(tools::funclatency::FunclatencyArgs),
    Slow(tools::funclatency::slow::SlowArgs),
    Msglat(tools::msglat::MsglatArgs),
    /// One-command reproductions on real traffic in network namespaces.
    Lab(lab::LabArgs),
}

fn main() -> ExitCode {
    sonde::engine::quiet_libbpf();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: the problem, then where to look for the fix.
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut first = lines.next().unwrap_or("bad usage").trim_start_matches("error: ").to_string();
            if first.ends_with(':') {
                // "the following required arguments were not provided:" + the arguments.
                let what: Vec<&str> =
                    lines.take_while(|l| !l.starts_with("Usage:") && !l.starts_with("tip:")).collect();
                first = format!("{} {}", first, what.join(", "));
            }
            let tip =
                text.lines().find(|l| l.trim_start().starts_with("tip:")).map(|t| t.trim().trim_start_matches("tip: "));
            match tip {
                Some(t) => eprintln!("sonde: {first}; {t}"),
                None => eprintln!("sonde: {first}; see `sonde --help`"),
            }
            return ExitCode::from(2);
        }
    };
    let r = match &cli.cmd {
        Cmd::Doctor(a) => tools::doctor::run(a),
        Cmd::Retrans(a) => tools::retrans::run(a),
        Cmd::Cwnd(a) => tools::cwnd::run(a),
        Cmd::Profile(a) => tools::profile::run(a),
        Cmd::Offcpu(a) => tools::offcpu::run(a),
        Cmd::Wakeup(a) => tools::offcpu::run_wakeup(a),
        Cmd::Funclatency(a) => tools::funclatency::run(a),
        Cmd::Slow(a) => tools::funclatency::slow::run(a),
        Cmd::Msglat(a) => tools::msglat::run(a),
        Cmd::Lab(a) => lab::run(a),
    };
    match r {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sonde: {e:#}");
            ExitCode::from(exit_code(&e) as u8)
        }
    }
}
