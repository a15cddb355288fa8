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
    Doctor(tools::doctor::DoctorArgs),
    Retrans(tools::retrans::RetransArgs),
    Drops(tools::drops::DropsArgs),
    Cwnd(tools::cwnd::CwndArgs),
    Profile(tools::profile::ProfileArgs),
    Offcpu(tools::offcpu::OffcpuArgs),
    Wakeup(tools::offcpu::WakeupArgs),
    Funclatency(tools::funclatency::FunclatencyArgs),
    Slow(tools::funclatency::slow::SlowArgs),
    Msglat(tools::msglat::MsglatArgs),
    Serve(tools::serve::ServeArgs),
    Why(tools::why::WhyArgs),
    /// One-command reproductions on real traffic in network namespaces.
    Lab(lab::LabArgs),
    /// Write the man pages and shell completions (`make install` does).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// What `sonde generate` writes.
#[derive(clap::Args, Debug)]
struct GenerateArgs {
    /// man (sonde.1, sonde-TOOL.1), bash (sonde.bash), zsh (_sonde), fish
    /// (sonde.fish) or all.
    #[arg(value_parser = ["man", "bash", "zsh", "fish", "all"])]
    what: String,
    /// The directory to write them in.
    dir: std::path::PathBuf,
}

/// Writes man pages and completions from the flag definitions, so that
/// they never fall behind them.
fn generate(a: &GenerateArgs) -> anyhow::Result<i32> {
    use anyhow::Context;
    use clap::CommandFactory;
    use clap_complete::Shell;
    let mut cmd = Cli::command();
    cmd.build();
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let write = |name: &str, body: Vec<u8>| -> anyhow::Result<()> {
        let p = a.dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
    };
    let all = a.what == "all";
    if all || a.what == "man" {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
        write("sonde.1", page)?;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            let name = format!("sonde-{}", sub.get_name());
            let mut page = Vec::new();
            clap_mangen::Man::new(sub.clone().name(name.clone()).bin_name(name.clone())).render(&mut page)?;
            write(&format!("{name}.1"), page)?;
        }
    }
    for (shell, file) in [(Shell::Bash, "sonde.bash"), (Shell::Zsh, "_sonde"), (Shell::Fish, "sonde.fish")] {
        if all || a.what == shell.to_string() {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "sonde", &mut out);
            write(file, out)?;
        }
    }
    Ok(0)
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
            eprintln!("{}", usage_line(&e));
            return ExitCode::from(2);
        }
    };
    match dispatch(&cli.cmd) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sonde: {}", sonde::engine::error::plain(&format!("{e:#}")));
            ExitCode::from(exit_code(&e) as u8)
        }
    }
}

/// A clap error as sonde's one line: the problem, then where to look for the fix.
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut first = lines.next().unwrap_or("bad usage").trim_start_matches("error: ").to_string();
    if first.ends_with(':') {
        // "the following required arguments were not provided:" + the arguments.
        let what: Vec<&str> = lines.take_while(|l| !l.starts_with("Usage:") && !l.starts_with("tip:")).collect();
        first = format!("{} {}", first, what.join(", "));
    }
    // Rust's own words for a number that is not one.
    first = first.replace("invalid digit found in string", "not a number");
    // The help of the tool named, where its options are.
    // (args_os: an argument that is not UTF-8 must not panic here.)
    let help = std::env::args_os()
        .nth(1)
        .and_then(|t| t.into_string().ok())
        .filter(|t| {
            use clap::CommandFactory;
            Cli::command().find_subcommand(t).is_some() && t != "help"
        })
        .map(|t| format!("see `sonde {t} --help`"))
        .unwrap_or_else(|| "see `sonde --help`".to_string());
    // clap's tip to pass a value that begins with '-' after `--` is wrong
    // here: after `--` comes the command a tool runs.
    let tip = text
        .lines()
        .find(|l| l.trim_start().starts_with("tip:"))
        .map(|t| t.trim().trim_start_matches("tip: "))
        .filter(|t| !t.starts_with("to pass '"));
    match tip {
        Some(t) => format!("sonde: {first}; {t}"),
        None => format!("sonde: {first}; {help}"),
    }
}

