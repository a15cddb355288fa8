//! What `funclatency` (and `slow`) trace: `BINARY_OR_LIB:GLOB`,
//! `syscall:NAME`, `softirq:NAME` and `kernel:GLOB`, resolved into probes.
use std::{
    collections::BTreeMap,
    ops::ControlFlow,
    path::{Path, PathBuf},
};

use blazesym::inspect::{source::Elf, Inspector};
use blazesym::SymType;

use crate::engine::{
    error::{env, usage},
    features, kfunc,
    procroot::{pinned_path, LastSymlink, Root},
};

/// Softirq vectors by name (include/linux/interrupt.h order).
pub const SOFTIRQS: [&str; 10] =
    ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"];

/// One probe point and how it is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    /// uprobe + uretprobe at `offset` in the ELF file `path`.
    User {
        /// The ELF file.
        path: PathBuf,
        /// File offset of the function's first instruction.
        offset: u64,
    },
    /// syscalls:sys_enter_NAME and sys_exit_NAME.
    Syscall(String),
    /// irq:softirq_entry/exit of this vector.
    Softirq(u32),
    /// A kernel function (its symbol): fentry/fexit, else kprobe/kretprobe.
    Kernel(String),
}

/// A resolved probe, named as printed (`libc:getnameinfo`, `syscall:connect`).
#[derive(Debug, Clone)]
pub struct Probe {
    /// Display name.
    pub name: String,
    /// Where it attaches.
    pub kind: ProbeKind,
}

fn glob(pat: &str, what: &str) -> anyhow::Result<glob::Pattern> {
    glob::Pattern::new(pat).map_err(|e| usage(format!("{what} '{pat}': {e}")))
}

/// Resolves every target; `pids` (from -p) name whose mappings short library
/// names are looked up in.
pub fn resolve(targets: &[String], pids: &[u32], max_probes: usize) -> anyhow::Result<Vec<Probe>> {
    if targets.is_empty() {
        return Err(usage("give at least one target: BINARY:FUNCTION, syscall:NAME, softirq:NAME or kernel:FUNCTION"));
    }
    let mut out: Vec<Probe> = Vec::new();
    for t in targets {
        let Some((scope, pat)) = t.split_once(':') else {
            return Err(usage(format!(
                "target '{t}': write BINARY:FUNCTION, syscall:NAME, softirq:NAME or kernel:FUNCTION"
            )));
        };
        if pat.is_empty() {
            return Err(usage(format!("target '{t}': nothing after ':'; name a function (globs like mysql_* work)")));
        }
        let found = match scope {
            "syscall" => syscalls(pat)?,
            "softirq" => softirqs(pat)?,
            "kernel" | "k" => kernel_functions(pat)?,
            _ => user_functions(scope, pat, pids)?,
        };
        if found.is_empty() {
            return Err(usage(format!(
                "target '{t}': '{pat}' matches nothing; check the name (globs like mysql_* work)"
            )));
        }
        for p in found {
            if !out.iter().any(|o| o.kind == p.kind) {
                out.push(p);
            }
        }
        if out.len() > max_probes {
            return Err(usage(format!(
                "the targets match at least {} functions, over --max-probes {max_probes}; narrow the glob or raise --max-probes",
                out.len()
            )));
        }
    }
    Ok(out)
}

/// Kernel functions matching `pat`; refused with the reason where the kernel
/// has neither fentry nor kprobes.
fn kernel_functions(pat: &str) -> anyhow::Result<Vec<Probe>> {
    if !features::has_kprobes() {
        if let Err(why) = crate::engine::caps::fentry_attaches() {
            return Err(env(format!(
                "kernel:{pat}: kernel functions need fentry/fexit or kprobes, and this kernel has kprobes compiled out and refuses fentry ({why}); trace a syscall:NAME or softirq:NAME instead, or see `sonde doctor`"
            )));
        }
    }
    let tracefs = features::tracefs()
        .ok_or_else(|| env("kernel targets need tracefs (mount -t tracefs nodev /sys/kernel/tracing)"))?;
    Ok(kfunc::matching(&tracefs, pat)?
        .into_iter()
        .map(|f| Probe { name: format!("kernel:{f}"), kind: ProbeKind::Kernel(f) })
        .collect())
}

