//! The kernel's own counts of the drops `sonde drops` sees, per network
//! namespace: the MIBs (/proc/net/snmp, netstat, snmp6), nftables rule
//! counters, queueing disciplines' drops and interfaces' statistics
//! (rtnetlink), and the drops no tracer sees (NIC ring misses, the softnet
//! backlog). Read from inside the namespace once sonde counts and before it
//! stops, between two readings of its counts; [`relations`] puts each beside
//! sonde's count with the relation that must hold.
use std::collections::BTreeMap;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage},
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use serde_json::{json, Value};

use crate::engine::{
    mib::{in_netns, read_mib, Mib},
    output::table,
};

/// An interface's counters.
#[derive(Debug, Clone, Default)]
pub struct Link {
    /// Its index in the namespace.
    pub ifindex: u32,
    /// Its name.
    pub name: String,
    /// Packets the stack dropped on it (no protocol handler, ...).
    pub rx_dropped: u64,
    /// Packets the NIC dropped before the kernel saw them (its ring full).
    pub rx_missed: u64,
    /// Packets for another host dropped (Linux 6.0+).
    pub rx_otherhost: u64,
}

/// A queueing discipline's drops.
#[derive(Debug, Clone, Default)]
pub struct Qdisc {
    /// Its interface.
    pub ifindex: u32,
    /// "pfifo", "clsact", ...
    pub kind: String,
    /// An ingress or clsact qdisc (its drops are tc filters' verdicts).
    pub ingress: bool,
    /// Drops.
    pub drops: u64,
}

/// One namespace's counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// SNMP, netstat and SNMP6 counters.
    pub mib: Mib,
    /// Interfaces.
    pub links: Vec<Link>,
    /// Queueing disciplines.
    pub qdiscs: Vec<Qdisc>,
    /// nftables: packets counted by rules that drop, and whether some
    /// dropping rule or chain policy counts nothing (None: no nft here).
    pub nft: Option<(u64, bool)>,
    /// Drops of the per-CPU backlog (all namespaces: /proc/net/softnet_stat).
    pub softnet_dropped: u64,
}

impl Snapshot {
    /// Reads network namespace `netns`'s counters from inside it.
    pub fn read(netns: u32) -> anyhow::Result<Snapshot> {
        in_netns(netns, || -> anyhow::Result<Snapshot> {
            let (links, qdiscs) = rtnetlink().unwrap_or_default();
            Ok(Snapshot { mib: read_mib()?, links, qdiscs, nft: nft_drops(), softnet_dropped: softnet_dropped() })
        })?
    }
}

/// Sends a dump request and gathers the replies.
fn dump(sock: &Socket, msg: RouteNetlinkMessage, seq: u32) -> anyhow::Result<Vec<RouteNetlinkMessage>> {
    let mut packet = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(msg));
    packet.header.flags = NLM_F_DUMP | NLM_F_REQUEST;
    packet.header.sequence_number = seq;
    packet.finalize();
    let mut buf = vec![0; packet.header.length as usize];
    packet.serialize(&mut buf[..]);
    sock.send(&buf[..], 0)?;
    let mut out = Vec::new();
    let mut rx = vec![0u8; 1 << 16];
    for _ in 0..10_000 {
        let n = sock.recv(&mut &mut rx[..], 0)?;
        let mut off = 0;
        while off < n {
            let m: NetlinkMessage<RouteNetlinkMessage> = NetlinkMessage::deserialize(&rx[off..n])?;
            let len = m.header.length as usize;
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => anyhow::bail!("rtnetlink: {e:?}"),
                NetlinkPayload::InnerMessage(i) => out.push(i),
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += len;
        }
    }
    Ok(out)
}

