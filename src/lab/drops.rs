//! The drops lab: two namespaces joined by veth where the kernel drops
//! packets for ten kinds of cause at once (no listener, an nftables rule, a
//! full receive buffer, a socket filter, an unknown IP protocol,
//! reverse-path filtering, bad checksums, a tc ingress filter, an interface
//! without carrier, a full qdisc), IPv4 and
//! IPv6; `sonde drops` counts them, and its summary puts each reason beside
//! the namespaces' own counters.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    thread,
    time::Duration,
};

use anyhow::Context;
use clap::Args;

use super::netns::{Netns, Pair};
use crate::{
    engine::{cli, features, run::RunControl},
    tools::drops::{run_with, DropsArgs},
};

/// Options of `sonde lab drops`.
#[derive(Debug, Args, Clone)]
pub struct DropsLabArgs {
    /// Packets sent for each kind of drop.
    #[arg(long, default_value_t = 200)]
    pub packets: u32,
    /// Print every drop, not just the count table.
    #[arg(long)]
    pub events: bool,
}

/// UDP ports of the workload (b's side).
pub const PORT_CLOSED: u16 = 9;
/// Dropped by an nftables rule with a counter.
pub const PORT_NFT: u16 = 7777;
/// A socket with the smallest receive buffer that never reads.
pub const PORT_RCVBUF: u16 = 7001;
/// A socket whose filter rejects every datagram.
pub const PORT_FILTER: u16 = 7002;
/// Dropped by a tc ingress filter.
pub const PORT_TC: u16 = 7003;
/// Datagrams from an address b has no route back to (reverse-path filter).
pub const PORT_RPF: u16 = 7004;
/// Datagrams with a bad checksum to a closed port.
pub const PORT_CSUM: u16 = 7005;
/// Sent through a qdisc that holds nothing.
pub const PORT_QDISC: u16 = 7006;
/// The IP protocol no socket handles.
pub const PROTO_UNKNOWN: i32 = 253;
/// The source address b has no route back to.
pub const SPOOFED: &str = "192.0.2.7";

/// Sends `n` UDP datagrams of `len` bytes from `from` to `to`.
fn udp_send(from: SocketAddr, to: SocketAddr, n: u32, len: usize) -> anyhow::Result<()> {
    let s = UdpSocket::bind(from).with_context(|| format!("binding {from}"))?;
    let buf = vec![0x5au8; len];
    for _ in 0..n {
        // A qdisc that drops says so (ENOBUFS): the drop is what we want.
        let _ = s.send_to(&buf, to);
    }
    Ok(())
}

