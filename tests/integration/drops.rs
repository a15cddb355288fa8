//! `sonde drops` against the kernel's own counters in the test's own
//! namespaces: nine reasons provoked at once (the drops lab's workload),
//! each reason's count equal to what was sent and its relation to its
//! counter holding; the owner of a socket that drops is its process; bad
//! input; nothing left attached after SIGKILL.
use std::collections::BTreeMap;

use super::common::*;

/// Drops by reason in one namespace, from the summary's `counters` lines.
fn relations(summary: &Value) -> Vec<&Value> {
    summary["counters"].as_array().map(|v| v.iter().collect()).unwrap_or_default()
}

/// Counts by (reason, netns) from `--count --json` rows.
fn counts(lines: &[Value]) -> BTreeMap<(String, u64), u64> {
    let mut m = BTreeMap::new();
    for r in lines.iter().filter(|l| l["type"] == "count") {
        *m.entry((r["reason"].as_str().unwrap_or("").to_string(), r["netns"].as_u64().unwrap_or(0))).or_default() +=
            r["drops"].as_u64().unwrap_or(0);
    }
    m
}

fn netns_ino(name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{name}")).unwrap().ino()
}

#[test]
fn nine_reasons_match_the_namespaces_counters() {
    let pair = sonde::lab::netns::Pair::new().unwrap();
    let (a, b) = (pair.a.name.clone(), pair.b.name.clone());
    let t = Tracer::start_tool("drops", "tracing packet drops", &["--netns", &a, "--netns", &b, "--count"]);
    let n = 200u64;
    sonde::lab::drops::workload(&pair, n as u32).unwrap();
    let (code, lines) = t.stop();
    assert_eq!(code, 130, "{lines:?}");
    let s = summary(&lines);
    let rel = relations(s);
    assert!(!rel.is_empty(), "{s}");
    for r in &rel {
        assert_eq!(r["holds"], true, "a relation that does not hold: {r}");
    }
    let c = counts(&lines);
    let (ia, ib) = (netns_ino(&a), netns_ino(&b));
    let get = |r: &str, ns: u64| c.get(&(r.to_string(), ns)).copied().unwrap_or(0);
    // Exactly what was sent, where nothing else drops for that reason.
    assert_eq!(get("NO_SOCKET", ib), 2 * n, "v4 and v6 to a closed port: {c:?}");
    assert_eq!(get("NETFILTER_DROP", ib), n, "{c:?}");
    assert_eq!(get("SOCKET_FILTER", ib), n, "{c:?}");
    assert_eq!(get("IP_NOPROTO", ib), n, "{c:?}");
    assert_eq!(get("IP_RPFILTER", ib), n, "{c:?}");
    assert_eq!(get("UDP_CSUM", ib), n, "{c:?}");
    assert_eq!(get("TC_INGRESS", ib), n, "{c:?}");
    // All but the few datagrams the buffer held, v4 and v6.
    let rcvbuf = get("SOCKET_RCVBUFF", ib);
    assert!(rcvbuf > 2 * n - 20 && rcvbuf <= 2 * n, "SOCKET_RCVBUFF {rcvbuf}: {c:?}");
    // The qdisc also dropped what a's stack sent on its own meanwhile.
    let qdisc: u64 = c.iter().filter(|((r, ns), _)| r.starts_with("QDISC") && *ns == ia).map(|(_, v)| v).sum();
    assert!(qdisc >= n, "QDISC drops {qdisc}: {c:?}");
    // Each relation names the counter the test's own namespace kept.
    let kernel = |what: &str| {
        rel.iter().find(|r| r["what"] == what && r["netns"] == ib).map(|r| r["kernel"].as_u64().unwrap()).unwrap_or(0)
    };
    assert_eq!(kernel("NO_SOCKET udp IPv4"), n);
    assert_eq!(kernel("NO_SOCKET udp IPv6"), n);
    assert_eq!(kernel("IP_NOPROTO IPv4"), n);
    assert_eq!(kernel("IP_RPFILTER"), n);
    assert_eq!(kernel("UDP_CSUM udp IPv4"), n);
    assert_eq!(kernel("NETFILTER_DROP"), n);
    assert_eq!(kernel("TC_INGRESS+TC_EGRESS"), n);
    assert_eq!(kernel("SOCKET_FILTER udp IPv4"), n);
}

