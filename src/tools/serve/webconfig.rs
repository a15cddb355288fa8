//! The web configuration file of Prometheus' exporter-toolkit
//! (`--web.config.file`), the one node_exporter users already have: TLS,
//! basic auth, extra response headers and a request rate limit.
//!
//! The schema is exporter-toolkit's `docs/web-configuration.md`; unknown keys
//! are refused, and relative paths are relative to the file's directory, as
//! there. Differences: the file is read once at start (exporter-toolkit reads
//! it per request), except that certificate and key files are re-read when
//! their modification time changes, so a rotated certificate is picked up on
//! the next handshake; TLS is rustls with the `ring` provider, which speaks
//! TLS 1.2 and 1.3 only (`min_version: TLS10`/`TLS11` act as `TLS12`), and
//! `client_allowed_sans` matches DNS names and IP addresses only.
use std::{
    collections::{BTreeMap, VecDeque},
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::{Instant, SystemTime},
};

use anyhow::Result;
use base64::Engine;
use rustls::{
    crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::{
        danger::{ClientCertVerified, ClientCertVerifier},
        ClientHello, ResolvesServerCert, WebPkiClientVerifier,
    },
    sign::CertifiedKey,
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::engine::error::usage;

/// Successful (user, password) checks remembered, so that a scrape every
/// second does not cost a bcrypt each time (exporter-toolkit keeps 100 too).
const AUTH_CACHE: usize = 100;

/// A loaded and checked web configuration.
pub struct WebConfig {
    path: PathBuf,
    tls: Option<Arc<ServerConfig>>,
    users: BTreeMap<String, String>,
    /// Checked against when the user is unknown, so that the answer takes as
    /// long as for a known user (no user enumeration by timing).
    decoy_hash: String,
    headers: Vec<(String, String)>,
    limiter: Option<Mutex<Bucket>>,
    /// SHA-256 of (user, hash, password) of recent successful checks.
    verified: Mutex<VecDeque<[u8; 32]>>,
    /// One bcrypt at a time: each costs tens of milliseconds of CPU.
    bcrypt: Mutex<()>,
}

/// The outcome of checking a request's `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub enum Auth {
    /// No `basic_auth_users`: everyone is let in.
    Open,
    /// Basic auth succeeded for this user.
    User(String),
    /// Credentials missing or wrong: answer 401.
    Denied,
}

