//! Compiles every `src/tools/<tool>/<tool>.bpf.c` into a libbpf-rs skeleton in OUT_DIR.
use std::{env, fs, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR set by cargo"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let include = manifest.join("src/bpf");
    println!("cargo:rerun-if-changed=src/bpf");
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
