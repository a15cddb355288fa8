//! `sonde serve` against real components: a real Prometheus scraping it while
//! lossy traffic runs (oracle: the namespaces' MIB counters and a workload
//! whose calls are built in), `promtool check metrics`, `go tool pprof` on
//! the pulled profiles, a local receiver for the push, and bad input.
use super::common::*;
use sonde::lab::netns::Netns;

/// A running `sonde serve`, stopped (SIGTERM) when dropped.
struct Serve {
    child: Child,
    /// host:port it listens on.
    addr: String,
    /// Everything it wrote to stderr so far.
    stderr: Arc<Mutex<String>>,
}

impl Serve {
    /// `[ip netns exec NS] sonde serve ARGS`, once it says it listens.
    fn start(ns: Option<&Netns>, args: &[&str]) -> Serve {
        let mut cmd = match ns {
            Some(n) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &n.name, SONDE]);
                c
            }
            None => Command::new(SONDE),
        };
        // NODE_NAME as the DaemonSet sets it: pushes carry it as `node`.
        cmd.env("NODE_NAME", "node-7.test");
        let mut child = cmd.arg("serve").args(args).stderr(Stdio::piped()).spawn().expect("spawn sonde serve");
        let mut r = BufReader::new(child.stderr.take().unwrap());
        let text = wait_for_stderr_line(&mut r, "listening on");
        let addr = text
            .lines()
            .find_map(|l| {
                l.split("://")
                    .nth(1)?
                    .split(':')
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(":")
                    .split(' ')
                    .next()
                    .map(String::from)
            })
            // A Unix socket's line has no URL: the caller knows the path.
            .unwrap_or_default();
        let addr = addr.trim_end_matches(':').to_string();
        let stderr = Arc::new(Mutex::new(text));
        let s2 = stderr.clone();
        thread::spawn(move || {
            for l in r.lines().map_while(Result::ok) {
                s2.lock().unwrap().push_str(&(l + "\n"));
            }
        });
        Serve { child, addr, stderr }
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> i32 {
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        std::mem::forget(self);
        code
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `curl` (inside `ns` if given): (HTTP status, body).
fn curl(ns: Option<&Netns>, args: &[&str]) -> (u16, Vec<u8>) {
    let mut cmd = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &n.name, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let out = cmd.args(["-s", "-m", "60", "-w", "\n%{http_code}"]).args(args).output().expect("curl");
    let mut body = out.stdout;
    let nl = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&body[nl + 1..]).trim().parse().unwrap_or(0);
    body.truncate(nl);
    (code, body)
}