impl WebConfig {
    /// Reads and checks the file: YAML schema, certificate and key, client
    /// CA, bcrypt hashes. A bad file is a usage error naming the file, the
    /// line when the YAML parser gives one, and the problem.
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text = fs::read_to_string(path)
            .map_err(|e| usage(format!("--web.config.file {}: cannot read it ({e})", path.display())))?;
        Self::parse(&text, path)
            .map_err(|msg| usage(format!("--web.config.file {}: {}", path.display(), msg.replace('\n', " "))))
    }

    fn parse(text: &str, path: &Path) -> Result<WebConfig, String> {
        let raw: RawConfig =
            serde_yaml_ng::from_str::<Option<RawConfig>>(text).map_err(yaml_error)?.unwrap_or_default();
        let dir = path.parent().unwrap_or(Path::new("."));
        let tls = match raw.tls_server_config {
            Some(t) if t.enabled() => Some(tls_config(t, dir)?),
            _ => None,
        };
        let users = raw.basic_auth_users.unwrap_or_default();
        let mut max_cost = 0;
        for (user, hash) in &users {
            let parts: bcrypt::HashParts = hash
                .parse()
                .map_err(|e| format!("basic_auth_users: {user}: not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"))?;
            max_cost = max_cost.max(parts.get_cost());
        }
        // Any well-formed hash will do as the decoy: checking a password
        // against it costs the same as against a user's hash of that cost.
        let decoy_hash = format!("$2y${:02}${}", max_cost.max(4), ".".repeat(53));
        let http = raw.http_server_config.unwrap_or_default();
        let headers = http.headers.map(|h| h.pairs()).unwrap_or_default();
        // Every response carries them: a value that cannot be sent (a line
        // break, a control character) is refused here, not per request.
        if let Some((k, _)) = headers.iter().find(|(_, v)| hyper::header::HeaderValue::from_str(v).is_err()) {
            return Err(format!(
                "http_server_config.headers.{k}: not a valid header value (a line break or control character); write it on one line"
            ));
        }
        let limiter = match raw.rate_limit {
            Some(r) => Bucket::new(&r)?.map(Mutex::new),
            None => None,
        };
        Ok(WebConfig {
            path: path.to_path_buf(),
            tls,
            users,
            decoy_hash,
            headers,
            limiter,
            verified: Mutex::new(VecDeque::new()),
            bcrypt: Mutex::new(()),
        })
    }

    /// The file this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether connections are TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether requests need basic auth.
    pub fn basic_auth(&self) -> bool {
        !self.users.is_empty()
    }

    /// The rustls configuration, when `tls_server_config` is set.
    pub fn tls_config(&self) -> Option<Arc<ServerConfig>> {
        self.tls.clone()
    }

    /// `http_server_config.headers`: added to every response.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Takes a token from the `rate_limit` bucket; false means answer 429.
    pub fn allow(&self) -> bool {
        self.limiter.as_ref().is_none_or(|b| lock(b).take(Instant::now()))
    }

    /// Checks an `Authorization` header value against `basic_auth_users`.
    pub fn authenticate(&self, authorization: Option<&str>) -> Auth {
        if self.users.is_empty() {
            return Auth::Open;
        }
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return Auth::Denied;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.decoy_hash.as_str(), false),
        };
        let key = cache_key(&user, hash, &password);
        if known && self.remembered(&key) {
            return Auth::User(user);
        }
        let ok = {
            let _one_at_a_time = lock(&self.bcrypt);
            bcrypt::verify(&password, hash).unwrap_or(false)
        };
        if ok && known {
            let mut verified = lock(&self.verified);
            if verified.len() >= AUTH_CACHE {
                verified.pop_front();
            }
            verified.push_back(key);
            Auth::User(user)
        } else {
            Auth::Denied
        }
    }

    /// Whether `key` is in the cache; compares every entry in constant time.
    fn remembered(&self, key: &[u8; 32]) -> bool {
        let verified = lock(&self.verified);
        let mut found = subtle::Choice::from(0);
        for k in verified.iter() {
            found |= k.ct_eq(key);
        }
        found.into()
    }
}

/// The parser's message, with the line even for the file's first line
/// (which serde_yaml_ng leaves out).
fn yaml_error(e: serde_yaml_ng::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        Some(at) if !msg.contains(" at line ") => format!("{msg} at line {} column {}", at.line(), at.column()),
        _ => msg,
    }
}

