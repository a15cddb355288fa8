//! Who holds which socket or pipe, and which socket is whose peer: one walk
//! of `/proc/*/fd`, and the kernel's exact socket lookup (sock_diag netlink)
//! in each network namespace.
//!
//! Everything here comes from procfs and the kernel, which the traced
//! processes cannot redirect: descriptors are read with `readlink` (never
//! followed), and only a process's pid and its name (as `ps` shows them)
//! come out. Each walk is bounded in descriptors, lookups and time, and
//! says when it stopped early.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// What a descriptor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `socket:[INODE]`
    Socket,
    /// `pipe:[INODE]`
    Pipe,
    /// A named FIFO (the link is its path): by its file system's device
    /// (the kernel's number, major << 20 | minor, as its mount shows it)
    /// and its inode.
    Fifo {
        /// The device of the FIFO's file system.
        dev: u64,
    },
}

/// A process holding a socket or pipe open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process id (in sonde's pid namespace).
    pub pid: u32,
    /// Its name (`/proc/PID/comm`).
    pub comm: String,
    /// Whether its descriptor can write (a pipe's write end); read from
    /// `fdinfo` for pipes only (sockets: true).
    pub writes: bool,
    /// Whether its descriptor can read (see `writes`).
    pub reads: bool,
}

/// The result of one walk.
#[derive(Debug, Default)]
pub struct Held {
    /// Holders of each wanted inode, one per process (at most
    /// [`MAX_HOLDERS`]).
    pub by_inode: HashMap<(Kind, u64), Vec<Holder>>,
    /// Whether every process's descriptors were read (false: the bounds
    /// below stopped the walk).
    pub complete: bool,
}

/// Descriptors read at most in one walk.
pub const MAX_FDS: usize = 2_000_000;
/// Processes kept per inode (the first found).
pub const MAX_HOLDERS: usize = 256;
/// Wall time one walk may take.
pub const MAX_TIME: Duration = Duration::from_secs(3);

/// The numeric entries of /proc.
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// What a descriptor's link names, `socket:[123]` or `pipe:[123]`.
pub fn parse_link(t: &str) -> Option<(Kind, u64)> {
    let (kind, rest) = if let Some(r) = t.strip_prefix("socket:[") {
        (Kind::Socket, r)
    } else {
        (Kind::Pipe, t.strip_prefix("pipe:[")?)
    };
    Some((kind, rest.strip_suffix(']')?.parse().ok()?))
}

/// The access mode of descriptor `fd` of `pid` (its `fdinfo` flags):
/// (reads, writes).
fn access(pid: u32, fd: &str) -> (bool, bool) {
    fdinfo(pid, fd).map_or((false, false), |i| rw(i.flags.unwrap_or(0)))
}

/// Most bytes of a process's mountinfo read.
const MAX_MOUNTINFO: u64 = 4 << 20;

/// The kernel's device number (major << 20 | minor) of each mount's file
/// system, by mount id, as `/proc/PID/mountinfo` lists them (at most
/// [`MAX_MOUNTINFO`] bytes of it).
fn mount_devs(pid: u32) -> HashMap<u64, u64> {
    use std::io::Read;
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/mountinfo")) {
        let _ = f.take(MAX_MOUNTINFO).read_to_string(&mut text);
    }
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let id: u64 = f.next()?.parse().ok()?;
            let (ma, mi) = f.nth(1)?.split_once(':')?;
            Some((id, (ma.parse::<u64>().ok()? << 20) | mi.parse::<u64>().ok()?))
        })
        .collect()
}

/// What `/proc/PID/fdinfo/FD` says of a descriptor.
struct FdInfo {
    /// Its open flags.
    flags: Option<u32>,
    /// Its mount's id.
    mnt_id: Option<u64>,
    /// Its inode's number (from Linux 5.14).
    ino: Option<u64>,
}

