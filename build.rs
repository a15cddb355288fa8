//! Compiles every `src/tools/<tool>/<tool>.bpf.c` into a libbpf-rs skeleton in OUT_DIR.
use std::{env, fs, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    build_lab_workload(&out, &manifest);
    let include = manifest.join("src/bpf");
    println!("cargo:rerun-if-changed=src/bpf");
    // New tool folders too.
    println!("cargo:rerun-if-changed=src/tools");
    for entry in fs::read_dir(manifest.join("src/tools")).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", dir.display());
        for f in fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".bpf.c") else { continue };
            let skel = out.join(format!("{stem}.skel.rs"));
            SkeletonBuilder::new()
                .source(&path)
                .clang_args([
                    "-I".as_ref(),
                    include.as_os_str(),
                    "-I".as_ref(),
                    dir.as_os_str(),
                    "-Wall".as_ref(),
                    "-Wno-unused-function".as_ref(),
                ])
                .build_and_generate(&skel)
                .unwrap_or_else(|e| panic!("building {}: {e:#}", path.display()));
        }
    }
}

/// The lab workloads (tests/workloads/: burn.c for `lab profile`, dnsweb.c
/// for `lab dns`, msgbench.c for `lab msglat`), built static with frame
/// pointers and line tables and embedded in the binary: the labs need no
/// compiler on the host. `burn-nofp` is burn.c built as distributions build
/// their packages, without frame pointers, for `lab profile`'s second run.
fn build_lab_workload(out: &std::path::Path, manifest: &std::path::Path) {
    let fp: &[&str] = &["-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"];
    let nofp: &[&str] = &["-fomit-frame-pointer"];
    for (name, src, extra) in [("burn", "burn", fp), ("burn-nofp", "burn", nofp), ("dnsweb", "dnsweb", fp), ("msgbench", "msgbench", fp)] {
        let src = manifest.join(format!("tests/workloads/{src}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        let bin = out.join(name);
        let st = std::process::Command::new("clang")
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
