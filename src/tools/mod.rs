//! One folder per tool: the kernel half (`NAME.bpf.c`, `NAME.h`) beside the user half.
pub mod cwnd;
pub mod doctor;
pub mod drops;
pub mod funclatency;
pub mod msglat;
pub mod offcpu;
pub mod profile;
pub mod retrans;
pub mod serve;
pub mod why;