/// `/proc/PID/fdinfo/FD`, None when it cannot be read.
fn fdinfo(pid: u32, fd: &str) -> Option<FdInfo> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    let field = |k: &str| s.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
    Some(FdInfo {
        flags: field("flags:").and_then(|v| u32::from_str_radix(v, 8).ok()),
        mnt_id: field("mnt_id:").and_then(|v| v.parse().ok()),
        ino: field("ino:").and_then(|v| v.parse().ok()),
    })
}

/// The kernel's number of a device (major << 20 | minor, as its inodes'
/// superblocks and mountinfo give it) from `st_dev` as `stat` gives it.
pub fn kernel_dev(st_dev: u64) -> u64 {
    (u64::from(libc::major(st_dev)) << 20) | u64::from(libc::minor(st_dev))
}

/// Reads and writes of open flags `flags`.
fn rw(flags: u32) -> (bool, bool) {
    match flags & 3 {
        0 => (true, false),
        1 => (false, true),
        _ => (true, true),
    }
}

/// Mount namespaces whose mounts one walk keeps at most.
const MAX_MOUNT_NS: usize = 4096;

/// What descriptor `fd` of `pid`, whose link names a path, is when it may
/// be one of the named FIFOs on the devices `devs` (the kernel's numbers),
/// given its process's mounts (`mounts`: mount id to device): its mount's
/// device, then its inode's number from its fdinfo; and its (reads,
/// writes). No file system is asked anything for a descriptor on another
/// device (a hung network mount cannot stop the walk), and none at all
/// where fdinfo gives the inode; an older kernel's is read with `stat` of
/// the descriptor itself (procfs hands over the open file; no path in the
/// process's reach is walked).
fn fifo_of(pid: u32, fd: &str, devs: &HashSet<u64>, mounts: &HashMap<u64, u64>) -> Option<((Kind, u64), (bool, bool))> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let FdInfo { flags, mnt_id, ino } = fdinfo(pid, fd)?;
    let (flags, dev) = (flags?, *mounts.get(&mnt_id?)?);
    if !devs.contains(&dev) {
        return None;
    }
    let ino = match ino {
        Some(i) => i,
        None => {
            let m = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
            if !m.file_type().is_fifo() {
                return None;
            }
            m.ino()
        }
    };
    Some(((Kind::Fifo { dev }, ino), rw(flags)))
}

/// Walks every process's descriptors for the inodes `want` accepts, up to
/// `max_inodes` of them, within [`MAX_FDS`] descriptors and [`MAX_TIME`].
/// `fifo_devs`: the devices (the kernel's numbers) of the named FIFOs
/// wanted too (see [`fifo_of`]).
pub fn holders(want: impl Fn(Kind, u64) -> bool, fifo_devs: &HashSet<u64>, max_inodes: usize) -> Held {
    let t0 = Instant::now();
    let mut out = Held { complete: true, ..Default::default() };
    let mut fds_read = 0usize;
    let mut mounts: HashMap<String, HashMap<u64, u64>> = HashMap::new();
    'procs: for pid in pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        let mut comm: Option<String> = None;
        // Its mount namespace, once it has a descriptor naming a path.
        let mut ns: Option<Option<String>> = None;
        for fd in fds.flatten() {
            fds_read += 1;
            if fds_read > MAX_FDS || (fds_read % 4096 == 0 && t0.elapsed() > MAX_TIME) {
                out.complete = false;
                break 'procs;
            }
            // readlink on /proc/PID/fd/N names the object; nothing is followed.
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let name = fd.file_name().to_string_lossy().into_owned();
            let (kind, ino, fifo_rw) = match target.to_str().and_then(parse_link) {
                Some((k, i)) => (k, i, None),
                None if !fifo_devs.is_empty() && target.as_os_str().as_encoded_bytes().first() == Some(&b'/') => {
                    let ns = ns.get_or_insert_with(|| {
                        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok().map(|l| l.to_string_lossy().into_owned())
                    });
                    let Some(ns) = ns.as_ref() else { continue };
                    if !mounts.contains_key(ns) {
                        if mounts.len() >= MAX_MOUNT_NS {
                            out.complete = false;
                            break 'procs;
                        }
                        mounts.insert(ns.clone(), mount_devs(pid));
                    }
                    let Some(((k, i), a)) = fifo_of(pid, &name, fifo_devs, &mounts[ns]) else { continue };
                    (k, i, Some(a))
                }
                None => continue,
            };
            if !want(kind, ino) {
                continue;
            }
            let (reads, writes) = match (kind, fifo_rw) {
                (_, Some(a)) => a,
                (Kind::Pipe | Kind::Fifo { .. }, None) => access(pid, &name),
                (Kind::Socket, None) => (true, true),
            };
            let comm = comm
                .get_or_insert_with(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string()
                })
                .clone();
            let new = !out.by_inode.contains_key(&(kind, ino));
            if new && out.by_inode.len() >= max_inodes {
                out.complete = false;
                break 'procs;
            }
            let v = out.by_inode.entry((kind, ino)).or_default();
            let full = v.len() >= MAX_HOLDERS;
            match v.iter_mut().find(|h| h.pid == pid) {
                Some(h) => {
                    h.reads |= reads;
                    h.writes |= writes;
                }
                None if !full => v.push(Holder { pid, comm, writes, reads }),
                None => {}
            }
        }
    }
    out
}

