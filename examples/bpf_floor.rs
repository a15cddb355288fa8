//! Loads a BPF object and attaches each of its programs by its section
//! (`tp_btf/...`), then holds them until stdin closes or the process is
//! killed: the empty-program floor that bench/why/run measures beside
//! `sonde why` (bench/why/floor.bpf.c). Not part of sonde.
use std::io::Read;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: bpf_floor OBJECT.o"))?;
    let obj = libbpf_rs::ObjectBuilder::default().open_file(&path)?.load()?;
    let links: Vec<libbpf_rs::Link> = obj.progs_mut().map(|p| p.attach()).collect::<Result<_, _>>()?;
    eprintln!("bpf_floor: {} programs attached", links.len());
    let _ = std::io::stdin().read(&mut [0u8; 1])?;
    Ok(())
}
