//! The stacks `why` takes with the stack engine (walked in the kernel,
//! language frames included), symbolized at the end:
//!
//! - who released the locks traced threads waited for: the waker's stacks
//!   at the wake-up of a lock wait (why.bpf.c's `releases`), attached to the
//!   waits they ended;
//! - the hottest functions of each traced process on CPU: its threads'
//!   stacks sampled by a CPU-clock perf event (`stk_counts`).
//!
//! The unwinder's tables and the runtimes' descriptions are loaded for the
//! processes whose stacks the kernel half walks (it asks in `unw_need`), and
//! each such process's mappings are snapshot while it lives, so a process
//! that exits before the report is still named.
use std::collections::{HashMap, HashSet};

use libbpf_rs::MapCore;

use super::skel::{types, WhySkel};
use crate::engine::{
    record::{decode, for_each_entry},
    stacks::{self, FrameKind, Images, RawSample, Stack, SymStats, Symbols},
    stacktool::pids_in,
    unwind::{Session, UnwMaps},
};

/// One thread's releases of one lock wait, with its stack then.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Releaser {
    /// The releasing thread (the waker) and its process.
    pub tid: u32,
    /// See `tid`.
    pub pid: u32,
    /// Its name at the release.
    pub comm: String,
    /// The time the waits it ended had lasted, in ns (estimated: a wait
    /// under 10 ms is taken with probability its length over 10 ms and then
    /// counts 10 ms).
    pub ns: u64,
    /// Releases counted (a wait under 10 ms is counted with probability
    /// its length over 10 ms), walked or not (an empty `stack`).
    pub samples: u64,
    /// Its stack at the release, innermost first: `function (file:line)`,
    /// or `function [module]` without a line; language frames (Python,
    /// Java, JavaScript, Go) as the profile shows them. Empty for releases
    /// counted without a walk (the CPU's walks for the moment were spent).
    pub stack: Vec<String>,
    /// The frame the text report names: the innermost that is the
    /// program's own (a language frame, or native code outside the C
    /// library and the kernel).
    #[serde(skip)]
    pub at: Option<String>,
}

/// Releasers by (waiting thread, the wait's object, waking thread, the
/// wait's kernel stack).
pub type ByWait = HashMap<(u32, u64, u32, u64), Vec<Releaser>>;

/// One of a process's hottest functions on CPU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hot {
    /// `function (file)`, or `function [module]`: the innermost frame of
    /// each sample that is the program's own (see [`own_frame`]).
    pub function: String,
    /// Its share of the process's samples on CPU.
    pub share: f64,
    /// Samples (99 a second on CPU).
    pub samples: u64,
}

/// Each process's hottest functions, most samples first.
pub type Hottest = HashMap<u32, Vec<Hot>>;

/// What was lost of the releasers' stacks.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Loss {
    /// Releases whose stacks were cut short (no frame pointers, or a walk
    /// that ended early), of those taken.
    pub truncated: u64,
    /// Releases counted (walked or not).
    pub taken: u64,
}

/// Keeps what naming the releasers' stacks needs during the run.
pub struct Tracker {
    /// The unwinder's session.
    pub session: Session,
    images: Images,
    scanned: Option<std::time::Instant>,
}

impl Tracker {
    /// Starts with the unwinder's session of the loaded object.
    pub fn new(session: Session) -> Tracker {
        Tracker { session, images: Images::default(), scanned: None }
    }

    /// Loads the tables the walk asked for, and snapshots each releasing
    /// process once (per image) while it lives.
    pub fn tick(&mut self, m: &UnwMaps<'_>, releases: &dyn MapCore, samples: &dyn MapCore) {
        let l = self.session.tick(m);
        for &pid in &l.execs {
            self.images.observe_image(pid, self.session.generation(pid));
        }
        for pid in l.loaded.into_iter().filter(|p| !l.execs.contains(p)) {
            self.images.observe_loaded(pid, self.session.generation(pid));
        }
        // New releasing processes, and what those seen added to their perf
        // maps: looked for every half second.
        if self.scanned.is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(500)) {
            return;
        }
        self.scanned = Some(std::time::Instant::now());
        // Both maps' keys begin with a `struct stk_key`: the process first.
        let pids: HashSet<u32> = pids_in(releases).into_iter().chain(pids_in(samples)).collect();
        for pid in pids {
            self.images.keep_up(pid, self.session.generation(pid));
        }
    }

    /// Reads and names every release and sample (after the last tick).
    pub fn finish(mut self, skel: &WhySkel<'static>) -> anyhow::Result<(ByWait, Loss, Hottest)> {
        let um = crate::unw_maps!(skel);
        self.scanned = None;
        self.tick(&um, &skel.maps.releases, &skel.maps.stk_counts);
        let names = self.session.finish_names(&um);
        self.images.set_lang(names, self.session.frames());
        let maps = crate::stack_maps!(skel);
        let mut keys = Vec::new();
        let mut raw = Vec::new();
        let mut vals = Vec::new();
        for_each_entry(&skel.maps.releases, |k, v| {
            if let (Some(k), Some(v)) = (decode::<types::why_release_key>(k), decode::<types::why_release>(v)) {
                keys.push(k);
                vals.push(v);
            }
        })?;
        for k in &keys {
            let kstack = stacks::read_stack(maps.traces, k.s.kstack)?;
            let (ustack, walk, lang) = stacks::read_user_stack(maps, k.s.ustack, k.s.uhash)?;
            raw.push(RawSample {
                pid: k.s.pid,
                tid: k.s.tid,
                comm: super::cstr(&k.s.comm),
                kstack,
                ustack,
                walk,
                lang,
                in_signal: false,
                count: 1,
            });
        }
        let samples = stacks::read_samples(&skel.maps.stk_counts, maps)?;
        let mut sym = SymStats::default();
        let mut syms = Symbols::default();
        let named = syms.stacks(&raw, &mut self.images, &mut sym);
        let hottest = hottest(&syms.stacks(&samples, &mut self.images, &mut sym));
        let mut by: ByWait = HashMap::new();
        let mut loss = Loss::default();
        for ((k, v), s) in keys.iter().zip(&vals).zip(named) {
            loss.taken += v.count;
            if s.frames.iter().any(|f| f.kind == FrameKind::Truncated) {
                loss.truncated += v.count;
            }
            let r = releaser(k, v, &s);
            by.entry((k.tid, k.obj, k.s.tid, k.kstack)).or_default().push(r);
        }
        for rs in by.values_mut() {
            merge(rs);
        }
        Ok((by, loss, hottest))
    }
}