/// A Prometheus query's vector result as (labels, value).
fn query(ns: &Netns, prom: &str, q: &str) -> Vec<(Value, f64)> {
    let (code, body) =
        curl(Some(ns), &["-G", &format!("http://{prom}/api/v1/query"), "--data-urlencode", &format!("query={q}")]);
    assert_eq!(code, 200, "query {q}: {}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse::<f64>().unwrap()))
        .collect()
}

fn one(ns: &Netns, prom: &str, q: &str) -> f64 {
    let r = query(ns, prom, q);
    assert_eq!(r.len(), 1, "{q}: {r:?}");
    r[0].1
}

/// The real Prometheus (Debian's), scraping `target` every second, in `ns`.
fn prometheus(ns: &Netns, dir: &std::path::Path, target: &str) -> KillOnDrop {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: sonde\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let p = KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, "prometheus"])
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("db").display()))
            .args(["--web.listen-address=127.0.0.1:9090", "--log.level=warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (apt-get install prometheus)"),
    );
    let t0 = Instant::now();
    loop {
        let (code, body) = curl(Some(ns), &["http://127.0.0.1:9090/api/v1/targets"]);
        if code == 200 && String::from_utf8_lossy(&body).contains("\"health\":\"up\"") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "Prometheus never scraped sonde: {}",
            String::from_utf8_lossy(&body)
        );
        thread::sleep(Duration::from_millis(250));
    }
    p
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sonde-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn prometheus_scrapes_retransmits_that_match_the_mib_and_latencies_the_workload_made() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("prom");
    let pair = Pair::new().expect("namespaces");
    let ns = Netns::create(&format!("sonde-prom-{}", std::process::id())).unwrap();
    let lat =
        build_workload("lat", &["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"]);
    let cfg = dir.join("sonde.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:9632\"\n[retrans]\naddr = [\"{}\", \"{}\"]\n[cwnd]\nenabled = false\n[funclatency]\ntargets = [\"{l}:one_ms\", \"{l}:ten_ms\"]\nmin = \"1us\"\nmax = \"1s\"\n",
            pair.net4,
            pair.net6,
            l = lat.display()
        ),
    )
    .unwrap();
    let serve = Serve::start(Some(&ns), &["--config", cfg.to_str().unwrap()]);
    let pid = serve.child.id();
    let _prom = prometheus(&ns, &dir, &serve.addr);

    // Metrics lint: Prometheus' own checker on what sonde serves.
    let (code, body) = curl(Some(&ns), &[&format!("http://{}/metrics", serve.addr)]);
    assert_eq!(code, 200);
    let mut lint = Command::new("promtool").args(["check", "metrics"]).stdin(Stdio::piped()).output_with(&body);
    assert!(lint.status.success(), "promtool check metrics: {}", String::from_utf8_lossy(&lint.stderr));
    lint.stderr.clear();

    // The workloads: 100 calls of 1.2 ms and 10 of 12 ms, and lossy traffic.
    let log = dir.join("lat.log");
    let mut w = Command::new(&lat).args(["0.2", "0.1", log.to_str().unwrap()]).spawn().unwrap();
    let before = pair.mib().unwrap();
    workload(&pair, 2, 8).expect("workload");
    let after = settled_mib(&pair, Duration::from_secs(15)).unwrap();
    assert!(w.wait().unwrap().success());
    let d = after.delta(&before);
    // Two scrapes after the traffic settled.
    let done = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() + 2.5;
    let t0 = Instant::now();
    while one(&ns, "127.0.0.1:9090", "max(timestamp(sonde_build_info))") < done {
        assert!(t0.elapsed() < Duration::from_secs(30), "no scrape after the traffic");
        thread::sleep(Duration::from_millis(300));
    }

    let by_kind: std::collections::HashMap<String, i64> =
        query(&ns, "127.0.0.1:9090", "sum by (kind) (sonde_tcp_retransmit_segments_total)")
            .into_iter()
            .map(|(m, v)| (m["kind"].as_str().unwrap().to_string(), v as i64))
            .collect();
    let k = |n: &str| by_kind.get(n).copied().unwrap_or(0);
    let unseen = one(&ns, "127.0.0.1:9090", "sonde_tcp_retransmit_unseen_segments_total") as i64;
    let lost = one(&ns, "127.0.0.1:9090", "sonde_lost_events_total{collector=\"retrans\"}") as i64;
    let total: i64 = by_kind.values().sum();
    let sent = d.get("TcpRetransSegs") - d.get("TcpExtTCPRetransFail");
    eprintln!("serve via Prometheus: {by_kind:?}, unseen {unseen}, lost {lost}; MIB {d:?}");
    assert!(total > 0 && k("rto") > 0 && k("syn") > 0, "the lossy workload retransmits: {by_kind:?}");
    // The relations `sonde retrans` proves, through Prometheus: every
    // successful retransmitted segment, but for request sockets' SYN-ACKs
    // (no counter to find an unseen one in later) and what the kernel skipped.
    let short_ok = hidden_synack_allowance() + lost;
    assert!(
        total + unseen <= sent && sent - (total + unseen) <= short_ok,
        "segments {total} + unseen {unseen} vs RetransSegs - RetransFail {sent}"
    );
    assert!(
        k("fast") <= d.get("TcpExtTCPFastRetrans") && d.get("TcpExtTCPFastRetrans") - k("fast") <= unseen + lost,
        "fast {} vs TCPFastRetrans {}",
        k("fast"),
        d.get("TcpExtTCPFastRetrans")
    );
    let syn = k("syn") + k("synack");
    assert!(
        syn <= d.get("TcpExtTCPSynRetrans") && d.get("TcpExtTCPSynRetrans") - syn <= unseen + short_ok,
        "syn+synack {syn} vs TCPSynRetrans {}",
        d.get("TcpExtTCPSynRetrans")
    );

    // The latency histograms: counts the workload made, medians in the bucket
    // of the built-in durations (1.2 ms: le 2.097151 ms; 12 ms: le 16.777215 ms).
    for (f, n, lo, hi) in [("one_ms", 100.0, 0.001048575, 0.002097151), ("ten_ms", 10.0, 0.008388607, 0.016777215)] {
        let sel = format!("target=~\".*:{f}\"");
        assert_eq!(
            one(&ns, "127.0.0.1:9090", &format!("sonde_function_latency_seconds_count{{{sel}}}")),
            n,
            "{f} calls"
        );
        let inf = one(&ns, "127.0.0.1:9090", &format!("sonde_function_latency_seconds_bucket{{{sel},le=\"+Inf\"}}"));
        assert_eq!(inf, n, "+Inf bucket == count");
        let p50 = one(
            &ns,
            "127.0.0.1:9090",
            &format!("histogram_quantile(0.5, sonde_function_latency_seconds_bucket{{{sel}}})"),
        );
        assert!(p50 > lo && p50 <= hi, "{f} p50 {p50} in ({lo}, {hi}]");
    }
    let ours = programs_of(pid);
    assert!(!ours.is_empty());
    assert_eq!(serve.stop(), 0, "SIGTERM ends serve with 0");
    assert_gone(pid, &ours);
}

