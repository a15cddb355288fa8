//! Real TCP traffic for labs and tests: bulk transfers, request/response
//! exchanges and connection attempts, each bounded in bytes and time.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::netns::Netns;

/// Threads that run until this is dropped: each polls the shared stop flag;
/// dropping sets it and joins them all (the labs' responders, clients and
/// connection churn).
#[derive(Default)]
pub struct Workers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<anyhow::Result<()>>>,
}

impl Workers {
    /// The flag the threads poll.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Adds a thread that polls `stop_flag()`.
    pub fn add(&mut self, t: JoinHandle<anyhow::Result<()>>) {
        self.threads.push(t);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A server thread in a namespace; stops when dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    handle: Option<JoinHandle<anyhow::Result<anyhow::Result<()>>>>,
}

/// What a server does with each connection.
#[derive(Clone, Copy)]
pub enum Mode {
    /// Read until EOF, then close.
    Sink,
    /// For each `req`-byte request, answer `resp` bytes.
    Echo {
        /// Request size in bytes.
        req: usize,
        /// Response size in bytes.
        resp: usize,
    },
}

impl Server {
    /// Listens on `addr` inside `ns`.
    pub fn start(ns: &Netns, addr: SocketAddr, mode: Mode) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let st = stop.clone();
        let handle = ns.spawn(move || -> anyhow::Result<()> {
            let l = match TcpListener::bind(addr) {
                Ok(l) => {
                    tx.send(Ok(())).ok();
                    l
                }
                Err(e) => {
                    tx.send(Err(e)).ok();
                    return Ok(());
                }
            };
            l.set_nonblocking(true)?;
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false)?;
                        std::thread::spawn(move || serve(s, mode));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            Ok(())
        });
        rx.recv()??;
        Ok(Self { stop, addr, handle: Some(handle) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn serve(mut s: TcpStream, mode: Mode) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    match mode {
        Mode::Sink => {
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
        }
        Mode::Echo { req, resp } => {
            let _ = s.set_nodelay(true);
            let mut rbuf = vec![0u8; req];
            let wbuf = vec![b'r'; resp];
            while s.read_exact(&mut rbuf).is_ok() {
                if s.write_all(&wbuf).is_err() {
                    break;
                }
            }
        }
    }
}

/// Sends `bytes` to a sink server, then closes and waits for the peer's close.
pub fn bulk(ns: &Netns, to: SocketAddr, bytes: usize) -> anyhow::Result<()> {
    ns.run(move || -> anyhow::Result<()> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        s.set_write_timeout(Some(Duration::from_secs(60)))?;
        let chunk = vec![b'x'; 1 << 16];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n])?;
            left -= n;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut b = [0u8; 16];
        let _ = s.read(&mut b);
        Ok(())
    })?
}

/// `count` request/response exchanges on one connection, `gap` apart.
pub fn request_response(
    ns: &Netns,
    to: SocketAddr,
    count: usize,
    req: usize,
    resp: usize,
    gap: Duration,
) -> anyhow::Result<()> {
    ns.run(move || -> anyhow::Result<()> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let q = vec![b'q'; req];
        let mut r = vec![0u8; resp];
        for _ in 0..count {
            s.write_all(&q)?;
            s.read_exact(&mut r)?;
            std::thread::sleep(gap);
        }
        Ok(())
    })?
}

/// Starts a non-blocking connect and keeps the socket for `hold`, then closes
/// it: with SYNs (or SYN-ACKs) dropped, the kernel retransmits meanwhile.
/// Returns whether the connection was established by then.
pub fn connect_attempt(ns: &Netns, to: SocketAddr, hold: Duration) -> anyhow::Result<bool> {
    ns.run(move || -> anyhow::Result<bool> {
        let domain = if to.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        // CLOEXEC: a process spawned meanwhile (a test's workload) must not hold it.
        // SAFETY: socket takes no pointers; the fd is closed below.
        let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        anyhow::ensure!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let (sa, len) = sockaddr(&to);
        // SAFETY: sa is a sockaddr of length len (sockaddr() builds both).
        unsafe { libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) };
        let deadline = Instant::now() + hold;
        let mut connected = false;
        while Instant::now() < deadline {
            let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            let ms = deadline.saturating_duration_since(Instant::now()).as_millis() as i32;
            // SAFETY: pfd is one valid pollfd, as the count says.
            if unsafe { libc::poll(&mut pfd, 1, ms.max(1)) } > 0 {
                let mut err: libc::c_int = 0;
                let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: err and l are valid out-parameters of the sizes passed.
                unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut err as *mut _ as *mut _, &mut l) };
                connected = err == 0;
                break;
            }
        }
        if connected {
            // Stay for the rest of the hold so the listener side finishes too.
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        Ok(connected)
    })?
}

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as _,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>() as _)
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as _,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as _)
        }
    }
}