/// A connected socket's endpoints: local address and port, remote address
/// and port (IPv4-mapped IPv6 addresses as IPv4).
pub type Tuple = (IpAddr, u16, IpAddr, u16);

/// The inode of each socket whose endpoints `want` holds, per network
/// namespace (by its inode), TCP (`udp`: UDP) sockets, asked of every
/// namespace a process is in: one exact lookup per socket and namespace
/// over sock_diag netlink (a hash lookup in the kernel; reading
/// /proc/net/tcp walks every bucket of the table, 7 ms here for 3 sockets).
/// At most [`MAX_LOOKUPS`] lookups and [`MAX_TIME`] per call; the bool says
/// whether every namespace was asked.
pub fn sockets_by_tuple(want: &HashSet<Tuple>, udp: bool) -> (HashMap<Tuple, Vec<SocketAt>>, bool) {
    let mut out: HashMap<Tuple, Vec<SocketAt>> = HashMap::new();
    if want.is_empty() {
        return (out, true);
    }
    let t0 = Instant::now();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut budget = MAX_LOOKUPS;
    use std::os::unix::fs::MetadataExt;
    for pid in pids() {
        if budget < want.len() || t0.elapsed() > MAX_TIME {
            return (out, false);
        }
        // The namespace the opened file names (a pid reused between a stat
        // of the path and its open would name another).
        let Ok(file) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else { continue };
        let Ok(ns) = file.metadata().map(|m| m.ino()) else { continue };
        if !seen.insert(ns) {
            continue;
        }
        budget -= want.len();
        let found = crate::engine::mib::run_in(&file, &ns.to_string(), || -> Vec<(Tuple, (u64, bool))> {
            let Some(sock) = diag_socket() else { return Vec::new() };
            let mut seq = 0u32;
            want.iter()
                .take_while(|_| t0.elapsed() <= MAX_TIME)
                .filter_map(|t| Some((*t, diag_one(&sock, &mut seq, *t, udp)?)))
                .collect()
        });
        for (t, (ino, unaccepted)) in found.unwrap_or_default() {
            out.entry(t).or_default().push(SocketAt { ns, ino, unaccepted });
        }
    }
    let done = t0.elapsed() <= MAX_TIME;
    (out, done)
}

/// A socket [`sockets_by_tuple`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAt {
    /// Its network namespace (inode).
    pub ns: u64,
    /// Its inode; for a connection not yet accepted (no file, inode 0), the
    /// inode of the listening socket that holds it.
    pub ino: u64,
    /// Not yet accepted: `ino` is its listener's.
    pub unaccepted: bool,
}

/// Lookups one [`sockets_by_tuple`] call makes at most.
pub const MAX_LOOKUPS: usize = 100_000;

