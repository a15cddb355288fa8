//! `sonde serve`: the always-on mode. One process loads the BPF of the
//! enabled collectors once, counts in the kernel, and answers pulls:
//! Prometheus `/metrics` (maps read at scrape time, no timers of its own)
//! and pprof `/debug/pprof/{profile,offcpu,wakeup}`; optionally pushes CPU
//! profiles to a Pyroscope-compatible `/ingest`.
//!
//! Threads: the HTTP server's (http.rs) answer requests; a scrape is passed
//! to the main thread, which owns the collectors (their BPF objects), and
//! waits for its text; a profile runs on the requesting thread.
pub mod collector;
pub mod config;
pub mod expo;
pub mod http;
pub mod labels;
pub mod peer;
pub mod profiles;
pub mod webconfig;

use std::{
    path::PathBuf,
    sync::{atomic::Ordering, mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Args;

use self::{
    collector::Collector,
    config::Config,
    expo::{Expo, Range, Type},
    http::{Request, Response, Server},
    labels::CgroupLabels,
    profiles::{Kind, Profiler, Pusher},
};
use crate::{
    engine::{
        error::{usage, SondeError},
        features,
        run::{duration_arg, RunControl, Stop},
    },
    tools::{
        cwnd::collect::CwndCollector, funclatency::collect::FunclatencyCollector, retrans::collect::RetransCollector,
    },
};

/// Always-on mode: Prometheus metrics and pprof profiles over HTTP.
///
/// Serves `GET /metrics` (Prometheus text format: retransmits by cause,
/// slow-start restarts, latency histograms, sonde's own health), pprof
/// profiles at `/debug/pprof/profile?seconds=N` (CPU), `/debug/pprof/offcpu`
/// and `/debug/pprof/wakeup` (filters: `comm`, `cgroup`), and `/-/healthy`.
/// With no config and no flags: the retrans and cwnd collectors system-wide
/// and the profile endpoints, on 127.0.0.1:9632. A config file (TOML, see
/// the README) sets everything; each flag below overrides its key.
///
/// OVERHEAD (bench/serve/run, 2-core VM): idle host, defaults, 0.017% of a
/// core unscraped and 0.10% scraped every second (0.22 ms CPU per scrape; p50
/// 0.40 ms); under a SYN storm (80k sockets, 23k retransmits/s) 452 ns per
/// retransmit in the kernel, 0.30x `sonde retrans --count`'s 1,520 (no
/// per-flow table), 0.10% of a core for the process; a bulk transfer over veth
/// at 2.4 GB/s loses 7% (cwnd's send hook runs per copy into the send queue;
/// `--disable cwnd` removes it); 9,577 series scrape in 4.5-5.0 ms (p99 5.0-5.9
/// ms) with 12-13 MiB RSS; 64 clients on one connection each are served
/// 10,900-11,700 requests/s, p99 9.5-10.0 ms.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check this config file (and the web config it names) and exit.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:9632: loopback only), or
    /// unix:/PATH for a Unix socket (mode 0600; clients known by their uid).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// TLS and basic auth, in the exporter-toolkit web config format
    /// (node_exporter's --web.config.file).
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Latency histograms of these targets (as `sonde funclatency` names
    /// them; repeatable).
    #[arg(long = "funclatency", value_name = "TARGET")]
    pub funclatency: Vec<String>,
    /// Turn off a collector or the profile endpoints (repeatable): retrans,
    /// cwnd, drops, profiles.
    #[arg(long, value_name = "NAME", value_parser = ["retrans", "cwnd", "drops", "profiles"])]
    pub disable: Vec<String>,
    /// Per-cgroup series (cgroup path, Kubernetes pod UID, container ID).
    #[arg(long, value_name = "SET", value_parser = ["cgroup"])]
    pub labels: Vec<String>,
    /// Only connections and packets in these network namespaces (retrans,
    /// cwnd, drops).
    #[arg(long, value_name = "NETNS")]
    pub netns: Vec<String>,
    /// Only connections owned by a task of this name (retrans and cwnd;
    /// repeatable, up to 4).
    #[arg(long, value_name = "NAME")]
    pub comm: Vec<String>,
    /// Without basic auth, also let local clients of this uid pull profiles
    /// (repeatable; root always may unless the config's allow_uids says
    /// otherwise).
    #[arg(long, value_name = "UID")]
    pub profiles_allow_uid: Vec<u32>,
    /// Push CPU profiles to this Pyroscope-compatible /ingest URL (http://).
    #[arg(long, value_name = "URL")]
    pub push_url: Option<String>,
    /// Time between pushes.
    #[arg(long, value_name = "DURATION")]
    pub push_interval: Option<String>,
    /// Stop after this long (tests and benches; default: until a signal).
    #[arg(short = 'd', long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
}

/// The config with the flags applied.
fn settle(a: &ServeArgs) -> anyhow::Result<Config> {
    let mut c = match (&a.config, &a.check_config) {
        (Some(p), _) | (None, Some(p)) => config::load(p)?,
        _ => Config::default(),
    };
    if let Some(l) = &a.listen {
        c.listen = Some(l.clone());
    }
    if let Some(w) = &a.web_config {
        c.web_config = Some(w.to_string_lossy().into_owned());
    }
    c.funclatency.targets.extend(a.funclatency.iter().cloned());
    for d in &a.disable {
        match d.as_str() {
            "retrans" => c.retrans.enabled = false,
            "cwnd" => c.cwnd.enabled = false,
            "drops" => c.drops.enabled = false,
            _ => c.profiles.enabled = false,
        }
    }
    c.labels.extend(a.labels.iter().cloned());
    for n in &a.netns {
        c.retrans.netns.push(n.clone());
        c.cwnd.netns.push(n.clone());
        c.drops.netns.push(n.clone());
    }
    for n in &a.comm {
        c.retrans.comm.push(n.clone());
        c.cwnd.comm.push(n.clone());
    }
    c.profiles.allow_uids.extend(a.profiles_allow_uid.iter().copied());
    if let Some(u) = &a.push_url {
        c.push.url = Some(u.clone());
    }
    if let Some(i) = &a.push_interval {
        c.push.interval = Some(i.clone());
    }
    // The flags' values meet the file's checks too.
    c.check().map_err(|e| usage(format!("serve: {e}")))?;
    Ok(c)
}

/// The web config named by the config, its path relative to the config's
/// directory when relative.
fn web_config(c: &Config, a: &ServeArgs) -> anyhow::Result<Option<webconfig::WebConfig>> {
    let Some(w) = &c.web_config else { return Ok(None) };
    let mut p = PathBuf::from(w);
    if p.is_relative() && a.web_config.is_none() {
        if let Some(dir) = a.config.as_ref().or(a.check_config.as_ref()).and_then(|f| f.parent()) {
            p = dir.join(p);
        }
    }
    webconfig::WebConfig::load(&p).map(Some)
}

/// The push's labels, and `node` from `NODE_NAME` (the DaemonSet sets it
/// from the pod's spec.nodeName) unless the config names one: profiles of
/// a fleet must say which node they are from. A value that is not a plain
/// host name is left out.
fn push_labels(labels: &std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, String> {
    let mut l = labels.clone();
    if let Ok(n) = std::env::var("NODE_NAME") {
        let plain =
            !n.is_empty() && n.len() <= 253 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
        if plain {
            l.entry("node".to_string()).or_insert(n);
        }
    }
    l
}

/// One collector slot: running, or why not.
struct Slot {
    name: &'static str,
    running: Option<Box<dyn Collector>>,
}

/// Starts the enabled collectors. A default collector that cannot attach on
/// this kernel is reported down (`sonde_collector_up` 0, and a line on
/// stderr); one the user named (funclatency targets) must start.
fn start_collectors(c: &Config) -> anyhow::Result<Vec<Slot>> {
    let by_cgroup = c.labels.iter().any(|l| l == "cgroup");
    let mut slots = Vec::new();
    // A kernel that cannot run a collector leaves it down; a filter the
    // user got wrong stops serve (exit 2).
    let mut add = |name: &'static str, r: anyhow::Result<Box<dyn Collector>>| match r {
        Ok(col) => {
            slots.push(Slot { name, running: Some(col) });
            Ok(())
        }
        Err(e) if e.chain().any(|c| matches!(c.downcast_ref(), Some(SondeError::Usage(_)))) => {
            Err(e.context(format!("serve: {name}")))
        }
        Err(e) => {
            eprintln!("sonde serve: collector {name} is down: {e:#}");
            slots.push(Slot { name, running: None });
            Ok(())
        }
    };
    if c.retrans.enabled {
        add(
            "retrans",
            RetransCollector::start(&c.retrans.argv(), by_cgroup).map(|x| Box::new(x) as Box<dyn Collector>),
        )?;
    }
    if c.cwnd.enabled {
        add("cwnd", CwndCollector::start(&c.cwnd.argv(), by_cgroup).map(|x| Box::new(x) as Box<dyn Collector>))?;
    }
    if c.drops.enabled {
        add(
            "drops",
            crate::tools::drops::collect::DropsCollector::start(&c.drops.argv(), by_cgroup)
                .map(|x| Box::new(x) as Box<dyn Collector>),
        )?;
    }
    if !c.funclatency.targets.is_empty() {
        let (min, max) = c.range_ns();
        let mut extra = vec!["--max-probes".to_string(), "4096".to_string()];
        if !c.funclatency.cgroup.is_empty() {
            extra.extend(["--cgroup".to_string(), c.funclatency.cgroup.clone()]);
        }
        let f = FunclatencyCollector::start(
            &c.funclatency.targets,
            &extra,
            Range::new(min, max, c.funclatency.quarters),
            by_cgroup,
        )?;
        slots.push(Slot { name: "funclatency", running: Some(Box::new(f)) });
    }
    Ok(slots)
}

/// What the main thread keeps between scrapes.
struct State {
    slots: Vec<Slot>,
    labels: CgroupLabels,
    http: Arc<http::HttpStats>,
    profiler: Option<Arc<Profiler>>,
    pusher: Option<Arc<Pusher>>,
}

impl State {
    /// One scrape: every collector's families, then sonde's own.
    fn scrape(&mut self) -> String {
        let t0 = Instant::now();
        let mut e = Expo::default();
        self.labels.new_scrape();
        let mut up = Vec::new();
        for s in &mut self.slots {
            let ok = match &mut s.running {
                Some(c) => match c.collect(&mut e, &mut self.labels) {
                    Ok(()) => true,
                    Err(err) => {
                        eprintln!("sonde serve: collector {} failed to read: {err:#}", s.name);
                        false
                    }
                },
                None => false,
            };
            up.push((s.name, ok, s.running.as_ref().map(|c| c.mechanism()).unwrap_or_default()));
        }
        self.health(&mut e, &up);
        e.single(
            "sonde_scrape_duration_seconds",
            Type::Gauge,
            "Time this scrape took to read the kernel's maps and write the text",
            t0.elapsed().as_secs_f64(),
        );
        e.finish()
    }

    fn health(&self, e: &mut Expo, up: &[(&str, bool, String)]) {
        e.family("sonde_build_info", Type::Gauge, "sonde's version (always 1)");
        e.sample("", &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
        e.family("sonde_collector_up", Type::Gauge, "1 if the collector is attached and its maps were read, else 0");
        for (name, ok, mech) in up {
            e.sample("", &[("collector", name), ("mechanism", mech)], if *ok { 1.0 } else { 0.0 });
        }
        e.family(
            "sonde_lost_events_total",
            Type::Counter,
            "Events a collector could not count: maps full, sockets unreadable, runs the kernel skipped",
        );
        for s in &self.slots {
            // A read that fails writes no sample (a 0 would look like a reset).
            if let Some(Ok(n)) = s.running.as_ref().map(|c| c.lost()) {
                e.sample("", &[("collector", s.name)], n as f64);
            }
        }
        // Read each scrape: an operator may turn bpf_stats on for a while.
        if features::sysctl("kernel/bpf_stats_enabled").as_deref() == Some("1") {
            e.family(
                "sonde_bpf_run_seconds_total",
                Type::Counter,
                "Time the collector's BPF programs ran in the kernel (counted while kernel.bpf_stats_enabled is 1)",
            );
            for s in &self.slots {
                if let Some(c) = &s.running {
                    e.sample("", &[("collector", s.name)], c.run_time_ns() as f64 * 1e-9);
                }
            }
        }
        if let Some(p) = &self.profiler {
            e.family("sonde_profiles_total", Type::Counter, "Profiles served, by kind");
            for (i, k) in [Kind::Cpu, Kind::Offcpu, Kind::Wakeup].iter().enumerate() {
                e.sample("", &[("kind", k.name())], p.served[i].load(Ordering::Relaxed) as f64);
            }
            e.family(
                "sonde_profile_requests_refused_total",
                Type::Counter,
                "Profile requests refused: busy (429, a profile was running) or forbidden (403, not an allowed client)",
            );
            e.sample("", &[("reason", "busy")], p.busy_refused.load(Ordering::Relaxed) as f64);
            e.sample("", &[("reason", "forbidden")], p.forbidden.load(Ordering::Relaxed) as f64);
        }
        if let Some(p) = &self.pusher {
            e.family("sonde_profile_pushes_total", Type::Counter, "Profile pushes, by result");
            e.sample("", &[("result", "ok")], p.pushed.load(Ordering::Relaxed) as f64);
            e.sample("", &[("result", "failed")], p.failed.load(Ordering::Relaxed) as f64);
        }
        let h = &self.http;
        e.single(
            "sonde_http_requests_total",
            Type::Counter,
            "HTTP requests passed to the handlers",
            h.requests.load(Ordering::Relaxed) as f64,
        );
        e.family("sonde_http_rejected_total", Type::Counter, "HTTP requests or connections refused, by reason");
        for r in http::Reject::ALL {
            e.sample("", &[("reason", r.name())], h.rejected(r) as f64);
        }
        e.single(
            "sonde_http_open_connections",
            Type::Gauge,
            "HTTP connections being served",
            h.open.load(Ordering::Relaxed) as f64,
        );
        if self.labels.walks > 0 {
            e.single(
                "sonde_cgroup_walks_total",
                Type::Counter,
                "Walks of the cgroup hierarchy to name cgroup ids (one per scrape at most)",
                self.labels.walks as f64,
            );
        }
    }
}

/// A scrape asked of the main thread; the text comes back on the channel.
type ScrapeReq = mpsc::Sender<String>;

/// Entry point for the CLI; returns the exit status.
pub fn run(a: &ServeArgs) -> anyhow::Result<i32> {
    let c = settle(a)?;
    let web = web_config(&c, a)?;
    if a.check_config.is_some() {
        eprintln!("sonde serve: config is valid");
        return Ok(0);
    }
    features::require_tracing_privileges()?;
    let listen = c.listen.clone().unwrap_or_else(|| config::DEFAULT_LISTEN.to_string());
    // Bound first: a port in use is reported before anything is loaded.
    let guarded = web.as_ref().is_some_and(|w| w.tls() || w.basic_auth());
    let server = Server::bind(&listen, web)?;
    let addr = server.local_addr();
    let scheme = server.scheme();
    if !addr.is_local() && !guarded {
        eprintln!("sonde serve: warning: listening on {addr} without TLS or basic auth (--web-config): anyone who reaches it can read the metrics (profiles go only to local clients of profiles.allow_uids)");
    }
    let ctl = RunControl::new(a.duration)?;
    let slots = start_collectors(&c)?;
    let profiler = if c.profiles.enabled {
        let access = profiles::Access { uids: c.profiles.allow_uids.clone(), any: c.profiles.allow_any };
        Some(Arc::new(Profiler::new(c.profiles.max_seconds, c.profiles.frequency, ctl.clone())?.with_access(access)))
    } else {
        None
    };
    let pusher = match (&c.push.url, &profiler) {
        (Some(url), Some(_)) => Some(Arc::new(Pusher {
            url: url.clone(),
            interval: crate::engine::run::parse_duration(c.push.interval.as_deref().unwrap_or("60s"))?,
            seconds: c.push.seconds.unwrap_or(10),
            name: Pusher::name_of(c.push.service_name.as_deref().unwrap_or("sonde"), &push_labels(&c.push.labels)),
            pushed: Default::default(),
            failed: Default::default(),
        })),
        (Some(_), None) => return Err(usage("push needs the profile endpoints; drop --disable profiles")),
        _ => None,
    };
    let caps = drop_caps(profiler.is_some());
    let mut state = State {
        slots,
        labels: CgroupLabels::default(),
        http: server.stats(),
        profiler: profiler.clone(),
        pusher: pusher.clone(),
    };
    let (tx, rx) = mpsc::channel::<ScrapeReq>();
    let tx = Mutex::new(tx);
    let prof = profiler.clone();
    let handler: http::Handler = Arc::new(move |req: &Request| route(req, &tx, prof.as_deref()));
    let http_server = server.spawn(handler);
    let push_thread = pusher.clone().zip(profiler.clone()).map(|(p, prof)| {
        let ctl = ctl.clone();
        std::thread::spawn(move || p.run(&prof, &|| ctl.should_stop().is_some()))
    });
    let up: Vec<String> =
        state.slots.iter().map(|s| format!("{}{}", s.name, if s.running.is_some() { "" } else { " (down)" })).collect();
    eprintln!(
        "sonde serve: listening on {}: /metrics ({}){}; SIGTERM or Ctrl-C ends",
        addr.url(scheme),
        up.join(", "),
        if profiler.is_some() { ", /debug/pprof/{profile,offcpu,wakeup}" } else { "" },
    );
    if !caps.is_empty() {
        eprintln!("sonde serve: {caps}");
    }
    let mut scrapes = 0u64;
    let stopped = loop {
        if let Some(s) = ctl.should_stop() {
            break s;
        }
        match rx.recv_timeout(ctl.next_wait(Duration::from_millis(200))) {
            Ok(reply) => {
                scrapes += 1;
                let _ = reply.send(state.scrape());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break Stop::Done,
        }
    };
    http_server.stop();
    if let Some(t) = push_thread {
        let _ = t.join();
    }
    // Links go with the collectors (fd-based).
    drop(state);
    eprintln!("sonde serve: stopped after {scrapes} scrapes");
    Ok(stopped.exit_code())
}

/// Routes one request (on an HTTP thread).
fn route(req: &Request, scrape: &Mutex<mpsc::Sender<ScrapeReq>>, prof: Option<&Profiler>) -> Response {
    match req.path.as_str() {
        "/metrics" => {
            let (tx, rx) = mpsc::channel();
            let sent = scrape.lock().map(|s| s.send(tx).is_ok()).unwrap_or(false);
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(text) if sent => Response::bytes(200, expo::CONTENT_TYPE, text.into_bytes()),
                _ => Response::text(503, "the scrape did not finish in 10 s, or sonde is stopping\n"),
            }
        }
        "/-/healthy" => Response::text(200, "ok\n"),
        "/" => Response::bytes(
            200,
            "text/html; charset=utf-8",
            b"<html><head><title>sonde</title></head><body><h1>sonde serve</h1><ul>\
<li><a href=\"/metrics\">/metrics</a></li><li><a href=\"/debug/pprof/profile?seconds=10\">/debug/pprof/profile</a></li>\
<li><a href=\"/debug/pprof/offcpu?seconds=10\">/debug/pprof/offcpu</a></li>\
<li><a href=\"/debug/pprof/wakeup?seconds=10\">/debug/pprof/wakeup</a></li></ul></body></html>\n"
                .to_vec(),
        ),
        p => {
            let kind = match p {
                "/debug/pprof/profile" => Kind::Cpu,
                "/debug/pprof/offcpu" => Kind::Offcpu,
                "/debug/pprof/wakeup" => Kind::Wakeup,
                _ => return Response::text(404, "not found; see / for the endpoints\n"),
            };
            match prof {
                // HEAD asks whether the endpoint is there, not for a profile.
                Some(_) if req.method == "HEAD" => Response::bytes(200, "application/octet-stream", Vec::new()),
                Some(pr) => pr.handle(kind, req),
                None => Response::text(404, "profiles are disabled in this sonde serve\n"),
            }
        }
    }
}

/// Drops the capabilities not needed after attach: all but what the profile
/// endpoints need to load and attach again (BPF, PERFMON, SYS_RESOURCE for
/// older kernels' memlock, SYS_PTRACE and DAC_READ_SEARCH to read traced
/// processes' maps and files, SYSLOG for kernel symbols), or all of them
/// when profiles are off. Returns a line for the log.
pub fn drop_caps(profiles: bool) -> String {
    use caps::{CapSet, Capability as C};
    // CHECKPOINT_RESTORE: /proc/PID/map_files, for binaries deleted while
    // running. Kernels before 5.8 have no CAP_BPF/CAP_PERFMON: SYS_ADMIN then.
    let mut keep: Vec<C> = if profiles {
        vec![
            C::CAP_BPF,
            C::CAP_PERFMON,
            C::CAP_SYS_RESOURCE,
            C::CAP_SYS_PTRACE,
            C::CAP_DAC_READ_SEARCH,
            C::CAP_SYSLOG,
            C::CAP_CHECKPOINT_RESTORE,
        ]
    } else {
        Vec::new()
    };
    let last_cap = features::sysctl("kernel/cap_last_cap").and_then(|v| v.parse::<u32>().ok()).unwrap_or(40);
    if profiles && last_cap < 39 {
        keep.push(C::CAP_SYS_ADMIN);
    }
    let Ok(have) = caps::read(None, CapSet::Permitted) else { return String::new() };
    let keep: caps::CapsHashSet = keep.iter().copied().filter(|c| have.contains(c)).collect();
    let dropped = have.len().saturating_sub(keep.len());
    for set in [CapSet::Effective, CapSet::Inheritable, CapSet::Permitted] {
        if caps::set(None, set, &keep).is_err() {
            return "could not drop capabilities".into();
        }
    }
    for c in have.difference(&keep) {
        let _ = caps::drop(None, CapSet::Bounding, *c);
    }
    format!("dropped {dropped} capabilities after attach, kept {}", keep.len())
}