/// Per process, the samples by the innermost frame that is the program's
/// own, the five with the most.
fn hottest(samples: &[Stack]) -> Hottest {
    let mut by: HashMap<u32, HashMap<String, u64>> = HashMap::new();
    for s in samples {
        let leaf_first: Vec<&stacks::Frame> = s.frames.iter().rev().collect();
        let name = own_frame(&leaf_first)
            .or(leaf_first.first().copied())
            .map(|f| match &f.file {
                Some(file) => format!("{} ({})", f.name, short(file)),
                None => native_text(&f.name, short(&f.module)),
            })
            .unwrap_or_else(|| "[unknown]".into());
        *by.entry(s.pid).or_default().entry(name).or_default() += s.count;
    }
    by.into_iter()
        .map(|(pid, fs)| {
            let all: u64 = fs.values().sum();
            let mut v: Vec<Hot> = fs
                .into_iter()
                .map(|(function, samples)| Hot { function, share: samples as f64 / all.max(1) as f64, samples })
                .collect();
            v.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.function.cmp(&b.function)));
            v.truncate(5);
            (pid, v)
        })
        .collect()
}

/// The innermost frame (of a stack, innermost first) that is the program's
/// own: a language frame outside its runtime's library (the runtime's
/// native frames and its standard library run every program's code, and
/// say little: `Queue.put` is called by the program's `producer`), else
/// any language frame, else native code outside the C library.
pub fn own_frame<'a>(leaf_first: &[&'a stacks::Frame]) -> Option<&'a stacks::Frame> {
    let lang = |f: &&&stacks::Frame| matches!(f.kind, FrameKind::Lang(_) | FrameKind::Go | FrameKind::Jit);
    let library = |f: &stacks::Frame| match f.kind {
        FrameKind::Lang(l) => crate::engine::runtime::registry::library_frame(l, &f.name, f.file.as_deref()),
        FrameKind::Go => crate::engine::runtime::go::library_frame(&f.name, &f.module),
        _ => false,
    };
    leaf_first
        .iter()
        .filter(lang)
        .find(|f| !library(f))
        .or_else(|| leaf_first.iter().find(lang))
        .or_else(|| {
            leaf_first
                .iter()
                .find(|f| f.kind == FrameKind::User && !is_system_library(&f.module) && !is_system_function(&f.name))
        })
        .copied()
}

fn releaser(k: &types::why_release_key, v: &types::why_release, s: &Stack) -> Releaser {
    let leaf_first: Vec<&stacks::Frame> = s.frames.iter().rev().collect();
    let text = |f: &stacks::Frame| match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{} ({file}:{line})", f.name),
        _ => native_text(&f.name, &f.module),
    };
    let own = own_frame(&leaf_first);
    Releaser {
        tid: k.s.tid,
        pid: k.s.pid,
        comm: super::cstr(&k.s.comm),
        ns: v.ns,
        samples: v.count,
        stack: leaf_first.iter().map(|f| text(f)).collect(),
        at: own.map(|f| match (&f.file, f.line) {
            (Some(file), Some(line)) => format!("{} ({}:{line})", f.name, short(file)),
            _ => f.name.clone(),
        }),
    }
}

/// The C library and the dynamic loader: where every lock is released, so
/// never what the text report names.
fn is_system_library(module: &str) -> bool {
    let base = module.rsplit('/').next().unwrap_or(module);
    ["libc.so", "libc-", "libpthread", "ld-linux", "ld-musl", "libstdc++", "libgcc_s", "[vdso]"]
        .iter()
        .any(|p| base.starts_with(p))
}