/// Drops that never stop (a sender flooding a closed port from before
/// sonde starts to after it stops): the counters are read while sonde
/// counts, so the relation still holds, the kernel's count inside sonde's
/// bracket.
#[test]
fn relations_hold_while_drops_keep_coming() {
    let pair = sonde::lab::netns::Pair::new().unwrap();
    let b = pair.b.name.clone();
    let code = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nprint('ready',flush=True)\nwhile True:\n  s.sendto(b'x',('{}',9))\n",
        pair.b4
    );
    let mut c = Command::new("ip")
        .args(["netns", "exec", &pair.a.name, "python3", "-c", &code])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut BufReader::new(c.stdout.take().unwrap()), &mut line).unwrap();
    let _flood = KillOnDrop(c);
    let t = Tracer::start_tool("drops", "tracing packet drops", &["--netns", &b, "--count"]);
    thread::sleep(Duration::from_millis(1500));
    let (code, lines) = t.stop();
    assert_eq!(code, 130);
    let r = relations(summary(&lines)).into_iter().find(|r| r["what"] == "NO_SOCKET udp IPv4").cloned();
    let r = r.expect("the kernel's UdpNoPorts line");
    let (lo, hi, k) = (r["sonde"].as_u64().unwrap(), r["sonde_max"].as_u64().unwrap(), r["kernel"].as_u64().unwrap());
    eprintln!("NO_SOCKET under a flood: sonde {lo}-{hi}, UdpNoPorts {k}");
    assert!(k > 1000 && r["holds"] == true && r["relation"] == "==", "{r}");
}

/// Filters leave drops out: the relations then say sonde's count is at most
/// the kernel's (and the summary says why), never that they agree.
#[test]
fn a_reason_left_out_turns_its_relation_into_at_most() {
    let pair = sonde::lab::netns::Pair::new().unwrap();
    let b = pair.b.name.clone();
    let t =
        Tracer::start_tool("drops", "tracing packet drops", &["--netns", &b, "--count", "--not-reason", "NO_SOCKET"]);
    pair.a
        .run(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..50 {
                s.send_to(b"x", (pair.b4.as_str(), 9)).unwrap();
            }
        })
        .unwrap();
    thread::sleep(Duration::from_millis(200));
    let (_, lines) = t.stop();
    let r = relations(summary(&lines)).into_iter().find(|r| r["what"] == "NO_SOCKET udp IPv4").cloned();
    let r = r.expect("the kernel's UdpNoPorts line");
    assert_eq!(
        (r["sonde"].as_u64(), r["kernel"].as_u64(), r["relation"].as_str()),
        (Some(0), Some(50), Some("<=")),
        "{r}"
    );
    assert_eq!(summary(&lines)["counters_filtered"], true);
}

