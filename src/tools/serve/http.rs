//! serve's HTTP/1.1 server: hyper, on a current-thread tokio runtime on one
//! thread of its own, with TLS by tokio-rustls. hyper reads and checks the
//! requests (a parser fuzzed and deployed far beyond this project); around
//! it this module keeps what a daemon holding BPF privileges needs: a cap on
//! the request head ([`MAX_HEAD`], [`MAX_HEADERS`]), deadlines on every read
//! and write, at most [`MAX_CONNECTIONS`] connections, no request bodies,
//! GET and HEAD only, and a handler that panics costs one 500.
//!
//! Handlers are plain functions and may block (a profile pull runs for its
//! whole duration): each request runs on tokio's blocking pool, so a slow
//! handler never holds up another connection.
//!
//! With a [`WebConfig`] it adds TLS, basic auth, the configured response
//! headers and the rate limit. Besides TCP it listens on a Unix socket
//! (`unix:/run/sonde.sock`, mode 0600), whose clients it knows by their
//! credentials (`SO_PEERCRED`).
use std::{
    collections::HashMap,
    convert::Infallible,
    fmt, fs,
    future::Future,
    io,
    net::{SocketAddr, ToSocketAddrs},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::fs::{FileTypeExt, MetadataExt},
    },
    path::{Path, PathBuf},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    task::{Context, Poll},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, header, server::conn::http1, service::service_fn, Method, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
    sync::{watch, Notify, OwnedSemaphorePermit, Semaphore},
    time::{sleep, sleep_until, timeout, timeout_at, Sleep},
};
use tokio_rustls::TlsAcceptor;

use super::webconfig::{Auth, WebConfig};
use crate::engine::error::{env, usage};

/// Bytes of request line plus headers accepted; more gets 431.
pub const MAX_HEAD: usize = 8 * 1024;
/// Header lines accepted; more gets 431.
pub const MAX_HEADERS: usize = 100;
/// Connections served at once; the next ones wait up to a second for one to
/// end, then get 503 and are closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a whole request head (TLS handshake included),
/// and that a kept-alive connection may stay idle.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to take the rest of a response once it stops reading.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections above [`MAX_CONNECTIONS`] that wait (up to [`BUSY_TIMEOUT`])
/// for a slot or are answered 503; beyond, they are closed unanswered.
const MAX_BUSY: usize = 16;
const BUSY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_millis(500);
/// Requests served on one kept-alive connection before it is closed.
const MAX_REQUESTS_PER_CONNECTION: usize = 1000;
/// How long the server waits after a failed accept (out of descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_millis(200);
/// How long the server waits, once stopped, for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// Who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Over TCP.
    Tcp {
        /// The client's address.
        peer: SocketAddr,
        /// The address it reached (ours).
        local: SocketAddr,
    },
    /// Over the Unix socket, with the client process's credentials as the
    /// kernel gave them when it connected (`SO_PEERCRED`).
    Unix {
        /// Its user.
        uid: u32,
        /// Its process (0 when the kernel gave none).
        pid: i32,
    },
}

/// A GET or HEAD request that passed every check.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET` or `HEAD` (a HEAD response's body is dropped by the server).
    pub method: String,
    /// The percent-decoded path, e.g. `/metrics`.
    pub path: String,
    /// The percent-decoded query pairs, in order (`+` is a space).
    pub query: Vec<(String, String)>,
    /// Who sent it.
    pub client: Client,
    /// The basic-auth user, when the web config requires one.
    pub user: Option<String>,
}

impl Request {
    /// The first value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A response; the server adds `Content-Length`, `Date` and `Connection`.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code, e.g. 200.
    pub status: u16,
    /// Headers besides the ones the server adds.
    pub headers: Vec<(String, String)>,
    /// The body (not sent for HEAD).
    pub body: Vec<u8>,
}

impl Response {
    /// A `text/plain; charset=utf-8` response.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self::bytes(status, "text/plain; charset=utf-8", body.into().into_bytes())
    }

    /// A response with the given content type.
    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Self {
        Response { status, headers: vec![("Content-Type".into(), content_type.into())], body }
    }

    /// Sets header `k` (replacing a header of the same name, in any case).
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.retain(|(name, _)| !name.eq_ignore_ascii_case(k));
        self.headers.push((k.into(), v.into()));
        self
    }
}

/// What serves requests; called on a thread of the blocking pool.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Why a request or connection was refused (the `reason` label of a
/// rejected-requests metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Over [`MAX_CONNECTIONS`] for a second (or over [`MAX_BUSY`] more): 503.
    Busy,
    /// No complete request head within [`HEAD_TIMEOUT`], or a response not
    /// taken within [`WRITE_TIMEOUT`].
    Timeout,
    /// Not HTTP/1.0 or 1.1 as RFC 9112 writes it: 400.
    BadRequest,
    /// Head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] lines: 431.
    HeaderTooLarge,
    /// Neither GET nor HEAD: 405.
    Method,
    /// A request with a body: 413.
    Body,
    /// Basic auth missing or wrong: 401.
    Unauthorized,
    /// Over the web config's `rate_limit`: 429.
    RateLimited,
    /// TLS handshake failed, or plain HTTP sent to the TLS port.
    Tls,
    /// The handler panicked or returned an invalid header: 500.
    HandlerError,
}

impl Reject {
    /// Every reason, in the order of [`HttpStats::rejected`].
    pub const ALL: [Reject; 10] = [
        Reject::Busy,
        Reject::Timeout,
        Reject::BadRequest,
        Reject::HeaderTooLarge,
        Reject::Method,
        Reject::Body,
        Reject::Unauthorized,
        Reject::RateLimited,
        Reject::Tls,
        Reject::HandlerError,
    ];

    /// A label value: `busy`, `timeout`, `bad_request`, ...
    pub fn name(self) -> &'static str {
        match self {
            Reject::Busy => "busy",
            Reject::Timeout => "timeout",
            Reject::BadRequest => "bad_request",
            Reject::HeaderTooLarge => "header_too_large",
            Reject::Method => "method",
            Reject::Body => "body",
            Reject::Unauthorized => "unauthorized",
            Reject::RateLimited => "rate_limited",
            Reject::Tls => "tls",
            Reject::HandlerError => "handler_error",
        }
    }

    fn status(self) -> u16 {
        match self {
            Reject::Busy => 503,
            Reject::Timeout => 408,
            Reject::BadRequest | Reject::Tls => 400,
            Reject::HeaderTooLarge => 431,
            Reject::Method => 405,
            Reject::Body => 413,
            Reject::Unauthorized => 401,
            Reject::RateLimited => 429,
            Reject::HandlerError => 500,
        }
    }

    /// The response sent for this reason.
    fn response(self, detail: &str) -> Response {
        let status = self.status();
        let phrase = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
        let r = Response::text(status, format!("{phrase}: {detail}\n"));
        match self {
            Reject::Busy | Reject::RateLimited => r.header("Retry-After", "1"),
            Reject::Method => r.header("Allow", "GET, HEAD"),
            Reject::Unauthorized => r.header("WWW-Authenticate", "Basic realm=\"sonde\""),
            _ => r,
        }
    }
}