/// Functions of the C library by their names, for a program that has it
/// linked in (static): `__libc_pread`, `__lll_lock_wake`, `pthread_mutex_unlock`.
fn is_system_function(name: &str) -> bool {
    [
        "__libc_",
        "__lll_",
        "__GI_",
        "__pthread_",
        "___pthread_",
        "pthread_",
        "__futex",
        "futex_",
        "__clock_",
        "clock_nanosleep",
        "__nanosleep",
        "_IO_",
        "__syscall_cp",
        "__timedwait",
        "__new_sem",
        "sem_",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// A native frame as the text names it: "function [module]" (a module
/// already in brackets, as `[kernel]`, kept as it is; an unknown function
/// in an unknown module named once).
fn native_text(name: &str, module: &str) -> String {
    if module.is_empty() || name == module {
        name.to_string()
    } else if module.starts_with('[') && module.ends_with(']') {
        format!("{name} {module}")
    } else {
        format!("{name} [{module}]")
    }
}

fn short(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// One row per (thread, stack), the longest first, the three longest kept.
pub fn merge(rs: &mut Vec<Releaser>) {
    let mut out: Vec<Releaser> = Vec::new();
    for r in rs.drain(..) {
        match out.iter_mut().find(|o| o.tid == r.tid && o.stack == r.stack) {
            Some(o) => {
                o.ns += r.ns;
                o.samples += r.samples;
            }
            None => out.push(r),
        }
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.ns));
    out.truncate(3);
    *rs = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(tid: u32, stack: &[&str], ns: u64) -> Releaser {
        Releaser {
            tid,
            pid: 1,
            comm: "t".into(),
            ns,
            samples: 1,
            stack: stack.iter().map(|s| s.to_string()).collect(),
            at: None,
        }
    }

    #[test]
    fn merge_sums_one_thread_and_stack_and_keeps_the_three_longest() {
        let mut v = vec![
            r(1, &["a"], 10),
            r(1, &["a"], 5),
            r(2, &["a"], 1),
            r(1, &["b"], 20),
            r(3, &["c"], 2),
            r(4, &["d"], 3),
        ];
        merge(&mut v);
        let got: Vec<(u32, u64)> = v.iter().map(|r| (r.tid, r.ns)).collect();
        assert_eq!(got, vec![(1, 20), (1, 15), (4, 3)]);
    }

    #[test]
    fn each_runtime_knows_its_own_library() {
        use crate::engine::runtime::{java::HOTSPOT, plugin::Runtime, python::CPYTHON, v8::NODE};
        let py = |f: &str| CPYTHON.library_frame("f", Some(f));
        assert!(py("/usr/lib/python3.14/threading.py"));
        assert!(py("/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py"));
        assert!(py("<frozen importlib._bootstrap>"));
        assert!(py("/usr/lib64/python3.12/threading.py"));
        assert!(py("/usr/lib/python3.13t/queue.py"));
        assert!(!py("/usr/lib/python3/dist-packages/requests/api.py"));
        assert!(!py("/srv/venv/lib/python3.12/site-packages/flask/app.py"));
        assert!(!py("/tmp/app.py"));
        assert!(HOTSPOT.library_frame("java.util.concurrent.locks.LockSupport.unpark", None));
        assert!(HOTSPOT.library_frame("jdk.internal.misc.Unsafe.unpark", None));
        assert!(!HOTSPOT.library_frame("JQueue.producer", None));
        assert!(!HOTSPOT.library_frame("com.example.Worker.run", None));
        assert!(NODE.library_frame("emit", Some("node:events")));
        assert!(!NODE.library_frame("handler", Some("/srv/app/server.js")));
    }

    #[test]
    fn native_frames_are_named_with_their_module_in_brackets_once() {
        assert_eq!(native_text("_raw_spin_unlock", "[kernel]"), "_raw_spin_unlock [kernel]");
        assert_eq!(native_text("[unknown]", "[unknown]"), "[unknown]");
        assert_eq!(native_text("crunch", "whylab"), "crunch [whylab]");
        assert_eq!(native_text("crunch", ""), "crunch");
    }

    #[test]
    fn the_c_library_linked_in_is_never_the_named_frame() {
        use crate::engine::stacks::Frame;
        let f = |name: &str| Frame {
            name: name.into(),
            file: None,
            line: None,
            kind: FrameKind::User,
            module: "/srv/whylab".into(),
            inlined: false,
        };
        let (pread, reader, main) = (f("__libc_pread"), f("reader"), f("main"));
        assert_eq!(own_frame(&[&pread, &reader, &main]).map(|x| x.name.as_str()), Some("reader"));
        let (wake, unlock, holder) = (f("__lll_lock_wake"), f("___pthread_mutex_unlock"), f("hold_it"));
        assert_eq!(own_frame(&[&wake, &unlock, &holder]).map(|x| x.name.as_str()), Some("hold_it"));
    }

    #[test]
    fn the_c_library_is_never_the_named_frame() {
        assert!(is_system_library("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_system_library("libpthread.so.0"));
        assert!(!is_system_library("/usr/bin/python3.11"));
        assert!(!is_system_library("/opt/app/liblock.so"));
    }
}
