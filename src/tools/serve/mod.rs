//! `sonde serve`: a long-running process that exposes Prometheus `/metrics`
//! and pprof endpoints. `http` is its GET-only HTTP/1.1 server; `webconfig`
//! reads exporter-toolkit's `--web.config.file` (TLS, basic auth).
pub mod http;
pub mod webconfig;
