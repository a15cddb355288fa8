//! The shared engine: everything a tool needs that is not the tool itself.
pub mod attach;
pub mod btfnames;
pub mod caps;
pub mod cgroup;
pub mod chart;
pub mod cli;
pub mod elfcheck;
pub mod error;
pub mod features;
pub mod flowfilter;
pub mod hist;
pub mod kfunc;
pub mod launch;
pub mod mib;
pub mod netns;
pub mod output;
pub mod perf;
pub mod perfmap;
pub mod pprof;
pub mod process;
pub mod procfd;
pub mod procroot;
pub mod record;
pub mod render;
pub mod ringbuf;
pub mod run;
pub mod runtime;
pub mod slots;
pub mod stacks;
pub mod stacktool;
pub mod symbols;
pub mod taskfilter;
pub mod time;
pub mod unwind;

/// Declares `mod skel`: the libbpf-rs skeleton that build.rs generated from
/// the tool's `NAME.bpf.c` (generated code, so the crate's lints do not apply).
#[macro_export]
macro_rules! skeleton {
    ($name:literal) => {
        mod skel {
            #![allow(
                clippy::all,
                clippy::undocumented_unsafe_blocks,
                missing_docs,
                unused_imports,
                non_camel_case_types,
                dead_code
            )]
            include!(concat!(env!("OUT_DIR"), "/", $name, ".skel.rs"));
        }
    };
}

/// Routes libbpf's own messages to stderr only with SONDE_DEBUG set: sonde
/// reports load failures itself, in one line.
pub fn quiet_libbpf() {
    if std::env::var_os("SONDE_DEBUG").is_some() {
        return;
    }
    libbpf_rs::set_print(None);
}

/// Whether a process with this pid exists now (its /proc directory).
pub fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether a process exists and has not exited (a zombie waiting for its
/// parent counts as exited).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}