/// The calling thread's namespace's interfaces and queueing disciplines.
fn rtnetlink() -> anyhow::Result<(Vec<Link>, Vec<Qdisc>)> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut links = Vec::new();
    for m in dump(&sock, RouteNetlinkMessage::GetLink(LinkMessage::default()), 1)? {
        let RouteNetlinkMessage::NewLink(l) = m else { continue };
        let mut link = Link { ifindex: l.header.index, ..Default::default() };
        for a in l.attributes {
            match a {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::Stats64(s) => {
                    link.rx_dropped = s.rx_dropped;
                    link.rx_missed = s.rx_missed_errors;
                    link.rx_otherhost = s.rx_otherhost_dropped;
                }
                _ => {}
            }
        }
        links.push(link);
    }
    let mut qdiscs = Vec::new();
    for m in dump(&sock, RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()), 2)? {
        let RouteNetlinkMessage::NewQueueDiscipline(q) = m else { continue };
        let mut qd = Qdisc {
            ifindex: q.header.index as u32,
            ingress: q.header.parent == TcHandle::INGRESS,
            ..Default::default()
        };
        let mut from_stats2 = None;
        for a in q.attributes {
            match a {
                TcAttribute::Kind(k) => qd.kind = k,
                TcAttribute::Stats(s) => qd.drops = s.drops as u64,
                TcAttribute::Stats2(v) => {
                    for s in v {
                        if let TcStats2::Queue(q) = s {
                            from_stats2 = Some(q.drops as u64);
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(d) = from_stats2 {
            qd.drops = d;
        }
        qd.ingress |= qd.kind == "ingress" || qd.kind == "clsact";
        qdiscs.push(qd);
    }
    Ok((links, qdiscs))
}

/// Packets counted by nftables rules that drop; and whether some dropping
/// rule (or a chain's drop policy) counts nothing. None without `nft`.
fn nft_drops() -> Option<(u64, bool)> {
    let out = std::process::Command::new("nft").args(["-j", "list", "ruleset"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let (mut n, mut uncounted) = (0u64, false);
    for item in v["nftables"].as_array()? {
        if item["chain"]["policy"] == "drop" {
            uncounted = true;
        }
        let Some(expr) = item["rule"]["expr"].as_array() else { continue };
        if !expr.iter().any(|e| e.get("drop").is_some()) {
            continue;
        }
        match expr.iter().find_map(|e| e["counter"]["packets"].as_u64()) {
            Some(p) => n += p,
            None => uncounted = true,
        }
    }
    Some((n, uncounted))
}

/// The softnet backlog's drops, summed over CPUs (column 2, hex).
fn softnet_dropped() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .map(|t| {
            t.lines().filter_map(|l| l.split_whitespace().nth(1).and_then(|x| u64::from_str_radix(x, 16).ok())).sum()
        })
        .unwrap_or(0)
}

/// How sonde's count stands to the kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Rel {
    /// Equal.
    #[serde(rename = "==")]
    Eq,
    /// sonde's is at most the kernel's (the counter counts more).
    #[serde(rename = "<=")]
    Le,
    /// sonde's is at least the kernel's (some drops counted nowhere).
    #[serde(rename = ">=")]
    Ge,
}

impl Rel {
    fn holds(self, sonde: u64, kernel: u64) -> bool {
        match self {
            Rel::Eq => sonde == kernel,
            Rel::Le => sonde <= kernel,
            Rel::Ge => sonde >= kernel,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Rel::Eq => "==",
            Rel::Le => "<=",
            Rel::Ge => ">=",
        }
    }
}

/// One line of the comparison.
#[derive(Debug, Clone)]
pub struct Relation {
    /// The namespace.
    pub netns: u32,
    /// sonde's reasons (and protocol) compared.
    pub what: String,
    /// sonde's count between the two readings of the kernel's counters:
    /// at least `sonde` and at most `sonde_max` (the same when nothing
    /// dropped while the counters were being read).
    pub sonde: u64,
    /// See `sonde`.
    pub sonde_max: u64,
    /// The relation that must hold.
    pub rel: Rel,
    /// The kernel's count over the run.
    pub kernel: u64,
    /// The kernel's counter(s).
    pub counter: String,
}

impl Relation {
    /// Whether it holds for some count in sonde's bracket.
    pub fn holds(&self) -> bool {
        match self.rel {
            Rel::Eq => self.sonde <= self.kernel && self.kernel <= self.sonde_max,
            Rel::Le => self.rel.holds(self.sonde, self.kernel),
            Rel::Ge => self.rel.holds(self.sonde_max, self.kernel),
        }
    }

    /// sonde's count as text: one number, or the bracket.
    fn sonde_text(&self) -> String {
        if self.sonde == self.sonde_max {
            self.sonde.to_string()
        } else {
            format!("{}-{}", self.sonde, self.sonde_max)
        }
    }

    /// Its JSON form.
    pub fn json(&self) -> Value {
        json!({
            "netns": self.netns,
            "what": self.what,
            "sonde": self.sonde,
            "sonde_max": self.sonde_max,
            "relation": self.rel,
            "kernel": self.kernel,
            "counter": self.counter,
            "holds": self.holds(),
        })
    }
}

/// Which of sonde's drops a line counts: reasons (exact names, or prefixes
/// ending in `_`), IP protocol, IP version.
struct Pick {
    reasons: &'static [&'static str],
    l4: Option<u8>,
    fam: Option<u8>,
}

impl Pick {
    fn count(&self, netns: u32, by: &BTreeMap<(u32, String, u8, u8), u64>) -> u64 {
        by.iter()
            .filter(|((n, r, l4, fam), _)| {
                *n == netns
                    // (QDISC_DROP/noop: a queue no tc counter counts.)
                    && !r.ends_with(super::reasons::NOOP_SUFFIX)
                    && self.reasons.iter().any(|p| if p.ends_with('_') { r.starts_with(p) } else { r == p })
                    && self.l4.is_none_or(|x| x == *l4)
                    && self.fam.is_none_or(|x| x == *fam)
            })
            .map(|(_, n)| n)
            .sum()
    }
}

const UDP: Option<u8> = Some(17);
const V4: Option<u8> = Some(4);
const V6: Option<u8> = Some(6);

/// The MIB relations: sonde's drops, the relation, the counter (a sum of
/// counters, less others).
#[allow(clippy::type_complexity)]
const MIB: &[(Pick, Rel, &[&str], &[&str])] = &[
    (Pick { reasons: &["NO_SOCKET"], l4: UDP, fam: V4 }, Rel::Eq, &["UdpNoPorts"], &[]),
    (Pick { reasons: &["NO_SOCKET"], l4: UDP, fam: V6 }, Rel::Eq, &["Udp6NoPorts"], &[]),
    (Pick { reasons: &["SOCKET_RCVBUFF"], l4: UDP, fam: V4 }, Rel::Eq, &["UdpRcvbufErrors"], &[]),
    (Pick { reasons: &["SOCKET_RCVBUFF"], l4: UDP, fam: V6 }, Rel::Eq, &["Udp6RcvbufErrors"], &[]),
    (Pick { reasons: &["UDP_CSUM"], l4: UDP, fam: V4 }, Rel::Eq, &["UdpInCsumErrors"], &[]),
    (Pick { reasons: &["UDP_CSUM"], l4: UDP, fam: V6 }, Rel::Eq, &["Udp6InCsumErrors"], &[]),
    // UDP's InErrors also counts receive-buffer, checksum and memory
    // errors (apart above) and too-short packets, policy drops.
    (
        Pick { reasons: &["SOCKET_FILTER"], l4: UDP, fam: V4 },
        Rel::Le,
        &["UdpInErrors"],
        &["UdpRcvbufErrors", "UdpInCsumErrors", "UdpMemErrors"],
    ),
    (
        Pick { reasons: &["SOCKET_FILTER"], l4: UDP, fam: V6 },
        Rel::Le,
        &["Udp6InErrors"],
        &["Udp6RcvbufErrors", "Udp6InCsumErrors", "Udp6MemErrors"],
    ),
    (Pick { reasons: &["IP_NOPROTO"], l4: None, fam: V4 }, Rel::Eq, &["IpInUnknownProtos"], &[]),
    (Pick { reasons: &["IP_NOPROTO"], l4: None, fam: V6 }, Rel::Eq, &["Ip6InUnknownProtos"], &[]),
    (Pick { reasons: &["IP_RPFILTER"], l4: None, fam: None }, Rel::Eq, &["TcpExtIPReversePathFilter"], &[]),
    (Pick { reasons: &["IP_CSUM"], l4: None, fam: V4 }, Rel::Eq, &["IpExtInCsumErrors"], &[]),
    (Pick { reasons: &["TCP_CSUM"], l4: None, fam: None }, Rel::Eq, &["TcpInCsumErrors"], &[]),
    (Pick { reasons: &["SOCKET_BACKLOG"], l4: None, fam: None }, Rel::Eq, &["TcpExtTCPBacklogDrop"], &[]),
    (Pick { reasons: &["TCP_ZEROWINDOW"], l4: None, fam: None }, Rel::Eq, &["TcpExtTCPZeroWindowDrop"], &[]),
    (Pick { reasons: &["TCP_LISTEN_OVERFLOW"], l4: None, fam: None }, Rel::Le, &["TcpExtListenOverflows"], &[]),
    (Pick { reasons: &["IPV6DISABLED"], l4: None, fam: V6 }, Rel::Le, &["Ip6InDiscards"], &[]),
];

/// Before Linux 5.17 the kernel passes no reason: drops are known by the
/// function that freed them, and a function frees for more than one cause,
/// so only lower bounds hold. __udp4_lib_rcv and __udp6_lib_rcv free a
/// datagram that finds no socket (counted in NoPorts) and one that is
/// short or fails its checksum (counted apart).
#[allow(clippy::type_complexity)]
const BY_PLACE: &[(Pick, Rel, &[&str], &[&str])] = &[
    (Pick { reasons: &["UNKNOWN@__udp4_lib_rcv"], l4: UDP, fam: V4 }, Rel::Ge, &["UdpNoPorts"], &[]),
    (Pick { reasons: &["UNKNOWN@__udp6_lib_rcv"], l4: UDP, fam: V6 }, Rel::Ge, &["Udp6NoPorts"], &[]),
];

/// sonde's drops by (netns, reason, IP protocol, IP version 4/6/0); keyed
/// by REASON@function for drops the reason does not tell apart
/// (NOT_SPECIFIED; UNKNOWN on kernels that pass none).
pub type ByReason = BTreeMap<(u32, String, u8, u8), u64>;

/// `a - b`, entry by entry.
pub fn minus(a: &ByReason, b: &ByReason) -> ByReason {
    a.iter().map(|(k, v)| (k.clone(), v.saturating_sub(b.get(k).copied().unwrap_or(0)))).collect()
}

/// One namespace's counters read between two readings of sonde's counts.
#[derive(Debug, Clone, Default)]
pub struct Bracketed {
    /// The kernel's counters.
    pub snap: Snapshot,
    /// sonde's counts just before and just after they were read.
    pub before: ByReason,
    /// See `before`.
    pub after: ByReason,
}

/// How sonde's counts are compared.
#[derive(Debug, Clone, Copy)]
pub struct Compare {
    /// The kernel passes reasons (5.17+); without them only [`BY_PLACE`].
    pub reasons_known: bool,
    /// Filters other than --netns left drops out: sonde's counts can only
    /// be at most the kernel's.
    pub filtered: bool,
}

/// sonde's drops beside the namespace's counters between the readings `b`
/// (after attaching) and `a` (before detaching), only lower bounds before
/// 5.17 ([`BY_PLACE`]). sonde's count is bracketed: drops that happen while
/// the counters are read may fall on either side. A line is left out when
/// neither side counted anything.
pub fn relations(netns: u32, b: &Bracketed, a: &Bracketed, how: Compare) -> Vec<Relation> {
    let lo = minus(&a.before, &b.after);
    let hi = minus(&a.after, &b.before);
    let (b, a) = (&b.snap, &a.snap);
    let reasons_known = how.reasons_known;
    let d = a.mib.delta(&b.mib);
    let mut out = Vec::new();
    let what = |p: &Pick| {
        let mut s = p.reasons.iter().map(|r| r.trim_end_matches('_')).collect::<Vec<_>>().join("+");
        if let Some(l) = p.l4 {
            s.push_str(&format!(" {}", super::proto_name(l)));
        }
        if let Some(f) = p.fam {
            s.push_str(&format!(" IPv{f}"));
        }
        s
    };
    let mut push = |what: String, p: &Pick, rel: Rel, kernel: i64, counter: String| {
        let kernel = kernel.max(0) as u64;
        let (sonde, sonde_max) = (p.count(netns, &lo), p.count(netns, &hi));
        // Filtered, sonde counts a part: at most the kernel's count, and
        // a lower bound says nothing.
        let rel = if how.filtered && rel == Rel::Eq { Rel::Le } else { rel };
        if (sonde_max > 0 || kernel > 0) && !(how.filtered && rel == Rel::Ge) {
            out.push(Relation { netns, what, sonde, sonde_max, rel, kernel, counter });
        }
    };
    for (pick, rel, plus, minus) in if reasons_known { MIB } else { BY_PLACE } {
        if !plus.iter().all(|k| a.mib.has(k)) {
            continue;
        }
        let k: i64 = plus.iter().map(|k| d.get(k)).sum::<i64>() - minus.iter().map(|k| d.get(k)).sum::<i64>();
        let mut counter = plus.join(" + ");
        for m in *minus {
            counter.push_str(&format!(" - {m}"));
        }
        push(what(pick), pick, *rel, k, counter);
    }
    if !reasons_known {
        return out;
    }
    // nftables: rules that drop and count.
    if let (Some((n0, _)), Some((n1, uncounted))) = (b.nft, a.nft) {
        let p = Pick { reasons: &["NETFILTER_DROP"], l4: None, fam: None };
        let rel = if uncounted { Rel::Ge } else { Rel::Eq };
        push(what(&p), &p, rel, n1 as i64 - n0 as i64, "nftables counters of dropping rules".into());
    }
    // Queueing disciplines, and tc filters' drops on ingress and clsact.
    let qd = |s: &Snapshot, ingress: bool| -> i64 {
        s.qdiscs.iter().filter(|q| q.ingress == ingress).map(|q| q.drops as i64).sum()
    };
    let p = Pick { reasons: &["QDISC_", "FQ_", "CAKE_"], l4: None, fam: None };
    push(what(&p), &p, Rel::Eq, qd(a, false) - qd(b, false), "queueing disciplines' drops (tc -s qdisc)".into());
    let p = Pick { reasons: &["TC_INGRESS", "TC_EGRESS"], l4: None, fam: None };
    push(what(&p), &p, Rel::Eq, qd(a, true) - qd(b, true), "ingress and clsact qdiscs' drops".into());
    let link = |s: &Snapshot, f: fn(&Link) -> u64| -> i64 { s.links.iter().map(|l| f(l) as i64).sum() };
    let p = Pick { reasons: &["UNHANDLED_PROTO"], l4: None, fam: None };
    push(what(&p), &p, Rel::Le, link(a, |l| l.rx_dropped) - link(b, |l| l.rx_dropped), "interfaces' rx_dropped".into());
    let p = Pick { reasons: &["OTHERHOST"], l4: None, fam: None };
    push(
        what(&p),
        &p,
        Rel::Le,
        link(a, |l| l.rx_otherhost) - link(b, |l| l.rx_otherhost),
        "interfaces' rx_otherhost_dropped".into(),
    );
    let p = Pick { reasons: &["CPU_BACKLOG"], l4: None, fam: None };
    push(
        what(&p),
        &p,
        Rel::Le,
        a.softnet_dropped as i64 - b.softnet_dropped as i64,
        "softnet backlog drops (every namespace)".into(),
    );
    out
}

/// The comparison as a table.
pub fn relation_table(rel: &[&Relation]) -> String {
    if rel.is_empty() {
        return "  (no drop either side counted)\n".into();
    }
    let rows: Vec<Vec<String>> = rel
        .iter()
        .map(|r| {
            vec![
                r.what.clone(),
                r.sonde_text(),
                r.rel.text().into(),
                r.kernel.to_string(),
                r.counter.clone(),
                if r.holds() { "ok".into() } else { "DOES NOT HOLD".into() },
            ]
        })
        .collect();
    table(&["SONDE", "DROPS", "", "KERNEL", "COUNTER", ""], &rows)
}

/// Drops no tracer sees, over the run.
fn invisible(b: &Snapshot, a: &Snapshot) -> (u64, u64) {
    let missed = |s: &Snapshot| -> u64 { s.links.iter().map(|l| l.rx_missed).sum() };
    (missed(a).saturating_sub(missed(b)), a.softnet_dropped.saturating_sub(b.softnet_dropped))
}

/// ... as the summary's text.
pub fn invisible_text(b: &Snapshot, a: &Snapshot) -> String {
    let (missed, softnet) = invisible(b, a);
    format!(
        "out of any tracer's view: {missed} packets the NICs missed (rx_missed_errors: their rings were full), {softnet} softnet backlog drops (all namespaces)\n"
    )
}

/// ... as JSON.
pub fn invisible_json(netns: u32, b: &Snapshot, a: &Snapshot) -> Value {
    let (missed, softnet) = invisible(b, a);
    json!({"netns": netns, "nic_rx_missed": missed, "softnet_dropped": softnet})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pairs: &[(&str, i64)]) -> Snapshot {
        Snapshot { mib: Mib(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()), ..Default::default() }
    }

    /// sonde's counts read around `b` and `a`: nothing counted at `b`,
    /// `by` (and `extra` more, while the counters were read) at `a`.
    fn bracket(b: Snapshot, a: Snapshot, by: &ByReason, extra: &ByReason) -> (Bracketed, Bracketed) {
        let mut after = by.clone();
        for (k, v) in extra {
            *after.entry(k.clone()).or_default() += v;
        }
        (Bracketed { snap: b, ..Default::default() }, Bracketed { snap: a, before: by.clone(), after })
    }

    const EXACT: Compare = Compare { reasons_known: true, filtered: false };

    #[test]
    fn relations_put_each_reason_beside_its_counter() {
        let b = snap(&[
            ("UdpNoPorts", 10),
            ("UdpInErrors", 5),
            ("UdpRcvbufErrors", 1),
            ("UdpInCsumErrors", 0),
            ("UdpMemErrors", 0),
        ]);
        let a = snap(&[
            ("UdpNoPorts", 110),
            ("UdpInErrors", 25),
            ("UdpRcvbufErrors", 6),
            ("UdpInCsumErrors", 0),
            ("UdpMemErrors", 0),
        ]);
        let mut by = BTreeMap::new();
        by.insert((7, "NO_SOCKET".to_string(), 17, 4), 100);
        by.insert((7, "NO_SOCKET".to_string(), 6, 4), 3); // TCP: no MIB
        by.insert((7, "SOCKET_RCVBUFF".to_string(), 17, 4), 5);
        by.insert((7, "SOCKET_FILTER".to_string(), 17, 4), 15);
        by.insert((8, "SOCKET_FILTER".to_string(), 17, 4), 99); // another namespace
        let none = ByReason::new();
        let (bb, ab) = bracket(b.clone(), a.clone(), &by, &none);
        let r = relations(7, &bb, &ab, EXACT);
        let get = |w: &str| r.iter().find(|x| x.what == w).unwrap();
        assert!(get("NO_SOCKET udp IPv4").holds() && get("NO_SOCKET udp IPv4").kernel == 100);
        assert!(get("SOCKET_RCVBUFF udp IPv4").holds());
        let f = get("SOCKET_FILTER udp IPv4");
        assert_eq!((f.sonde, f.kernel, f.rel), (15, 15, Rel::Le));
        // A count off by one does not hold.
        let mut off = by.clone();
        off.insert((7, "NO_SOCKET".to_string(), 17, 4), 99);
        let (bb, ab) = bracket(b.clone(), a.clone(), &off, &none);
        assert!(!relations(7, &bb, &ab, EXACT).iter().find(|x| x.what == "NO_SOCKET udp IPv4").unwrap().holds());
        // ... unless a drop happened while the counters were read: then
        // the kernel's count may be anywhere in sonde's bracket.
        let mut one = ByReason::new();
        one.insert((7, "NO_SOCKET".to_string(), 17, 4), 2);
        let (bb, ab) = bracket(b.clone(), a.clone(), &off, &one);
        let r2 = relations(7, &bb, &ab, EXACT);
        let n = r2.iter().find(|x| x.what == "NO_SOCKET udp IPv4").unwrap();
        assert!(n.holds() && (n.sonde, n.sonde_max) == (99, 101), "{n:?}");
        assert_eq!(relation_table(&[n]).lines().nth(1).unwrap().split_whitespace().nth(3), Some("99-101"));
        // Neither side counted: no line.
        assert!(r.iter().all(|x| x.what != "IP_NOPROTO IPv4"));
        // Filters left drops out: at most the kernel's count.
        let (bb, ab) = bracket(b.clone(), a.clone(), &off, &none);
        let r3 = relations(7, &bb, &ab, Compare { reasons_known: true, filtered: true });
        let n = r3.iter().find(|x| x.what == "NO_SOCKET udp IPv4").unwrap();
        assert!(n.holds() && n.rel == Rel::Le, "{n:?}");
        // No reasons (before 5.17): the place, as a lower bound, and
        // nothing compared by reason.
        let mut old = BTreeMap::new();
        old.insert((7, "UNKNOWN@__udp4_lib_rcv".to_string(), 17, 4), 101);
        let (bb, ab) = bracket(b, a, &old, &none);
        let r = relations(7, &bb, &ab, Compare { reasons_known: false, filtered: false });
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            (r[0].what.as_str(), r[0].kernel, r[0].rel, r[0].holds()),
            ("UNKNOWN@__udp4_lib_rcv udp IPv4", 100, Rel::Ge, true)
        );
    }
}
