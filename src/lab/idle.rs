//! `sonde lab idle-restart`: seed 002. A server answers a small request with
//! a ~700 KB response on one long-lived connection, every few seconds: longer
//! than the RTO, so before each response the connection has been idle. With
//! CUBIC and net.ipv4.tcp_slow_start_after_idle=1 the kernel restarts slow
//! start before every response (RFC 5681 4.1) and each one costs extra round
//! trips; with BBR it never does (BBR has its own cong_control hook); with
//! the sysctl at 0 it never does either. `sonde cwnd` watches all three
//! settings, `ss -ti` read during each idle gap checks its cwnd, and the
//! client's own response times give the round trips each restart costs.
//!
//! The path has a fixed delay (a TUN relay, src/lab/delay.rs) so that round
//! trips take measurable time.
use std::{
    io::{Read, Write},
    net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd,
    path::PathBuf,
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use clap::Args;
use serde::Serialize;

use super::netns::{sh, Mib, Netns, Pair};
use super::{delay::DelayLink, median};
use crate::{
    engine::{
        cli,
        error::{env, usage},
        features,
        output::table,
        run::{duration_arg, RunControl},
    },
    tools::cwnd::{run_with, CwndArgs, IdleSend, MECHANISMS},
};

/// Options of `sonde lab idle-restart`.
#[derive(Debug, Args)]
pub struct IdleLabArgs {
    /// Responses per setting: the first on a fresh connection, each further
    /// one after an idle gap.
    #[arg(long, default_value_t = 5)]
    pub responses: usize,
    /// Idle time before each further response (longer than the RTO, which
    /// is at least 200 ms; long enough for CUBIC's cwnd to decay to the
    /// initial window: one halving per RTO idle).
    #[arg(long, value_parser = duration_arg, default_value = "2s")]
    pub gap: Duration,
    /// Response size in bytes.
    #[arg(long, default_value_t = 700_000)]
    pub size: usize,
    /// One-way delay of the path between the namespaces.
    #[arg(long, value_parser = duration_arg, default_value = "10ms")]
    pub delay: Duration,
    /// Chart of cwnd over time for the three connections (.html or .svg).
    #[arg(short = 'o', long, default_value = "sonde-lab-idle-restart.html")]
    pub output: PathBuf,
    /// Print the findings as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// The attach mechanism `sonde cwnd` uses (default: the best available).
    #[arg(long, value_parser = crate::engine::attach::parser(MECHANISMS))]
    pub mechanism: Option<crate::engine::attach::Mechanism>,
}

/// One of the three settings compared.
struct Setting {
    name: &'static str,
    cc: &'static str,
    sysctl: u8,
    port: u16,
}

const SETTINGS: [Setting; 3] = [
    Setting { name: "cubic, tcp_slow_start_after_idle=1", cc: "cubic", sysctl: 1, port: 7101 },
    Setting { name: "bbr, tcp_slow_start_after_idle=1", cc: "bbr", sysctl: 1, port: 7102 },
    Setting { name: "cubic, tcp_slow_start_after_idle=0", cc: "cubic", sysctl: 0, port: 7103 },
];

/// What the lab found for one setting.
#[derive(Debug, Clone, Serialize)]
pub struct SettingResult {
    /// Human name.
    pub name: String,
    /// Congestion control.
    pub cc: String,
    /// The sysctl's value.
    pub sysctl: u8,
    /// Server port of its connection.
    pub port: u16,
    /// sonde's idle sends on the server's socket, in order.
    pub idle_sends: Vec<IdleSend>,
    /// cwnd `ss -ti` showed on the server's socket during each idle gap
    /// (before responses 2..n).
    pub ss_cwnd: Vec<Option<u32>>,
    /// Idle sends whose cwnd_before equals ss's cwnd in the gap before.
    pub ss_matches: usize,
    /// The client's time from request to last byte, per response, ms.
    pub response_ms: Vec<f64>,
    /// Median of the responses after an idle gap, ms.
    pub median_after_idle_ms: f64,
    /// Round trips those took (median / path RTT).
    pub round_trips: f64,
    /// The server namespace's own counters over this setting's run: slow
    /// starts CUBIC's HyStart ended early (TcpExtTCPHystartDelayDetect +
    /// TcpExtTCPHystartTrainDetect), and segments retransmitted
    /// (TcpRetransSegs). Either keeps a burst's cwnd from growing.
    pub hystart_exits: i64,
    /// See `hystart_exits`.
    pub retrans_segs: i64,
}

/// The TCP_CONGESTION socket option.
fn set_cc(s: &impl AsRawFd, cc: &str) -> anyhow::Result<()> {
    // SAFETY: a byte string and its length for a socket we own.
    let r = unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, cc.as_ptr() as *const _, cc.len() as _)
    };
    if r != 0 {
        return Err(env(format!(
            "setting congestion control {cc}: {}; load it with `modprobe tcp_{cc}`",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The server: accepts one connection, sets its congestion control, and
/// answers every 1-byte request with `size` bytes; under SCHED_FIFO like
/// the client, so that on a busy host neither waits for a CPU while the
/// connection could send (an application-limited burst grows no cwnd).
fn serve(l: TcpListener, cc: &str, size: usize) -> anyhow::Result<()> {
    super::realtime_or_warn();
    let (mut s, _) = l.accept()?;
    set_cc(&s, cc)?;
    s.set_nodelay(true)?;
    let resp = vec![b'r'; size];
    let mut req = [0u8; 1];
    while s.read_exact(&mut req).is_ok() {
        s.write_all(&resp)?;
    }
    Ok(())
}

/// `ss -tin` in the server's namespace: the cwnd of the socket on `port`.
fn ss_cwnd(ns: &Netns, port: u16) -> Option<u32> {
    let out = ns.exec(&["ss", "-tinH", "state", "established", "sport", "=", &format!(":{port}")]).ok()?;
    out.split_whitespace().find_map(|w| w.strip_prefix("cwnd:").and_then(|v| v.parse().ok()))
}

/// Runs one setting: returns (ss cwnd per gap, response times ms, the
/// server namespace's counters over the run).
fn run_setting(pair: &Pair, link: &DelayLink, st: &Setting, a: &IdleLabArgs) -> anyhow::Result<SettingRun> {
    pair.a.sysctl("net.ipv4.tcp_slow_start_after_idle", &st.sysctl.to_string())?;
    let mib0 = pair.a.mib()?;
    let addr = SocketAddr::V4(SocketAddrV4::new(link.a_addr, st.port));
    let l = pair.a.run(move || TcpListener::bind(addr))??;
    let (cc, size) = (st.cc, a.size);
    let server = thread::spawn(move || serve(l, cc, size));
    let client = pair.b.run(|| -> anyhow::Result<TcpStream> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(s)
    })??;
    let mut client = client;
    let mut buf = vec![0u8; a.size];
    let mut ss = Vec::new();
    let mut times = Vec::new();
    for i in 0..a.responses {
        if i > 0 {
            thread::sleep(a.gap);
            ss.push(ss_cwnd(&pair.a, st.port));
        }
        let t0 = Instant::now();
        client.write_all(b"q")?;
        client.read_exact(&mut buf)?;
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    drop(client);
    server.join().map_err(|_| anyhow::anyhow!("server panicked"))??;
    Ok((ss, times, pair.a.mib()?.delta(&mib0)))
}

/// Slow-start rounds to send `segs` segments from `cwnd`, doubling each round.
fn rounds(segs: u64, cwnd: u64) -> u32 {
    let (mut sent, mut w, mut r) = (0u64, cwnd.max(1), 0);
    while sent < segs {
        sent += w;
        w *= 2;
        r += 1;
    }
    r
}

/// Runs the lab; returns the exit status.
pub fn run(a: &IdleLabArgs) -> anyhow::Result<i32> {
    check(a)?;
    let pair = Pair::new()?;
    let link = DelayLink::new(&pair.a, &pair.b, pair.subnet(), a.delay)?;
    eprintln!(
        "lab: namespaces {} (server) and {} (client), path {} <-> {} with {:?} each way; {} responses of {} bytes per setting, {:?} apart",
        pair.a.name, pair.b.name, link.a_addr, link.b_addr, a.delay, a.responses, a.size, a.gap
    );
    let (result, measured) = trace(a, &pair, &link)?;
    let results = settings(a, &result, measured);
    let mss = result.idle_sends.iter().map(|i| i.mss).find(|m| *m > 0).unwrap_or(1448) as u64;
    if a.json {
        print_json(a, &result, &results, mss)?;
    } else {
        print_text(a, &results, mss)?;
    }
    let ok = results.iter().all(|r| r.ss_matches == r.ss_cwnd.len());
    if !ok {
        eprintln!("lab: sonde's cwnd before a response differs from `ss -ti` in the gap before it");
        return Ok(1);
    }
    Ok(result.stop.exit_code())
}

/// Checks the options and what the lab needs (exit 2 otherwise).
fn check(a: &IdleLabArgs) -> anyhow::Result<()> {
    if a.responses < 2 {
        return Err(usage("--responses must be at least 2: the first opens the connection, the rest follow idle gaps"));
    }
    if a.gap < Duration::from_millis(300) {
        return Err(usage("--gap must exceed the RTO (at least 200 ms); give 300ms or more"));
    }
    crate::engine::output::pick(&a.output, "the lab (a chart)", &[(".html", ()), (".svg", ())])?;
    features::require_tracing_privileges()?;
    if sh("which", &["ss"]).is_err() {
        return Err(env("`ss` is missing; install iproute2"));
    }
    Ok(())
}

/// What `ss -ti` showed in each gap, each response's time, and the server
/// namespace's counters, for one setting.
type SettingRun = (Vec<Option<u32>>, Vec<f64>, Mib);

/// [`SettingRun`] per setting.
type Measured = Vec<SettingRun>;

/// `sonde cwnd` on the server's namespace while each setting runs.
fn trace(a: &IdleLabArgs, pair: &Pair, link: &DelayLink) -> anyhow::Result<(crate::tools::cwnd::Outcome, Measured)> {
    let ctl = RunControl::new(None)?;
    let mut argv: Vec<std::ffi::OsString> = vec!["--netns".into(), pair.a.name.clone().into(), "--idle-only".into()];
    argv.extend(SETTINGS.iter().flat_map(|s| ["--port".into(), s.port.to_string().into()]));
    argv.extend(["-o".into(), a.output.clone().into_os_string()]);
    if let Some(m) = a.mechanism {
        argv.extend(["--mechanism".into(), m.name().into()]);
    }
    let cargs: CwndArgs = cli::parse("cwnd", argv)?;
    let measured = Mutex::new(Vec::new());
    let result = thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (pair, link, ctl, measured) = (&pair, &link, &ctl, &measured);
        let work = s.spawn(move || -> anyhow::Result<()> {
            if rx.recv().is_err() {
                anyhow::bail!("tracing did not start");
            }
            // The client: its clock times the responses.
            super::realtime_or_warn();
            let r = (|| {
                for st in &SETTINGS {
                    eprintln!("lab: {} ...", st.name);
                    let m = run_setting(pair, link, st, a)?;
                    measured.lock().unwrap().push(m);
                }
                Ok(())
            })();
            // Let the last confirmations (the next ACK) arrive.
            thread::sleep(Duration::from_millis(300));
            ctl.request_stop();
            r
        });
        let out = run_with(&cargs, ctl, true, || {
            let _ = tx.send(());
        });
        ctl.request_stop();
        let w = work.join().map_err(|_| anyhow::anyhow!("workload panicked"))?;
        w?;
        out
    })?;
    Ok((result, measured.into_inner().unwrap()))
}

/// Each setting's idle sends, checks against `ss -ti`, and response times.
fn settings(a: &IdleLabArgs, result: &crate::tools::cwnd::Outcome, measured: Measured) -> Vec<SettingResult> {
    let mut results = Vec::new();
    for (st, (ss, times, mib)) in SETTINGS.iter().zip(measured) {
        // The server's socket: local port is the setting's port.
        let idle: Vec<IdleSend> = result.idle_sends.iter().filter(|i| i.flow.sport == st.port).cloned().collect();
        // Idle sends after a gap (the first response may count as one when
        // the handshake was longer ago than the RTO; it is not a gap).
        let gaps = &idle[idle.len().saturating_sub(ss.len())..];
        let ss_matches = gaps.iter().zip(&ss).filter(|(i, c)| Some(i.cwnd_before) == **c).count();
        let after_idle = &times[1..];
        let srtt_ms = idle.iter().map(|i| i.srtt_us as f64 / 1000.0).fold(0.0, f64::max);
        let rtt_ms = if srtt_ms > 0.0 { srtt_ms } else { 2.0 * a.delay.as_secs_f64() * 1000.0 };
        let med = median(after_idle);
        results.push(SettingResult {
            name: st.name.to_string(),
            cc: st.cc.to_string(),
            sysctl: st.sysctl,
            port: st.port,
            idle_sends: idle.clone(),
            ss_cwnd: ss,
            ss_matches,
            response_ms: times.iter().map(|t| (t * 10.0).round() / 10.0).collect(),
            median_after_idle_ms: (med * 10.0).round() / 10.0,
            round_trips: (med / rtt_ms * 10.0).round() / 10.0,
            hystart_exits: mib.get("TcpExtTCPHystartDelayDetect") + mib.get("TcpExtTCPHystartTrainDetect"),
            retrans_segs: mib.get("TcpRetransSegs"),
        });
    }
    results
}

/// The median round trips of CUBIC with the sysctl at 0: no restart.
fn baseline(results: &[SettingResult]) -> f64 {
    results.iter().find(|r| r.cc == "cubic" && r.sysctl == 0).map(|r| r.round_trips).unwrap_or(0.0)
}

fn print_json(
    a: &IdleLabArgs,
    result: &crate::tools::cwnd::Outcome,
    results: &[SettingResult],
    mss: u64,
) -> anyhow::Result<()> {
    let (baseline, segs) = (baseline(results), (a.size as u64).div_ceil(mss));
    crate::outln!(
        "{}",
        serde_json::json!({
            "type": "lab",
            "lab": "idle-restart",
            "settings": results,
            "baseline_round_trips": baseline,
            "segments_per_response": segs,
            "chart": a.output,
            "mechanism": result.mechanism.to_string(),
            "lost": result.totals.lost,
            "missed": result.totals.missed,
        })
    )?;
    Ok(())
}

fn print_text(a: &IdleLabArgs, results: &[SettingResult], mss: u64) -> anyhow::Result<()> {
    let (baseline, segs) = (baseline(results), (a.size as u64).div_ceil(mss));
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let gaps = r.ss_cwnd.len();
            let restarts = r.idle_sends.iter().filter(|i| i.restart).count();
            let reasons: std::collections::BTreeSet<&str> = r.idle_sends.iter().map(|i| i.reason).collect();
            let last = r.idle_sends.last();
            vec![
                r.name.clone(),
                format!("{}/{}", restarts, gaps),
                reasons.into_iter().collect::<Vec<_>>().join(","),
                last.map(|i| format!("{} -> {}", i.cwnd_before, i.cwnd_after)).unwrap_or_else(|| "-".into()),
                format!("{}/{}", r.ss_matches, gaps),
                format!("{:.1}", r.median_after_idle_ms),
                format!("{:.1}", r.round_trips),
                last.map(|i| rounds(segs, i.cwnd_after as u64).to_string()).unwrap_or_else(|| "-".into()),
                format!("{:+.1}", r.round_trips - baseline),
            ]
        })
        .collect();
    crate::outln!(
        "\nEach response: {} bytes = {segs} segments of {mss}; path RTT ~{:.0} ms. Responses after an idle gap:",
        a.size,
        2.0 * a.delay.as_secs_f64() * 1000.0
    )?;
    crate::outln!(
        "{}",
        table(
            &[
                "SETTING",
                "RESTARTS",
                "REASON",
                "CWND BEFORE -> AFTER (last)",
                "SS -TI CWND AGREES",
                "RESPONSE ms (median)",
                "ROUND TRIPS",
                "SLOW-START ROUNDS",
                "EXTRA RTTs vs sysctl=0"
            ],
            &rows
        )
    )?;
    crate::outln!("\nchart: {} (cwnd over time, restarts marked)", a.output.display())?;

    Ok(())
}