fn syscalls(pat: &str) -> anyhow::Result<Vec<Probe>> {
    let g = glob(pat, "syscall")?;
    let dir = features::tracefs()
        .ok_or_else(|| env("syscall targets need tracefs (mount -t tracefs nodev /sys/kernel/tracing)"))?
        .join("events/syscalls");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| env(format!("reading {}: {e}; syscall tracepoints need CONFIG_FTRACE_SYSCALLS", dir.display())))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("sys_enter_").map(str::to_string))
        .filter(|n| g.matches(n))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| Probe { name: format!("syscall:{n}"), kind: ProbeKind::Syscall(n) }).collect())
}

fn softirqs(pat: &str) -> anyhow::Result<Vec<Probe>> {
    let g = glob(&pat.to_ascii_uppercase(), "softirq")?;
    let found: Vec<Probe> = SOFTIRQS
        .iter()
        .enumerate()
        .filter(|(_, n)| g.matches(n))
        .map(|(i, n)| Probe { name: format!("softirq:{n}"), kind: ProbeKind::Softirq(i as u32) })
        .collect();
    if found.is_empty() {
        return Err(usage(format!("softirq:{pat}: no such softirq; one of {}", SOFTIRQS.join(", "))));
    }
    Ok(found)
}

/// Functions of an ELF file matching `pat`, one probe per address (aliases
/// such as `getnameinfo` / `__getnameinfo` are one function).
fn user_functions(bin: &str, pat: &str, pids: &[u32]) -> anyhow::Result<Vec<Probe>> {
    let path = find_binary(bin, pids)?;
    let g = glob(pat, "function")?;
    let mut by_offset: BTreeMap<u64, String> = BTreeMap::new();
    // The file may belong to the traced process (`-p`): a compressed
    // section that would inflate without bound is refused, and a panic in
    // the ELF reader is an error, not a crash.
    let cannot =
        |why: String| usage(format!("{}: cannot read its symbols ({why}); is it an ELF file?", path.display()));
    match std::fs::File::open(&path).map(crate::engine::elfcheck::check) {
        Ok(crate::engine::elfcheck::Verdict::Refused(why)) => return Err(cannot(why)),
        Ok(crate::engine::elfcheck::Verdict::NotElf) => return Err(cannot("not an ELF file".into())),
        Ok(_) => {}
        Err(e) => return Err(cannot(e.to_string())),
    }
    let src = Elf { path: path.clone(), debug_syms: false, _non_exhaustive: () }.into();
    let read = crate::engine::elfcheck::guarded(|| {
        Inspector::new().for_each(&src, |s| {
            if s.sym_type == SymType::Function && g.matches(&s.name) {
                if let Some(off) = s.file_offset.filter(|&o| o > 0) {
                    // Prefer the plainest alias: fewest leading underscores, then shortest.
                    let better = |a: &str, b: &str| {
                        (a.len() - a.trim_start_matches('_').len(), a.len())
                            < (b.len() - b.trim_start_matches('_').len(), b.len())
                    };
                    let e = by_offset.entry(off).or_insert_with(|| s.name.to_string());
                    if better(&s.name, e) {
                        *e = s.name.to_string();
                    }
                }
            }
            ControlFlow::Continue(())
        })
    });
    match read {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(cannot(e.to_string())),
        Err(panic) => return Err(cannot(format!("the ELF reader failed: {panic}"))),
    }
    let mut v: Vec<Probe> = by_offset
        .into_iter()
        .map(|(offset, f)| Probe { name: format!("{bin}:{f}"), kind: ProbeKind::User { path: path.clone(), offset } })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}

