//! `sonde doctor`: what this kernel allows, found by trying, and which
//! mechanism each tool will use (or exactly why it cannot run).
use clap::Args;
use serde_json::{json, Value};

use crate::engine::{
    caps::{cannot, Caps},
    features,
};

/// What this kernel allows and which mechanism each tool uses.
///
/// What this kernel offers (BTF, tracepoints, tp_btf, raw_tp, kprobes,
/// fentry, uprobes, perf_event sampling, ring buffer, bpf_stats, privileges)
/// and which mechanism each sonde tool uses here.
///
/// Each program type is checked by loading (and where cheap attaching) a tiny
/// program, never by kernel version. Exit status 2 when sonde cannot run at all.
///
/// OVERHEAD: the test programs it attaches are detached before it exits,
/// nothing stays; a run takes 0.25-0.33 s of wall time, 0.07-0.08 s of CPU
/// and 9 MiB of memory (2-core VM, kernel 6.18, three runs).
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Instead of the kernel checks: the unwind table of this executable or
    /// library (repeatable): FDEs, rows, rules the walk cannot evaluate,
    /// kernel memory, and how long building it takes, cold and from the
    /// disk cache.
    #[arg(long, value_name = "FILE")]
    pub unwind: Vec<std::path::PathBuf>,
    /// Instead of the kernel checks: what sonde finds of the language
    /// runtime in this process (repeatable): which one, whether its frames
    /// are read, and what was learnt to read them.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Vec<u32>,
}

/// Runs every check; returns the exit status.
pub fn run(a: &DoctorArgs) -> anyhow::Result<i32> {
    if !a.unwind.is_empty() {
        return unwind_report(a);
    }
    if !a.pid.is_empty() {
        return runtime_report(a);
    }
    let caps = Caps::probe(crate::tools::profile::table_walk_loads);
    let tools: Vec<(&str, Value)> = TOOLS
        .iter()
        .map(|(name, report)| (*name, if caps.privileged { report(&caps) } else { cannot("not privileged") }))
        .collect();
    let usable = caps.privileged && ["tp_btf", "raw_tp", "tracepoint"].iter().any(|n| caps.ok(n));
    if a.json {
        print_json(&caps, &tools, usable)?;
    } else {
        print_text(&caps, &tools)?;
    }
    Ok(if usable { 0 } else { 2 })
}

/// Each tool's report of how it runs on this kernel, in doctor's order. A
/// tool's function reads the tool's own `MECHANISMS` list, so its fallback
/// order is written once.
const TOOLS: &[(&str, Report)] = &[
    ("retrans", crate::tools::retrans::doctor),
    ("drops", crate::tools::drops::doctor),
    ("cwnd", crate::tools::cwnd::doctor),
    ("msglat", msglat_report),
    ("profile", crate::tools::profile::doctor),
    ("offcpu", crate::tools::offcpu::doctor),
    ("wakeup", crate::tools::offcpu::doctor_wakeup),
    ("funclatency", crate::tools::funclatency::doctor),
    ("slow", crate::tools::funclatency::slow::doctor),
];

/// A tool's report of how it runs on this kernel, from what doctor found.
type Report = fn(&Caps) -> Value;

/// `doctor --pid`: the runtime of each process; exit 2 when one is gone.
fn runtime_report(a: &DoctorArgs) -> anyhow::Result<i32> {
    features::require_tracing_privileges()?;
    let mut code = 0;
    for &pid in &a.pid {
        let v = crate::engine::runtime::inspect(pid);
        if v.get("error").is_some() {
            code = 2;
        }
        if a.json {
            crate::outln!("{v}")?;
            continue;
        }
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        if let Some(e) = v.get("error") {
            crate::outln!("process {pid}: {}", e.as_str().unwrap_or("?"))?;
        } else if v["runtime"].is_null() {
            crate::outln!("process {pid} ({}): {}", s("comm"), s("detail"))?;
        } else if v["read"] == json!(true) {
            crate::outln!(
                "process {pid} ({}): {} in {}: its frames are read (offsets: {}; {})",
                s("comm"),
                s("runtime"),
                s("image"),
                s("offsets"),
                s("detail")
            )?;
        } else {
            crate::outln!(
                "process {pid} ({}): {} NOT READ: {}; its stacks stay native",
                s("comm"),
                s("runtime"),
                s("why")
            )?;
        }
    }
    Ok(code)
}

