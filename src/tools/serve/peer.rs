//! Who is on the other end of a TCP connection to sonde, when it is a socket
//! on this host: one `sock_diag` lookup (what `ss -e` shows as `uid:`) of the
//! client's socket by its exact addresses and ports. Loopback TCP has no
//! `SO_PEERCRED`; the kernel's socket table is the one place that knows.
use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR` (linux/netlink.h).
#[cfg(test)]
const NLMSG_ERROR: u16 = 2;
/// Offset of `idiag_uid` in `struct inet_diag_msg`: family, state, timer,
/// retrans (4 bytes), the socket id (48), expires, rqueue, wqueue (12).
const UID_OFFSET: usize = 4 + 48 + 12;
/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;

/// The uid owning the client socket of the connection `peer` -> `local`,
/// or `None` when no socket on this host (in sonde's network namespace) is
/// that client: a remote peer, or one gone since.
pub fn local_peer_uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    // A dual-stack listener sees an IPv4 client as ::ffff:a.b.c.d; the
    // client's own socket is IPv4.
    let unmap = |a: IpAddr| match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(a),
        v4 => v4,
    };
    let (src, dst) = (unmap(peer.ip()), unmap(local.ip()));
    let family = match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return Ok(None),
    };
    let req = request(family as u8, src, peer.port(), dst, local.port());
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new socket nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = socket2::SockRef::from(&sock).set_read_timeout(Some(std::time::Duration::from_secs(1)));
    // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: req and kernel outlive the call; lengths are theirs.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 1024];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(parse_reply(&buf[..n as usize]))
}

/// An exact-match `inet_diag_req_v2` for one TCP socket, in a netlink message.
fn request(family: u8, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    let mut m = Vec::with_capacity(72);
    m.extend_from_slice(&72u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid
    m.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state
    m.extend_from_slice(&sport.to_be_bytes());
    m.extend_from_slice(&dport.to_be_bytes());
    for a in [src, dst] {
        let mut b = [0u8; 16];
        match a {
            IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => b = v6.octets(),
        }
        m.extend_from_slice(&b);
    }
    m.extend_from_slice(&0u32.to_ne_bytes()); // interface: any
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    debug_assert_eq!(m.len(), 72);
    m
}

/// The uid in a reply, or `None` for an error reply (`NLMSG_ERROR`;
/// ENOENT: no such socket) or one too short to hold it.
fn parse_reply(r: &[u8]) -> Option<u32> {
    let ty = u16::from_ne_bytes(r.get(4..6)?.try_into().ok()?);
    if ty != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let at = NLMSG_HDR + UID_OFFSET;
    Some(u32::from_ne_bytes(r.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn finds_the_uid_of_a_loopback_client_and_nothing_for_an_unknown_one() {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = TcpListener::bind(bind) else { continue };
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, peer) = l.accept().unwrap();
            assert_eq!(peer, c.local_addr().unwrap());
            assert_eq!(local_peer_uid(s.local_addr().unwrap(), peer).unwrap(), Some(me), "{bind}");
            // A port nobody uses on that address: no socket, no uid.
            let mut gone = peer;
            gone.set_port(if peer.port() == 1 { 2 } else { 1 });
            assert_eq!(local_peer_uid(s.local_addr().unwrap(), gone).unwrap(), None, "{bind}");
        }
    }

    #[test]
    fn a_dual_stack_listener_finds_its_ipv4_client() {
        let Ok(l) = TcpListener::bind("[::]:0") else { return };
        let port = l.local_addr().unwrap().port();
        let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert!(matches!(peer.ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()), "{peer}");
        // SAFETY: geteuid cannot fail.
        assert_eq!(local_peer_uid(s.local_addr().unwrap(), peer).unwrap(), Some(unsafe { libc::geteuid() }));
    }

    #[test]
    fn error_and_short_replies_name_no_uid() {
        let mut err = vec![0u8; 36];
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert_eq!(parse_reply(&err), None);
        let mut short = vec![0u8; 40];
        short[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert_eq!(parse_reply(&short), None);
        assert_eq!(parse_reply(&[]), None);
    }
}