/// Finds the ELF file a target names: a path; with -p, a file mapped by one
/// of those processes (the executable, or a library such as `libc` for
/// `libc.so.6`); else a library in the dynamic linker's directories, else an
/// executable on PATH. A process's file is the very one it runs or maps,
/// held open and named `/proc/self/fd/N` ([`mapped_file`]).
pub fn find_binary(name: &str, pids: &[u32]) -> anyhow::Result<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return if p.is_file() { Ok(p) } else { Err(usage(format!("{name}: no such file"))) };
    }
    let lib_match = |file: &str| {
        file == name
            || [format!("{name}.so"), format!("lib{name}.so"), format!("{name}-"), format!("lib{name}-")]
                .iter()
                .any(|p| file.starts_with(p.as_str()) && file.contains(".so"))
    };
    for pid in pids {
        if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            if exe.file_name().and_then(|f| f.to_str()) == Some(name) {
                // The executable itself, whatever its path leads to now.
                if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/exe")) {
                    return Ok(pinned_path(f));
                }
            }
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        for l in maps.lines() {
            let mut fields = l.split_whitespace();
            let range = fields.next().unwrap_or("");
            let Some(path) = fields.nth(4).filter(|p| p.starts_with('/')) else { continue };
            let file = Path::new(path).file_name().and_then(|f| f.to_str()).unwrap_or("");
            if lib_match(file) {
                if let Some(f) = mapped_file(*pid, range, path) {
                    return Ok(pinned_path(f));
                }
            }
        }
    }
    for dir in lib_dirs() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        let mut hits: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(lib_match))
            .collect();
        // The soname (libfoo.so.3) before libfoo.so.3.1.2; libfoo.so is often
        // a linker script (not ELF) or the dev symlink.
        hits.sort_by_key(|p| {
            let f = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
            (f.ends_with(".so"), f.len())
        });
        if let Some(h) = hits.into_iter().find(|p| is_elf(p)) {
            return Ok(h);
        }
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(usage(format!(
        "{name}: no such binary or library (looked in the dynamic linker's directories and PATH{}); give its path",
        if pids.is_empty() { "; with -p, in the process's mappings" } else { " and the mappings of -p" }
    )))
}

/// The file a process maps at `range` (as `/proc/PID/maps` shows it):
/// through `/proc/PID/map_files` (the very inode), else by its path opened
/// inside the process's root (symlinks and `..` cannot lead out of it).
fn mapped_file(pid: u32, range: &str, path: &str) -> Option<std::fs::File> {
    let (s, e) = range.split_once('-')?;
    let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
    // map_files names ranges without the zero padding maps shows.
    std::fs::File::open(format!("/proc/{pid}/map_files/{s:x}-{e:x}")).ok().or_else(|| {
        let path = Path::new(path.trim_end_matches(" (deleted)"));
        Root::of_process(pid).ok()?.open(path, LastSymlink::Follow).ok()
    })
}

fn is_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == *b"\x7fELF"
}

/// The dynamic linker's search directories: /etc/ld.so.conf (with its
/// includes), then the multiarch and default directories.
fn lib_dirs() -> Vec<PathBuf> {
    fn conf(path: &Path, out: &mut Vec<PathBuf>, depth: u32) {
        let Ok(text) = std::fs::read_to_string(path) else { return };
        for l in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if let Some(inc) = l.strip_prefix("include") {
                let pat = inc.trim();
                if depth < 4 {
                    if let Ok(paths) = glob::glob(pat) {
                        for p in paths.flatten() {
                            conf(&p, out, depth + 1);
                        }
                    }
                }
            } else {
                out.push(PathBuf::from(l));
            }
        }
    }
    let mut dirs = Vec::new();
    conf(Path::new("/etc/ld.so.conf"), &mut dirs, 0);
    for d in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
        "/usr/local/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}