/// Runs the tool or lab the command line names; its exit status.
fn dispatch(cmd: &Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Doctor(a) => tools::doctor::run(a),
        Cmd::Retrans(a) => tools::retrans::run(a),
        Cmd::Drops(a) => tools::drops::run(a),
        Cmd::Cwnd(a) => tools::cwnd::run(a),
        Cmd::Profile(a) => tools::profile::run(a),
        Cmd::Offcpu(a) => tools::offcpu::run(a),
        Cmd::Wakeup(a) => tools::offcpu::run_wakeup(a),
        Cmd::Funclatency(a) => tools::funclatency::run(a),
        Cmd::Slow(a) => tools::funclatency::slow::run(a),
        Cmd::Msglat(a) => tools::msglat::run(a),
        Cmd::Serve(a) => tools::serve::run(a),
        Cmd::Why(a) => tools::why::run(a),
        Cmd::Lab(a) => lab::run(a),
        Cmd::Generate(a) => generate(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How sonde refuses `args`: the one line it prints (exit status 2 asserted).
    fn refusal(args: &[&str]) -> String {
        match Cli::try_parse_from(std::iter::once("sonde").chain(args.iter().copied())) {
            Err(e) => usage_line(&e),
            Ok(cli) => {
                let e = dispatch(&cli.cmd).expect_err("bad input must be refused");
                assert_eq!(exit_code(&e), 2, "{args:?}: {e:#}");
                format!("sonde: {e:#}")
            }
        }
    }

    /// Usage errors are refused by parsing or validation, before anything
    /// needs privileges or attaches: no root needed. Each names the problem.
    /// (tests/integration/cli.rs runs these and the kernel-dependent ones
    /// as root, checking nothing is left attached.)
    #[test]
    fn usage_errors_are_one_line_naming_the_problem() {
        let cases: &[(&[&str], &str)] = &[
            (&["retrans", "--bogus"], "--bogus"),
            (&["retrans", "--port", "0"], "0"),
            (&["retrans", "--port", "http"], "http"),
            (&["retrans", "--addr", "10.0.0.0/33"], "10.0.0.0/33"),
            (&["retrans", "--addr", "not-an-ip"], "not-an-ip"),
            (&["retrans", "--kind", "lost"], "lost"),
            (&["retrans", "-d", "-5s"], "-5"),
            (&["retrans", "-d", "soon"], "soon"),
            (&["retrans", "--cgroup", "/nonexistent/cgroup"], "/nonexistent/cgroup"),
            (&["retrans", "--netns", "no-such-namespace"], "no-such-namespace"),
            (&["retrans", "-p", "999999999"], "999999999"),
            (&["retrans", "-o", "out.svg"], "out.svg: retrans cannot write that format; use a .json, .txt or .log file name"),
            (&["retrans", "-i", "5s"], "--count"),
            (&["lab", "retrans", "--loss", "90"], "--loss"),
            (&["lab", "dns", "-d", "0s"], "0s"),
            (&["lab", "dns", "--delay", "200ms-100ms"], "--delay"),
            (&["lab", "dns", "--workers", "0"], "--workers"),
            (&["profile", "-F", "0"], "-F"),
            (&["profile", "-p", "999999999"], "999999999"),
            (&["profile", "-o", "p.png"], "p.png: the stack tools cannot write that format; use a .folded, .svg, .html, .json or .pb.gz file name"),
            (&["profile", "--user-only", "--kernel-only"], "--kernel-only"),
            (&["profile", "--unwind", "lbr"], "lbr"),
            (&["offcpu", "--unwind", "frame-pointers"], "frame-pointers"),
            (&["offcpu", "-p", "999999999"], "999999999"),
            (&["offcpu", "--min-block", "soon"], "soon"),
            (&["offcpu", "--min-block", "10ms", "--max-block", "1ms"], "--max-block"),
            (&["offcpu", "--state", "asleep"], "asleep"),
            (&["offcpu", "--mechanism", "kprobe"], "kprobe"),
            (&["wakeup", "-p", "999999999"], "999999999"),
            (&["funclatency"], "required"),
            (&["funclatency", "nocolon"], "nocolon"),
            (&["funclatency", "softirq:BOGUS"], "BOGUS"),
            (&["funclatency", "syscall:read", "-o", "x.svg"], "x.svg: funclatency cannot write that format"),
            (&["slow", "syscall:read"], "--over"),
            (&["slow", "syscall:read", "--over", "0"], "0"),
            (&["cwnd", "--every", "soon"], "soon"),
            (&["cwnd", "-o", "out.png"], "out.png: cwnd cannot write that format; use a .json, .txt, .log, .svg or .html file name"),
            (&["cwnd", "-o", "a.json", "-o", "b.json"], "-o given 2 times"),
            (&["cwnd", "--port", "0"], "0"),
            (&["cwnd", "--mechanism", "bpftrace"], "bpftrace"),
            (&["lab", "idle-restart", "--responses", "1"], "--responses"),
            (&["lab", "idle-restart", "-o", "chart.png"], "chart.png"),
            (&["msglat", "-p", "999999999"], "999999999"),
            (&["msglat", "-p", "1", "--id", "abc"], "abc"),
            (&["msglat", "-p", "1", "--id", "0:8", "--fifo"], "--fifo"),
            (&["msglat"], "-p"),
            (&["why", "-p", "999999999"], "999999999"),
            (&["why", "-o", "why.png"], "why.png"),
            (&["why", "-i", "1ms"], "-i"),
            (&["why", "--top", "0"], "--top"),
            (&["frobnicate"], "frobnicate"),
        ];
        let mut wrong = Vec::new();
        for (args, names) in cases {
            let line = refusal(args);
            if line.lines().count() != 1 || !line.starts_with("sonde: ") || !line.contains(names) {
                wrong.push(format!("{args:?} must name {names:?} in one line: {line}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