/// The drops collector through a real Prometheus: per reason and
/// protocol, what the kernel's counters in the namespace say (nine reasons
/// of the drops lab's workload), with labels bounded by the kernel's
/// reasons and the IP protocols.
#[test]
fn prometheus_scrapes_drops_by_reason_that_match_the_namespaces_counters() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("prom-drops");
    let pair = Pair::new().expect("namespaces");
    let ns = Netns::create(&format!("sonde-promd-{}", std::process::id())).unwrap();
    let cfg = dir.join("sonde.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:9633\"\n[retrans]\nenabled = false\n[cwnd]\nenabled = false\n[profiles]\nenabled = false\n[drops]\nnetns = [\"{}\"]\n",
            pair.b.name
        ),
    )
    .unwrap();
    let serve = Serve::start(Some(&ns), &["--config", cfg.to_str().unwrap()]);
    let _prom = prometheus(&ns, &dir, &serve.addr);
    let before = pair.b.mib().unwrap();
    sonde::lab::drops::workload(&pair, 150).expect("workload");
    let d = pair.b.mib().unwrap().delta(&before);
    let done = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() + 2.5;
    let t0 = Instant::now();
    while one(&ns, "127.0.0.1:9090", "max(timestamp(sonde_build_info))") < done {
        assert!(t0.elapsed() < Duration::from_secs(30), "no scrape after the traffic");
        thread::sleep(Duration::from_millis(300));
    }
    let series = query(&ns, "127.0.0.1:9090", "sonde_packet_drops_total");
    let by: std::collections::HashMap<(String, String), i64> = series
        .iter()
        .map(|(m, v)| {
            ((m["reason"].as_str().unwrap().to_string(), m["protocol"].as_str().unwrap().to_string()), *v as i64)
        })
        .collect();
    eprintln!("drops via Prometheus: {by:?}");
    let get = |r: &str, p: &str| by.get(&(r.to_string(), p.to_string())).copied().unwrap_or(0);
    assert_eq!(get("NO_SOCKET", "udp"), d.get("UdpNoPorts") + d.get("Udp6NoPorts"));
    assert_eq!(get("SOCKET_RCVBUFF", "udp"), d.get("UdpRcvbufErrors") + d.get("Udp6RcvbufErrors"));
    assert_eq!(get("UDP_CSUM", "udp"), d.get("UdpInCsumErrors"));
    assert_eq!(get("IP_NOPROTO", "253"), d.get("IpInUnknownProtos"));
    assert_eq!(get("IP_RPFILTER", "udp"), d.get("TcpExtIPReversePathFilter"));
    for (r, p) in [("NETFILTER_DROP", "udp"), ("TC_INGRESS", "udp"), ("SOCKET_FILTER", "udp")] {
        assert_eq!(get(r, p), 150, "{r} {p}");
    }
    // Bounded labels: the kernel's reason names and protocols, nothing per flow.
    for (m, _) in &series {
        let keys: Vec<&String> = m.as_object().unwrap().keys().collect();
        assert!(
            keys.iter().all(|k| ["__name__", "reason", "protocol", "instance", "job"].contains(&k.as_str())),
            "{m}"
        );
    }
    assert_eq!(serve.stop(), 0);
}

/// Runs `cmd` with `input` on stdin.
trait OutputWith {
    fn output_with(&mut self, input: &[u8]) -> std::process::Output;
}

impl OutputWith for Command {
    fn output_with(&mut self, input: &[u8]) -> std::process::Output {
        use std::io::Write;
        let mut c = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        c.wait_with_output().unwrap()
    }
}