/// The owner of a socket whose buffer overflows is its process (another
/// process than the one sending, and than sonde), read from the socket,
/// not from the task on the CPU.
#[test]
fn drops_name_the_owning_process_of_the_socket() {
    let pair = sonde::lab::netns::Pair::new().unwrap();
    let b = pair.b.name.clone();
    // The owner: a python3 in b that binds and never reads, started before
    // sonde (its socket is found in /proc) and one after (by the hooks).
    let owner = |port: u16| {
        let code = format!(
            "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,1)\ns.bind(('0.0.0.0',{port}))\nprint('ready',flush=True)\ntime.sleep(60)\n"
        );
        let mut c = Command::new("ip")
            .args(["netns", "exec", &b, "python3", "-c", &code])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut BufReader::new(c.stdout.take().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        KillOnDrop(c)
    };
    let before = owner(7101);
    let t = Tracer::start_tool("drops", "tracing packet drops", &["--netns", &b, "--reason", "SOCKET_RCVBUFF"]);
    let after = owner(7102);
    pair.a
        .run(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for p in [7101, 7102] {
                for _ in 0..30 {
                    s.send_to(&[0u8; 1000], (pair.b4.as_str(), p)).unwrap();
                }
            }
        })
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    let (_, lines) = t.stop();
    for (port, pid) in [(7101, before.0.id()), (7102, after.0.id())] {
        let drops: Vec<&Value> = of_type(&lines, "drop").into_iter().filter(|d| d["dport"] == port).collect();
        assert!(drops.len() >= 25, "port {port}: {} drops", drops.len());
        for d in &drops {
            assert_eq!(d["reason"], "SOCKET_RCVBUFF");
            assert_eq!(d["pid"], pid, "the socket's process, not the sender or sonde: {d}");
            assert_eq!(d["comm"], "python3", "{d}");
            assert_eq!(d["netns"], netns_ino(&b), "{d}");
            assert_eq!(d["protocol"], "udp");
        }
    }
}

/// `--cgroup` keeps the drops of sockets owned in the group or below it:
/// one made before sonde started (its owner handed to the kernel from /proc)
/// and one after (recorded by the hooks), and not those of a socket owned
/// beside the group.
#[test]
fn cgroup_filter_keeps_the_sockets_owned_in_the_group_made_before_and_after_the_start() {
    for root in TestCgroup::roots() {
        let g = TestCgroup::new(&root, "sonde-drops-cg");
        let pair = sonde::lab::netns::Pair::new().unwrap();
        let b = pair.b.name.clone();
        let owner = |port: u16, join: bool| {
            let code = format!(
                "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,1)\ns.bind(('0.0.0.0',{port}))\nprint('ready',flush=True)\ntime.sleep(60)\n"
            );
            // Into the group before `ip netns exec`, whose own /sys shows no cgroups.
            let cmd = format!("exec ip netns exec {b} python3 -c \"{code}\"");
            let cmd = if join { g.joined(&cmd["exec ".len()..]) } else { cmd };
            let mut w = KillOnDrop(Command::new("bash").args(["-c", &cmd]).stdout(Stdio::piped()).spawn().unwrap());
            assert_eq!(first_line(&mut w).trim(), "ready");
            w
        };
        let before = owner(7201, true);
        let dir = g.dir.to_str().unwrap();
        let t = Tracer::start_tool("drops", "tracing packet drops", &["--netns", &b, "--cgroup", dir]);
        let after = owner(7202, true);
        let _beside = owner(7203, false);
        pair.a
            .run(|| {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                for p in [7201, 7202, 7203] {
                    for _ in 0..30 {
                        s.send_to(&[0u8; 1000], (pair.b4.as_str(), p)).unwrap();
                    }
                }
            })
            .unwrap();
        thread::sleep(Duration::from_millis(300));
        let (_, lines) = t.stop();
        let drops = of_type(&lines, "drop");
        for (port, pid) in [(7201, before.0.id()), (7202, after.0.id())] {
            let mine: Vec<&&Value> = drops.iter().filter(|d| d["dport"] == port).collect();
            assert!(mine.len() >= 25, "{root}: port {port}: {} drops", mine.len());
            assert!(mine.iter().all(|d| d["pid"] == pid), "{root}: port {port}: {mine:?}");
        }
        let beside = drops.iter().filter(|d| d["dport"] == 7203).count();
        assert_eq!(beside, 0, "{root}: drops of the socket owned beside the group passed");
        eprintln!(
            "{root}: {} and {} drops of the sockets in the group, none of the one beside it",
            drops.iter().filter(|d| d["dport"] == 7201).count(),
            drops.iter().filter(|d| d["dport"] == 7202).count()
        );
    }
}

