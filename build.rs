//! Compiles every `src/tools/<tool>/<tool>.bpf.c` (and `src/engine/<part>/*.bpf.c`) into a
//! libbpf-rs skeleton in OUT_DIR, and the lab workloads into static binaries beside them.
//!
//! Cargo reruns this script after any change under `src/tools` (it must notice a new tool's
//! `.bpf.c` next to its `mod.rs`), so the script itself skips whatever is fresh: a skeleton is
//! rebuilt only when it is older than its `.bpf.c`, a header in the tool's folder or `src/bpf/`,
//! or this script; a workload only when it is older than its `.c`. A Rust-only edit then costs a
//! directory scan, not clang on every BPF object.
use std::{
    env, fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let script = newest(&[manifest.join("build.rs")]);
    // The target's kernel types (src/bpf/ARCH/vmlinux.h, scripts/vmlinux-h)
    // and, built on another architecture, clang's target for the workloads
    // (with Debian's cross libraries, e.g. gcc-aarch64-linux-gnu and
    // libc6-dev-arm64-cross).
    let (arch, triple) = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => ("x86", "x86_64-linux-gnu"),
        Ok("aarch64") => ("arm64", "aarch64-linux-gnu"),
        other => panic!("sonde's BPF programs are built for x86_64 and aarch64, not {other:?}"),
    };
    let cross_arg = format!("--target={triple}");
    let cross = (env::var("TARGET").ok() != env::var("HOST").ok()).then_some(cross_arg.as_str());
    build_lab_workloads(&out, &manifest, script, cross);
    let include = manifest.join("src/bpf");
    println!("cargo:rerun-if-changed=src/bpf");
    let arch_include = include.join(arch);
    println!("cargo:rerun-if-changed=src/bpf/{arch}");
    // The runtimes' kernel halves (src/engine/runtime/contract.h, runtimes.h and one
    // folder per runtime), included by the unwinder.
    let runtimes = manifest.join("src/engine/runtime");
    println!("cargo:rerun-if-changed=src/engine/runtime");
    // New tool folders too.
    println!("cargo:rerun-if-changed=src/tools");
    let mut shared = headers(&include);
    shared.extend(headers(&arch_include));
    shared.extend(headers(&runtimes));
    for entry in fs::read_dir(&runtimes).unwrap() {
        let dir = entry.unwrap().path();
        if dir.is_dir() {
            println!("cargo:rerun-if-changed={}", dir.display());
            shared.extend(headers(&dir));
        }
    }
    // Each tool's folder, and the engine's (doctor's probes live in
    // src/engine/caps, the runtimes' shared layouts in src/engine/runtime),
    // and each runtime's (its own layouts, src/engine/runtime/NAME).
    let folders = [manifest.join("src/tools"), manifest.join("src/engine"), runtimes.clone()];
    println!("cargo:rerun-if-changed=src/engine/caps");
    for entry in folders.iter().flat_map(|f| fs::read_dir(f).unwrap()) {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut inputs = shared.clone();
        inputs.extend(headers(&dir));
        for f in fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".bpf.c") else { continue };
            let skel = out.join(format!("{stem}.skel.rs"));
            let mut deps = inputs.clone();
            deps.push(path.clone());
            if fresh(&skel, newest(&deps).max(script)) {
                continue;
            }
            SkeletonBuilder::new()
                .source(&path)
                .clang_args([
                    "-I".as_ref(),
                    arch_include.as_os_str(),
                    "-I".as_ref(),
                    include.as_os_str(),
                    "-I".as_ref(),
                    dir.as_os_str(),
                    "-I".as_ref(),
                    runtimes.as_os_str(),
                    "-Wall".as_ref(),
                    "-Werror".as_ref(),
                    "-Wno-unused-function".as_ref(),
                ])
                .build_and_generate(&skel)
                .unwrap_or_else(|e| panic!("building {}: {e:#}", path.display()));
        }
    }
}

/// The `.h` files in a folder.
fn headers(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    v.sort();
    v
}

/// The newest modification time among these files (the epoch when none exists).
fn newest(paths: &[PathBuf]) -> SystemTime {
    paths.iter().filter_map(|p| fs::metadata(p).and_then(|m| m.modified()).ok()).max().unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Whether `output` exists and is at least as new as `input`.
fn fresh(output: &Path, input: SystemTime) -> bool {
    fs::metadata(output).and_then(|m| m.modified()).is_ok_and(|t| t >= input)
}

/// The lab workloads (tests/workloads/: burn.c for `lab profile`, dnsweb.c
/// for `lab dns`, msgbench.c for `lab msglat`, whylab.c for `lab why`), built static with frame
/// pointers and line tables and embedded in the binary: the labs need no
/// compiler on the host. `burn-nofp` is burn.c built as distributions build
/// their packages, without frame pointers, for `lab profile`'s second run.
fn build_lab_workloads(out: &Path, manifest: &Path, script: SystemTime, cross: Option<&str>) {
    let fp: &[&str] = &["-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"];
    let nofp: &[&str] = &["-fomit-frame-pointer"];
    for (name, src, extra) in [
        ("burn", "burn", fp),
        ("burn-nofp", "burn", nofp),
        ("dnsweb", "dnsweb", fp),
        ("msgbench", "msgbench", fp),
        ("whylab", "whylab", fp),
    ] {
        let src = manifest.join(format!("tests/workloads/{src}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        let bin = out.join(name);
        if fresh(&bin, newest(std::slice::from_ref(&src)).max(script)) {
            continue;
        }
        let st = std::process::Command::new("clang")
            .args(cross)
            .args(["-O2", "-gline-tables-only", "-fno-inline", "-pthread"])
            .args(extra)
            .arg("-static")
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("clang (for the lab workloads)");
        assert!(st.success(), "building {} statically (needs libc6-dev)", src.display());
    }
}