#[test]
fn pprof_pulls_show_the_workloads_split_one_at_a_time_and_pushes_reach_a_receiver() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("pprof");
    // The receiver: a wire-contract check of what Pyroscope's /ingest takes,
    // not Pyroscope itself (not installable here).
    let recv_log = dir.join("push.json");
    let _receiver = KillOnDrop(
        Command::new("/usr/bin/python3").args(["-c", PUSH_RECEIVER, recv_log.to_str().unwrap()]).spawn().unwrap(),
    );
    let t0 = Instant::now();
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(format!("{}.port", recv_log.display())) {
            if !p.is_empty() {
                break p.trim().to_string();
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "receiver did not start");
        thread::sleep(Duration::from_millis(50));
    };
    let calltree = build_workload("calltree", FP);
    let w = KillOnDrop(Command::new(&calltree).args(["60", "1"]).spawn().unwrap());
    // 499 Hz: enough samples in 3 s for the split to show within a few %.
    let cfg = dir.join("sonde.toml");
    // Pushes every 30 s, 2 s each: the first comes after the pulls below, so
    // their 429 check sees the pull it started, not a push.
    std::fs::write(&cfg, "[profiles]\nfrequency = 499\n[push]\ninterval = \"30s\"\nseconds = 2\n").unwrap();
    let serve = Serve::start(
        None,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--disable",
            "retrans",
            "--disable",
            "cwnd",
            "--push-url",
            &format!("http://127.0.0.1:{port}/ingest"),
        ],
    );
    // The push runs every 4 s for 10 s by default; first pull meanwhile may
    // meet it: retry on 429 as a client would, after Retry-After.
    let url = format!("http://{}/debug/pprof/profile?seconds=3&comm=calltree", serve.addr);
    let prof = dir.join("cpu.pb.gz");
    let t0 = Instant::now();
    loop {
        let (code, body) = curl(None, &["-D", "-", &url]);
        if code == 200 {
            // Headers and body came together: split at the blank line.
            let text = body;
            let at = text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            std::fs::write(&prof, &text[at..]).unwrap();
            break;
        }
        assert_eq!(code, 429, "only busy is allowed here");
        assert!(String::from_utf8_lossy(&body).to_lowercase().contains("retry-after"));
        assert!(t0.elapsed() < Duration::from_secs(40), "{}", serve.stderr.lock().unwrap());
        thread::sleep(Duration::from_secs(1));
    }
    // go tool pprof reads it; work() is reached through gamma, delta and
    // epsilon 50/30/20 as built.
    let out = Command::new(go_bin()).args(["tool", "pprof", "-top", "-cum"]).arg(&prof).output().unwrap();
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&out.stderr));
    let cum = |f: &str| -> f64 {
        top.lines()
            .find(|l| l.split_whitespace().last().is_some_and(|n| n.trim_end_matches('_') == f))
            .and_then(|l| l.split_whitespace().nth(4)?.trim_end_matches('%').parse().ok())
            .unwrap_or(0.0)
    };
    let (a, b, c) = (cum("gamma"), cum("delta"), cum("epsilon"));
    let sum = a + b + c;
    assert!(sum > 50.0, "calltree's tree holds its samples: {top}");
    for (got, want) in [(a, 0.5), (b, 0.3), (c, 0.2)] {
        assert!((got / sum - want).abs() < 0.07, "split {a}/{b}/{c} vs 50/30/20: {top}");
    }
    // One at a time: a second request while one runs gets 429 + Retry-After.
    let long = format!("http://{}/debug/pprof/offcpu?seconds=3", serve.addr);
    let first = thread::spawn(move || curl(None, &[&long]).0);
    thread::sleep(Duration::from_millis(700));
    let (code, body) = curl(None, &["-D", "-", &format!("http://{}/debug/pprof/wakeup?seconds=1", serve.addr)]);
    assert_eq!(code, 429, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).to_lowercase().contains("retry-after:"));
    assert_eq!(first.join().unwrap(), 200);
    // Bad seconds, unknown paths: refused, the server goes on.
    for (q, want) in [("seconds=0", 400), ("seconds=100000", 400), ("seconds=abc", 400)] {
        assert_eq!(curl(None, &[&format!("http://{}/debug/pprof/profile?{q}", serve.addr)]).0, want, "{q}");
    }
    assert_eq!(curl(None, &[&format!("http://{}/nope", serve.addr)]).0, 404);
    // The push: at least one arrived and matched the contract.
    let t0 = Instant::now();
    while std::fs::read_to_string(&recv_log).unwrap_or_default().lines().count() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no push arrived");
        thread::sleep(Duration::from_millis(300));
    }
    let pushed: Value =
        serde_json::from_str(std::fs::read_to_string(&recv_log).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(pushed["ok"], true, "push contract: {pushed}");
    assert!(pushed["name"].as_str().unwrap().starts_with("sonde{"), "{pushed}");
    assert!(pushed["name"].as_str().unwrap().contains("node=node-7.test"), "NODE_NAME as node: {pushed}");
    // The pushed pprof, as go tool pprof reads it: calltree's samples.
    let top = Command::new(go_bin())
        .args(["tool", "pprof", "-top"])
        .arg(format!("{}.pb.gz", recv_log.display()))
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.contains("work") && top.contains("Total samples"), "pushed profile: {top}");
    let (_, metrics) = curl(None, &[&format!("http://{}/metrics", serve.addr)]);
    let m = String::from_utf8_lossy(&metrics);
    assert!(m.contains("sonde_profile_pushes_total{result=\"ok\"}"), "{m}");
    drop(w);
    assert_eq!(serve.stop(), 0);
}