/// Sends `n` raw IPv4 packets of protocol `proto` to `to`.
fn raw_send(to: Ipv4Addr, proto: i32, n: u32) -> anyhow::Result<()> {
    // SAFETY: socket takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, proto) };
    if fd < 0 {
        anyhow::bail!("raw socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: sockaddr_in is plain data.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as u16;
    sa.sin_addr.s_addr = u32::from_ne_bytes(to.octets());
    let payload = [0u8; 32];
    for _ in 0..n {
        // SAFETY: fd is ours, payload and sa outlive the call with their sizes given.
        unsafe {
            libc::sendto(
                fd,
                payload.as_ptr() as *const _,
                payload.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    Ok(())
}

/// The internet checksum of `b`.
fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Sends `n` UDP datagrams with a wrong (non-zero) checksum, whole IP
/// packets from a raw socket (so no offload fixes them on the way).
fn bad_csum_send(from: Ipv4Addr, to: Ipv4Addr, dport: u16, n: u32) -> anyhow::Result<()> {
    // SAFETY: socket takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        anyhow::bail!("raw socket: {}", std::io::Error::last_os_error());
    }
    let mut p = [0u8; 20 + 8 + 16];
    let len = p.len() as u16;
    p[0] = 0x45;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&from.octets());
    p[16..20].copy_from_slice(&to.octets());
    let c = csum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p[20..22].copy_from_slice(&40000u16.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p[24..26].copy_from_slice(&24u16.to_be_bytes());
    // Any checksum but the right one (and not 0, which means none).
    p[26..28].copy_from_slice(&0x1234u16.to_be_bytes());
    // SAFETY: sockaddr_in is plain data.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as u16;
    sa.sin_addr.s_addr = u32::from_ne_bytes(to.octets());
    for _ in 0..n {
        // SAFETY: as in raw_send.
        unsafe {
            libc::sendto(
                fd,
                p.as_ptr() as *const _,
                p.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    Ok(())
}

/// A UDP socket on `port` in the calling thread's namespace with the
/// smallest receive buffer, never read.
pub fn small_buffer_socket(port: u16) -> anyhow::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(IpAddr::V6("::".parse()?), port))?;
    let one: libc::c_int = 1;
    // SAFETY: fd is the socket's own, the option a c_int of the size given.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &one as *const _ as *const _,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    Ok(s)
}

/// A UDP socket on `port` whose classic BPF filter rejects every datagram.
pub fn rejecting_socket(port: u16) -> anyhow::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(IpAddr::V6("::".parse()?), port))?;
    // `ret #0`: keep no byte of any packet.
    let mut prog = [libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 }];
    let fprog = libc::sock_fprog { len: 1, filter: prog.as_mut_ptr() };
    // SAFETY: fprog points at prog, alive for the call; the kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const _ as *const _,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if r != 0 {
        anyhow::bail!("SO_ATTACH_FILTER: {}", std::io::Error::last_os_error());
    }
    Ok(s)
}

/// The index of `dev` in `ns`.
fn ifindex_in(ns: &Netns, dev: &str) -> anyhow::Result<i32> {
    let j: serde_json::Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", dev])?)?;
    j[0]["ifindex"].as_i64().map(|i| i as i32).context("no interface index")
}

/// The MAC address of `dev` in `ns`.
fn mac(ns: &Netns, dev: &str) -> anyhow::Result<String> {
    let j: serde_json::Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", dev])?)?;
    j[0]["address"].as_str().map(str::to_string).context("no MAC address")
}

/// Sets up the drops' causes and sends `n` packets for each; the last,
/// a qdisc that holds nothing, stays on a's interface (with the tc filter
/// on b's), so nothing else goes out of a afterwards. Returns when all
/// traffic is done.
pub fn workload(pair: &Pair, n: u32) -> anyhow::Result<()> {
    let (a4, b4): (Ipv4Addr, Ipv4Addr) = (pair.a4.parse()?, pair.b4.parse()?);
    let (a6, b6): (IpAddr, IpAddr) = (pair.a6.parse()?, pair.b6.parse()?);
    let (va, vb) = (pair.va.as_str(), pair.vb.as_str());
    // b's side: an nftables rule, a tc ingress filter, reverse-path filtering.
    pair.b.nft(&format!(
        "table inet sonde_drops {{\n chain in {{\n  type filter hook input priority 0;\n  udp dport {PORT_NFT} counter drop\n }}\n}}\n"
    ))?;
    // A tc ingress filter (a BPF classifier: kernels without tc's gact
    // module drop this way too), until its clsact qdisc is deleted.
    let ifindex = ifindex_in(&pair.b, vb)?;
    pair.b.run(|| crate::tools::drops::tcdrop::attach(ifindex, PORT_TC))??;
    pair.b.sysctl("net.ipv4.conf.all.rp_filter", "1")?;
    pair.b.sysctl(&format!("net.ipv4.conf.{vb}.rp_filter"), "1")?;
    pair.a.ip(&["addr", "add", &format!("{SPOOFED}/32"), "dev", va])?;
    // The sockets that drop, in b: held open across the sends.
    let socks = pair
        .b
        .run(|| -> anyhow::Result<_> { Ok((small_buffer_socket(PORT_RCVBUF)?, rejecting_socket(PORT_FILTER)?)) })??;
    let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let any6 = SocketAddr::new(IpAddr::V6("::".parse()?), 0);
    pair.a.run(|| -> anyhow::Result<()> {
        let to = |ip: Ipv4Addr, p: u16| SocketAddr::new(IpAddr::V4(ip), p);
        udp_send(any4, to(b4, PORT_CLOSED), n, 64)?;
        udp_send(any6, SocketAddr::new(b6, PORT_CLOSED), n, 64)?;
        udp_send(any4, to(b4, PORT_NFT), n, 64)?;
        udp_send(any4, to(b4, PORT_RCVBUF), n, 1000)?;
        udp_send(any6, SocketAddr::new(b6, PORT_RCVBUF), n, 1000)?;
        udp_send(any4, to(b4, PORT_FILTER), n, 64)?;
        udp_send(any4, to(b4, PORT_TC), n, 64)?;
        udp_send(SocketAddr::new(IpAddr::V4(SPOOFED.parse()?), 0), to(b4, PORT_RPF), n, 64)?;
        raw_send(b4, PROTO_UNKNOWN, n)?;
        bad_csum_send(a4, b4, PORT_CSUM, n)?;
        Ok(())
    })??;
    // An interface without carrier (its veth peer stays down): its queue is
    // the built-in noop qdisc, which frees all it is given and counts none
    // (QDISC_DROP/noop). A static neighbour, so the packets reach it.
    let sub = pair.subnet();
    let (nx, ny, gw) = (format!("nx{sub}"), format!("ny{sub}"), format!("10.215.{sub}.2"));
    pair.a.ip(&["link", "add", &nx, "type", "veth", "peer", "name", &ny])?;
    pair.a.ip(&["addr", "add", &format!("10.215.{sub}.1/24"), "dev", &nx])?;
    pair.a.ip(&["link", "set", &nx, "up"])?;
    pair.a.ip(&["neigh", "replace", &gw, "lladdr", "02:00:00:00:00:02", "dev", &nx, "nud", "permanent"])?;
    pair.a.run(|| udp_send(any4, SocketAddr::new(IpAddr::V4(gw.parse()?), PORT_CLOSED), n, 64))??;
    // a's qdisc holds nothing: every packet out of va is dropped there (a
    // static neighbour, so no ARP is needed first).
    let mb = mac(&pair.b, vb)?;
    pair.a.ip(&["neigh", "replace", &pair.b4, "lladdr", &mb, "dev", va, "nud", "permanent"])?;
    // (It stays, and the clsact qdisc too: their counts go with them, and
    // sonde reads them after the run; the namespaces go at the end.)
    pair.a.exec(&["tc", "qdisc", "replace", "dev", va, "root", "pfifo", "limit", "0"])?;
    pair.a.run(|| udp_send(any4, SocketAddr::new(IpAddr::V4(b4), PORT_QDISC), n, 64))??;
    // Let the last packets through the stack.
    thread::sleep(Duration::from_millis(200));
    drop(socks);
    let _ = (a6, va);
    Ok(())
}

/// `sonde lab drops`.
pub fn run(a: &DropsLabArgs) -> anyhow::Result<i32> {
    if a.packets == 0 || a.packets > 100_000 {
        return Err(crate::engine::error::usage("--packets must be 1 to 100000"));
    }
    features::require_tracing_privileges()?;
    super::netns::require_tools(&["ip", "nft", "tc"])?;
    let pair = Pair::new()?;
    eprintln!(
        "lab: namespaces {} and {} ({} / {}): {} packets for each of ten kinds of drop",
        pair.a.name, pair.b.name, pair.net4, pair.net6, a.packets
    );
    let ctl = RunControl::new(None)?;
    let mut argv = vec!["--netns", &pair.a.name, "--netns", &pair.b.name];
    if !a.events {
        argv.push("--count");
    }
    let dargs: DropsArgs = cli::parse("drops", argv)?;
    let out = thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (pair, ctl) = (&pair, &ctl);
        let work = s.spawn(move || -> anyhow::Result<()> {
            if rx.recv().is_err() {
                anyhow::bail!("tracing did not start");
            }
            let r = workload(pair, a.packets);
            ctl.request_stop();
            r
        });
        let out = run_with(&dargs, ctl, |_| {
            let _ = tx.send(());
        });
        ctl.request_stop();
        work.join().map_err(|_| anyhow::anyhow!("workload panicked"))??;
        out
    })?;
    let bad = out.relations.iter().filter(|r| !r.holds()).count();
    if bad > 0 {
        eprintln!("lab: {bad} relation(s) did not hold");
        return Ok(1);
    }
    Ok(out.stop.exit_code())
}
