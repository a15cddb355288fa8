//! sonde: why a service is slow or where its packets are lost, with eBPF.
//!
//! `engine` is shared by every tool; `tools/<name>` holds each tool's kernel
//! half (`<name>.bpf.c`) beside its user half; `lab` reproduces workflows.
pub mod engine;
pub mod lab;
pub mod tools;
