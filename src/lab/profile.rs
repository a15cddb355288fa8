//! `sonde lab profile`: a bundled workload with a built-in 2:1 CPU split
//! (tests/workloads/burn.c: heavy() burns twice the CPU of light()), built
//! twice, with frame pointers and without (as distributions build), both
//! profiled at once by `sonde profile`; prints each measured split beside the
//! built-in one and writes the flame graphs.
use std::{path::PathBuf, process::Command, time::Duration};

use clap::Args;

use crate::{
    engine::{
        cli,
        error::usage,
        features,
        run::{RunControl, Stop},
        stacks::weight_under,
    },
    tools::profile::{self, ProfileArgs},
};

/// The workload, built static with frame pointers by build.rs.
const BURN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/burn"));
/// The same without frame pointers: its stacks need the unwind tables.
const BURN_NOFP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/burn-nofp"));

/// Options of `sonde lab profile`.
#[derive(Debug, Args)]
pub struct ProfileLabArgs {
    /// Seconds to profile the workload for.
    #[arg(short = 'd', long, default_value_t = 5)]
    pub seconds: u64,
    /// Samples per second.
    #[arg(short = 'F', long = "frequency", default_value_t = 199)]
    pub frequency: u64,
    /// Where to write the flame graphs (.html, .svg, .folded, .pb.gz, .json).
    #[arg(short = 'o', long = "output", default_values_t = ["sonde-lab-profile.html".to_string(), "sonde-lab-profile.svg".to_string()])]
    pub output: Vec<String>,
}

/// Kills and removes the workloads however the lab ends.
struct Workload {
    children: Vec<std::process::Child>,
    dir: PathBuf,
}

impl Drop for Workload {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the lab; returns the exit status.
pub fn run(a: &ProfileLabArgs) -> anyhow::Result<i32> {
    if a.seconds == 0 || a.seconds > 600 {
        return Err(usage(format!("-d {}: pick 1 to 600 seconds", a.seconds)));
    }
    features::require_tracing_privileges()?;
    let dir = std::env::temp_dir().join(format!("sonde-lab-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut w = Workload { children: Vec::new(), dir: dir.clone() };
    for (name, bytes) in [("burn", BURN), ("burn-nofp", BURN_NOFP)] {
        let bin = super::install(&dir, name, bytes)?;
        w.children.push(Command::new(&bin).arg((a.seconds + 5).to_string()).spawn()?);
    }
    std::thread::sleep(Duration::from_millis(100));
    eprintln!(
        "lab: workloads burn (frame pointers, pid {}) and burn-nofp (none, pid {}) burn CPU in heavy() and light() at 2:1; profiling them for {} s at {} Hz",
        w.children[0].id(),
        w.children[1].id(),
        a.seconds,
        a.frequency
    );
    let mut argv = vec!["-F".to_string(), a.frequency.to_string(), "-d".into(), format!("{}s", a.seconds)];
    argv.extend(["--top".into(), "10".into()]);
    argv.extend(w.children.iter().flat_map(|c| ["-p".to_string(), c.id().to_string()]));
    argv.extend(a.output.iter().flat_map(|o| ["-o".to_string(), o.to_string()]));
    let pargs: ProfileArgs = cli::parse("profile", argv)?;
    let ctl = RunControl::new(pargs.run.duration)?;
    let out = profile::run_with(&pargs, &ctl, || {})?;
    drop(w);
    crate::outln!("samples: {} ({} truncated)", out.totals.samples, out.totals.sym.truncated_samples)?;
    let mut ok = true;
    for (name, how) in [("burn", "frame pointers"), ("burn-nofp", "no frame pointers, unwind tables")] {
        let mine: Vec<_> = out.stacks.iter().filter(|s| s.process == name).cloned().collect();
        let (h, l) = (weight_under(&mine, "heavy"), weight_under(&mine, "light"));
        let share = h as f64 / (h + l).max(1) as f64;
        let good = (share - 2.0 / 3.0).abs() < 0.05 && h + l > 0;
        ok &= good;
        crate::outln!(
            "{name} ({how}): heavy : light = {h} : {l} samples = {:.1}% : {:.1}% (built in: 66.7% : 33.3%){}",
            100.0 * share,
            100.0 * (1.0 - share),
            if good { "" } else { "  MISMATCH" }
        )?;
    }
    crate::outln!(
        "{}",
        if ok {
            "split matches the built-in 2:1 (within 5 points)"
        } else {
            "MISMATCH: a split differs from the built-in 2:1"
        }
    )?;
    if !ok {
        return Ok(1);
    }
    Ok(match out.stop {
        Stop::Interrupted => 130,
        _ => 0,
    })
}
