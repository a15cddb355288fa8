//! msglat's flows belong to sockets, not descriptor numbers: a relay that
//! closes its listener and connects onward on the listener's old descriptor
//! (tests/workloads/relay.c), then replaces that connection by another on
//! the same descriptor. The oracle is the relay, which prints the ends of
//! each of its sockets.
use super::common::*;

const IN_PORT: u16 = 7410;
const OUT_PORT: u16 = 7411;
const MESSAGES: u64 = 1000;

/// `key=value` of one of the relay's lines.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// A socket of the relay: its descriptor and "local <- remote".
type Socket = (u64, String);

/// One run: `sonde msglat --hooks HOOKS` on the relay for `rounds` onward
/// connections. sonde attaches while the listener is open, and stops (SIGINT)
/// while the relay still holds its last sockets. Returns the summary, the
/// listener's descriptor, the inbound socket's (fd, "local <- remote") and
/// each round's onward socket's the same way.
fn relay_run(hooks: &str, rounds: u32) -> (Value, u64, Socket, Vec<Socket>) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let bin = build_workload("relay", &["-O2"]);
    let ns = sonde::lab::netns::Netns::create(&format!(
        "sonde-{}-t{}-relay",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
    .unwrap();
    let mut relay = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(&bin)
        .args([IN_PORT.to_string(), OUT_PORT.to_string(), MESSAGES.to_string(), rounds.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(relay.stdout.take().unwrap()).lines().map_while(Result::ok);
    let listening = out.next().expect("the relay's first line");
    assert!(listening.starts_with("listening"), "{listening}");
    assert_eq!(field(&listening, "addr"), format!("0.0.0.0:{IN_PORT}"));
    let listener_fd: u64 = field(&listening, "fd").parse().unwrap();
    let pid = relay.id().to_string();
    let t = Tracer::start_tool("msglat", "timing messages", &["-p", &pid, "--hooks", hooks]);
    let mut stdin = relay.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
    let ends =
        |l: &str| (field(l, "fd").parse::<u64>().unwrap(), format!("{} <- {}", field(l, "local"), field(l, "remote")));
    let mut inbound = None;
    let mut onward = Vec::new();
    for l in out.by_ref() {
        if l.starts_with("inbound") {
            inbound = Some(ends(&l));
        } else if l.starts_with("onward") {
            onward.push(ends(&l));
        } else if l == "done" {
            break;
        }
    }
    let inbound = inbound.expect("the relay's inbound line");
    assert_eq!(onward.len(), rounds as usize);
    let (code, vals) = t.stop();
    assert_eq!(code, 130, "SIGINT ends with status 130");
    drop(stdin);
    assert!(relay.wait().unwrap().success(), "the relay failed (the onward socket took another fd?)");
    (summary(&vals).clone(), listener_fd, inbound, onward)
}

#[test]
fn msglat_labels_a_relay_s_flows_by_socket_when_descriptors_are_reused() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    for hooks in ["sockets", "syscalls", "raw"] {
        for rounds in [1, 2] {
            let (s, lfd, (in_fd, in_ends), onward) = relay_run(hooks, rounds);
            let what = format!("--hooks {hooks}, {rounds} onward connection(s)");
            assert_eq!(s["hooks"], hooks, "{s}");
            let flows = s["flows"].as_array().unwrap();
            let listener = format!("0.0.0.0:{IN_PORT}");
            assert!(
                flows.iter().all(|f| !f["in"].as_str().unwrap().contains(&listener)
                    && !f["out"].as_str().unwrap().contains(&listener)),
                "{what}: a flow labelled with the closed listener: {s}"
            );
            // Each onward connection is two flows of its own (there and
            // back), MESSAGES each, on the listener's old descriptor.
            assert_eq!(flows.len(), 2 * rounds as usize, "{what}: {s}");
            assert!(flows.iter().all(|f| f["count"] == MESSAGES), "{what}: {s}");
            let inbound = format!("fd {in_fd} {in_ends}");
            let (last_fd, last_ends) = onward.last().unwrap();
            assert_eq!(*last_fd, lfd, "{what}");
            let last = format!("fd {last_fd} {last_ends}");
            // The last connection is open at the end: labelled exactly.
            for (i, o) in [(&inbound, &last), (&last, &inbound)] {
                let n = flows.iter().filter(|f| f["in"] == *i && f["out"] == *o).count();
                assert_eq!(n, 1, "{what}: one flow {i} -> {o}: {s}");
            }
            // Earlier ones were closed: their own ends or the bare
            // descriptor, never another socket's.
            for (fd, ends) in &onward[..onward.len() - 1] {
                let own = |l: &Value| *l == format!("fd {fd} {ends}") || *l == format!("fd {fd}");
                let there = flows.iter().filter(|f| f["in"] == inbound && own(&f["out"])).count();
                let back = flows.iter().filter(|f| own(&f["in"]) && f["out"] == inbound).count();
                assert_eq!(
                    (there, back),
                    (1, 1),
                    "{what}: one flow each way between {inbound} and fd {fd} ({ends}): {s}"
                );
            }
        }
    }
}