/// The server's counters, shared with whoever exports them.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Connections accepted (including those refused as busy).
    pub connections: AtomicU64,
    /// Connections being served now.
    pub open: AtomicU64,
    /// Requests passed to the handler.
    pub requests: AtomicU64,
    rejected: [AtomicU64; Reject::ALL.len()],
}

impl HttpStats {
    /// Requests or connections refused for `reason` so far.
    pub fn rejected(&self, reason: Reject) -> u64 {
        self.rejected[reason as usize].load(Relaxed)
    }

    fn reject(&self, reason: Reject) {
        self.rejected[reason as usize].fetch_add(1, Relaxed);
    }
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP address (the port the kernel picked, for port 0).
    Tcp(SocketAddr),
    /// A Unix socket's path.
    Unix(PathBuf),
}

impl Endpoint {
    /// Whether only this host can reach it (loopback or a Unix socket).
    pub fn is_local(&self) -> bool {
        match self {
            Endpoint::Tcp(a) => a.ip().is_loopback(),
            Endpoint::Unix(_) => true,
        }
    }

    /// How a user reaches it: `http://127.0.0.1:9632` or
    /// `unix:/run/sonde.sock (http)`.
    pub fn url(&self, scheme: &str) -> String {
        match self {
            Endpoint::Tcp(a) => format!("{scheme}://{a}"),
            Endpoint::Unix(p) => format!("unix:{} ({scheme})", p.display()),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

enum Listener {
    Tcp(std::net::TcpListener),
    /// The listener, its path and the socket file's (device, inode), to
    /// remove that file at the end only if it is still ours.
    Unix(std::os::unix::net::UnixListener, PathBuf, (u64, u64)),
}

/// A bound listener, not yet serving.
pub struct Server {
    listener: Listener,
    web: Option<Arc<WebConfig>>,
    stats: Arc<HttpStats>,
}

impl Server {
    /// Binds now (so "address in use" is reported before anything is
    /// loaded): a usage or environment error (exit 2) naming the address and
    /// the fix. `addr` is `HOST:PORT`, `[V6]:PORT`, `:PORT` (all IPv4
    /// addresses, as Go's `:9100`) or `unix:/PATH`.
    pub fn bind(addr: &str, web: Option<WebConfig>) -> Result<Server> {
        let listener = match addr.strip_prefix("unix:") {
            Some(path) => bind_unix(addr, Path::new(path))?,
            None => Listener::Tcp(bind_tcp(addr)?),
        };
        Ok(Server { listener, web: web.map(Arc::new), stats: Arc::default() })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Endpoint {
        match &self.listener {
            Listener::Tcp(l) => Endpoint::Tcp(l.local_addr().expect("a bound listener has an address")),
            Listener::Unix(_, path, _) => Endpoint::Unix(path.clone()),
        }
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.web.as_ref().is_some_and(|w| w.tls()) {
            "https"
        } else {
            "http"
        }
    }

    /// The counters, to export as metrics; they keep counting after spawn.
    pub fn stats(&self) -> Arc<HttpStats> {
        self.stats.clone()
    }

    /// Serves on a thread of its own until [`Running::stop`].
    pub fn spawn(self, handler: Handler) -> Running {
        let tls = self.web.as_ref().and_then(|w| w.tls_config());
        let ctx = Arc::new(Ctx {
            handler,
            web: self.web,
            tls: tls.map(TlsAcceptor::from),
            stats: self.stats,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            waiting: AtomicUsize::new(0),
            live: Mutex::default(),
            next_id: AtomicU64::new(0),
        });
        let listener = self.listener;
        let (stop, stopped) = watch::channel(false);
        let thread = thread::Builder::new()
            .name("sonde-http".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .max_blocking_threads(MAX_CONNECTIONS + MAX_BUSY)
                    .thread_name("sonde-http")
                    .build();
                let Ok(runtime) = runtime else {
                    eprintln!("sonde serve: cannot start the HTTP server's event loop; nothing is served");
                    return;
                };
                runtime.block_on(serve(listener, ctx, stopped));
                // Handlers still running on the blocking pool finish alone.
                runtime.shutdown_background();
            })
            .expect("spawning the HTTP thread");
        Running { thread, stop }
    }
}

/// The serving thread.
pub struct Running {
    thread: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Running {
    /// Stops the server and waits for its thread: it accepts no more, closes
    /// idle connections, lets requests in flight finish for up to 5 s and
    /// then closes everything (a handler still running is left to finish
    /// alone); a Unix socket's file is removed.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

fn bind_tcp(addr: &str) -> Result<std::net::TcpListener> {
    let spelled = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_string() };
    let addrs: Vec<SocketAddr> = spelled
        .to_socket_addrs()
        .map_err(|e| {
            usage(format!(
                "--listen {addr}: not HOST:PORT or unix:PATH ({e}); write e.g. 127.0.0.1:9435 or unix:/run/sonde.sock"
            ))
        })?
        .collect();
    let first = *addrs.first().ok_or_else(|| usage(format!("--listen {addr}: names no address")))?;
    let listener = std::net::TcpListener::bind(&addrs[..]).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => env(format!(
            "--listen {addr}: address in use (another sonde serve or exporter?); stop it or pick another port"
        )),
        io::ErrorKind::PermissionDenied => env(format!(
            "--listen {addr}: permission denied; ports below 1024 need CAP_NET_BIND_SERVICE, pick a higher port"
        )),
        io::ErrorKind::AddrNotAvailable => usage(format!(
            "--listen {addr}: {} is not an address of this host; use 127.0.0.1 or one from `ip addr`",
            first.ip()
        )),
        _ => env(format!("--listen {addr}: cannot listen ({e})")),
    })?;
    listener.set_nonblocking(true).map_err(|e| env(format!("--listen {addr}: {e}")))?;
    Ok(listener)
}

/// Binds a Unix socket at `path` with mode 0600 from its creation (the
/// process's umask is narrowed around bind(2); nothing else runs yet), then
/// listens. A socket file nobody listens on any more is replaced; a live
/// one, or a path that is not a socket, is an error.
fn bind_unix(spec: &str, path: &Path) -> Result<Listener> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if !path.is_absolute() {
        return Err(usage(format!("--listen {spec}: the path must be absolute, e.g. unix:/run/sonde.sock")));
    }
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= sun.sun_path.len() || bytes.contains(&0) {
        return Err(usage(format!(
            "--listen {spec}: a Unix socket path has at most {} bytes and no NUL; pick a shorter one",
            sun.sun_path.len() - 1
        )));
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(env(format!(
                    "--listen {spec}: a server already listens there (another sonde serve?); stop it or pick another path"
                )));
            }
            // Left by a server that is gone.
            fs::remove_file(path).map_err(|e| env(format!("--listen {spec}: cannot remove the stale socket ({e})")))?;
        }
        Ok(_) => {
            return Err(usage(format!("--listen {spec}: exists and is not a socket; pick another path")));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(env(format!("--listen {spec}: {e}"))),
    }
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(env(format!("--listen {spec}: {}", io::Error::last_os_error())));
    }
    // SAFETY: fd is a new socket nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: umask(2) takes no pointers; the old mask is put back below.
    let old = unsafe { libc::umask(0o177) };
    // SAFETY: sun is an initialised sockaddr_un that outlives the call, and
    // the length is its size.
    let bound = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sun as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    let bind_error = io::Error::last_os_error();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    if bound != 0 {
        return Err(match bind_error.kind() {
            io::ErrorKind::NotFound => {
                env(format!("--listen {spec}: its directory does not exist; create it or pick another path"))
            }
            io::ErrorKind::PermissionDenied => env(format!("--listen {spec}: permission denied; pick another path")),
            io::ErrorKind::AddrInUse => env(format!("--listen {spec}: the path is in use; pick another path")),
            _ => env(format!("--listen {spec}: cannot listen ({bind_error})")),
        });
    }
    // SAFETY: listen(2) on our socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        let e = io::Error::last_os_error();
        let _ = fs::remove_file(path);
        return Err(env(format!("--listen {spec}: cannot listen ({e})")));
    }
    let m = fs::symlink_metadata(path).map_err(|e| env(format!("--listen {spec}: {e}")))?;
    Ok(Listener::Unix(std::os::unix::net::UnixListener::from(fd), path.to_path_buf(), (m.dev(), m.ino())))
}