/// Checks each push as Pyroscope's /ingest reads it: the query parameters, a
/// multipart body whose `profile` part is a gzipped pprof with samples.
const PUSH_RECEIVER: &str = r#"
import gzip, http.server, json, sys, urllib.parse
log = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        u = urllib.parse.urlparse(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        r = {"path": u.path, "name": q.get("name", ""), "ok": False}
        try:
            ctype = self.headers.get("Content-Type", "")
            assert u.path == "/ingest", u.path
            assert q.get("format") == "pprof" and q.get("spyName") == "sonde", q
            assert int(q["from"]) <= int(q["until"]), q
            assert int(q["sampleRate"]) > 0, q
            assert ctype.startswith("multipart/form-data; boundary="), ctype
            boundary = ctype.split("boundary=", 1)[1].encode()
            parts = body.split(b"--" + boundary)
            prof = [p for p in parts if b'name="profile"' in p][0]
            data = prof.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n", 1)[0]
            assert data[:2] == b"\x1f\x8b", "gzip magic"
            raw = gzip.decompress(data)
            # pprof: field 2 (sample) entries are length-delimited, tag 0x12.
            assert len(raw) > 0, "empty pprof"
            open(log + ".pb.gz", "wb").write(data)
            r["ok"] = True
        except Exception as e:
            r["error"] = repr(e)
        with open(log, "a") as f:
            f.write(json.dumps(r) + "\n")
        self.send_response(200 if r["ok"] else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(log + ".port", "w").write(str(s.server_address[1]))
s.serve_forever()
"#;

#[test]
fn bad_config_and_bad_requests_are_refused_and_the_server_keeps_serving() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("bad");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "listen = \"127.0.0.1:0\"\n\n[retrans]\nenabeld = true\n").unwrap();
    let out = Command::new(SONDE).args(["serve", "--check-config", bad.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(bad.to_str().unwrap()) && err.contains("line 4") && err.contains("enabeld"), "{err}");
    let good = dir.join("good.toml");
    std::fs::write(&good, "[funclatency]\ntargets = [\"syscall:read\"]\n").unwrap();
    let out = Command::new(SONDE).args(["serve", "--check-config", good.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(SONDE).args(["serve", "--disable", "nosuch"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A comm the kernel cannot hold whole would never match: refused, with the name it keeps.
    let out = Command::new(SONDE).args(["serve", "--comm", "a-name-the-kernel-cuts"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.trim().lines().count() == 1 && err.contains("'a-name-the-kern'"), "{err}");
    // A port in use: refused before anything is loaded.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().to_string();
    // strace sees every bpf() call: none may load a program or create a map.
    let trace = dir.join("bpf.strace");
    let out = Command::new("strace")
        .args(["-f", "-e", "trace=bpf", "-o", trace.to_str().unwrap(), SONDE, "serve", "--listen", &port])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&port), "{err}");
    let calls = std::fs::read_to_string(&trace).unwrap();
    assert!(
        !calls.contains("BPF_PROG_LOAD") && !calls.contains("BPF_MAP_CREATE"),
        "loaded before the bind failed: {calls}"
    );
    // Garbage, a slow client that never finishes its request, then a scrape.
    let serve = Serve::start(None, &["--listen", "127.0.0.1:0", "--disable", "cwnd"]);
    use std::io::{Read, Write};
    let mut slow = std::net::TcpStream::connect(&serve.addr).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    // (request, whether a 4xx must come back: a TLS hello may just be closed)
    for (junk, answered) in [
        (&b"\x16\x03\x01\x00\xff garbage\r\n\r\n"[..], false),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", true),
        (b"GET /?a=%zz HTTP/1.1\r\n\r\n", true),
    ] {
        let mut s = std::net::TcpStream::connect(&serve.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(junk).unwrap();
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        assert!(resp.starts_with("HTTP/1.1 4") || (!answered && resp.is_empty()), "{resp:?}");
    }
    let (code, body) = curl(None, &[&format!("http://{}/metrics", serve.addr)]);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("sonde_collector_up{collector=\"retrans\""));
    drop(slow);
    // SIGKILL: nothing stays attached.
    let pid = serve.child.id();
    let ours = programs_of(pid);
    assert!(!ours.is_empty());
    let mut serve = serve;
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    assert_gone(pid, &ours);
}

/// `curl` as another uid (setpriv): (HTTP status, body).
fn curl_as(uid: u32, url: &str) -> (u16, String) {
    curl_as_with(uid, &[url])
}

/// `curl ARGS` as another uid (setpriv): (HTTP status, body); status 0 when
/// it could not connect.
fn curl_as_with(uid: u32, args: &[&str]) -> (u16, String) {
    let id = uid.to_string();
    let out = Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", "curl", "-s", "-m", "60", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("setpriv curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn without_basic_auth_profiles_go_only_to_local_clients_of_allowed_uids() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let serve = Serve::start(
        None,
        &["--listen", "127.0.0.1:0", "--disable", "retrans", "--disable", "cwnd", "--profiles-allow-uid", "65533"],
    );
    let prof = format!("http://{}/debug/pprof/profile?seconds=1", serve.addr);
    // The kernel's socket table names the client: root (allowed by
    // default) and 65533 (the flag) get a profile, 65534 gets 403 naming
    // itself and the fix; metrics stay open to every local user.
    let (code, body) = curl(None, &[&prof]);
    assert_eq!(code, 200, "root: {}", String::from_utf8_lossy(&body));
    let (code, body) = curl_as(65533, &prof);
    assert_eq!(code, 200, "uid 65533: {body}");
    let (code, body) = curl_as(65534, &prof);
    assert_eq!(code, 403, "uid 65534: {body}");
    assert!(body.contains("uid 65534") && body.contains("--profiles-allow-uid 65534"), "{body}");
    let (code, metrics) = curl_as(65534, &format!("http://{}/metrics", serve.addr));
    assert_eq!(code, 200);
    assert!(metrics.contains("sonde_profile_requests_refused_total{reason=\"forbidden\"} 1"), "{metrics}");
    assert!(metrics.contains("sonde_profiles_total{kind=\"profile\"} 2"), "{metrics}");
    assert_eq!(serve.stop(), 0);
}

#[test]
fn a_unix_socket_admits_root_only_and_knows_each_clients_uid_from_the_kernel() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("unix");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.join("sonde.sock");
    let (spec, path) = (format!("unix:{}", sock.display()), sock.to_str().unwrap().to_string());
    let serve = Serve::start(
        None,
        &["--listen", &spec, "--disable", "retrans", "--disable", "cwnd", "--profiles-allow-uid", "65533"],
    );
    assert!(serve.stderr.lock().unwrap().contains(&format!("listening on {spec} (http)")));
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let url = |p: &str| format!("http://localhost{p}");
    let prof = url("/debug/pprof/profile?seconds=1");
    let (code, metrics) = curl(None, &["--unix-socket", &path, &url("/metrics")]);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&metrics).contains("sonde_build_info{"), "{}", String::from_utf8_lossy(&metrics));
    let (code, body) = curl(None, &["--unix-socket", &path, &prof]);
    assert_eq!(code, 200, "root: {}", String::from_utf8_lossy(&body));
    assert!(body.starts_with(&[0x1f, 0x8b]), "a gzipped pprof profile");
    // Mode 0600: another user cannot even connect.
    let (code, _) = curl_as_with(65534, &["--unix-socket", &path, &url("/metrics")]);
    assert_eq!(code, 0, "uid 65534 connected to a 0600 socket");
    // Opened to everyone, the uid the kernel gives with each connection
    // (SO_PEERCRED) decides: 65533 (the flag) gets a profile, 65534 a 403
    // naming itself and the fix; metrics stay open.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, body) = curl_as_with(65533, &["--unix-socket", &path, &prof]);
    assert_eq!(code, 200, "uid 65533: {body}");
    let (code, body) = curl_as_with(65534, &["--unix-socket", &path, &prof]);
    assert_eq!(code, 403, "uid 65534: {body}");
    assert!(body.contains("uid 65534") && body.contains("--profiles-allow-uid 65534"), "{body}");
    let (code, _) = curl_as_with(65534, &["--unix-socket", &path, &url("/metrics")]);
    assert_eq!(code, 200);
    assert_eq!(serve.stop(), 0);
    assert!(!sock.exists(), "the socket file is removed at exit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cgroup_labels_name_the_pod_and_container_whose_sockets_retransmitted_restarted_and_slept() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    const UID: &str = "5a1f7c2e-93d4-4b8a-a6e1-0c2d3e4f5a6b";
    const ID: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";
    let root = sonde::engine::cgroup::cgroup2_root().expect("cgroup v2");
    // The kubelet's systemd-driver layout (pod UID with underscores).
    let pod = std::path::Path::new(&root)
        .join("kubepods.slice/kubepods-besteffort.slice")
        .join(format!("kubepods-besteffort-pod{}.slice", UID.replace('-', "_")));
    let scope = pod.join(format!("cri-containerd-{ID}.scope"));
    std::fs::create_dir_all(&scope).unwrap();
    // A second container of the pod, for the workload cwnd and funclatency see.
    const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let scope2 = pod.join(format!("cri-containerd-{ID2}.scope"));
    std::fs::create_dir_all(&scope2).unwrap();
    let ns = Netns::create(&format!("sonde-cg-{}", std::process::id())).unwrap();
    let serve = Serve::start(
        None,
        &[
            "--listen",
            "127.0.0.1:0",
            "--labels",
            "cgroup",
            "--netns",
            &ns.name,
            "--funclatency",
            "syscall:clock_nanosleep",
        ],
    );
    let before = ns.mib().unwrap();
    let overflow = build_workload("overflow", &["-O2"]);
    let bursts = build_workload("bursts", &["-O2"]);
    let udpdrops = build_workload("udpdrops", &["-O2"]);
    // The workloads join a container cgroup of the pod, then its namespace:
    // overflow retransmits; in the second container, bursts answers GAPS
    // requests after 400 ms of idle (longer than loopback's RTO: slow start
    // restarts under CUBIC), its client sleeping (usleep: clock_nanosleep)
    // before each.
    const GAPS: u64 = 3;
    let runs = [
        (&scope, format!("{} 7000 4", overflow.display())),
        (&scope2, format!("{} 7100 cubic {} 400 100000", bursts.display(), GAPS + 1)),
        // Datagrams to a closed port (no socket: no owner) and to a
        // socket of the first container that never reads.
        (&scope, format!("{} 100", udpdrops.display())),
    ];
    for (cg, cmd) in runs {
        let join = format!("echo $$ > {}/cgroup.procs && exec ip netns exec {} {cmd}", cg.display(), ns.name);
        let st = Command::new("sh").args(["-c", &join]).stdout(Stdio::null()).status().unwrap();
        assert!(st.success(), "{cmd}");
    }
    thread::sleep(Duration::from_millis(500));
    let d = ns.mib().unwrap().delta(&before);
    let (_, body) = curl(None, &[&format!("http://{}/metrics", serve.addr)]);
    let text = String::from_utf8_lossy(&body).into_owned();
    let series: Vec<(&str, f64)> = text
        .lines()
        .filter(|l| l.starts_with("sonde_tcp_retransmit_segments_total{"))
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    let total: f64 = series.iter().map(|s| s.1).sum();
    let in_pod: f64 = series
        .iter()
        .filter(|(k, _)| {
            k.contains(&format!("pod_uid=\"{UID}\""))
                && k.contains(&format!("container_id=\"containerd://{ID}\""))
                && k.contains("cri-containerd-")
        })
        .map(|s| s.1)
        .sum();
    let unseen: f64 =
        text.lines().find_map(|l| l.strip_prefix("sonde_tcp_retransmit_unseen_segments_total ")?.parse().ok()).unwrap();
    let sent = (d.get("TcpRetransSegs") - d.get("TcpExtTCPRetransFail")) as f64;
    eprintln!("cgroup labels: {series:?}; unseen {unseen}; MIB {d:?}");
    assert!(in_pod > 0.0, "the pod's series: {text}");
    assert_eq!(in_pod, total, "every retransmit in the namespace is the pod's: {series:?}");
    assert!(
        in_pod + unseen <= sent && sent - (in_pod + unseen) <= hidden_synack_allowance() as f64,
        "{in_pod} + {unseen} vs {sent}"
    );
    // cwnd and funclatency carry the same labels (bursts' container).
    let pod_labels = format!("pod_uid=\"{UID}\",container_id=\"containerd://{ID2}\"");
    let sum = |prefix: &str, pod: Option<bool>| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter(|l| pod.is_none_or(|p| l.contains(&pod_labels) == p))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let idle_pod = sum("sonde_tcp_idle_sends_total{", Some(true));
    let restarts_pod = sum("sonde_tcp_slow_start_restarts_total{cc=\"cubic\"", Some(true));
    eprintln!("cgroup labels: idle sends {idle_pod} in the pod, restarts {restarts_pod}");
    assert_eq!(idle_pod, sum("sonde_tcp_idle_sends_total{", None), "the namespace's idle sends are the pod's: {text}");
    // The server's GAPS responses restart; the client's requests may too.
    assert!((GAPS as f64..=2.0 * GAPS as f64).contains(&restarts_pod), "restarts in the pod: {text}");
    let sleeps_pod = sum("sonde_function_latency_seconds_count{target=\"syscall:clock_nanosleep\"", Some(true));
    assert_eq!(sleeps_pod, GAPS as f64, "bursts' client slept GAPS times: {text}");
    // Drops: a full socket's are its container's, to the last one the
    // namespace's counters kept; those that name no socket are "unknown".
    let rcvbuf = (d.get("UdpRcvbufErrors") + d.get("Udp6RcvbufErrors")) as f64;
    let noport_unknown: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("sonde_packet_drops_total{reason=\"NO_SOCKET\",protocol=\"udp\"")
                && l.contains("cgroup=\"unknown\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    eprintln!("cgroup labels: RcvbufErrors {rcvbuf}, NO_SOCKET unknown {noport_unknown}");
    let pod1 = format!("pod_uid=\"{UID}\",container_id=\"containerd://{ID}\"");
    assert!(rcvbuf > 0.0, "{d:?}");
    assert_eq!(sum("sonde_packet_drops_total{reason=\"SOCKET_RCVBUFF\"", None), rcvbuf, "{text}");
    assert!(
        text.lines()
            .filter(|l| l.starts_with("sonde_packet_drops_total{reason=\"SOCKET_RCVBUFF\""))
            .all(|l| l.contains(&pod1)),
        "every full-socket drop is the first container's: {text}"
    );
    assert_eq!(noport_unknown, (d.get("UdpNoPorts") + d.get("Udp6NoPorts")) as f64, "{text}");
    assert_eq!(serve.stop(), 0);
    let _ = std::fs::remove_dir(&scope);
    let _ = std::fs::remove_dir(&scope2);
    let _ = std::fs::remove_dir(&pod);
    let _ = std::fs::remove_dir(pod.parent().unwrap());
    let _ = std::fs::remove_dir(pod.parent().unwrap().parent().unwrap());
}

#[test]
fn tls_and_basic_auth_from_a_node_exporter_web_config_refuse_plain_http_and_wrong_passwords() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("tls");
    let sh = |cmd: &str| {
        let out = Command::new("sh").arg("-c").arg(cmd).current_dir(&dir).output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // A CA and a server certificate for 127.0.0.1 signed by it (openssl).
    sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca 2>/dev/null");
    sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout sonde.key -out sonde.csr -subj /CN=sonde 2>/dev/null");
    sh("printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && openssl x509 -req -in sonde.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out sonde.crt -days 2 -extfile san.ext 2>/dev/null");
    let hash = bcrypt::hash("s3cret", 6).unwrap();
    std::fs::write(
        dir.join("web.yml"),
        format!(
            "tls_server_config:\n  cert_file: sonde.crt\n  key_file: sonde.key\nbasic_auth_users:\n  prom: '{hash}'\n"
        ),
    )
    .unwrap();
    let web = dir.join("web.yml");
    let out = Command::new(SONDE)
        .args(["serve", "--check-config", "/dev/null", "--web-config", web.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let serve =
        Serve::start(None, &["--listen", "127.0.0.1:0", "--disable", "cwnd", "--web-config", web.to_str().unwrap()]);
    let url = format!("https://{}/metrics", serve.addr);
    let ca = dir.join("ca.crt");
    let ca = ca.to_str().unwrap();
    // Plain HTTP to the TLS port: refused.
    assert_ne!(curl(None, &[&format!("http://{}/metrics", serve.addr)]).0, 200);
    // TLS without trusting the CA: the handshake fails (no status).
    assert_eq!(curl(None, &[&url]).0, 0);
    // Trusted, but no password or a wrong one: 401.
    assert_eq!(curl(None, &["--cacert", ca, &url]).0, 401);
    assert_eq!(curl(None, &["--cacert", ca, "-u", "prom:wrong", &url]).0, 401);
    assert_eq!(curl(None, &["--cacert", ca, "-u", "nobody:s3cret", &url]).0, 401);
    // The CA and the password: the metrics.
    let (code, body) = curl(None, &["--cacert", ca, "-u", "prom:s3cret", &url]);
    assert_eq!(code, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("sonde_http_rejected_total{reason=\"unauthorized\"} 3"), "{text}");
    // A bad web config: one line naming the file and the key, exit 2.
    std::fs::write(dir.join("bad.yml"), "tls_server_config:\n  cert_fiel: sonde.crt\n").unwrap();
    let out =
        Command::new(SONDE).args(["serve", "--web-config", dir.join("bad.yml").to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.trim().lines().count() == 1 && err.contains("bad.yml") && err.contains("cert_fiel"), "{err}");
    assert_eq!(serve.stop(), 0);
}
