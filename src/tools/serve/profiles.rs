//! The pprof pull endpoints (`/debug/pprof/profile`, `offcpu`, `wakeup`: the
//! paths Parca and Grafana Alloy scrape) and the optional push of CPU
//! profiles to a Pyroscope-compatible `/ingest`.
//!
//! Each request runs the one-shot tool for `seconds` with `-o x.pb.gz`, so a
//! pulled profile is byte for byte what `sonde profile -o x.pb.gz` writes:
//! same unwinding, same symbols. One profile at a time (a profile is CPU for
//! the host): a second request gets 429 with Retry-After.
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::http::{Client, Request, Response};
use crate::{
    engine::run::RunControl,
    tools::{
        offcpu::{self, OffcpuArgs},
        profile::{self, ProfileArgs},
    },
};

/// Which profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// CPU samples.
    Cpu,
    /// Off-CPU time.
    Offcpu,
    /// Off-CPU time joined to the wakers' stacks.
    Wakeup,
}

impl Kind {
    /// The tool's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "profile",
            Kind::Offcpu => "offcpu",
            Kind::Wakeup => "wakeup",
        }
    }
}

/// Runs profiles one at a time into a private directory.
pub struct Profiler {
    dir: PathBuf,
    /// When the running profile ends, if one runs.
    busy: Mutex<Option<Instant>>,
    max_seconds: u64,
    frequency: u64,
    ctl: RunControl,
    seq: AtomicU64,
    /// Profiles served, by kind index (Cpu, Offcpu, Wakeup) and refused busy.
    pub served: [AtomicU64; 3],
    /// Requests answered 429.
    pub busy_refused: AtomicU64,
    /// Requests answered 403 (not an allowed client).
    pub forbidden: AtomicU64,
    /// Who may pull profiles without basic auth.
    access: Access,
    /// Profiles that failed.
    pub failed: AtomicU64,
}

/// What one profile run gave.
pub struct Taken {
    /// The gzipped pprof.
    pub pprof: Vec<u8>,
    /// Its start and end, seconds since the epoch.
    pub from: u64,
    /// End.
    pub until: u64,
}

/// Who may pull profiles. A profile names every function running on the
/// host, so without basic auth (web config) only local clients of allowed
/// uids get one: loopback TCP carries no credentials, so the client's
/// socket is looked up in the kernel's table ([`super::peer`]).
#[derive(Debug, Clone)]
pub struct Access {
    /// Uids whose local sockets may pull.
    pub uids: Vec<u32>,
    /// Anyone may pull (an authenticating proxy in front).
    pub any: bool,
}

impl Default for Access {
    fn default() -> Self {
        Self { uids: vec![0], any: false }
    }
}

impl Access {
    /// Ok, or the 403 body naming why and the fix.
    fn check(&self, req: &Request) -> Result<(), String> {
        if self.any || req.user.is_some() {
            return Ok(());
        }
        let who = match req.client {
            Client::Unix { uid, .. } => Ok(Some(uid)),
            Client::Tcp { peer, local } => super::peer::local_peer_uid(local, peer),
        };
        match who {
            Ok(Some(uid)) if self.uids.contains(&uid) => Ok(()),
            Ok(Some(uid)) => Err(format!(
                "profiles: uid {uid} may not pull profiles; add it to profiles.allow_uids (--profiles-allow-uid {uid}) or give users basic auth (--web-config)\n"
            )),
            Ok(None) => Err(
                "profiles: clients on other hosts need basic auth (--web-config); or set profiles.allow_any behind an authenticating proxy\n"
                    .to_string(),
            ),
            Err(e) => Err(format!("profiles: cannot tell who the client is ({e}); use basic auth (--web-config)\n")),
        }
    }
}