/// What every connection shares.
struct Ctx {
    handler: Handler,
    web: Option<Arc<WebConfig>>,
    tls: Option<TlsAcceptor>,
    stats: Arc<HttpStats>,
    /// The [`MAX_CONNECTIONS`] slots.
    slots: Arc<Semaphore>,
    /// Connections over the limit now, waiting or answered 503 (at most
    /// [`MAX_BUSY`]).
    waiting: AtomicUsize,
    /// The connections being served (not those answered 503), by id.
    live: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

/// Accepts until stopped, then drains.
async fn serve(listener: Listener, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let (bound, unix_file) = match listener {
        Listener::Tcp(l) => (TcpListener::from_std(l).map(Bound::Tcp), None),
        Listener::Unix(l, path, id) => (UnixListener::from_std(l).map(Bound::Unix), Some((path, id))),
    };
    match bound {
        Ok(bound) => loop {
            tokio::select! {
                _ = stop.changed() => break,
                r = bound.accept() => match r {
                    Ok(Some((stream, client))) => dispatch(stream, client, &ctx, stop.clone()),
                    // Gone before we could ask who it is.
                    Ok(None) => {}
                    // Out of file descriptors and the like: let it pass, then retry.
                    Err(_) => sleep(ACCEPT_PAUSE).await,
                },
            }
        },
        Err(e) => eprintln!("sonde serve: cannot serve HTTP ({e})"),
    }
    let until = Instant::now() + DRAIN;
    while ctx.stats.open.load(Relaxed) > 0 && Instant::now() < until {
        sleep(Duration::from_millis(20)).await;
    }
    if let Some((path, (dev, ino))) = unix_file {
        if fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == (dev, ino)) {
            let _ = fs::remove_file(&path);
        }
    }
}

/// The listener on the runtime.
enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Bound {
    /// The next connection and who it is from; None when it was gone before
    /// its address or credentials could be read.
    async fn accept(&self) -> io::Result<Option<(Stream, Client)>> {
        Ok(match self {
            Bound::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                let _ = s.set_nodelay(true);
                s.local_addr().ok().map(|local| (Stream::Tcp(s), Client::Tcp { peer, local }))
            }
            Bound::Unix(l) => {
                let (s, _) = l.accept().await?;
                let cred = s.peer_cred().ok();
                cred.map(|c| (Stream::Unix(s), Client::Unix { uid: c.uid(), pid: c.pid().unwrap_or(0) }))
            }
        })
    }
}

/// A stream the server accepted, TCP or Unix.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// One of the [`MAX_CONNECTIONS`] slots, held while a connection is served.
struct Slot {
    _permit: OwnedSemaphorePermit,
    ctx: Arc<Ctx>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, ctx: &Arc<Ctx>) -> Slot {
        ctx.stats.open.fetch_add(1, Relaxed);
        Slot { _permit: permit, ctx: ctx.clone() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ctx.stats.open.fetch_sub(1, Relaxed);
    }
}