/// Locks, ignoring poisoning: the guarded data stays consistent (every
/// update is a single push or pop).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `Basic base64(user:password)` -> (user, password).
fn basic_credentials(header: &str) -> Option<(String, Vec<u8>)> {
    let (scheme, token) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(token.trim()).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

fn cache_key(user: &str, hash: &str, password: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [user.as_bytes(), hash.as_bytes(), password] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

// ---- the file's schema (exporter-toolkit `web/tls_config.go` `Config`) ----

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    tls_server_config: Option<RawTls>,
    http_server_config: Option<RawHttp>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<RawRateLimit>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<ClientAuth>,
    client_ca_file: Option<String>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
    cipher_suites: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Option<Vec<String>>,
}

impl RawTls {
    /// exporter-toolkit's `IsEnabled`: any TLS field set turns TLS on (and
    /// then the certificate and key must be there).
    fn enabled(&self) -> bool {
        let set = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        set(&self.cert)
            || set(&self.key)
            || set(&self.client_ca)
            || set(&self.cert_file)
            || set(&self.key_file)
            || set(&self.client_ca_file)
            || self.client_auth_type.is_some_and(|a| a != ClientAuth::NoClientCert)
    }
}

/// Go's `tls.ClientAuthType` names.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
enum ClientAuth {
    #[serde(alias = "")]
    NoClientCert,
    RequestClientCert,
    #[serde(alias = "RequireClientCert")]
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum TlsVersion {
    TLS10,
    TLS11,
    TLS12,
    TLS13,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    /// Accepted for compatibility; sonde speaks HTTP/1.1 only.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<RawHeaders>,
}

/// The headers exporter-toolkit allows (`extraHTTPHeaders` in `web/handler.go`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHeaders {
    #[serde(rename = "Content-Security-Policy")]
    content_security_policy: Option<String>,
    #[serde(rename = "X-Frame-Options")]
    x_frame_options: Option<FrameOptions>,
    #[serde(rename = "X-Content-Type-Options")]
    x_content_type_options: Option<ContentTypeOptions>,
    #[serde(rename = "X-XSS-Protection")]
    x_xss_protection: Option<String>,
    #[serde(rename = "Strict-Transport-Security")]
    strict_transport_security: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum FrameOptions {
    Deny,
    Sameorigin,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum ContentTypeOptions {
    Nosniff,
}

impl RawHeaders {
    fn pairs(self) -> Vec<(String, String)> {
        let frame = self.x_frame_options.map(|f| match f {
            FrameOptions::Deny => "deny".to_string(),
            FrameOptions::Sameorigin => "sameorigin".to_string(),
        });
        let nosniff = self.x_content_type_options.map(|ContentTypeOptions::Nosniff| "nosniff".to_string());
        [
            ("Content-Security-Policy", self.content_security_policy),
            ("X-Frame-Options", frame),
            ("X-Content-Type-Options", nosniff),
            ("X-XSS-Protection", self.x_xss_protection),
            ("Strict-Transport-Security", self.strict_transport_security),
        ]
        .into_iter()
        // Blank means unset, as in exporter-toolkit.
        .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| (k.to_string(), v)))
        .collect()
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    interval: Option<String>,
    burst: Option<u32>,
}

/// A token bucket, like Go's `rate.NewLimiter(rate.Every(interval), burst)`.
struct Bucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    last: Instant,
}

impl Bucket {
    fn new(raw: &RawRateLimit) -> Result<Option<Bucket>, String> {
        let interval = match raw.interval.as_deref() {
            None | Some("") | Some("0") => return Ok(None),
            Some(s) => humantime::parse_duration(s)
                .map_err(|e| format!("rate_limit.interval {s:?}: {e}; write a duration such as 100ms or 1s"))?,
        };
        if interval.is_zero() {
            return Ok(None);
        }
        let burst = raw.burst.unwrap_or(0);
        if burst == 0 {
            return Err(
                "rate_limit.burst must be at least 1 when an interval is set (0 would refuse every request)".into()
            );
        }
        let burst = f64::from(burst);
        Ok(Some(Bucket { tokens: burst, burst, per_sec: 1.0 / interval.as_secs_f64(), last: Instant::now() }))
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

// ---- TLS ----

/// A PEM source: a file (re-read when it changes) or inline text.
#[derive(Debug, Clone)]
enum Pem {
    File { key: &'static str, path: PathBuf },
    Inline { key: &'static str, text: String },
}

impl Pem {
    /// `file` (relative to `dir`) or `inline`; at most one of them.
    fn pick(
        file_key: &'static str,
        file: Option<String>,
        inline_key: &'static str,
        inline: Option<String>,
        dir: &Path,
    ) -> Result<Option<Pem>, String> {
        let file = file.filter(|s| !s.is_empty());
        let inline = inline.filter(|s| !s.is_empty());
        match (file, inline) {
            (Some(_), Some(_)) => Err(format!("tls_server_config: give {file_key} or {inline_key}, not both")),
            (Some(f), None) => Ok(Some(Pem::File { key: file_key, path: dir.join(f) })),
            (None, Some(text)) => Ok(Some(Pem::Inline { key: inline_key, text })),
            (None, None) => Ok(None),
        }
    }

    fn read(&self) -> Result<Vec<u8>, String> {
        match self {
            Pem::File { key, path } => {
                fs::read(path).map_err(|e| format!("tls_server_config.{key} {}: cannot read it ({e})", path.display()))
            }
            Pem::Inline { text, .. } => Ok(text.clone().into_bytes()),
        }
    }

    fn name(&self) -> String {
        match self {
            Pem::File { key, path } => format!("tls_server_config.{key} {}", path.display()),
            Pem::Inline { key, .. } => format!("tls_server_config.{key}"),
        }
    }

    fn modified(&self) -> Option<SystemTime> {
        match self {
            Pem::File { path, .. } => fs::metadata(path).and_then(|m| m.modified()).ok(),
            Pem::Inline { .. } => None,
        }
    }

    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        let pem = self.read()?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", self.name()))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM CERTIFICATE block in it", self.name()));
        }
        Ok(certs)
    }
}

fn tls_config(t: RawTls, dir: &Path) -> Result<Arc<ServerConfig>, String> {
    let cert = Pem::pick("cert_file", t.cert_file, "cert", t.cert, dir)?
        .ok_or("tls_server_config: cert_file (or cert) is missing")?;
    let key = Pem::pick("key_file", t.key_file, "key", t.key, dir)?
        .ok_or("tls_server_config: key_file (or key) is missing")?;
    let client_ca = Pem::pick("client_ca_file", t.client_ca_file, "client_ca", t.client_ca, dir)?;

    let min = t.min_version.unwrap_or(TlsVersion::TLS12);
    let max = t.max_version.unwrap_or(TlsVersion::TLS13);
    if min > max {
        return Err(format!("tls_server_config: min_version {min:?} is above max_version {max:?}"));
    }
    if max < TlsVersion::TLS12 {
        return Err(format!("tls_server_config.max_version {max:?}: sonde's TLS (rustls) speaks TLS12 and TLS13 only"));
    }
    let mut versions = Vec::new();
    if min <= TlsVersion::TLS12 {
        versions.push(&rustls::version::TLS12);
    }
    if max == TlsVersion::TLS13 {
        versions.push(&rustls::version::TLS13);
    }

    let mut provider = ring::default_provider();
    if let Some(names) = t.cipher_suites.filter(|n| !n.is_empty()) {
        provider.cipher_suites = cipher_suites(&names)?;
        if max == TlsVersion::TLS12 && provider.cipher_suites.iter().all(|s| s.tls13().is_some()) {
            return Err("tls_server_config.cipher_suites: none of them is usable with TLS12".into());
        }
    }
    if let Some(names) = t.curve_preferences.filter(|n| !n.is_empty()) {
        provider.kx_groups = curves(&names)?;
    }
    let provider = Arc::new(provider);

    let resolver = Arc::new(CertReloader::new(cert, key, provider.clone())?);
    let auth = t.client_auth_type.unwrap_or(ClientAuth::NoClientCert);
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Option<Arc<dyn ClientCertVerifier>> = match (auth, &client_ca) {
        (ClientAuth::NoClientCert, None) => None,
        (ClientAuth::NoClientCert, Some(_)) => {
            return Err("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert; \
                        set client_auth_type: RequireAndVerifyClientCert"
                .into())
        }
        (ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert, _) => {
            Some(Arc::new(AnyClientCert { mandatory: auth == ClientAuth::RequireAnyClientCert, algorithms }))
        }
        (ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert, None) => {
            return Err(format!("tls_server_config.client_auth_type {auth:?} needs client_ca_file (or client_ca)"));
        }
        (ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for c in ca.certificates()? {
                roots.add(c).map_err(|e| format!("{}: {e}", ca.name()))?;
            }
            let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let builder =
                if auth == ClientAuth::VerifyClientCertIfGiven { builder.allow_unauthenticated() } else { builder };
            Some(builder.build().map_err(|e| format!("{}: {e}", ca.name()))?)
        }
    };

    let verifier: Option<Arc<dyn ClientCertVerifier>> = match t.client_allowed_sans.filter(|s| !s.is_empty()) {
        None => verifier,
        Some(sans) => {
            let (Some(inner), ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert) =
                (verifier, auth)
            else {
                return Err("tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert \
                            (or RequireAnyClientCert): with the others a client may send no certificate"
                    .into());
            };
            Some(Arc::new(AllowedSans { inner, sans: allowed_sans(&sans)? }))
        }
    };

    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    Ok(Arc::new(config))
}

/// Go's cipher suite names (TLS 1.2 only: Go does not let TLS 1.3 suites be
/// chosen) to the ring provider's suites, keeping the TLS 1.3 ones.
fn cipher_suites(names: &[String]) -> Result<Vec<rustls::SupportedCipherSuite>, String> {
    let all = ring::ALL_CIPHER_SUITES;
    let mut picked: Vec<_> = all.iter().filter(|s| s.tls13().is_some()).copied().collect();
    for name in names {
        // Go also accepts the chacha names without the `_SHA256` tail.
        let full = if name.ends_with("CHACHA20_POLY1305") { format!("{name}_SHA256") } else { name.clone() };
        let suite =
            all.iter().find(|s| s.tls13().is_none() && format!("{:?}", s.suite()) == full).ok_or_else(|| {
                let known: Vec<_> =
                    all.iter().filter(|s| s.tls13().is_none()).map(|s| format!("{:?}", s.suite())).collect();
                format!("tls_server_config.cipher_suites: {name} is not available; choose from {}", known.join(", "))
            })?;
        picked.push(*suite);
    }
    Ok(picked)
}

/// Go's curve names to the ring provider's key exchange groups.
fn curves(names: &[String]) -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "X25519" => Ok(ring::kx_group::X25519),
            "CurveP256" => Ok(ring::kx_group::SECP256R1),
            "CurveP384" => Ok(ring::kx_group::SECP384R1),
            _ => Err(format!(
                "tls_server_config.curve_preferences: {name} is not available; choose from X25519, CurveP256, CurveP384"
            )),
        })
        .collect()
}

