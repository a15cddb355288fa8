//! A small GET-only HTTP/1.1 server on std threads (sonde has no async
//! runtime), hardened for a daemon that holds BPF privileges: the request
//! head is capped ([`MAX_HEAD`], [`MAX_HEADERS`]), every read and write has
//! a deadline, at most [`MAX_CONNECTIONS`] connections are served at once,
//! request bodies are refused, and a panicking handler costs one 500.
//!
//! With a [`WebConfig`] it adds TLS (rustls), basic auth, the configured
//! response headers and the rate limit. Each connection has its own thread;
//! a malformed request, a plain-HTTP client on the TLS port or a slow client
//! only ever affects its own connection.
use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    os::fd::AsRawFd,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use super::webconfig::{Auth, WebConfig};
use crate::engine::error::{env, usage};

/// Bytes of request line plus headers accepted; more gets 431.
pub const MAX_HEAD: usize = 8 * 1024;
/// Header lines accepted; more gets 431.
pub const MAX_HEADERS: usize = 100;
/// Connections served at once; the next ones get 503 and are closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a whole request head (TLS handshake included),
/// and that a kept-alive connection may stay idle.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to take one whole response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections above [`MAX_CONNECTIONS`] that are still answered 503 (each on
/// a short-lived thread, within [`BUSY_TIMEOUT`]); beyond, they are closed.
const MAX_BUSY: usize = 16;
const BUSY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_millis(500);
/// Requests served on one kept-alive connection before it is closed.
const MAX_REQUESTS_PER_CONNECTION: usize = 1000;
/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(200);
/// How long the accept thread waits, once stopped, for open connections.
const DRAIN: Duration = Duration::from_secs(5);

/// A parsed GET or HEAD request.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET` or `HEAD` (a HEAD response's body is dropped by the server).
    pub method: String,
    /// The percent-decoded path, e.g. `/metrics`.
    pub path: String,
    /// The percent-decoded query pairs, in order (`+` is a space).
    pub query: Vec<(String, String)>,
    /// The client's address.
    pub peer: SocketAddr,
    /// The address the client reached (ours).
    pub local: SocketAddr,
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