/// One of the [`MAX_BUSY`] places of connections over the limit, held while
/// one waits for a slot or is answered 503.
struct Waiting(Arc<Ctx>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

/// Serves a new connection in a slot; over [`MAX_CONNECTIONS`], it asks an
/// idle kept-alive connection to make room and waits up to [`BUSY_TIMEOUT`]
/// for a slot, then gets 503; beyond [`MAX_BUSY`] of those waiting, it is
/// closed unanswered.
fn dispatch(stream: Stream, client: Client, ctx: &Arc<Ctx>, stop: watch::Receiver<bool>) {
    ctx.stats.connections.fetch_add(1, Relaxed);
    if let Ok(permit) = ctx.slots.clone().try_acquire_owned() {
        let slot = Arc::new(Slot::new(permit, ctx));
        let ctx = ctx.clone();
        tokio::spawn(async move { connection(stream, client, &ctx, Some(slot), stop).await });
        return;
    }
    if ctx.waiting.fetch_add(1, Relaxed) >= MAX_BUSY {
        ctx.waiting.fetch_sub(1, Relaxed);
        ctx.stats.reject(Reject::Busy);
        return; // dropped: closed without an answer
    }
    let waiting = Waiting(ctx.clone());
    ctx.evict_idle();
    tokio::spawn(async move {
        let ctx = waiting.0.clone();
        match timeout(BUSY_TIMEOUT, ctx.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => {
                let slot = Arc::new(Slot::new(permit, &ctx));
                drop(waiting);
                connection(stream, client, &ctx, Some(slot), stop).await;
            }
            _ => {
                ctx.stats.reject(Reject::Busy);
                connection(stream, client, &ctx, None, stop).await;
                drop(waiting);
            }
        }
    });
}

impl Stream {
    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// The first byte the client sent, without consuming it (`None`: it
    /// closed).
    async fn peek_byte(&self) -> io::Result<Option<u8>> {
        let fd = self.fd();
        let peek = || {
            let mut b = 0u8;
            // SAFETY: one byte of writable memory that outlives the call.
            let n = unsafe { libc::recv(fd, (&mut b as *mut u8).cast(), 1, libc::MSG_PEEK) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok((n == 1).then_some(b))
            }
        };
        loop {
            let r = match self {
                Stream::Tcp(s) => {
                    s.readable().await?;
                    s.try_io(Interest::READABLE, peek)
                }
                Stream::Unix(s) => {
                    s.readable().await?;
                    s.try_io(Interest::READABLE, peek)
                }
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A stream whose client must take a response within [`WRITE_TIMEOUT`] of
/// first making the server wait: the clock starts at the first write the
/// socket cannot take at once and stops only when the response is flushed,
/// so a client reading a byte now and then cannot stretch it.
struct Guarded {
    inner: Stream,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Guarded {
    /// `r` as it is, or TimedOut once the deadline passed while pending.
    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            return r;
        }
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(sleep(WRITE_TIMEOUT)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            this.deadline = None;
        }
        this.check(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, r)
    }
}

/// What hyper serves on: a guarded stream, in TLS or not.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Serves one connection in its `slot` (held until the connection and every
/// handler it started have ended): TLS handshake when configured, then
/// requests until the client or the server closes; without a slot, answers
/// 503 and closes.
async fn connection(
    stream: Stream,
    client: Client,
    ctx: &Arc<Ctx>,
    slot: Option<Arc<Slot>>,
    mut stop: watch::Receiver<bool>,
) {
    let busy = slot.is_none();
    // A second descriptor of the socket, for the linger at the end: hyper
    // and TLS own and drop the stream.
    // SAFETY: dup(2) of a descriptor the stream keeps open meanwhile.
    let dup = unsafe { libc::fcntl(stream.fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return;
    }
    // SAFETY: a new descriptor nobody else owns.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    let unix = matches!(stream, Stream::Unix(_));
    let head_timeout = if busy { BUSY_TIMEOUT } else { HEAD_TIMEOUT };
    // One deadline for the TLS handshake and the first request's head.
    let first_head = tokio::time::Instant::now() + head_timeout;
    let io: Box<dyn Io> = match &ctx.tls {
        None => Box::new(Guarded { inner: stream, deadline: None }),
        Some(acceptor) => match tls(stream, acceptor, ctx, first_head).await {
            Some(io) => io,
            None => {
                linger(dup, unix).await;
                return;
            }
        },
    };
    let conn = Arc::new(Conn {
        ctx: ctx.clone(),
        client,
        slot,
        served: AtomicUsize::new(0),
        in_flight: AtomicBool::new(false),
        evict: Notify::new(),
        evicting: AtomicBool::new(false),
    });
    let listed = (!busy).then(|| Listed::new(ctx, &conn));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_HEAD)
        .max_headers(MAX_HEADERS)
        .title_case_headers(true)
        .keep_alive(!busy);
    let svc = {
        let conn = conn.clone();
        service_fn(move |req| {
            let conn = conn.clone();
            async move { Ok::<_, Infallible>(conn.answer(req).await) }
        })
    };
    // Boxed, to be dropped (closing hyper's side) before the linger.
    let mut serving = Box::pin(builder.serve_connection(TokioIo::new(io), svc));
    let first_head = sleep_until(first_head);
    tokio::pin!(first_head);
    let mut first_served = false;
    let result = loop {
        tokio::select! {
            r = serving.as_mut() => break Some(r),
            _ = stop.changed() => {
                break if conn.in_flight.load(Relaxed) {
                    // Let the answer go out, then close.
                    serving.as_mut().graceful_shutdown();
                    timeout(DRAIN, serving.as_mut()).await.ok()
                } else {
                    None // idle: closed now
                };
            }
            _ = conn.evict.notified() => {
                // Idle between requests while another client waits: closed
                // now, or after the request that just came in.
                serving.as_mut().graceful_shutdown();
                break timeout(WRITE_TIMEOUT, serving.as_mut()).await.ok();
            }
            _ = first_head.as_mut(), if !first_served => {
                // The TLS handshake and the first head share one deadline
                // (hyper's own restarts after the handshake).
                if conn.served.load(Relaxed) == 0 {
                    if !busy {
                        ctx.stats.reject(Reject::Timeout);
                    }
                    break None;
                }
                first_served = true;
            }
        }
    };
    // A connection over the limit was counted as busy already.
    if let Some(Err(e)) = result.filter(|_| !busy) {
        let served = conn.served.load(Relaxed);
        if e.is_parse_too_large() {
            ctx.stats.reject(Reject::HeaderTooLarge);
        } else if e.is_parse() {
            ctx.stats.reject(Reject::BadRequest);
        } else if e.is_timeout() && served == 0 {
            // An idle kept-alive connection timing out is no rejection.
            ctx.stats.reject(Reject::Timeout);
        } else if std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
        {
            ctx.stats.reject(Reject::Timeout);
        }
    }
    drop(serving);
    drop(listed); // closing: not one to evict
    linger(dup, unix).await;
}

/// The TLS handshake before `deadline`, after checking that the client speaks
/// TLS at all (plain HTTP gets Go's plain-text 400); None when the
/// connection ends here.
async fn tls(stream: Stream, acceptor: &TlsAcceptor, ctx: &Ctx, deadline: tokio::time::Instant) -> Option<Box<dyn Io>> {
    // A TLS connection starts with a handshake record (content type 22).
    match timeout_at(deadline, stream.peek_byte()).await {
        Ok(Ok(Some(22))) => {}
        Ok(Ok(Some(_))) => {
            ctx.stats.reject(Reject::Tls);
            let body = "Client sent an HTTP request to an HTTPS server.\n";
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let mut stream = stream;
            let _ = timeout(BUSY_TIMEOUT, stream.write_all(answer.as_bytes())).await;
            return None;
        }
        Ok(Ok(None) | Err(_)) => return None,
        Err(_) => {
            ctx.stats.reject(Reject::Timeout);
            return None;
        }
    }
    match timeout_at(deadline, acceptor.accept(Guarded { inner: stream, deadline: None })).await {
        Ok(Ok(s)) => Some(Box::new(s)),
        Ok(Err(_)) => {
            ctx.stats.reject(Reject::Tls);
            None
        }
        Err(_) => {
            ctx.stats.reject(Reject::Timeout);
            None
        }
    }
}

/// Ends a connection: a half-close, then reading what the client still
/// sends for a moment, so that the close does not reset the connection
/// before the client has read the last response.
async fn linger(fd: OwnedFd, unix: bool) {
    // SAFETY: shutdown(2) on a descriptor we own.
    if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) } != 0 {
        return;
    }
    let mut stream = if unix {
        match UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)) {
            Ok(s) => Stream::Unix(s),
            Err(_) => return,
        }
    } else {
        match TcpStream::from_std(std::net::TcpStream::from(fd)) {
            Ok(s) => Stream::Tcp(s),
            Err(_) => return,
        }
    };
    let mut scratch = [0u8; 4096];
    let _ = timeout(LINGER, async {
        for _ in 0..16 {
            if matches!(stream.read(&mut scratch).await, Ok(0) | Err(_)) {
                break;
            }
        }
    })
    .await;
}

/// One connection's state, shared with its requests.
struct Conn {
    ctx: Arc<Ctx>,
    client: Client,
    /// Its slot (None: over the limit, answered 503); each handler holds it
    /// too, so that a client gone mid-request frees no slot while its
    /// handler still runs.
    slot: Option<Arc<Slot>>,
    /// Requests answered so far.
    served: AtomicUsize,
    /// A request is being answered (the server, stopping, lets it finish).
    in_flight: AtomicBool,
    /// Asked to close while idle, to give its slot to a waiting client.
    evict: Notify,
    evicting: AtomicBool,
}