/// A SYN to a port nothing listens on, from a known source port over IPv4
/// and IPv6: one drop each, with the flow the client used and its flags,
/// filtered in the kernel by protocol and port; headers read through typed
/// pointers (tp_btf) and by the helper (raw_tp).
#[test]
fn a_syn_to_a_closed_port_shows_the_clients_flow_and_flags() {
    for (mech, port) in [("tp_btf", 40120), ("raw_tp", 40130)] {
        syn_to_a_closed_port(mech, port);
    }
}

fn syn_to_a_closed_port(mech: &str, port: u16) {
    let pair = sonde::lab::netns::Pair::new().unwrap();
    let b = pair.b.name.clone();
    let t = Tracer::start_tool(
        "drops",
        "tracing packet drops",
        &["--netns", &b, "--proto", "tcp", "--port", "9", "--mechanism", mech],
    );
    let flows = [(4, pair.a4.clone(), pair.b4.clone(), port), (6, pair.a6.clone(), pair.b6.clone(), port + 1)];
    let mut code = String::from("import socket\n");
    for (fam, src, dst, sport) in &flows {
        let af = if *fam == 4 { "AF_INET" } else { "AF_INET6" };
        code += &format!(
            "s=socket.socket(socket.{af},socket.SOCK_STREAM)\ns.bind(('{src}',{sport}))\ntry:\n  s.connect(('{dst}',9))\nexcept ConnectionRefusedError:\n  pass\ns.close()\n"
        );
    }
    let st = Command::new("ip").args(["netns", "exec", &pair.a.name, "python3", "-c", &code]).status().unwrap();
    assert!(st.success());
    thread::sleep(Duration::from_millis(300));
    let (_, lines) = t.stop();
    let drops = of_type(&lines, "drop");
    for (fam, src, dst, sport) in &flows {
        let mine: Vec<&&Value> = drops.iter().filter(|d| d["sport"] == *sport).collect();
        assert_eq!(mine.len(), 1, "{mech} IPv{fam}: {drops:?}");
        let d = mine[0];
        assert_eq!(
            (
                d["reason"].as_str(),
                d["protocol"].as_str(),
                d["family"].as_u64(),
                d["saddr"].as_str(),
                d["daddr"].as_str()
            ),
            (Some("NO_SOCKET"), Some("tcp"), Some(*fam), Some(src.as_str()), Some(dst.as_str())),
            "{d}"
        );
        assert_eq!((d["dport"].as_u64(), d["tcp_flags"].as_str()), (Some(9), Some("S")), "{d}");
        let place = if *fam == 4 { "tcp_v4_rcv" } else { "tcp_v6_rcv" };
        assert!(d["location"].as_str().unwrap().starts_with(place), "{d}");
    }
    // Nothing but TCP on port 9 passed the filters.
    assert!(drops.iter().all(|d| d["protocol"] == "tcp" && (d["sport"] == 9 || d["dport"] == 9)), "{drops:?}");
}

#[test]
fn unknown_reasons_are_refused_in_one_line_naming_the_valid_ones() {
    let out = Command::new(SONDE).args(["drops", "--reason", "NO_SUCH_REASON"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("NO_SUCH_REASON") && err.contains("NO_SOCKET") && err.contains("SOCKET_RCVBUFF"), "{err}");
    let out = Command::new(SONDE).args(["drops", "--proto", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn sigkill_leaves_nothing_attached() {
    let mut c = Command::new(SONDE).args(["drops", "--count"]).stderr(Stdio::piped()).spawn().unwrap();
    let mut r = BufReader::new(c.stderr.take().unwrap());
    wait_for_stderr_line(&mut r, "tracing packet drops");
    let ours = programs_of(c.id());
    assert!(!ours.is_empty());
    let pid = c.id();
    c.kill().unwrap();
    c.wait().unwrap();
    assert_gone(pid, &ours);
}