impl Profiler {
    /// Makes the private directory (0700, a fresh name: nothing there is
    /// followed or reused). `ctl`: the server's control, whose signals also
    /// end a running profile.
    pub fn new(max_seconds: u64, frequency: u64, ctl: RunControl) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let mut dir = base.join(format!("sonde-serve.{}", std::process::id()));
        let mut n = 0;
        while let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            n += 1;
            if e.kind() != std::io::ErrorKind::AlreadyExists || n > 100 {
                return Err(crate::engine::error::env(format!(
                    "cannot make a private directory for profiles in {} ({e}); mount a writable /tmp (an emptyDir) or set TMPDIR",
                    base.display()
                )));
            }
            dir = base.join(format!("sonde-serve.{}.{n}", std::process::id()));
        }
        Ok(Self {
            dir,
            busy: Mutex::new(None),
            max_seconds,
            frequency,
            ctl,
            seq: AtomicU64::new(0),
            served: Default::default(),
            busy_refused: AtomicU64::new(0),
            forbidden: AtomicU64::new(0),
            access: Access::default(),
            failed: AtomicU64::new(0),
        })
    }

    /// Sets who may pull profiles without basic auth.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Answers a pull: `?seconds=N` (default 10, at most the configured
    /// cap), filters `comm` and `cgroup`.
    pub fn handle(&self, kind: Kind, req: &Request) -> Response {
        if let Err(why) = self.access.check(req) {
            self.forbidden.fetch_add(1, Ordering::Relaxed);
            return Response::text(403, why);
        }
        let seconds = match req.param("seconds").map(str::parse::<u64>) {
            None => 10.min(self.max_seconds),
            Some(Ok(s)) if s >= 1 && s <= self.max_seconds => s,
            Some(_) => {
                return Response::text(
                    400,
                    format!("seconds: give a whole number from 1 to {} (profiles.max_seconds)\n", self.max_seconds),
                )
            }
        };
        let mut filters = Vec::new();
        for key in ["comm", "cgroup"] {
            if let Some(v) = req.param(key) {
                if v.is_empty() || v.len() > 4096 || v.starts_with('-') {
                    return Response::text(400, format!("{key}: give a non-empty value\n"));
                }
                // A cgroup is named relative to the cgroup mounts: no absolute
                // path, no `..`, so a caller cannot make root stat any path.
                if key == "cgroup" && (v.starts_with('/') || v.split('/').any(|c| c == ".." || c == ".")) {
                    return Response::text(
                        400,
                        "cgroup: give a path relative to the cgroup2 mount or a v1 controller's, without ..\n",
                    );
                }
                filters.extend([format!("--{key}"), v.to_string()]);
            }
        }
        match self.take(kind, seconds, &filters) {
            Ok(t) => Response::bytes(200, "application/octet-stream", t.pprof)
                .header("Content-Disposition", &format!("attachment; filename=\"{}.pb.gz\"", kind.name())),
            Err(Busy(Some(left))) => {
                self.busy_refused.fetch_add(1, Ordering::Relaxed);
                Response::text(429, "a profile is already running; one at a time\n")
                    .header("Retry-After", &left.as_secs_f64().ceil().max(1.0).to_string())
            }
            Err(Busy(None)) => Response::text(500, "the profile failed; sonde's log says why\n"),
        }
    }

    /// Runs one profile of `seconds` unless one runs: Busy(Some(time left))
    /// then; Busy(None) if it failed (logged).
    pub fn take(&self, kind: Kind, seconds: u64, filters: &[String]) -> Result<Taken, Busy> {
        {
            let mut b = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(end) = *b {
                return Err(Busy(Some(end.saturating_duration_since(Instant::now()))));
            }
            *b = Some(Instant::now() + Duration::from_secs(seconds));
        }
        // Cleared however the run ends, a panic included (the HTTP server
        // catches it): else every later request would get 429.
        struct Free<'a>(&'a Mutex<Option<Instant>>);
        impl Drop for Free<'_> {
            fn drop(&mut self) {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        let _free = Free(&self.busy);
        let r = self.run(kind, seconds, filters);
        match r {
            Ok(t) => {
                self.served[kind as usize].fetch_add(1, Ordering::Relaxed);
                Ok(t)
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("sonde serve: {} profile failed: {e:#}", kind.name());
                Err(Busy(None))
            }
        }
    }

    fn run(&self, kind: Kind, seconds: u64, filters: &[String]) -> anyhow::Result<Taken> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}.pb.gz", kind.name()));
        let mut argv: Vec<String> =
            vec!["-d".into(), format!("{seconds}s"), "-o".into(), path.to_string_lossy().into_owned()];
        argv.extend(filters.iter().cloned());
        let ctl = self.ctl.with_duration(Duration::from_secs(seconds));
        let from = now();
        // Removed however the run ends.
        struct Gone<'a>(&'a std::path::Path);
        impl Drop for Gone<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _gone = Gone(&path);
        match kind {
            Kind::Cpu => {
                argv.extend(["-F".into(), self.frequency.to_string()]);
                let a: ProfileArgs = crate::engine::cli::parse("profile", &argv)?;
                profile::run_with(&a, &ctl, || {})?;
            }
            Kind::Offcpu | Kind::Wakeup => {
                let a: OffcpuArgs = crate::engine::cli::parse(kind.name(), &argv)?;
                offcpu::run_with(&a, &ctl, kind == Kind::Wakeup, || {})?;
            }
        }
        let pprof = std::fs::read(&path)?;
        Ok(Taken { pprof, from, until: now() })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why no profile: one is running (time left), or it failed (None).
