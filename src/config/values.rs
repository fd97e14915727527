//! The flags' values: their types and parsers, each refusing a bad value with a
//! message that names what is wrong.

use std::net::SocketAddr;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::limiter::{DeniedSpend, OverrideCounter, ResetResolution, StoreErrorAnswer};
use crate::policy::{DirFiles, FailureMode};
use crate::service::HeaderStyle;

/// The admin port's address as given, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAddr {
    Off,
    At(SocketAddr),
}

/// The admin API's address when `--admin-addr` is not given.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:8082";

pub(super) fn parse_admin_addr(s: &str) -> Result<AdminAddr, String> {
    match s.trim() {
        "" | "off" => Ok(AdminAddr::Off),
        a => a.parse().map(AdminAddr::At).map_err(|e| {
            format!("'{a}': {e}; expected IP:PORT (an address, not a host name) or off")
        }),
    }
}

/// `--prometheus-path`: an HTTP path, so it starts with `/`.
pub(super) fn parse_http_path(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err(format!(
            "'{s}' is not a path: it must start with '/', e.g. /metrics"
        ));
    }
    if s.contains(['?', '#', ' ']) {
        return Err(format!("'{s}' is not a path: no query, fragment or space"));
    }
    // The router reads these as captures and wildcards, not as the path's own.
    if s.contains(['{', '}']) || s.split('/').any(|seg| seg.starts_with([':', '*'])) {
        return Err(format!(
            "'{s}' is not a path: no '{{' or '}}', and no segment starting with ':' or '*'"
        ));
    }
    Ok(s.to_string())
}

/// The most `--worker-threads`: each thread takes its stack and guard pages, and far
/// more threads than cores only add switches.
const MAX_WORKER_THREADS: usize = 1024;

/// `--worker-threads`: 0 (one per CPU) up to [`MAX_WORKER_THREADS`].
pub(super) fn parse_worker_threads(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|e| format!("'{s}': {e}; expected a number of threads, 0 for one per CPU"))?;
    if n > MAX_WORKER_THREADS {
        return Err(format!(
            "{n} is more than {MAX_WORKER_THREADS} threads; 0 gives one per CPU"
        ));
    }
    Ok(n)
}

/// `--admin-max-connections`: at least one (`--admin-addr off` turns the port off).
pub(super) fn parse_admin_max_connections(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err(
            "0: the admin port must take at least one connection (--admin-addr off turns it off)"
                .to_string(),
        ),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("'{s}': {e}; expected a number of connections")),
    }
}

/// `--max-keys`: at least one counter (0 would be read as one per shard).
pub(super) fn parse_max_keys(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("0: the store must hold at least one counter".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("'{s}': {e}; expected a number of counters")),
    }
}

/// `--redis-key-prefix`, as the Redis store takes it.
pub(super) fn parse_key_prefix(s: &str) -> Result<String, String> {
    crate::store::redis::check_prefix(s).map_err(|e| format!("'{s}': {e}"))?;
    Ok(s.to_string())
}

/// `--local-share-advertise`: HOST:PORT, where the peers reach this replica's HTTP
/// port, or an IPv6 address and a port joined by `:` without brackets. No scheme,
/// path or `@` (the heartbeat set's member separates the id from the address by it).
pub(super) fn parse_advertise(s: &str) -> Result<String, String> {
    let err = || format!("expected HOST:PORT (the pod's IP and the HTTP port), got {s:?}");
    let s = s.trim();
    if s.is_empty() || s.contains(['@', '/', ' ']) {
        return Err(err());
    }
    // An IPv6 address without brackets (a pod IP and a port joined, as the Helm
    // chart passes them): its last group is the port.
    if let Some((host, port)) = s.rsplit_once(':') {
        if let (Ok(ip), Ok(port)) = (host.parse::<std::net::Ipv6Addr>(), port.parse::<u16>()) {
            if port > 0 {
                return Ok(SocketAddr::from((ip, port)).to_string());
            }
        }
    }
    let uri: http::Uri = format!("http://{s}/").parse().map_err(|_| err())?;
    let authority = uri.authority().ok_or_else(err)?;
    match authority.port_u16() {
        Some(p) if p > 0 && !authority.host().is_empty() => Ok(s.to_string()),
        _ => Err(err()),
    }
}

/// An xDS server's address: `http://HOST:PORT` or `https://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsUrl {
    /// The URL as given, normalised to `scheme://host:port`.
    pub url: String,
    pub tls: bool,
    pub host: String,
}

pub(super) fn parse_xds_url(s: &str) -> Result<XdsUrl, String> {
    let err = || format!("expected http://HOST:PORT or https://HOST:PORT, got {s:?}");
    let (tls, rest) = if let Some(rest) = s.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = s.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(err());
    };
    let rest = rest.trim_end_matches('/');
    let uri: http::Uri = format!("http://{rest}").parse().map_err(|_| err())?;
    let authority = uri.authority().ok_or_else(err)?;
    if uri.path() != "/" || authority.port_u16().is_none() || rest.contains('@') {
        return Err(err());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    Ok(XdsUrl {
        url: format!("{}://{authority}", if tls { "https" } else { "http" }),
        tls,
        host: host.to_string(),
    })
}

/// A secret given on the command line or in the environment; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

