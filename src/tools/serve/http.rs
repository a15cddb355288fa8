//! STUB (replaced by the http branch): a minimal GET server.
#![allow(missing_docs)]
use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener},
    sync::{atomic::AtomicBool, Arc},
};

pub struct Request {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub peer: SocketAddr,
    pub user: Option<String>,
}
impl Request {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}
impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self::bytes(status, "text/plain; charset=utf-8", body.into().into_bytes())
    }
    pub fn bytes(status: u16, ct: &str, body: Vec<u8>) -> Self {
        Self { status, headers: vec![("Content-Type".into(), ct.into())], body }
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
}
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;
#[derive(Default)]
pub struct HttpStats;
impl HttpStats {
    pub fn expose(&self, _e: &mut super::expo::Expo) {}
}
pub struct Server(TcpListener);
impl Server {
    pub fn bind(addr: &str, _web: Option<super::webconfig::WebConfig>) -> anyhow::Result<Server> {
        Ok(Server(TcpListener::bind(addr)?))
    }
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }
    pub fn stats(&self) -> Arc<HttpStats> {
        Arc::default()
    }
    pub fn spawn(self, h: Handler, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        self.0.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((s, peer)) = self.0.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                };
                let h = h.clone();
                std::thread::spawn(move || {
                    s.set_nonblocking(false).unwrap();
                    let mut r = BufReader::new(&s);
                    let mut line = String::new();
                    let _ = r.read_line(&mut line);
                    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
                    let query =
                        q.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
                    let req = Request { method: "GET".into(), path: path.into(), query, peer, user: None };
                    let resp = h(&req);
                    let mut w = &s;
                    let _ = write!(
                        w,
                        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                        resp.status,
                        resp.body.len()
                    );
                    for (k, v) in &resp.headers {
                        let _ = write!(w, "{k}: {v}\r\n");
                    }
                    let _ = w.write_all(b"\r\n");
                    let _ = w.write_all(&resp.body);
                });
            }
        })
    }
}