/// A sock_diag socket in the calling thread's network namespace, answers
/// awaited at most 100 ms.
fn diag_socket() -> Option<netlink_sys::Socket> {
    let mut s = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_SOCK_DIAG).ok()?;
    s.bind_auto().ok()?;
    s.connect(&netlink_sys::SocketAddr::new(0, 0)).ok()?;
    socket2::SockRef::from(&s).set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    Some(s)
}

/// The inode of the socket with endpoints `t` in the calling thread's
/// namespace (an IPv4 one also as an IPv4-mapped IPv6 socket's), and
/// whether it is a TCP connection not yet accepted: it has no inode of its
/// own then, and the inode is its listener's (the socket listening on its
/// local address and port). Each request carries its own sequence number
/// (`seq`), and a reply to another (one that came after its wait ran out)
/// is passed over.
fn diag_one(sock: &netlink_sys::Socket, seq: &mut u32, t: Tuple, udp: bool) -> Option<(u64, bool)> {
    match diag_ask(sock, seq, t, udp, true)? {
        (0, state) if !udp && matches!(state, TCP_ESTABLISHED | TCP_SYN_RECV | TCP_CLOSE_WAIT) => {
            // In its listener's queue. The kernel's lookup of a remote end
            // no socket has falls back to the listener on the local address
            // and port.
            // Only a listener alone on that port: with several (SO_REUSEPORT
            // workers), the one the kernel's lookup picks need not be the
            // one holding the connection.
            let (la, lp, ra, _) = t;
            if diag_listeners(sock, seq, la, lp)? > 1 {
                return None;
            }
            let none = if ra.is_ipv4() { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) };
            diag_ask(sock, seq, (la, lp, none, 0), udp, false).filter(|(i, _)| *i != 0).map(|(i, _)| (i, true))
        }
        (0, _) => None,
        (ino, _) => Some((ino, false)),
    }
}

/// Sends sock_diag request `req` with netlink `flags`, under the next
/// sequence number (`seq`).
fn send_request(
    sock: &netlink_sys::Socket,
    seq: &mut u32,
    req: netlink_packet_sock_diag::inet::InetRequest,
    flags: u16,
) -> Option<()> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage};
    use netlink_packet_sock_diag::SockDiagMessage;
    *seq = seq.wrapping_add(1);
    let mut packet = NetlinkMessage::new(NetlinkHeader::default(), SockDiagMessage::InetRequest(req).into());
    packet.header.flags = flags;
    packet.header.sequence_number = *seq;
    packet.finalize();
    let mut buf = vec![0; packet.header.length as usize];
    packet.serialize(&mut buf[..]);
    sock.send(&buf[..], 0).ok().map(|_| ())
}

/// How many TCP sockets listen on port `lp` of address `la` (or of every
/// address) in the calling thread's namespace: a dump of the listeners,
/// read for at most 64 replies; None where it could not be read.
fn diag_listeners(sock: &netlink_sys::Socket, seq: &mut u32, la: IpAddr, lp: u16) -> Option<usize> {
    use netlink_packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    let mut inodes: HashSet<u32> = HashSet::new();
    for family in [AF_INET, AF_INET6] {
        let req = InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::LISTEN,
            socket_id: if family == AF_INET { SocketId::new_v4() } else { SocketId::new_v6() },
        };
        send_request(sock, seq, req, NLM_F_REQUEST | NLM_F_DUMP)?;
        let mut rx = vec![0u8; 65536];
        let mut done = false;
        for _ in 0..64 {
            let n = sock.recv(&mut &mut rx[..], 0).ok()?;
            let mut at = 0;
            while at + 16 <= n {
                let len = NetlinkBuffer::new_checked(&rx[at..n]).ok()?.length() as usize;
                if len < 16 || at + len > n {
                    break;
                }
                let m: NetlinkMessage<SockDiagMessage> = NetlinkMessage::deserialize(&rx[at..at + len]).ok()?;
                at += (len + 3) & !3;
                if m.header.sequence_number != *seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        let id = &r.header.socket_id;
                        let a = id.source_address.to_canonical();
                        if id.source_port == lp && (a == la.to_canonical() || a.is_unspecified()) {
                            inodes.insert(r.header.inode);
                        }
                    }
                    NetlinkPayload::Done(_) | NetlinkPayload::Error(_) => done = true,
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        if !done {
            return None;
        }
    }
    Some(inodes.len())
}