/// The server's certificate and key, re-read on the next handshake after
/// either file changes (a failed re-read keeps the previous pair).
#[derive(Debug)]
struct CertReloader {
    cert: Pem,
    key: Pem,
    provider: Arc<CryptoProvider>,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl CertReloader {
    fn new(cert: Pem, key: Pem, provider: Arc<CryptoProvider>) -> Result<CertReloader, String> {
        let stamp = (cert.modified(), key.modified());
        let loaded = load_pair(&cert, &key, &provider)?;
        Ok(CertReloader { cert, key, provider, current: Mutex::new((stamp, loaded)) })
    }
}

fn load_pair(cert: &Pem, key: &Pem, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, String> {
    let chain = cert.certificates()?;
    let pem = key.read()?;
    let der =
        PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{}: no usable private key ({e})", key.name()))?;
    let certified =
        CertifiedKey::from_der(chain, der, provider).map_err(|e| format!("{} and {}: {e}", cert.name(), key.name()))?;
    Ok(Arc::new(certified))
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let stamp = (self.cert.modified(), self.key.modified());
        let mut current = lock(&self.current);
        if stamp != current.0 {
            if let Ok(fresh) = load_pair(&self.cert, &self.key, &self.provider) {
                *current = (stamp, fresh);
            }
        }
        Some(current.1.clone())
    }
}

/// `client_allowed_sans` entries as names a certificate can be checked
/// against: DNS names and IP addresses (webpki checks no e-mail or URI SANs).
fn allowed_sans(sans: &[String]) -> Result<Vec<ServerName<'static>>, String> {
    sans.iter()
        .map(|san| {
            ServerName::try_from(san.as_str()).map(|n| n.to_owned()).map_err(|_| {
                format!(
                    "tls_server_config.client_allowed_sans: {san:?} is not a DNS name or IP address \
                     (sonde cannot match e-mail or URI SANs)"
                )
            })
        })
        .collect()
}