pub(super) fn parse_secret(s: &str) -> Result<Secret, String> {
    Ok(Secret(s.to_string()))
}

pub(super) fn parse_failure_mode(s: &str) -> Result<FailureMode, String> {
    FailureMode::parse(s).ok_or_else(|| format!("expected open, closed or local, got {s:?}"))
}

pub(super) fn parse_dir_files(s: &str) -> Result<DirFiles, String> {
    match s {
        "yaml" => Ok(DirFiles::Yaml),
        "all" => Ok(DirFiles::All),
        _ => Err(format!("expected yaml or all, got {s:?}")),
    }
}

pub(super) fn parse_denied_spend(s: &str) -> Result<DeniedSpend, String> {
    match s {
        "nothing" => Ok(DeniedSpend::Nothing),
        "admitting-limits" => Ok(DeniedSpend::AdmittingLimits),
        _ => Err(format!("expected nothing or admitting-limits, got {s:?}")),
    }
}

pub(super) fn parse_override_counter(s: &str) -> Result<OverrideCounter, String> {
    match s {
        "apart" => Ok(OverrideCounter::Apart),
        "shared" => Ok(OverrideCounter::Shared),
        _ => Err(format!("expected apart or shared, got {s:?}")),
    }
}

/// `--reset-resolution`: a resolution, or `auto` to follow the header style
/// ([`super::Serve::reset_resolution`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetChoice {
    Auto,
    Resolution(ResetResolution),
}

pub(super) fn parse_reset_resolution(s: &str) -> Result<ResetChoice, String> {
    match s {
        "auto" => Ok(ResetChoice::Auto),
        "micros" => Ok(ResetChoice::Resolution(ResetResolution::Micros)),
        "seconds" => Ok(ResetChoice::Resolution(ResetResolution::Seconds)),
        _ => Err(format!("expected auto, micros or seconds, got {s:?}")),
    }
}

pub(super) fn parse_store_error_answer(s: &str) -> Result<StoreErrorAnswer, String> {
    match s {
        "failure-mode" => Ok(StoreErrorAnswer::FailureMode),
        "error" => Ok(StoreErrorAnswer::Error),
        _ => Err(format!("expected failure-mode or error, got {s:?}")),
    }
}

pub(super) fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number from 0 to 1, got {s:?}")),
    }
}

pub(super) fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!(
            "expected fixed_window, sliding_window_log, sliding_window_counter, token_bucket or leaky_bucket, got {s:?}"
        )
    })
}

/// `--response-headers`: a header style, or `auto` to let the policy source decide
/// ([`super::Serve::header_style`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderChoice {
    Auto,
    Style(HeaderStyle),
}

pub(super) fn parse_header_choice(s: &str) -> Result<HeaderChoice, String> {
    match s {
        "auto" => Ok(HeaderChoice::Auto),
        "off" => Ok(HeaderChoice::Style(HeaderStyle::Off)),
        "draft03" => Ok(HeaderChoice::Style(HeaderStyle::Draft03)),
        "ietf" => Ok(HeaderChoice::Style(HeaderStyle::Ietf)),
        _ => Err(format!("expected auto, off, draft03 or ietf, got {s:?}")),
    }
}

/// A duration longer than zero.
pub(super) fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("{s:?} must be longer than zero")),
        d => Ok(d),
    }
}

/// Parses a size: `65536`, `64KiB`, `1MiB`; at least one byte.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let err = || format!("invalid size {s:?} (use e.g. 65536, 64KiB, 1MiB)");
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: usize = digits.parse().map_err(|_| err())?;
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(err()),
    };
    match n.checked_mul(scale) {
        Some(0) => Err(format!("size {s:?} must be at least one byte")),
        Some(b) => Ok(b),
        None => Err(err()),
    }
}

/// `--max-request-bytes`: a size ([`parse_bytes`]) of at most 4 GiB. A gRPC
/// message's length prefix is 32 bits, so no limit above that refuses anything more.
pub fn parse_request_bytes(s: &str) -> Result<usize, String> {
    const MOST: u64 = 4 << 30;
    let b = parse_bytes(s)?;
    if b as u64 > MOST {
        return Err(format!(
            "size {s:?} is over 4096MiB, the most a gRPC message can declare"
        ));
    }
    Ok(b)
}

/// Envoy 1.40's time between RLQS reports, whatever its `reporting_interval`.
const MIN_ASSIGNMENT_TTL: Duration = Duration::from_secs(5);

/// A quota TTL: whole seconds, as Envoy reads them (`1500ms` would silently become
/// 1 s there), and at least Envoy's 5 s between reports, or every assignment
/// would lapse before the next one and leave its bucket to Envoy's fallback.
pub fn parse_assignment_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "{s:?} is not a whole number of seconds (Envoy reads it in whole seconds)"
        ));
    }
    if d < MIN_ASSIGNMENT_TTL {
        return Err(format!(
            "{s:?} is too short: at least 5s (Envoy reports every 5 s; an assignment that lapses before the next report leaves its bucket to Envoy's fallback)"
        ));
    }
    Ok(d)
}

/// Parses a duration flag with the policies' syntax (`250ms`, `10s`, `1.5s`, `1d`,
/// `1m30s`; [`crate::policy::duration`]), zero included.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::policy::duration::parse(s).map(Duration::from_micros)
}