/// TCP states (include/net/tcp_states.h).
const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_RECV: u8 = 3;
const TCP_CLOSE_WAIT: u8 = 8;
const TCP_LISTEN: u8 = 10;

/// One sock_diag lookup of endpoints `t`: the inode of the socket found
/// (0: one with no file) and its state, only one with exactly these
/// endpoints when `exact`, else the listener the kernel's lookup falls
/// back to.
fn diag_ask(
    sock: &netlink_sys::Socket,
    seq: &mut u32,
    (la, lp, ra, rp): Tuple,
    udp: bool,
    exact: bool,
) -> Option<(u64, u8)> {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    let v6 = |a: IpAddr| match a {
        IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
        a => a,
    };
    let mut asks = vec![(AF_INET6, v6(la), v6(ra))];
    if la.is_ipv4() && ra.is_ipv4() {
        asks.insert(0, (AF_INET, la, ra));
    }
    for (family, local, remote) in asks {
        // TCP's exact lookup takes the socket's own end as the source;
        // UDP's (udp_dump_one) takes it as the destination.
        let ((sa, sp), (da, dp)) = if udp { ((remote, rp), (local, lp)) } else { ((local, lp), (remote, rp)) };
        let req = InetRequest {
            family,
            protocol: if udp { IPPROTO_UDP } else { IPPROTO_TCP },
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: sp,
                destination_port: dp,
                source_address: sa,
                destination_address: da,
                interface_id: 0,
                cookie: [0xff; 8], // none: any socket with these endpoints
            },
        };
        send_request(sock, seq, req, NLM_F_REQUEST)?;
        let mut rx = vec![0u8; 8192];
        // Its reply, past any late reply to an earlier request.
        let m = (0..8).find_map(|_| {
            let n = sock.recv(&mut &mut rx[..], 0).ok()?;
            let m: NetlinkMessage<SockDiagMessage> = NetlinkMessage::deserialize(rx.get(..n)?).ok()?;
            Some((m.header.sequence_number == *seq).then_some(m))
        });
        let Some(Some(m)) = m else { return None };
        // The kernel's lookup falls back to a listening socket on the
        // local address: asked for an exact one, only a socket with exactly
        // these endpoints counts; asked for the listener, only a listener
        // on the local port.
        if let NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) = m.payload {
            let id = &r.header.socket_id;
            let same = id.destination_port == rp
                && id.source_port == lp
                && id.destination_address.to_canonical() == ra.to_canonical()
                && id.source_address.to_canonical() == la.to_canonical();
            let listener = r.header.state == TCP_LISTEN && id.source_port == lp;
            if (exact && same) || (!exact && listener) {
                return Some((u64::from(r.header.inode), r.header.state));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connections_other_end_is_found_by_its_endpoints() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let ino = |fd: i32| std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap().ino();
        let (ca, sa) = (c.local_addr().unwrap(), s.local_addr().unwrap());
        // The client's view, reversed: the server's socket.
        let t: Tuple = (sa.ip(), sa.port(), ca.ip(), ca.port());
        let (found, done) = sockets_by_tuple(&[t].into_iter().collect(), false);
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert!(done);
        let at = |ino, unaccepted| SocketAt { ns: own, ino, unaccepted };
        assert_eq!(found.get(&t), Some(&vec![at(ino(s.as_raw_fd()), false)]), "{found:?}");
        // Not UDP, and no socket with other endpoints (not the listener
        // either, which the kernel's lookup falls back to).
        assert!(sockets_by_tuple(&[t].into_iter().collect(), true).0.is_empty());
        let none: Tuple = (sa.ip(), sa.port(), ca.ip(), ca.port().wrapping_add(1));
        assert!(sockets_by_tuple(&[none].into_iter().collect(), false).0.is_empty());
        // A connected UDP pair: each end found by its own endpoints.
        let (u1, u2) =
            (std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        u1.connect(u2.local_addr().unwrap()).unwrap();
        u2.connect(u1.local_addr().unwrap()).unwrap();
        let (a1, a2) = (u1.local_addr().unwrap(), u2.local_addr().unwrap());
        let t2: Tuple = (a2.ip(), a2.port(), a1.ip(), a1.port());
        let (found, _) = sockets_by_tuple(&[t2].into_iter().collect(), true);
        assert_eq!(found.get(&t2), Some(&vec![at(ino(u2.as_raw_fd()), false)]), "{found:?}");
        assert!(sockets_by_tuple(&[t2].into_iter().collect(), false).0.is_empty());
        // A connection its server has not accepted: it has no inode of its
        // own; its listener's is found, said so.
        let c2 = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let ca2 = c2.local_addr().unwrap();
        let t3: Tuple = (sa.ip(), sa.port(), ca2.ip(), ca2.port());
        let (found, _) = sockets_by_tuple(&[t3].into_iter().collect(), false);
        assert_eq!(found.get(&t3), Some(&vec![at(ino(l.as_raw_fd()), true)]), "{found:?}");
        // Two listeners on one port (SO_REUSEPORT): which holds the
        // connection is not known, and none is named.
        let reuse = || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_reuse_port(true).unwrap();
            s
        };
        let (r1, r2) = (reuse(), reuse());
        r1.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        let port = r1.local_addr().unwrap().as_socket().unwrap();
        r2.bind(&port.into()).unwrap();
        r1.listen(4).unwrap();
        r2.listen(4).unwrap();
        let c3 = std::net::TcpStream::connect(port).unwrap();
        let ca3 = c3.local_addr().unwrap();
        let t4: Tuple = (port.ip(), port.port(), ca3.ip(), ca3.port());
        assert!(sockets_by_tuple(&[t4].into_iter().collect(), false).0.is_empty());
    }

    #[test]
    fn links_parse() {
        assert_eq!(parse_link("socket:[12]"), Some((Kind::Socket, 12)));
        assert_eq!(parse_link("pipe:[7]"), Some((Kind::Pipe, 7)));
        assert_eq!(parse_link("/tmp/x"), None);
        assert_eq!(parse_link("pipe:[7"), None);
    }

    #[test]
    fn a_pipe_is_found_with_its_ends() {
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", fds[0])).unwrap().ino();
        let held = holders(|k, i| k == Kind::Pipe && i == ino, &HashSet::new(), 8);
        let me = std::process::id();
        let h = held.by_inode.get(&(Kind::Pipe, ino)).and_then(|v| v.iter().find(|h| h.pid == me)).cloned();
        // SAFETY: both descriptors are ours.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let h = h.expect("this process holds its pipe");
        assert!(h.reads && h.writes, "{h:?}");
    }

    #[test]
    fn a_named_fifo_is_found_by_device_and_inode_with_its_end() {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let dir = std::env::temp_dir().join(format!("sonde-procfd-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: c is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Its read end (not blocking for a writer).
        let r = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        // The kernel's number of the device (as its mount shows it).
        let dev = kernel_dev(m.dev());
        let (fifo, ino) = (Kind::Fifo { dev }, m.ino());
        let want = |k: Kind, i: u64| k == fifo && i == ino;
        let me = std::process::id();
        let found = holders(want, &[dev].into_iter().collect(), 8);
        let h = found.by_inode.get(&(fifo, ino)).and_then(|v| v.iter().find(|h| h.pid == me)).cloned();
        // Without its device, paths are not looked at; on another device,
        // neither.
        let skipped = holders(want, &HashSet::new(), 8);
        let elsewhere = holders(want, &[dev ^ 1].into_iter().collect(), 8);
        drop(r);
        let _ = std::fs::remove_dir_all(&dir);
        let h = h.expect("this process holds its FIFO");
        assert!(h.reads && !h.writes, "{h:?}");
        assert!(skipped.by_inode.is_empty(), "{:?}", skipped.by_inode);
        assert!(elsewhere.by_inode.is_empty(), "{:?}", elsewhere.by_inode);
    }
}
