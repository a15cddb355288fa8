//! End-to-end tests: the real `sonde` binary against real kernel traffic in
//! the tests' own network namespaces, checked against those namespaces' MIB
//! counters, and workloads whose behaviour is built in. They need root (as in
//! CI); they fail, not skip, without it. One test binary, one module per area.

/// Helpers shared by every module.
mod common;

/// `--cgroup`, v2 and v1, a group and the groups below it.
mod cgroups;
/// The command line: bad input, signals, closed stdout, privileges, help, doctor.
mod cli;
/// `sonde cwnd`.
mod cwnd;
/// Attach and detach cycles of funclatency, slow and serve on a self-checking target.
mod cycles;
/// `sonde drops` against the namespaces' own counters.
mod drops;
/// `sonde funclatency` and `sonde slow`.
mod funclatency;
/// Go binaries, stripped or not, named and walked from Go's own table.
mod golang;
/// Crafted ELF files and perf maps: a corpus and a bounded fuzzer.
mod hostile_elf;
/// Java (HotSpot) frames read in the kernel, on JDK 11, 17, 21 and 25, against JFR.
mod java;
/// The labs, end to end.
mod labs;
/// `-- CMD`, processes that exec while watched, runs that end with their targets.
mod launch;
/// `sonde msglat`.
mod msglat;
/// `sonde msglat` on a relay that reuses its listener's fd for the onward connection.
mod msglat_relay;
/// JavaScript (V8) frames read in the kernel, on Node.js 18, 20 and 22, against `--cpu-prof`.
mod node;
/// `sonde offcpu` and `sonde wakeup`.
mod offcpu;
/// Perf maps of traced processes as hostile input.
mod perfmap;
/// `sonde profile`.
mod profile;
/// Python frames read in the kernel, on every CPython here, against py-spy.
mod python;
/// Real programs (pyflakes, terser, javac, gofmt) against each runtime's own or a trusted profiler.
mod real;
/// `sonde retrans`.
mod retrans;
/// `sonde serve`: a real Prometheus, go tool pprof, a push receiver, bad input.
mod serve;
/// User stacks without frame pointers (`--unwind`).
mod unwind;
/// What a person sees of the HTML flame graph (a browser's screenshot).
mod view;
/// `sonde why`.
mod why;
