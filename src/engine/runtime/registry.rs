//! The runtimes this build reads: one line each in [`RUNTIMES`] (their
//! kernel halves have theirs in `runtimes.h`), and what is asked of all of
//! them at once: which one a process runs ([`detect`]), what `doctor`
//! lists ([`supported`]) and says of a process ([`inspect`]).
use super::{
    java,
    plugin::{Detected, Lang, Runtime},
    python, v8,
};
use crate::engine::process::Process;

/// Every runtime, in the order detection asks them (the first that finds
/// itself in a process is its runtime: a JVM embeds no Python, but a
/// program embedding CPython may be named `node`).
pub static RUNTIMES: &[&dyn Runtime] = &[&java::HOTSPOT, &v8::NODE, &python::CPYTHON];

/// The runtime of `enum rt_kind` value `kind`.
pub fn by_kind(kind: u8) -> Option<&'static dyn Runtime> {
    RUNTIMES.iter().copied().find(|r| r.kind() == kind)
}

/// How frames of runtime `kind` are shown (a kind no runtime has: as
/// Python's, which never happens with a kernel half built from the same
/// list).
pub fn lang(kind: u8) -> &'static Lang {
    by_kind(kind).map(|r| r.lang()).unwrap_or(python::CPYTHON.lang())
}

/// Whether a frame of `lang` is its runtime's own library
/// ([`Runtime::library_frame`]).
pub fn library_frame(lang: &Lang, name: &str, file: Option<&str>) -> bool {
    RUNTIMES.iter().any(|r| std::ptr::eq(r.lang(), lang) && r.library_frame(name, file))
}

/// Which runtime, if any, `p` runs, and what it found (a runtime known by
/// its files' names alone has none).
pub fn detect(p: &Process) -> Option<(Option<&'static dyn Runtime>, Detected)> {
    match std::env::consts::ARCH {
        // The runtimes' structures are laid out alike on AArch64; their
        // frames differ where each reader says.
        "x86_64" | "aarch64" => RUNTIMES.iter().find_map(|r| r.detect(p).map(|d| (Some(*r), d))),
        arch => not_read_here(arch, p).map(|d| (None, d)),
    }
}

/// On an architecture whose runtimes' layouts this sonde does not know
/// (all but x86-64 and AArch64): the runtime a process runs, recognised by
/// the names of its files alone, reported as not read, so that its stacks
/// are said to stay native rather than silently left so.
pub fn not_read_here(arch: &str, p: &Process) -> Option<Detected> {
    let what = p.exec_files().find_map(|m| RUNTIMES.iter().find_map(|r| r.by_file_name(m.base())))?;
    Some(Detected::not_read(
        what,
        format!(
            "its frames are read on x86-64 and AArch64 only so far; this is an {arch} process (native frames only)"
        ),
    ))
}

/// What runtime a file of this name is ("Python 3.12", ...), if any.
pub fn runtime_named(base: &str) -> Option<String> {
    RUNTIMES.iter().find_map(|r| r.by_file_name(base))
}

/// The runtimes this build reads, for `doctor` and the docs.
pub fn supported() -> Vec<(&'static str, &'static str)> {
    RUNTIMES.iter().map(|r| (r.name(), r.versions())).collect()
}

/// What `doctor --pid` says of one process: its runtime, if any, whether
/// its frames are read, and what was learnt.
pub fn inspect(pid: u32) -> serde_json::Value {
    use serde_json::json;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim_end().to_string());
    let Ok(comm) = comm else { return json!({"pid": pid, "error": "no such process"}) };
    let Some(p) = Process::read(pid).filter(|p| p.mem().is_some()) else {
        return json!({"pid": pid, "comm": comm, "error": "its maps or memory cannot be read"});
    };
    match detect(&p).map(|d| d.1) {
        None => {
            json!({"pid": pid, "comm": comm, "runtime": null, "detail": "no runtime sonde reads (native frames only)"})
        }
        Some(Detected::Read(i)) => {
            let a = i.about();
            let mut v = json!({
                "pid": pid, "comm": comm, "runtime": a.runtime, "read": true,
                "image": a.image, "offsets": a.offsets, "detail": a.detail,
            });
            if let Some(t) = &a.untested {
                v["untested"] = json!(t);
            }
            if let Some(o) = v.as_object_mut() {
                o.extend(a.fields);
            }
            v
        }
        Some(Detected::NotRead { what, why }) => {
            json!({"pid": pid, "comm": comm, "runtime": what, "read": false, "why": why})
        }
        Some(Detected::Later(why)) => {
            json!({"pid": pid, "comm": comm, "runtime": why.split(':').next().unwrap_or("a runtime"), "read": false, "why": why})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::process::MapLine;

    #[test]
    fn runtimes_on_another_architecture_are_named_as_not_read() {
        let line = |p: &str| MapLine { start: 0x1000, end: 0x2000, offset: 0, exec: true, path: p.into() };
        for (path, what) in [
            ("/usr/bin/python3.11", "Python 3.11"),
            ("/usr/lib/jvm/java-17-openjdk-arm64/lib/server/libjvm.so", "a Java VM (libjvm.so)"),
            ("/usr/bin/node", "Node.js"),
        ] {
            let p = Process::from_maps(1, vec![line("/usr/lib/riscv64-linux-gnu/libc.so.6"), line(path)]);
            match not_read_here("riscv64", &p) {
                Some(Detected::NotRead { what: w, why }) => {
                    assert_eq!(w, what);
                    assert!(why.contains("AArch64 only") && why.contains("riscv64"), "{why}");
                }
                _ => panic!("{path}: not reported"),
            }
        }
        assert!(not_read_here("riscv64", &Process::from_maps(1, vec![line("/usr/bin/bash")])).is_none());
    }

    #[test]
    fn every_runtime_has_a_kind_and_marks_of_its_own() {
        let mut kinds: Vec<u8> = RUNTIMES.iter().map(|r| r.kind()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), RUNTIMES.len());
        assert!(!kinds.contains(&0), "0 is RT_NONE");
        for r in RUNTIMES {
            assert_eq!(by_kind(r.kind()).map(|x| x.name()), Some(r.name()));
            assert!(!r.lang().kind.is_empty() && r.lang().folded.starts_with("_["));
        }
    }
}