/// Verifies as `inner`, then requires the client certificate to carry one
/// of `sans` as a subject alternative name (exporter-toolkit's
/// `VerifyPeerCertificate`; a wildcard DNS SAN in the certificate matches
/// too, as webpki matches names).
#[derive(Debug)]
struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    sans: Vec<ServerName<'static>>,
}

impl ClientCertVerifier for AllowedSans {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
        if self.sans.iter().any(|name| cert.verify_is_valid_for_subject_name(name).is_ok()) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `RequestClientCert` / `RequireAnyClientCert`: asks for a client
/// certificate and checks that the client holds its key, but trusts any
/// certificate (Go's semantics; exporter-toolkit calls these insecure).
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, path::PathBuf};

    use super::*;
    use crate::engine::error::exit_code;

    /// Writes `files` into a fresh directory and loads `web.yml` from it.
    fn load(name: &str, yaml: &str, files: &[(&str, &str)]) -> (Result<WebConfig>, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sonde-webconfig-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            fs::write(dir.join(f), text).unwrap();
        }
        let path = dir.join("web.yml");
        fs::write(&path, yaml).unwrap();
        let loaded = WebConfig::load(&path);
        let _ = fs::remove_dir_all(&dir);
        (loaded, path)
    }

    /// The one-line usage error for `yaml`, checked to name the file.
    fn error(name: &str, yaml: &str, files: &[(&str, &str)]) -> String {
        let (loaded, path) = load(name, yaml, files);
        let err = loaded.err().expect("the file should be refused");
        assert_eq!(exit_code(&err), 2, "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        msg
    }

    fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn empty_files_and_empty_sections_mean_plain_http_without_auth() {
        for yaml in
            ["", "# nothing\n", "tls_server_config:\nbasic_auth_users:\n", "tls_server_config:\n  cert_file: \"\"\n"]
        {
            let web = load("empty", yaml, &[]).0.unwrap();
            assert!(!web.tls() && !web.basic_auth(), "{yaml:?}");
            assert_eq!(web.authenticate(None), Auth::Open);
            assert!(web.headers().is_empty() && web.allow());
        }
    }

    #[test]
    fn unknown_keys_are_refused_with_the_key_and_line() {
        let msg = error("unknown", "basic_auth_users: {}\ntls_server_config:\n  cert_fle: x.pem\n", &[]);
        assert!(msg.contains("cert_fle") && msg.contains("line 3"), "{msg}");
        let msg = error("top", "rate_limits: {}\n", &[]);
        assert!(msg.contains("rate_limits") && msg.contains("line 1"), "{msg}");
        let msg = error("header", "http_server_config:\n  headers:\n    X-Powered-By: sonde\n", &[]);
        assert!(msg.contains("X-Powered-By"), "{msg}");
        let msg = error("frame", "http_server_config:\n  headers:\n    X-Frame-Options: allow\n", &[]);
        assert!(msg.contains("allow") && msg.contains("line 3"), "{msg}");
        let msg = error("auth", "tls_server_config:\n  client_auth_type: Always\n", &[]);
        assert!(msg.contains("Always") && msg.contains("RequireAndVerifyClientCert"), "{msg}");
        let msg = error("yaml", "basic_auth_users: [\n", &[]);
        assert!(msg.contains("line"), "{msg}");
    }

    #[test]
    fn unreadable_or_inconsistent_tls_settings_are_refused() {
        let (cert, key) = self_signed();
        let files = [("c.pem", cert.as_str()), ("k.pem", key.as_str())];
        let msg = error("nocert", "tls_server_config:\n  cert_file: missing.pem\n  key_file: k.pem\n", &files);
        assert!(msg.contains("missing.pem") && msg.contains("cannot read"), "{msg}");
        let msg = error("nokey", "tls_server_config:\n  cert_file: c.pem\n", &files);
        assert!(msg.contains("key_file"), "{msg}");
        let msg = error("swapped", "tls_server_config:\n  cert_file: k.pem\n  key_file: c.pem\n", &files);
        assert!(msg.contains("k.pem"), "{msg}");
        let base = "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n";
        let msg = error("ca", &format!("{base}  client_ca_file: c.pem\n"), &files);
        assert!(msg.contains("NoClientCert"), "{msg}");
        let msg = error("noca", &format!("{base}  client_auth_type: RequireAndVerifyClientCert\n"), &files);
        assert!(msg.contains("client_ca_file"), "{msg}");
        let msg = error("versions", &format!("{base}  min_version: TLS13\n  max_version: TLS12\n"), &files);
        assert!(msg.contains("min_version"), "{msg}");
        let msg = error("suite", &format!("{base}  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n"), &files);
        assert!(msg.contains("TLS_RSA_WITH_RC4_128_SHA") && msg.contains("choose from"), "{msg}");
        let msg = error("curve", &format!("{base}  curve_preferences: [CurveP521]\n"), &files);
        assert!(msg.contains("CurveP521"), "{msg}");
        let msg = error("sans", &format!("{base}  client_allowed_sans: [a.example]\n"), &files);
        assert!(msg.contains("RequireAndVerifyClientCert"), "{msg}");
        let sans = "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [ops@example.com]\n";
        let msg = error("email", &format!("{base}{sans}"), &files);
        assert!(msg.contains("ops@example.com") && msg.contains("e-mail"), "{msg}");
        let msg = error("both", &format!("{base}  cert: |\n    x\n"), &files);
        assert!(msg.contains("not both"), "{msg}");
    }

    #[test]
    fn tls_settings_from_go_names_load() {
        let (cert, key) = self_signed();
        let indented = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
        let yaml = format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}  client_auth_type: RequireAnyClientCert\n  \
             min_version: TLS10\n  max_version: TLS12\n  prefer_server_cipher_suites: false\n  \
             cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305]\n  \
             curve_preferences: [X25519, CurveP256]\nhttp_server_config:\n  http2: false\n",
            indented(&cert),
            indented(&key)
        );
        let web = load("inline", &yaml, &[]).0.unwrap();
        assert!(web.tls());
        let config = web.tls_config().unwrap();
        assert!(!config.ignore_client_order);
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn the_example_file_loads() {
        let (cert, key) = self_signed();
        let example = include_str!("../../../deploy/web-config.example.yml");
        let files = [("sonde.crt", cert.as_str()), ("sonde.key", key.as_str())];
        let web = load("example", example, &files).0.unwrap();
        assert!(web.tls() && web.basic_auth());
        assert_eq!(web.headers().len(), 2);
    }

    #[test]
    fn header_values_that_cannot_be_sent_are_refused() {
        let msg = error(
            "web.yml",
            "http_server_config:\n  headers:\n    Content-Security-Policy: \"default-src 'self'\\nSet-Cookie: x\"\n",
            &[],
        );
        assert!(msg.contains("headers.Content-Security-Policy") && msg.contains("one line"), "{msg}");
    }

    #[test]
    fn bad_bcrypt_hashes_and_rate_limits_are_refused() {
        let msg = error("hash", "basic_auth_users:\n  alice: plaintext\n", &[]);
        assert!(msg.contains("alice") && msg.contains("htpasswd"), "{msg}");
        let msg = error("burst", "rate_limit:\n  interval: 1s\n", &[]);
        assert!(msg.contains("burst"), "{msg}");
        let msg = error("interval", "rate_limit:\n  interval: often\n  burst: 1\n", &[]);
        assert!(msg.contains("often"), "{msg}");
        let web = load("nolimit", "rate_limit:\n  interval: 0s\n  burst: 0\n", &[]).0.unwrap();
        assert!(web.allow());
    }

    #[test]
    fn successful_checks_are_cached_and_unknown_users_cost_a_bcrypt() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let web = load("cache", &format!("basic_auth_users:\n  alice: '{hash}'\n"), &[]).0.unwrap();
        let header = |user: &str, pw: &str| {
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}")))
        };
        assert_eq!(web.authenticate(Some(&header("alice", "pw"))), Auth::User("alice".into()));
        assert_eq!(lock(&web.verified).len(), 1);
        assert_eq!(web.authenticate(Some(&header("alice", "pw"))), Auth::User("alice".into()));
        assert_eq!(lock(&web.verified).len(), 1, "the second check is served from the cache");
        assert_eq!(web.authenticate(Some(&header("alice", "nope"))), Auth::Denied);
        assert_eq!(web.authenticate(Some(&header("bob", "pw"))), Auth::Denied);
        assert_eq!(web.authenticate(Some("Basic !!!")), Auth::Denied);
        assert_eq!(web.authenticate(None), Auth::Denied);
        assert_eq!(lock(&web.verified).len(), 1, "failures are not cached");
        // The decoy is a well-formed hash of the users' cost.
        assert_eq!(bcrypt::verify("pw", &web.decoy_hash).ok(), Some(false));
        assert!(web.decoy_hash.starts_with("$2y$04$"), "{}", web.decoy_hash);
    }
}