/// A connection in the server's list of those that may be evicted; taken
/// off when dropped.
struct Listed {
    ctx: Arc<Ctx>,
    id: u64,
}

impl Listed {
    fn new(ctx: &Arc<Ctx>, conn: &Arc<Conn>) -> Listed {
        let id = ctx.next_id.fetch_add(1, Relaxed);
        ctx.live.lock().unwrap_or_else(|e| e.into_inner()).insert(id, conn.clone());
        Listed { ctx: ctx.clone(), id }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.ctx.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl Ctx {
    /// Asks one kept-alive connection idle between requests to close (nginx
    /// does the same when its connections run out): a client that keeps a
    /// connection open does not hold a slot another is waiting for.
    fn evict_idle(&self) {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let idle = live
            .values()
            .find(|c| c.served.load(Relaxed) > 0 && !c.in_flight.load(Relaxed) && !c.evicting.load(Relaxed));
        if let Some(c) = idle {
            c.evicting.store(true, Relaxed);
            c.evict.notify_one();
        }
    }
}

type Answer = hyper::Response<Full<Bytes>>;

impl Conn {
    async fn answer(&self, req: hyper::Request<Incoming>) -> Answer {
        let served = self.served.fetch_add(1, Relaxed);
        if self.slot.is_none() {
            let r = Reject::Busy.response(&format!("over {MAX_CONNECTIONS} connections; retry later"));
            return self.finish(r, false);
        }
        if let Err((reason, detail)) = check(&req) {
            self.ctx.stats.reject(reason);
            return self.finish(reason.response(&detail), false);
        }
        let keep = keep_alive(&req) && served + 1 < MAX_REQUESTS_PER_CONNECTION && !self.evicting.load(Relaxed);
        let (path, query) = match split_target(req.uri()) {
            Ok(pq) => pq,
            Err(detail) => {
                self.ctx.stats.reject(Reject::BadRequest);
                return self.finish(Reject::BadRequest.response(detail), false);
            }
        };
        if self.ctx.web.as_ref().is_some_and(|web| !web.allow()) {
            self.ctx.stats.reject(Reject::RateLimited);
            return self.finish(Reject::RateLimited.response("over the web config's rate_limit"), keep);
        }
        // Basic auth (bcrypt: milliseconds) and the handler run on the
        // blocking pool, never on the thread that serves every connection.
        let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (web, handler, stats) = (self.ctx.web.clone(), self.ctx.handler.clone(), self.ctx.stats.clone());
        let (slot, client, method) = (self.slot.clone(), self.client, req.method().to_string());
        self.in_flight.store(true, Relaxed);
        let result = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let user = match web.as_ref().map(|w| w.authenticate(authorization.as_deref())) {
                None | Some(Auth::Open) => None,
                Some(Auth::User(u)) => Some(u),
                Some(Auth::Denied) => return None,
            };
            stats.requests.fetch_add(1, Relaxed);
            Some(handler(&Request { method, path, query, client, user }))
        })
        .await;
        self.in_flight.store(false, Relaxed);
        match result {
            Ok(Some(r)) => self.finish(r, keep),
            Ok(None) => {
                self.ctx.stats.reject(Reject::Unauthorized);
                self.finish(Reject::Unauthorized.response("basic auth needed"), keep)
            }
            Err(_) => {
                self.ctx.stats.reject(Reject::HandlerError);
                self.finish(Reject::HandlerError.response("the handler failed"), keep)
            }
        }
    }

    /// The response as hyper sends it, with the web config's headers (the
    /// handler's win), a default `Content-Type` and `Connection`; a handler's
    /// response that cannot be written as is (a bad status or header) is a 500.
    fn finish(&self, r: Response, keep: bool) -> Answer {
        if let Some(a) = self.build(&r, keep, true) {
            return a;
        }
        self.ctx.stats.reject(Reject::HandlerError);
        let r = Reject::HandlerError.response("the handler returned an invalid header or status");
        // Without the web config's headers: the server's own text only.
        self.build(&r, false, false).unwrap_or_else(|| {
            let mut a = hyper::Response::new(Full::new(Bytes::from_static(b"Internal Server Error\n")));
            *a.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            a
        })
    }

    fn build(&self, r: &Response, keep: bool, web_headers: bool) -> Option<Answer> {
        let ours = ["content-length", "connection", "date", "transfer-encoding"];
        let set_by_handler = |k: &str| r.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(k));
        let mut b = hyper::Response::builder().status(StatusCode::from_u16(r.status).ok()?);
        for (k, v) in self.ctx.web.iter().filter(|_| web_headers).flat_map(|w| w.headers()) {
            if !set_by_handler(k) {
                b = b.header(k.as_str(), v.as_str());
            }
        }
        for (k, v) in &r.headers {
            if !ours.iter().any(|o| k.eq_ignore_ascii_case(o)) {
                b = b.header(k.as_str(), v.as_str());
            }
        }
        if !set_by_handler("content-type") {
            b = b.header(header::CONTENT_TYPE, "application/octet-stream");
        }
        b = b.header(header::CONNECTION, if keep { "keep-alive" } else { "close" });
        b.body(Full::new(Bytes::from(r.body.clone()))).ok()
    }
}

/// What hyper leaves to the server to refuse (RFC 9112): methods other than
/// GET and HEAD, bodies, `Host` other than exactly once on HTTP/1.1, and
/// more than one `Authorization`.
fn check(req: &hyper::Request<Incoming>) -> Result<(), (Reject, String)> {
    let m = req.method();
    if m != Method::GET && m != Method::HEAD {
        return Err((Reject::Method, format!("{m} is not served; use GET")));
    }
    let h = req.headers();
    let bad = |detail: &str| (Reject::BadRequest, detail.to_string());
    if h.contains_key(header::TRANSFER_ENCODING) {
        return Err((Reject::Body, "request bodies are not accepted".into()));
    }
    for length in h.get_all(header::CONTENT_LENGTH) {
        match length.to_str().ok().and_then(|l| l.trim().parse::<u64>().ok()) {
            Some(0) => {}
            Some(_) => return Err((Reject::Body, "request bodies are not accepted".into())),
            None => return Err(bad("bad Content-Length")),
        }
    }
    if req.version() == Version::HTTP_11 && h.get_all(header::HOST).iter().count() != 1 {
        return Err(bad("HTTP/1.1 needs exactly one Host header"));
    }
    if h.get_all(header::AUTHORIZATION).iter().count() > 1 {
        return Err(bad("more than one Authorization header"));
    }
    Ok(())
}

/// Whether the client asked to keep the connection (HTTP/1.1 unless it
/// said `close`; HTTP/1.0 only when it said `keep-alive`).
fn keep_alive(req: &hyper::Request<Incoming>) -> bool {
    let tokens = || {
        req.headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
    };
    if req.version() == Version::HTTP_11 {
        !tokens().any(|t| t == "close")
    } else {
        tokens().any(|t| t == "keep-alive")
    }
}