/// What serves requests; called on the connection's thread.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Why a request or connection was refused (the `reason` label of a
/// rejected-requests metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Over [`MAX_CONNECTIONS`]: 503.
    Busy,
    /// No complete request head within [`HEAD_TIMEOUT`], or a response not
    /// taken within [`WRITE_TIMEOUT`].
    Timeout,
    /// Not HTTP/1.x as RFC 9112 writes it: 400.
    BadRequest,
    /// Head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] lines: 431.
    HeaderTooLarge,
    /// Neither GET nor HEAD: 405.
    Method,
    /// A request with a body: 413.
    Body,
    /// An HTTP version other than 1.0 and 1.1: 505.
    Version,
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
    pub const ALL: [Reject; 11] = [
        Reject::Busy,
        Reject::Timeout,
        Reject::BadRequest,
        Reject::HeaderTooLarge,
        Reject::Method,
        Reject::Body,
        Reject::Version,
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
            Reject::Version => "version",
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
            Reject::Version => 505,
            Reject::Unauthorized => 401,
            Reject::RateLimited => 429,
            Reject::HandlerError => 500,
        }
    }

    /// The response sent for this reason.
    fn response(self, detail: &str) -> Response {
        let r = Response::text(self.status(), format!("{}: {detail}\n", reason_phrase(self.status())));
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

/// A bound listener, not yet serving.
pub struct Server {
    listener: TcpListener,
    web: Option<Arc<WebConfig>>,
    stats: Arc<HttpStats>,
}

impl Server {
    /// Binds now (so "address in use" is reported before anything is
    /// loaded): a usage or environment error (exit 2) naming the address and
    /// the fix. `addr` is `HOST:PORT`, `[V6]:PORT` or `:PORT` (all IPv4
    /// addresses, as Go's `:9100`).
    pub fn bind(addr: &str, web: Option<WebConfig>) -> Result<Server> {
        let spelled = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_string() };
        let addrs: Vec<SocketAddr> = spelled
            .to_socket_addrs()
            .map_err(|e| usage(format!("--listen {addr}: not HOST:PORT ({e}); write e.g. 127.0.0.1:9435")))?
            .collect();
        let first = *addrs.first().ok_or_else(|| usage(format!("--listen {addr}: names no address")))?;
        let listener = TcpListener::bind(&addrs[..]).map_err(|e| match e.kind() {
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
        Ok(Server { listener, web: web.map(Arc::new), stats: Arc::default() })
    }

    /// The bound address (the port the kernel picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
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

    /// Serves on background threads until `stop` is set; returns the accept
    /// thread's handle. Once stopped, that thread stops accepting and waits
    /// (up to 5 s) for open connections, which end at their next read or
    /// write; a handler still running after that is left to finish alone.
    pub fn spawn(self, handler: Handler, stop: Arc<AtomicBool>) -> JoinHandle<()> {
        let tls = self.web.as_ref().and_then(|w| w.tls_config());
        let ctx = Arc::new(Ctx { handler, web: self.web, tls, stats: self.stats, stop, busy: AtomicUsize::new(0) });
        let listener = self.listener;
        thread::Builder::new()
            .name("sonde-http".into())
            .spawn(move || accept_loop(&listener, &ctx))
            .expect("spawning the HTTP accept thread")
    }
}

/// What every connection thread shares.
struct Ctx {
    handler: Handler,
    web: Option<Arc<WebConfig>>,
    tls: Option<Arc<ServerConfig>>,
    stats: Arc<HttpStats>,
    stop: Arc<AtomicBool>,
    /// Busy responders running now (at most [`MAX_BUSY`]).
    busy: AtomicUsize,
}

fn accept_loop(listener: &TcpListener, ctx: &Arc<Ctx>) {
    while !ctx.stop.load(Relaxed) {
        if !readable(listener, TICK) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => dispatch(stream, peer, ctx),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            // Out of file descriptors and the like: let it pass, then retry.
            Err(_) => thread::sleep(TICK),
        }
    }
    let until = Instant::now() + DRAIN;
    while ctx.stats.open.load(Relaxed) > 0 && Instant::now() < until {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `timeout` for a connection to accept.
fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fd` is one valid, initialised pollfd that outlives the call,
    // and nfds is 1; the listener keeps the descriptor open meanwhile.
    unsafe { libc::poll(&mut fd, 1, ms) > 0 }
}

/// Holds one of the [`MAX_CONNECTIONS`] slots (or, with `busy`, one of the
/// [`MAX_BUSY`] ones) until dropped, however the thread ends or fails to start.
struct Slot {
    ctx: Arc<Ctx>,
    busy: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.busy {
            self.ctx.busy.fetch_sub(1, Relaxed);
        } else {
            self.ctx.stats.open.fetch_sub(1, Relaxed);
        }
    }
}

fn dispatch(stream: TcpStream, peer: SocketAddr, ctx: &Arc<Ctx>) {
    ctx.stats.connections.fetch_add(1, Relaxed);
    let busy = ctx.stats.open.fetch_add(1, Relaxed) >= MAX_CONNECTIONS as u64;
    if busy {
        ctx.stats.open.fetch_sub(1, Relaxed);
        ctx.stats.reject(Reject::Busy);
        if ctx.busy.fetch_add(1, Relaxed) >= MAX_BUSY {
            ctx.busy.fetch_sub(1, Relaxed);
            return; // dropped: closed without an answer
        }
    }
    let slot = Slot { ctx: ctx.clone(), busy };
    let _ = thread::Builder::new().name("sonde-http".into()).spawn(move || serve(stream, peer, &slot.ctx, slot.busy));
}

/// A socket whose reads and writes give up at a deadline, or soon after the
/// stop flag is set.
struct Sock {
    tcp: TcpStream,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

impl Sock {
    /// Runs `op` with socket timeouts cut into ticks until it succeeds, the
    /// deadline passes or the server stops.
    fn with_deadline<T>(
        &mut self,
        set: fn(&TcpStream, Option<Duration>) -> io::Result<()>,
        mut op: impl FnMut(&mut TcpStream) -> io::Result<T>,
    ) -> io::Result<T> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            if self.stop.load(Relaxed) {
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
            set(&self.tcp, Some(left.min(TICK)))?;
            match op(&mut self.tcp) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                r => return r,
            }
        }
    }

    /// The first byte the client sent, without consuming it.
    fn peek_byte(&mut self) -> io::Result<Option<u8>> {
        let mut b = [0u8; 1];
        let n = self.with_deadline(TcpStream::set_read_timeout, |t| t.peek(&mut b))?;
        Ok((n == 1).then_some(b[0]))
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.with_deadline(TcpStream::set_read_timeout, |t| t.read(buf))
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.with_deadline(TcpStream::set_write_timeout, |t| t.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Conn {
    Plain(Sock),
    Tls(Box<StreamOwned<ServerConnection, Sock>>),
}

impl Conn {
    fn sock(&mut self) -> &mut Sock {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => &mut t.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(t) => t.flush(),
        }
    }
}

/// Serves one connection; `busy` answers its first request 503 and closes.
fn serve(tcp: TcpStream, peer: SocketAddr, ctx: &Ctx, busy: bool) {
    let Ok(local) = tcp.local_addr() else { return };
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_nodelay(true);
    let timeout = if busy { BUSY_TIMEOUT } else { HEAD_TIMEOUT };
    let sock = Sock { tcp, deadline: Instant::now() + timeout, stop: ctx.stop.clone() };
    let Some(mut conn) = handshake(sock, ctx) else { return };
    let mut buf = Vec::with_capacity(1024);
    for served in 0.. {
        conn.sock().deadline = Instant::now() + timeout;
        let end = match read_head(&mut conn, &mut buf) {
            Ok(end) => end,
            Err(HeadError::Closed) => break,
            Err(HeadError::Timeout) => {
                // An idle kept-alive connection timing out is no rejection.
                if served == 0 || !buf.is_empty() {
                    ctx.stats.reject(Reject::Timeout);
                }
                return; // without lingering: the client is not talking
            }
            Err(HeadError::TooLarge) => {
                ctx.stats.reject(Reject::HeaderTooLarge);
                let r = Reject::HeaderTooLarge.response(&format!("request head over {MAX_HEAD} bytes"));
                let _ = send(&mut conn, ctx, r, false, false);
                break;
            }
        };
        let parsed = parse_head(&buf[..end]);
        buf.drain(..end);
        if busy {
            let r = Reject::Busy.response(&format!("over {MAX_CONNECTIONS} connections; retry later"));
            let _ = send(&mut conn, ctx, r, false, false);
            break;
        }
        let (response, head_only, keep) = match parsed {
            Err((reason, detail)) => {
                ctx.stats.reject(reason);
                (reason.response(&detail), false, false)
            }
            Ok(head) => {
                let keep = head.keep_alive
                    && served + 1 < MAX_REQUESTS_PER_CONNECTION
                    && ctx.stats.open.load(Relaxed) <= MAX_CONNECTIONS as u64 / 2;
                let head_only = head.method == "HEAD";
                match respond(head, (peer, local), ctx) {
                    Ok(r) => (r, head_only, keep),
                    Err(r) => (r, head_only, false),
                }
            }
        };
        if send(&mut conn, ctx, response, head_only, keep).is_err() || !keep {
            break;
        }
    }
    close(conn);
}

/// Ends a connection: TLS close_notify, a half-close, then reading what the
/// client still sends for a moment, so that the close does not reset the
/// connection before the client has read the last response.
fn close(mut conn: Conn) {
    if let Conn::Tls(t) = &mut conn {
        t.conn.send_close_notify();
        let _ = t.flush();
    }
    let sock = conn.sock();
    if sock.tcp.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    sock.deadline = Instant::now() + LINGER;
    let mut scratch = [0u8; 4096];
    for _ in 0..16 {
        if matches!(sock.read(&mut scratch), Ok(0) | Err(_)) {
            break;
        }
    }
}

/// Wraps the socket in TLS when configured and completes the handshake
/// (within the head deadline), so its failures count as TLS rejections.
fn handshake(mut sock: Sock, ctx: &Ctx) -> Option<Conn> {
    let Some(config) = &ctx.tls else { return Some(Conn::Plain(sock)) };
    // A TLS connection starts with a handshake record (content type 22).
    match sock.peek_byte() {
        Ok(Some(22)) => {}
        Ok(Some(_)) => {
            ctx.stats.reject(Reject::Tls);
            // Go's answer, in plain text, to plain HTTP on a TLS port.
            let body = "Client sent an HTTP request to an HTTPS server.\n";
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.deadline = Instant::now() + BUSY_TIMEOUT;
            if sock.write_all(answer.as_bytes()).is_ok() {
                close(Conn::Plain(sock));
            }
            return None;
        }
        Ok(None) => return None,
        Err(e) => {
            if e.kind() == io::ErrorKind::TimedOut {
                ctx.stats.reject(Reject::Timeout);
            }
            return None;
        }
    }
    let server = ServerConnection::new(config.clone()).ok()?;
    let mut tls = StreamOwned::new(server, sock);
    while tls.conn.is_handshaking() {
        if let Err(e) = tls.conn.complete_io(&mut tls.sock) {
            let reason = if e.kind() == io::ErrorKind::TimedOut { Reject::Timeout } else { Reject::Tls };
            ctx.stats.reject(reason);
            return None;
        }
    }
    Some(Conn::Tls(Box::new(tls)))
}

enum HeadError {
    /// The client closed (or the server stopped) between requests.
    Closed,
    Timeout,
    TooLarge,
}

/// Reads until `buf` holds a whole request head; returns its length.
fn read_head(conn: &mut Conn, buf: &mut Vec<u8>) -> Result<usize, HeadError> {
    let mut chunk = [0u8; 2048];
    loop {
        // RFC 9112 2.2: ignore empty lines before a request line.
        let blank = buf.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        buf.drain(..blank);
        if let Some(end) = head_end(buf) {
            return Ok(end);
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        let want = (MAX_HEAD - buf.len()).min(chunk.len());
        match conn.read(&mut chunk[..want]) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(HeadError::Timeout),
            Err(_) => return Err(HeadError::Closed),
        }
    }
}

/// The end of the head: just past the first empty line (`\n\n` or `\n\r\n`).
fn head_end(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| match (buf[i], buf.get(i + 1), buf.get(i + 2)) {
        (b'\n', Some(b'\n'), _) => Some(i + 2),
        (b'\n', Some(b'\r'), Some(b'\n')) => Some(i + 3),
        _ => None,
    })
}

/// A request head that passed every check.
struct Head {
    method: String,
    target: String,
    keep_alive: bool,
    authorization: Option<String>,
}

/// Checks a request head (RFC 9112): request line, header syntax, method,
/// version, no body, `Host` on HTTP/1.1.
fn parse_head(bytes: &[u8]) -> Result<Head, (Reject, String)> {
    let bad = |detail: &str| (Reject::BadRequest, detail.to_string());
    let text = std::str::from_utf8(bytes).map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).take_while(|l| !l.is_empty());
    let line = lines.next().ok_or_else(|| bad("empty request"))?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("request line is not METHOD TARGET VERSION"));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(bad("bad method"));
    }
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("bad request target"));
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        v if v.starts_with("HTTP/") => return Err((Reject::Version, format!("{v} is not served; use HTTP/1.1"))),
        _ => return Err(bad("bad HTTP version")),
    };

    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err((Reject::HeaderTooLarge, format!("over {MAX_HEADERS} header lines")));
        }
        if line.starts_with([' ', '\t']) {
            return Err(bad("obsolete header line folding"));
        }
        let (name, value) = line.split_once(':').ok_or_else(|| bad("header line without a colon"))?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(bad("bad header name"));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(bad("control character in a header value"));
        }
        headers.push((name, value));
    }
    let all = |name: &'static str| headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v);

    if method != "GET" && method != "HEAD" {
        return Err((Reject::Method, format!("{method} is not served; use GET")));
    }
    if all("transfer-encoding").next().is_some() {
        return Err((Reject::Body, "request bodies are not accepted".into()));
    }
    for length in all("content-length") {
        match length.parse::<u64>() {
            Ok(0) => {}
            Ok(_) => return Err((Reject::Body, "request bodies are not accepted".into())),
            Err(_) => return Err(bad("bad Content-Length")),
        }
    }
    if http11 && all("host").count() != 1 {
        return Err(bad("HTTP/1.1 needs exactly one Host header"));
    }
    let connection: Vec<String> =
        all("connection").flat_map(|v| v.split(',')).map(|t| t.trim().to_ascii_lowercase()).collect();
    let keep_alive =
        if http11 { !connection.iter().any(|t| t == "close") } else { connection.iter().any(|t| t == "keep-alive") };
    let mut auth = all("authorization");
    let authorization = auth.next().map(str::to_string);
    if auth.next().is_some() {
        return Err(bad("more than one Authorization header"));
    }
    Ok(Head { method: method.to_string(), target: target.to_string(), keep_alive, authorization })
}

/// RFC 9110 `tchar`: the characters of methods and header names.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Runs the web config's checks and the handler for one parsed head; Err
/// is a response after which the connection is closed.
fn respond(head: Head, (peer, local): (SocketAddr, SocketAddr), ctx: &Ctx) -> Result<Response, Response> {
    let (path, query) = match split_target(&head.target) {
        Ok(pq) => pq,
        Err(detail) => {
            ctx.stats.reject(Reject::BadRequest);
            return Err(Reject::BadRequest.response(detail));
        }
    };
    let mut user = None;
    if let Some(web) = &ctx.web {
        if !web.allow() {
            ctx.stats.reject(Reject::RateLimited);
            return Ok(Reject::RateLimited.response("over the web config's rate_limit"));
        }
        match web.authenticate(head.authorization.as_deref()) {
            Auth::Open => {}
            Auth::User(u) => user = Some(u),
            Auth::Denied => {
                ctx.stats.reject(Reject::Unauthorized);
                return Ok(Reject::Unauthorized.response("basic auth needed"));
            }
        }
    }
    let request = Request { method: head.method, path, query, peer, local, user };
    ctx.stats.requests.fetch_add(1, Relaxed);
    match catch_unwind(AssertUnwindSafe(|| (ctx.handler)(&request))) {
        Ok(r) if valid(&r) => Ok(r),
        Ok(_) => {
            ctx.stats.reject(Reject::HandlerError);
            Ok(Reject::HandlerError.response("the handler returned an invalid header or status"))
        }
        Err(_) => {
            ctx.stats.reject(Reject::HandlerError);
            Ok(Reject::HandlerError.response("the handler failed"))
        }
    }
}

/// Whether a handler's response can be written as is (no header injection).
fn valid(r: &Response) -> bool {
    (100..=999).contains(&r.status)
        && r.headers.iter().all(|(k, v)| {
            !k.is_empty() && k.bytes().all(is_tchar) && v.bytes().all(|b| (b >= b' ' && b != 0x7f) || b == b'\t')
        })
}

/// Decoded query pairs, in order.
type Query = Vec<(String, String)>;

/// `/path?query` (or absolute-form `http://host/path?query`) -> decoded
/// path and query pairs.
fn split_target(target: &str) -> Result<(String, Query), &'static str> {
    let origin = match target.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => {
            rest.find('/').map_or("/", |i| &rest[i..])
        }
        _ => target,
    };
    if !origin.starts_with('/') {
        return Err("request target must start with /");
    }
    let (path, query) = origin.split_once('?').unwrap_or((origin, ""));
    let path = decode(path, false).ok_or("bad percent-encoding in the path")?;
    if path.contains('\0') {
        return Err("NUL in the path");
    }
    let mut pairs = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
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

/// Writes a response with `Content-Length`, `Date`, `Connection`, the web
/// config's headers (the handler's win) and a default `Content-Type`.
fn send(conn: &mut Conn, ctx: &Ctx, r: Response, head_only: bool, keep: bool) -> io::Result<()> {
    conn.sock().deadline = Instant::now() + WRITE_TIMEOUT;
    let mut head = format!("HTTP/1.1 {} {}\r\n", r.status, reason_phrase(r.status));
    let mut line = |k: &str, v: &str| {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    };
    let ours = ["content-length", "connection", "date", "transfer-encoding"];
    let set_by_handler = |k: &str| r.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(k));
    for (k, v) in ctx.web.iter().flat_map(|w| w.headers()) {
        if !set_by_handler(k) {
            line(k, v);
        }
    }
    for (k, v) in &r.headers {
        if !ours.iter().any(|o| k.eq_ignore_ascii_case(o)) {
            line(k, v);
        }
    }
    if !set_by_handler("content-type") {
        line("Content-Type", "application/octet-stream");
    }
    line("Date", &http_date(SystemTime::now()));
    line("Content-Length", &r.body.len().to_string());
    line("Connection", if keep { "keep-alive" } else { "close" });
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(&r.body);
    }
    conn.write_all(&out)?;
    conn.flush()
}

