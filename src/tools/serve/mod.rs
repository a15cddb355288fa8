//! `sonde serve`: a long-running process that exposes Prometheus `/metrics`
//! and pprof endpoints. `webconfig` reads exporter-toolkit's
//! `--web.config.file` (TLS, basic auth).
pub mod webconfig;