/// The language runtimes whose frames stack tools read, and whether this
/// kernel runs that reading (it rides on the table walk).
fn runtimes_report(caps: &Caps) -> Value {
    let walk = caps.ok("unwind");
    json!({
        "read_in_kernel": walk,
        "detail": if walk { "read beside the table walk of user stacks (--frames mixed, the default)".to_string() } else { "not here: language frames ride on the table walk, which does not load here (see unwind above)".to_string() },
        "runtimes": crate::engine::runtime::supported().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

/// What this build's architecture changes for the user.
fn arch_detail() -> String {
    if cfg!(target_arch = "x86_64") {
        "every tool; user stacks walked from .eh_frame tables; Python, Java and Node.js frames".into()
    } else {
        let mask = crate::engine::unwind::return_address_mask();
        let pac = if mask >> 55 == 0 && mask.count_ones() < 55 {
            format!("pointer authentication codes in bits {}-54 of return addresses stripped", mask.count_ones())
        } else {
            "no pointer authentication on this CPU".to_string()
        };
        format!(
            "every tool; user stacks walked from .eh_frame tables with AArch64's rules (the return address in x30 \
             or saved with x29; {pac}); Python frames; Java and Node.js frames are read on x86-64 only so far"
        )
    }
}

fn print_json(caps: &Caps, tools: &[(&str, Value)], usable: bool) -> anyhow::Result<()> {
    let mut feats = serde_json::Map::new();
    for (name, ok, detail) in caps.checks() {
        feats.insert(name.into(), json!({"ok": ok, "detail": detail}));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let v = json!({
        "type": "doctor",
        "kernel": kernel,
        "arch": {"name": std::env::consts::ARCH, "detail": arch_detail()},
        "usable": usable,
        "features": feats,
        "tools": tools.iter().map(|(n, v)| (n.to_string(), v.clone())).collect::<serde_json::Map<_, _>>(),
        "language_frames": runtimes_report(caps),
    });
    crate::outln!("{v}")?;
    Ok(())
}

fn print_text(caps: &Caps, tools: &[(&str, Value)]) -> anyhow::Result<()> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    crate::outln!("kernel {}", kernel.trim())?;
    crate::outln!("arch   {}: {}", std::env::consts::ARCH, arch_detail())?;
    for (name, ok, detail) in caps.checks() {
        crate::outln!("  {:<11} {:<4} {}", name, if ok { "yes" } else { "NO" }, detail)?;
    }
    crate::outln!("tools:")?;
    for (t, v) in tools {
        if v["usable"] == json!(true) {
            crate::outln!(
                "  {t:<11} uses {} ({})",
                v["mechanism"].as_str().unwrap_or("?"),
                v["detail"].as_str().unwrap_or("")
            )?;
        } else {
            crate::outln!("  {t:<11} CANNOT RUN: {}", v["why"].as_str().unwrap_or("?"))?;
        }
    }
    let rt = runtimes_report(caps);
    let names: Vec<String> = rt["runtimes"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    crate::outln!("language frames: {}: {}", names.join("; "), rt["detail"].as_str().unwrap_or(""))?;
    match crate::engine::cgroup::cgroup2_root() {
        Some(r) => crate::outln!("cgroup v2 at {r} (--cgroup paths are relative to it)")?,
        None => crate::outln!("note: no cgroup v2 mounted; --cgroup filters will not resolve")?,
    }

    Ok(())
}

/// msglat: the socket tracepoints as BTF tracepoints where the kernel has
/// them (the default hooks), else the syscall tracepoints.
fn msglat_report(cx: &Caps) -> Value {
    let fetch = features::has_atomic_fetch();
    let regs = features::has_task_regs();
    let mut limits = String::new();
    if !fetch {
        limits.push_str("; no BPF atomic fetch or compare-and-exchange (5.12): every flow in the per-CPU hash, --fifo positions taken by read-then-add");
    }
    if !regs {
        limits.push_str("; no bpf_task_pt_regs (5.15): a receive's arguments kept from its entry (one more program per receive; one already blocked at start is not timed)");
    }
    if cx.ok("tp_btf") && crate::tools::msglat::socket_tracepoints_exist() {
        json!({"usable": true, "mechanism": "tp_btf", "atomic_fetch": fetch, "task_regs": regs, "detail": format!("sock:sock_recv_length + tcp:tcp_sendmsg_locked (--hooks sockets); --hooks syscalls and raw also available{limits}")})
    } else if features::tracepoint_exists("syscalls", "sys_enter_write") {
        json!({"usable": true, "mechanism": "tracepoint", "atomic_fetch": fetch, "task_regs": regs, "detail": format!("syscalls:sys_enter_write/sys_exit_read ... (--hooks syscalls); the socket tracepoints are missing or tp_btf does not load{limits}")})
    } else {
        cannot("neither the socket tracepoints (tp_btf) nor the syscall tracepoints are available")
    }
}
/// `doctor --unwind FILE...`: each file's unwind table.
fn unwind_report(a: &DoctorArgs) -> anyhow::Result<i32> {
    use crate::engine::unwind::{cache, elf, kernel, table};
    use std::time::Instant;
    let mut out = Vec::new();
    for path in &a.unwind {
        let f = std::fs::File::open(path)
            .map_err(|e| crate::engine::error::usage(format!("--unwind {}: {e}; give an ELF file", path.display())))?;
        let t0 = Instant::now();
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Err(crate::engine::error::usage(format!(
                "--unwind {}: not a regular file; give an executable or library",
                path.display()
            )));
        }
        let info = match elf::read_file(f) {
            Ok(i) => i,
            Err(crate::engine::unwind::UnwindError::NotElf(e)) => {
                return Err(crate::engine::error::usage(format!(
                    "--unwind {}: not an x86-64 ELF file ({e}); give an executable or library",
                    path.display()
                )))
            }
            Err(e) => {
                out.push(json!({"file": path, "table": false, "why": e.to_string()}));
                continue;
            }
        };
        let built = table::build(&info);
        let cold = t0.elapsed();
        let t = match built {
            Ok(t) => t,
            Err(e) => {
                out.push(json!({"file": path, "table": false, "why": e.to_string()}));
                continue;
            }
        };
        // From a fresh cache directory: read the file and its sections,
        // hash them, read the stored table.
        let dir = std::env::temp_dir().join(format!("sonde-doctor-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = cache::Cache::open_at(&dir);
        let key = cache::key(&info);
        c.put(&key, &t);
        let t1 = Instant::now();
        let again = elf::read_file(std::fs::File::open(path)?).ok().and_then(|i| c.get(&cache::key(&i)));
        let warm = t1.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        let Some(pages) = kernel::layout(&t) else {
            out.push(json!({"file": path, "table": false, "why": "its rows span more than 16 GiB of addresses"}));
            continue;
        };
        let page_rows: usize = pages.iter().map(|p| p.1.len()).sum();
        let kbytes = (page_rows + pages.len()) * 8;
        let cfi = info.eh_frame.as_ref().map_or(0, |s| s.data.len())
            + info.debug_frame.as_ref().map_or(0, |s| s.data.len())
            + info.gopclntab.as_ref().map_or(0, |s| s.data.len());
        out.push(json!({
            "file": path, "table": true,
            "source": if info.gopclntab.is_some() && info.eh_frame.is_none() { "Go's .gopclntab" } else if info.eh_frame.is_some() { if info.via_program_headers { ".eh_frame (through PT_GNU_EH_FRAME: no section headers)" } else { ".eh_frame" } } else { ".debug_frame" },
            "debug_frame": info.debug_frame.is_some(),
            "build_id": info.build_id.as_ref().map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
            "cfi_bytes": cfi, "fdes": t.stats.fdes, "cfi_rows": t.stats.cfi_rows, "rows": t.rows.len(),
            "unsupported_rows": t.stats.unsupported_cfa, "unknown_rbp_rows": t.stats.unknown_rbp, "bad_fdes": t.stats.bad_fdes,
            "pages": pages.len(), "kernel_bytes": kbytes,
            "kernel_bytes_per_cfi_byte": kbytes as f64 / cfi.max(1) as f64,
            "build_ms": cold.as_secs_f64() * 1e3, "cached_ms": warm.as_secs_f64() * 1e3, "cache_round_trip": again.as_ref() == Some(&t),
        }));
    }
    if a.json {
        crate::outln!("{}", json!({"type": "doctor_unwind", "files": out}))?;
        return Ok(0);
    }
    for v in &out {
        if v["table"] == json!(true) {
            crate::outln!(
                "{}: {} rows from {} FDEs in {:.1} KB of {}; {} rows the walk cannot evaluate; kernel {:.1} KB ({:.2} bytes per byte of CFI, {} pages of 64 KiB); built in {:.1} ms, {:.1} ms from the disk cache",
                v["file"].as_str().unwrap_or("?"),
                v["rows"],
                v["fdes"],
                v["cfi_bytes"].as_f64().unwrap_or(0.0) / 1e3,
                v["source"].as_str().unwrap_or("?"),
                v["unsupported_rows"],
                v["kernel_bytes"].as_f64().unwrap_or(0.0) / 1e3,
                v["kernel_bytes_per_cfi_byte"].as_f64().unwrap_or(0.0),
                v["pages"],
                v["build_ms"].as_f64().unwrap_or(0.0),
                v["cached_ms"].as_f64().unwrap_or(0.0),
            )?;
        } else {
            crate::outln!(
                "{}: no table: {} (its frames are walked by frame pointers)",
                v["file"].as_str().unwrap_or("?"),
                v["why"].as_str().unwrap_or("?")
            )?;
        }
    }
    Ok(0)
}