/// Decoded query pairs, in order.
type Query = Vec<(String, String)>;

/// The request target (origin form `/path?query`, or absolute form
/// `http://host/path?query`) -> decoded path and query pairs.
fn split_target(uri: &hyper::Uri) -> Result<(String, Query), &'static str> {
    if uri.scheme().is_none() && uri.authority().is_some() {
        return Err("request target must start with /");
    }
    let path = if uri.scheme().is_some() && uri.path().is_empty() { "/" } else { uri.path() };
    if !path.starts_with('/') {
        return Err("request target must start with /");
    }
    let path = decode(path, false).ok_or("bad percent-encoding in the path")?;
    if path.contains('\0') {
        return Err("NUL in the path");
    }
    let mut pairs = Vec::new();
    for part in uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let bad = "bad percent-encoding in the query";
        pairs.push((decode(k, true).ok_or(bad)?, decode(v, true).ok_or(bad)?));
    }
    Ok((path, pairs))
}

/// Percent-decodes `s` (and `+` to space in a query); None if an escape is
/// malformed or the result is not UTF-8.
fn decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok().filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit()))?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        io::{Read, Write},
        net::{Shutdown, SocketAddr, TcpStream},
        path::PathBuf,
        sync::{atomic::Ordering::Relaxed, Arc},
        thread,
        time::{Duration, Instant},
    };

    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};

    use super::*;
    use crate::{engine::error::exit_code, tools::serve::webconfig::WebConfig};

    /// A running server that stops when dropped.
    struct Started {
        addr: SocketAddr,
        stats: Arc<HttpStats>,
        server: Option<Running>,
    }

    impl Drop for Started {
        fn drop(&mut self) {
            if let Some(s) = self.server.take() {
                s.stop();
            }
        }
    }

    /// Answers `/` and `/echo` (path, user and query back), 404 elsewhere;
    /// `/panic` panics and `/inject` returns a header with a newline.
    fn handler() -> Handler {
        Arc::new(|r: &Request| match r.path.as_str() {
            "/" => Response::text(200, "hello\n"),
            "/echo" => {
                let q: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
                Response::text(200, format!("{} {} user={:?} {}", r.method, r.path, r.user, q.join(";")))
            }
            "/panic" => panic!("handler panic (expected by the test)"),
            "/inject" => Response::text(200, "x").header("X-Evil", "a\r\nSet-Cookie: b"),
            "/big" => Response::text(200, "x".repeat(4 << 20)),
            "/slow" => {
                thread::sleep(Duration::from_millis(1500));
                Response::text(200, "late\n")
            }
            _ => Response::text(404, "not found\n"),
        })
    }

    fn start(web: Option<WebConfig>) -> Started {
        let server = Server::bind("127.0.0.1:0", web).unwrap();
        let Endpoint::Tcp(addr) = server.local_addr() else { unreachable!("a TCP address") };
        let stats = server.stats();
        Started { addr, stats, server: Some(server.spawn(handler())) }
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Sends `request` on a new connection and reads the answer to the end.
    fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = connect(addr);
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get(addr: SocketAddr, target: &str, extra: &str) -> String {
        raw(addr, format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n").as_bytes())
    }

    fn status(response: &str) -> u16 {
        response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
        let head = response.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn body(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn get_reaches_the_handler_with_decoded_path_and_query() {
        let s = start(None);
        let r = get(s.addr, "/e%63ho?q=a%20b&plus=1+2&empty&x=%E2%82%AC", "");
        assert_eq!(status(&r), 200, "{r}");
        assert_eq!(body(&r), "GET /echo user=None q=a b;plus=1 2;empty=;x=€");
        assert_eq!(header(&r, "Content-Length"), Some(body(&r).len().to_string().as_str()));
        assert_eq!(header(&r, "Content-Type"), Some("text/plain; charset=utf-8"));
        assert_eq!(header(&r, "Connection"), Some("close"));
        assert!(header(&r, "Date").is_some_and(|d| d.ends_with(" GMT")));
        assert_eq!(s.stats.requests.load(Relaxed), 1);
    }

    #[test]
    fn request_param_returns_the_first_value() {
        let r = Request {
            method: "GET".into(),
            path: "/".into(),
            query: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            client: Client::Unix { uid: 0, pid: 1 },
            user: None,
        };
        assert_eq!(r.param("a"), Some("1"));
        assert_eq!(r.param("b"), None);
    }

    #[test]
    fn unknown_path_is_the_handlers_404() {
        let s = start(None);
        assert_eq!(status(&get(s.addr, "/nope", "")), 404);
    }

    #[test]
    fn other_methods_get_405_with_allow() {
        let s = start(None);
        for method in ["POST", "PUT", "DELETE", "OPTIONS", "get"] {
            let r = raw(s.addr, format!("{method} / HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            assert_eq!(status(&r), 405, "{method}: {r}");
            assert_eq!(header(&r, "Allow"), Some("GET, HEAD"));
        }
        assert_eq!(s.stats.rejected(Reject::Method), 5);
        assert_eq!(s.stats.requests.load(Relaxed), 0);
    }

    #[test]
    fn head_gets_the_headers_without_the_body() {
        let s = start(None);
        let r = raw(s.addr, b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!(status(&r), 200, "{r}");
        assert_eq!(header(&r, "Content-Length"), Some("6"));
        assert_eq!(body(&r), "");
    }

    #[test]
    fn malformed_requests_get_400_and_the_server_keeps_serving() {
        let s = start(None);
        let bad: [&[u8]; 10] = [
            b"GARBAGE\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nNo-Colon\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n folded: 1\r\n\r\n",
            b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /?a=%e2%82 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET nope HTTP/1.1\r\nHost: x\r\n\r\n",
        ];
        for req in bad {
            let r = raw(s.addr, req);
            assert_eq!(status(&r), 400, "{}: {r}", String::from_utf8_lossy(req));
        }
        wait_for("every refusal counted", || s.stats.rejected(Reject::BadRequest) == bad.len() as u64);
        assert_eq!(status(&raw(s.addr, b"GET / HTTP/2.0\r\nHost: x\r\n\r\n")), 400);
        assert_eq!(status(&get(s.addr, "/", "")), 200);
        // HTTP/1.0 needs no Host; absolute-form targets are served too.
        assert_eq!(status(&raw(s.addr, b"GET / HTTP/1.0\r\n\r\n")), 200);
        assert_eq!(status(&get(s.addr, "http://x:1/echo?a=1", "")), 200);
    }

    #[test]
    fn oversize_heads_get_431() {
        let s = start(None);
        let long = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(status(&raw(s.addr, long.as_bytes())), 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: 1\r\n")).collect();
        let r = raw(s.addr, format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes());
        assert_eq!(status(&r), 431, "{r}");
        wait_for("both refusals counted", || s.stats.rejected(Reject::HeaderTooLarge) == 2);
        assert_eq!(status(&get(s.addr, "/", "")), 200);
    }

    #[test]
    fn request_bodies_are_refused() {
        let s = start(None);
        let r = raw(s.addr, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(status(&r), 413, "{r}");
        let r = raw(s.addr, b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        assert_eq!(status(&r), 413, "{r}");
        let r = raw(s.addr, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        assert_eq!(status(&r), 200, "{r}");
    }

    #[test]
    fn keep_alive_serves_pipelined_requests_on_one_connection() {
        let s = start(None);
        let r = raw(
            s.addr,
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.matches("HTTP/1.1 200 OK").count(), 2, "{r}");
        assert!(r.contains("Connection: keep-alive") && r.ends_with("n=2"), "{r}");
        assert_eq!(s.stats.connections.load(Relaxed), 1);
    }

    #[test]
    fn a_panicking_handler_gives_500_and_the_server_survives() {
        let s = start(None);
        assert_eq!(status(&get(s.addr, "/panic", "")), 500);
        assert_eq!(status(&get(s.addr, "/inject", "")), 500);
        assert_eq!(s.stats.rejected(Reject::HandlerError), 2);
        assert_eq!(status(&get(s.addr, "/", "")), 200);
    }

    #[test]
    fn a_silent_client_does_not_block_another() {
        let s = start(None);
        let _silent = connect(s.addr);
        let mut partial = connect(s.addr);
        partial.write_all(b"GET / HTTP/1.1\r\nHo").unwrap();
        let t = Instant::now();
        assert_eq!(status(&get(s.addr, "/", "")), 200);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn over_the_connection_limit_the_extra_client_gets_503_and_others_recover() {
        let s = start(None);
        let mut idle: Vec<TcpStream> = (0..MAX_CONNECTIONS).map(|_| connect(s.addr)).collect();
        wait_for("64 open connections", || s.stats.open.load(Relaxed) == MAX_CONNECTIONS as u64);
        let r = get(s.addr, "/", "");
        assert_eq!(status(&r), 503, "{r}");
        assert_eq!(header(&r, "Retry-After"), Some("1"));
        assert_eq!(s.stats.rejected(Reject::Busy), 1);
        // An idle connection still works once it speaks.
        let mut first = idle.remove(0);
        first.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = first.read_to_string(&mut out);
        assert_eq!(status(&out), 200, "{out}");
        drop(idle.pop());
        wait_for("a free slot", || s.stats.open.load(Relaxed) < MAX_CONNECTIONS as u64);
        assert_eq!(status(&get(s.addr, "/", "")), 200);
    }

    #[test]
    fn when_every_slot_is_taken_an_idle_kept_alive_connection_makes_room() {
        let s = start(None);
        let kept: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| {
                let mut c = connect(s.addr);
                c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
                while !got.ends_with(b"hello\n") {
                    let n = c.read(&mut buf).unwrap();
                    assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                    got.extend_from_slice(&buf[..n]);
                }
                assert!(String::from_utf8_lossy(&got).contains("Connection: keep-alive"));
                c
            })
            .collect();
        wait_for("64 open connections", || s.stats.open.load(Relaxed) == MAX_CONNECTIONS as u64);
        let r = get(s.addr, "/", "");
        assert_eq!(status(&r), 200, "{r}");
        assert_eq!(s.stats.rejected(Reject::Busy), 0);
        // Exactly one kept-alive connection was closed to make room.
        let closed = kept
            .into_iter()
            .filter(|c| {
                // Its FIN came before the slot was free: no waiting.
                c.set_nonblocking(true).unwrap();
                matches!((&*c).read(&mut [0u8; 16]), Ok(0))
            })
            .count();
        assert_eq!(closed, 1);
    }

    #[test]
    fn a_client_gone_mid_request_holds_its_slot_until_the_handler_returns() {
        let s = start(None);
        let mut c = connect(s.addr);
        c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        wait_for("the handler", || s.stats.requests.load(Relaxed) == 1);
        drop(c);
        thread::sleep(Duration::from_millis(300));
        assert_eq!(s.stats.open.load(Relaxed), 1, "the slot went while the handler still ran");
        wait_for("the handler to return", || s.stats.open.load(Relaxed) == 0);
    }

    #[test]
    fn stop_ends_idle_connections_and_the_accept_thread() {
        let mut s = start(None);
        let mut idle = connect(s.addr);
        wait_for("the connection", || s.stats.open.load(Relaxed) == 1);
        let t = Instant::now();
        s.server.take().unwrap().stop();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(s.stats.open.load(Relaxed), 0);
        let mut out = Vec::new();
        assert_eq!(idle.read_to_end(&mut out).unwrap(), 0);
    }

    #[test]
    fn binding_a_used_port_is_an_exit_2_error_naming_it() {
        let s = start(None);
        let addr = s.addr.to_string();
        let err = Server::bind(&addr, None).err().unwrap();
        assert_eq!(exit_code(&err), 2);
        let msg = err.to_string();
        assert!(msg.contains(&addr) && msg.contains("in use"), "{msg}");
        for bad in ["nonsense", "127.0.0.1", "1.2.3.4.5:80"] {
            let err = Server::bind(bad, None).err().unwrap();
            assert_eq!(exit_code(&err), 2, "{bad}: {err}");
            assert!(err.to_string().contains(bad), "{err}");
        }
        let err = Server::bind("192.0.2.1:0", None).err().unwrap();
        assert!(err.to_string().contains("not an address of this host"), "{err}");
        assert!(Server::bind(":0", None).is_ok());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(decode("a%2Fb%20c+d", false).as_deref(), Some("a/b c+d"));
        assert_eq!(decode("a+b", true).as_deref(), Some("a b"));
        assert_eq!(decode("%", true), None);
        assert_eq!(decode("%4", true), None);
        assert_eq!(decode("%+1", true), None);
        assert_eq!(decode("%ff", true), None);
    }

    #[test]
    fn a_client_that_stops_reading_is_cut_off_and_others_are_served() {
        let s = start(None);
        // Pipelined requests for a response much larger than the socket
        // buffers, never read: the server's writes stall, not its loop.
        let mut stalled = connect(s.addr);
        let big = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
        stalled.write_all(big.as_bytes()).unwrap();
        thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        assert_eq!(status(&get(s.addr, "/", "")), 200);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    /// `GET target` on the Unix socket at `path`.
    fn unix_get(path: &std::path::Path, target: &str) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_unix_socket_is_private_knows_its_clients_and_goes_at_the_end() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = TempDir::new("unix");
        let path = dir.0.join("sonde.sock");
        let spec = format!("unix:{}", path.display());
        // A stale socket (its server gone) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let server = Server::bind(&spec, None).unwrap();
        assert_eq!(server.local_addr(), Endpoint::Unix(path.clone()));
        assert!(server.local_addr().is_local());
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A live one is not taken over.
        let err = Server::bind(&spec, None).err().unwrap();
        assert_eq!(exit_code(&err), 2);
        assert!(err.to_string().contains("already listens"), "{err}");
        let echo: Handler = Arc::new(|r: &Request| Response::text(200, format!("{:?}", r.client)));
        let running = server.spawn(echo);
        let r = unix_get(&path, "/");
        assert_eq!(status(&r), 200, "{r}");
        // SAFETY: getuid takes no arguments.
        let uid = unsafe { libc::getuid() };
        assert_eq!(body(&r), format!("Unix {{ uid: {uid}, pid: {} }}", std::process::id()));
        running.stop();
        assert!(!path.exists(), "the socket file is removed at the end");
        // Not a socket, relative, too long: exit 2, named.
        let file = dir.write("plain", "x");
        for (bad, says) in [
            (format!("unix:{}", file.display()), "not a socket"),
            ("unix:relative.sock".to_string(), "absolute"),
            (format!("unix:/{}", "a".repeat(200)), "at most"),
            (format!("unix:{}/missing/s.sock", dir.0.display()), "does not exist"),
        ] {
            let err = Server::bind(&bad, None).err().unwrap();
            assert_eq!(exit_code(&err), 2, "{bad}: {err}");
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
    }

    // ---- with a web config ----

    /// A directory for one test's files, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("sonde-http-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn basic(user: &str, password: &str) -> String {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Authorization: Basic {token}\r\n")
    }

    #[test]
    fn basic_auth_lets_the_right_password_in_only() {
        let dir = TempDir::new("auth");
        // Cost 4 (the minimum) keeps the test fast; real files use 10 or more.
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let path = dir.write("web.yml", &format!("basic_auth_users:\n  alice: {hash}\n"));
        let s = start(Some(WebConfig::load(&path).unwrap()));
        for auth in
            [String::new(), basic("alice", "wrong"), basic("bob", "s3cret"), "Authorization: Bearer x\r\n".into()]
        {
            let r = get(s.addr, "/echo", &auth);
            assert_eq!(status(&r), 401, "{auth}: {r}");
            assert_eq!(header(&r, "WWW-Authenticate"), Some("Basic realm=\"sonde\""));
        }
        for _ in 0..2 {
            let r = get(s.addr, "/echo", &basic("alice", "s3cret"));
            assert_eq!(status(&r), 200, "{r}");
            assert!(body(&r).contains("user=Some(\"alice\")"), "{r}");
        }
        assert_eq!(s.stats.rejected(Reject::Unauthorized), 4);
    }

    #[test]
    fn configured_headers_and_rate_limit_apply() {
        let dir = TempDir::new("headers");
        let path = dir.write(
            "web.yml",
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n\
             rate_limit:\n  interval: 1h\n  burst: 2\n",
        );
        let s = start(Some(WebConfig::load(&path).unwrap()));
        let r = get(s.addr, "/", "");
        assert_eq!(status(&r), 200, "{r}");
        assert_eq!(header(&r, "X-Frame-Options"), Some("deny"));
        assert_eq!(header(&r, "X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(status(&get(s.addr, "/", "")), 200);
        let r = get(s.addr, "/", "");
        assert_eq!(status(&r), 429, "{r}");
        assert_eq!(header(&r, "X-Frame-Options"), Some("deny"));
        assert_eq!(s.stats.rejected(Reject::RateLimited), 1);
    }

    /// A CA, a server certificate for localhost and a client certificate,
    /// as PEM files in `dir`.
    fn certificates(dir: &TempDir) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        dir.write("ca.pem", &ca.pem());
        for (name, sans) in [
            ("server", vec!["localhost".to_string(), "127.0.0.1".into()]),
            ("client", vec!["client.example".to_string()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(sans).unwrap().signed_by(&key, &ca).unwrap();
            dir.write(&format!("{name}.pem"), &cert.pem());
            dir.write(&format!("{name}.key"), &key.serialize_pem());
        }
    }

    /// GET `target` over TLS, trusting `ca.pem`, with the client
    /// certificate when `client_cert`.
    fn tls_get(addr: SocketAddr, dir: &TempDir, target: &str, client_cert: bool) -> io::Result<String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(dir.0.join("ca.pem")).unwrap()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if client_cert {
            let chain = vec![CertificateDer::from_pem_file(dir.0.join("client.pem")).unwrap()];
            let key = PrivateKeyDer::from_pem_file(dir.0.join("client.key")).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        let conn = rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, connect(addr));
        tls.write_all(format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())?;
        let mut out = String::new();
        tls.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn tls_serves_https_and_answers_plain_http_with_400() {
        let dir = TempDir::new("tls");
        certificates(&dir);
        let path = dir.write("web.yml", "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n");
        let web = WebConfig::load(&path).unwrap();
        assert!(web.tls());
        let server = Server::bind("127.0.0.1:0", Some(web)).unwrap();
        assert_eq!(server.scheme(), "https");
        drop(server);
        let s = start(Some(WebConfig::load(&path).unwrap()));
        let r = tls_get(s.addr, &dir, "/echo?x=1", false).unwrap();
        assert_eq!(status(&r), 200, "{r}");
        assert!(r.ends_with("x=1"), "{r}");
        let plain = get(s.addr, "/", "");
        assert_eq!(status(&plain), 400, "{plain}");
        assert!(plain.contains("HTTP request to an HTTPS server"), "{plain}");
        // A client that speaks TLS badly costs only its own connection.
        let mut junk = connect(s.addr);
        junk.write_all(&[22, 3, 1, 0, 5, 1, 2, 3, 4, 5]).unwrap();
        let _ = junk.shutdown(Shutdown::Write);
        let _ = junk.read_to_end(&mut Vec::new());
        wait_for("two TLS rejections", || s.stats.rejected(Reject::Tls) == 2);
        assert_eq!(status(&tls_get(s.addr, &dir, "/", false).unwrap()), 200);
    }

    #[test]
    fn tls_client_certificates_are_required_and_verified() {
        let dir = TempDir::new("mtls");
        certificates(&dir);
        let path = dir.write(
            "web.yml",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS13\n",
        );
        let s = start(Some(WebConfig::load(&path).unwrap()));
        assert!(tls_get(s.addr, &dir, "/", false).is_err());
        let r = tls_get(s.addr, &dir, "/", true).unwrap();
        assert_eq!(status(&r), 200, "{r}");
        wait_for("the TLS rejection", || s.stats.rejected(Reject::Tls) == 1);
    }

    #[test]
    fn tls_client_allowed_sans_must_match_the_client_certificate() {
        let dir = TempDir::new("sans");
        certificates(&dir);
        for (allowed, ok) in [("[client.example, 10.0.0.1]", true), ("[other.example]", false)] {
            let path = dir.write(
                "web.yml",
                &format!(
                    "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
                     client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  \
                     client_allowed_sans: {allowed}\n"
                ),
            );
            let s = start(Some(WebConfig::load(&path).unwrap()));
            let r = tls_get(s.addr, &dir, "/", true);
            assert_eq!(r.is_ok(), ok, "{allowed}: {r:?}");
            let want = u64::from(!ok);
            wait_for("the TLS rejection count", || s.stats.rejected(Reject::Tls) == want);
        }
    }
}