pub struct Busy(pub Option<Duration>);

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Pushes a CPU profile of `seconds` every `interval` to `url` (Pyroscope's
/// `/ingest`: `name=SERVICE{labels}`, `from`, `until`, `format=pprof`, the
/// pprof as the multipart field `profile`, as Pyroscope's own clients send
/// it). Returns when `stop` says so.
pub struct Pusher {
    /// The /ingest URL.
    pub url: String,
    /// Between pushes.
    pub interval: Duration,
    /// Each profile's length.
    pub seconds: u64,
    /// `service_name{k=v,...}` as Pyroscope's `name` takes it.
    pub name: String,
    /// Pushes that reached the server with a 2xx.
    pub pushed: AtomicU64,
    /// Pushes that failed (busy, profile, network or non-2xx).
    pub failed: AtomicU64,
}

impl Pusher {
    /// The `name` parameter: service name, then labels in braces.
    pub fn name_of(service: &str, labels: &std::collections::BTreeMap<String, String>) -> String {
        let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{service}{{{}}}", l.join(","))
    }

    /// The loop: runs on its own thread.
    pub fn run(&self, profiler: &Profiler, stop: &dyn Fn() -> bool) {
        let mut next = Instant::now() + self.interval;
        while !stop() {
            if Instant::now() < next {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            next += self.interval;
            let ok = match profiler.take(Kind::Cpu, self.seconds, &[]) {
                Ok(t) => match self.send(&t, profiler.frequency) {
                    Ok(()) => true,
                    Err(e) => {
                        eprintln!("sonde serve: push to {} failed: {e:#}", self.url);
                        false
                    }
                },
                Err(_) => false,
            };
            if ok {
                self.pushed.fetch_add(1, Ordering::Relaxed);
            } else {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn send(&self, t: &Taken, hz: u64) -> anyhow::Result<()> {
        let boundary = format!("sonde-{:x}", t.from ^ (t.pprof.len() as u64) << 20);
        let mut body = Vec::with_capacity(t.pprof.len() + 256);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pb.gz\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(&t.pprof);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let r = ureq::post(&self.url)
            .timeout(Duration::from_secs(30))
            .query("name", &self.name)
            .query("from", &t.from.to_string())
            .query("until", &t.until.to_string())
            .query("format", "pprof")
            .query("sampleRate", &hz.to_string())
            .query("spyName", "sonde")
            .set("Content-Type", &format!("multipart/form-data; boundary={boundary}"))
            .send_bytes(&body);
        match r {
            Ok(_) => Ok(()),
            Err(ureq::Error::Status(code, _)) => anyhow::bail!("the server answered {code}"),
            Err(e) => Err(e.into()),
        }
    }
}