/// RFC 9110 IMF-fixdate, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        io::{Read, Write},
        net::{Shutdown, SocketAddr, TcpStream},
        path::PathBuf,
        sync::{
            atomic::{AtomicBool, Ordering::Relaxed},
            Arc,
        },
        thread::{self, JoinHandle},
        time::{Duration, Instant},
    };

    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};

    use super::*;
    use crate::{engine::error::exit_code, tools::serve::webconfig::WebConfig};

    /// A running server that stops when dropped.
    struct Running {
        addr: SocketAddr,
        stats: Arc<HttpStats>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.stop.store(true, Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
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
            _ => Response::text(404, "not found\n"),
        })
    }

    fn start(web: Option<WebConfig>) -> Running {
        let server = Server::bind("127.0.0.1:0", web).unwrap();
        let addr = server.local_addr();
        let stats = server.stats();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = Some(server.spawn(handler(), stop.clone()));
        Running { addr, stats, stop, thread }
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
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
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
        assert_eq!(s.stats.rejected(Reject::BadRequest), bad.len() as u64);
        assert_eq!(status(&raw(s.addr, b"GET / HTTP/2.0\r\nHost: x\r\n\r\n")), 505);
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
        assert_eq!(s.stats.rejected(Reject::HeaderTooLarge), 2);
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
    fn stop_ends_idle_connections_and_the_accept_thread() {
        let mut s = start(None);
        let mut idle = connect(s.addr);
        wait_for("the connection", || s.stats.open.load(Relaxed) == 1);
        let t = Instant::now();
        s.stop.store(true, Relaxed);
        s.thread.take().unwrap().join().unwrap();
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
    fn percent_decoding_and_head_end() {
        assert_eq!(decode("a%2Fb%20c+d", false).as_deref(), Some("a/b c+d"));
        assert_eq!(decode("a+b", true).as_deref(), Some("a b"));
        assert_eq!(decode("%", true), None);
        assert_eq!(decode("%4", true), None);
        assert_eq!(decode("%+1", true), None);
        assert_eq!(decode("%ff", true), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nrest"), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\nrest"), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn http_date_is_imf_fixdate() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // leap day
        assert_eq!(http_date(t), "Tue, 29 Feb 2000 00:00:00 GMT");
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
