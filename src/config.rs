//! The command line, parsed once into typed settings (every `serve` flag also reads
//! `SLUICE_<FLAG>`). Nothing reads the environment after this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::algorithm::Algorithm;
use crate::limiter::{DeniedSpend, ResetResolution, StoreErrorAnswer};
use crate::policy::FailureMode;
use crate::service::HeaderStyle;
use crate::tls::TlsFiles;

/// An external rate-limit service for Envoy.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service.
    Serve(Box<Serve>),
    /// Check policy files; exit 0 if all load, 1 otherwise.
    Validate {
        /// Policy files or directories of *.yaml / *.yml.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Print the RateLimitPolicy CustomResourceDefinition.
    Crd,
    /// Explain what a request would get, and why, without spending anything: from
    /// a running sluice's admin API, or with --config from policy files alone.
    Explain(Box<crate::cli::explain::ExplainArgs>),
    /// A live view of a running sluice: rules, deny ratios, top offending keys, bans.
    Top(Box<crate::cli::top::TopArgs>),
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Another service's environment to read (`--env-compat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnvCompat {
    /// envoyproxy/ratelimit's variables (see docs/envoy-gateway.md).
    Erl,
}

/// `sluice serve` settings.
#[derive(Debug, Clone, Args)]
#[command(args_override_self = true)]
pub struct Serve {
    /// OpenTelemetry tracing (off unless asked for; see docs/tracing.md).
    #[command(flatten)]
    pub tracing: crate::trace::TracingArgs,
    /// Also read envoyproxy/ratelimit's environment variables (`erl`), as when
    /// started as `ratelimit`; a flag or SLUICE_* variable of the same setting wins.
    #[arg(long, env = "SLUICE_ENV_COMPAT", value_enum)]
    pub env_compat: Option<EnvCompat>,
    /// A policy file or a directory of *.yaml/*.yml; repeatable. Reloaded on change.
    #[arg(long, env = "SLUICE_CONFIG", value_delimiter = ',')]
    pub config: Vec<PathBuf>,
    /// Also watch RateLimitPolicy resources in the cluster.
    #[arg(long, env = "SLUICE_KUBE")]
    pub kube: bool,
    /// Watch one namespace only (default: all).
    #[arg(long, env = "SLUICE_KUBE_NAMESPACE")]
    pub kube_namespace: Option<String>,
    /// Domains that policies in several namespaces may share.
    #[arg(long, env = "SLUICE_SHARED_DOMAINS", value_delimiter = ',')]
    pub shared_domains: Vec<String>,
    /// Also take policies over xDS from this server (http://HOST:PORT, or https:// for
    /// TLS): `RateLimitConfig` resources over ADS, as Envoy Gateway serves them.
    #[arg(long, env = "SLUICE_XDS_SERVER", value_parser = parse_xds_url)]
    pub xds_server: Option<XdsUrl>,
    /// The node id sent to the xDS server (Envoy Gateway publishes to
    /// `envoy-ratelimit`).
    #[arg(long, env = "SLUICE_XDS_NODE_ID", default_value = "sluice")]
    pub xds_node_id: String,
    /// A PEM certificate (chain) presented to the xDS server, with --xds-tls-key.
    #[arg(long, env = "SLUICE_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// The PEM private key (PKCS#1, PKCS#8 or SEC1) of --xds-tls-cert.
    #[arg(long, env = "SLUICE_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// PEM certificates of the authorities that sign the xDS server's certificate;
    /// needed with https://.
    #[arg(long, env = "SLUICE_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,
    /// The name the xDS server's certificate must carry (default: the URL's host).
    #[arg(long, env = "SLUICE_XDS_TLS_SERVER_NAME")]
    pub xds_tls_server_name: Option<String>,
    /// Be ready (/readyz) before the first xDS configuration arrives. Without it,
    /// readiness waits for the first version the xDS server sends that compiles.
    #[arg(long, env = "SLUICE_XDS_START_WITHOUT_CONFIG")]
    pub xds_start_without_config: bool,
    /// Largest xDS message accepted.
    #[arg(long, env = "SLUICE_XDS_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub xds_max_message_bytes: usize,
    /// Also serve /metrics here, with envoyproxy/ratelimit's
    /// `ratelimit_service_rate_limit_*` series beside sluice's (what Envoy Gateway's
    /// dashboards read).
    #[arg(long, env = "SLUICE_PROMETHEUS_ADDR")]
    pub prometheus_addr: Option<SocketAddr>,
    /// The path of --prometheus-addr's metrics.
    #[arg(long, env = "SLUICE_PROMETHEUS_PATH", default_value = "/metrics")]
    pub prometheus_path: String,
    /// The share of a limit above which a decision counts as near the limit
    /// (`sluice_near_limit_total`, `ratelimit_service_rate_limit_near_limit`).
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub near_limit_ratio: f64,
    /// `sluice_in_flight` and `sluice_debt` show the highest value of at least
    /// this long (at most twice): at least your scrape interval, so that each
    /// scrape sees every peak since the one before.
    #[arg(long, env = "SLUICE_PEAK_WINDOW", default_value = "15s", value_parser = parse_nonzero_duration)]
    pub peak_window: Duration,
    /// Every limit counts and reports but never denies (as if each had
    /// shadow_mode: true).
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub shadow_mode: bool,
    /// Prepended to every Redis key, so that several sluice fleets can share one
    /// Redis (no `{`).
    #[arg(long, env = "SLUICE_REDIS_KEY_PREFIX", default_value = "sluice:")]
    pub redis_key_prefix: String,
    /// Standalone Redis shards (URL,URL,...). Without it counters live in memory.
    #[arg(long, env = "SLUICE_REDIS", value_delimiter = ',')]
    pub redis: Vec<String>,
    /// A Redis Cluster's seed nodes, instead of standalone shards.
    #[arg(
        long,
        env = "SLUICE_REDIS_CLUSTER",
        value_delimiter = ',',
        conflicts_with = "redis"
    )]
    pub redis_cluster: Vec<String>,
    /// Redis Sentinels (URL,URL,...; `redis://[:password@]host:port` or `rediss://`):
    /// the shards are the masters named by --redis-sentinel-master, wherever these
    /// sentinels say they are.
    #[arg(
        long,
        env = "SLUICE_REDIS_SENTINEL",
        value_delimiter = ',',
        conflicts_with_all = ["redis", "redis_cluster"],
        requires = "redis_sentinel_master"
    )]
    pub redis_sentinel: Vec<String>,
    /// The Sentinel masters, one shard each (NAME,NAME,...). A master's password,
    /// TLS and database go in a URL whose host is its name: `rediss://:PASSWORD@NAME/0`.
    #[arg(
        long,
        env = "SLUICE_REDIS_SENTINEL_MASTER",
        value_delimiter = ',',
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_master: Vec<String>,
    /// Address of the RateLimitService (and gRPC health).
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: SocketAddr,
    /// Address of /healthz, /readyz, /metrics, /json and /debug/*.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// PEM certificate chain of the gRPC port; with --grpc-tls-key the port serves
    /// TLS only. Re-read when it changes.
    #[arg(long, env = "SLUICE_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, env = "SLUICE_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificates: the gRPC port then requires client certificates they
    /// sign (mutual TLS).
    #[arg(long, env = "SLUICE_GRPC_TLS_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// A DNS name the client certificates of --grpc-tls-client-ca must also carry
    /// among their subject alternative names.
    #[arg(
        long,
        env = "SLUICE_GRPC_TLS_CLIENT_SAN",
        requires = "grpc_tls_client_ca"
    )]
    pub grpc_tls_client_san: Option<String>,
    /// Address of Sluice's admin API (gRPC: Explain, ListPolicies, WatchOffenders,
    /// WatchDecisions, with reflection and health); `off` (or empty) disables it.
    /// Default 127.0.0.1:8082, loopback only; when the default is taken (another
    /// sluice on the host) the admin API is off with a warning, while an address
    /// given here must bind.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", value_parser = parse_admin_addr)]
    pub admin_addr: Option<AdminAddr>,
    /// PEM certificate chain of the admin port; with --admin-tls-key the port serves
    /// TLS only. Re-read when it changes.
    #[arg(long, env = "SLUICE_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key of --admin-tls-cert.
    #[arg(long, env = "SLUICE_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
    /// PEM CA certificates: the admin port then requires client certificates they
    /// sign (mutual TLS).
    #[arg(long, env = "SLUICE_ADMIN_TLS_CLIENT_CA", requires = "admin_tls_cert")]
    pub admin_tls_client_ca: Option<PathBuf>,
    /// PEM certificate chain of the HTTP port; with --http-tls-key the port serves
    /// HTTPS only. Re-read when it changes.
    #[arg(long, env = "SLUICE_HTTP_TLS_CERT", requires = "http_tls_key")]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key of --http-tls-cert.
    #[arg(long, env = "SLUICE_HTTP_TLS_KEY", requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// PEM CA certificates: the HTTP port then requires client certificates they
    /// sign.
    #[arg(long, env = "SLUICE_HTTP_TLS_CLIENT_CA", requires = "http_tls_cert")]
    pub http_tls_client_ca: Option<PathBuf>,
    /// Longest wait for the counter store before the failure mode decides.
    #[arg(long, env = "SLUICE_STORE_TIMEOUT", default_value = "15ms", value_parser = parse_duration)]
    pub store_timeout: Duration,
    /// Rate Limit Quota Service: how long each quota assignment stays in force in
    /// Envoy (whole seconds; Envoy reports every 5 s).
    #[arg(long, env = "SLUICE_RLQS_ASSIGNMENT_TTL", default_value = "15s", value_parser = parse_whole_seconds)]
    pub rlqs_assignment_ttl: Duration,
    /// Rate Limit Quota Service: a bucket reported idle for this long is abandoned
    /// (Envoy drops it until a request falls into it again).
    #[arg(long, env = "SLUICE_RLQS_ABANDON_AFTER", default_value = "60s", value_parser = parse_duration)]
    pub rlqs_abandon_after: Duration,
    /// What to answer when the counter store cannot be reached: open, closed, or
    /// local (each replica decides with its share of the limit).
    #[arg(long, env = "SLUICE_FAILURE_MODE", default_value = "open", value_parser = parse_failure_mode)]
    pub failure_mode: FailureMode,
    /// `failure_mode: local`: the replicas assumed to share each limit until they
    /// have counted each other through Redis or Kubernetes (each replica's share is
    /// the limit divided by this).
    #[arg(long, env = "SLUICE_LOCAL_SHARE_REPLICAS", default_value = "1", value_parser = clap::value_parser!(u32).range(1..))]
    pub local_share_replicas: u32,
    /// `failure_mode: local`: also count the replicas from the EndpointSlices of this
    /// Service, NAME or NAMESPACE/NAME (a bare name is in the pod's namespace, or the
    /// kubeconfig context's). Its ready endpoints count when they are at least as
    /// many as the replicas counted through Redis.
    #[arg(long, env = "SLUICE_LOCAL_SHARE_SERVICE", value_name = "SERVICE")]
    pub local_share_service: Option<crate::source::replicas::ServiceRef>,
    /// The algorithm of rate limits that name none: fixed_window,
    /// sliding_window_log, sliding_window_counter, token_bucket or leaky_bucket.
    #[arg(long, env = "SLUICE_DEFAULT_ALGORITHM", default_value = "sliding_window_counter", value_parser = parse_algorithm)]
    pub default_algorithm: Algorithm,
    /// What a request denied by one limit spends of its other limits: `nothing`, or
    /// its hits on each limit that admitted it (`admitting-limits`, as
    /// envoyproxy/ratelimit counts).
    #[arg(long, env = "SLUICE_DENIED_REQUESTS_SPEND", default_value = "nothing", value_parser = parse_denied_spend)]
    pub denied_requests_spend: DeniedSpend,
    /// How precisely `duration_until_reset` is answered: `micros`, or `seconds`
    /// (rounded up, as envoyproxy/ratelimit answers).
    #[arg(long, env = "SLUICE_RESET_RESOLUTION", default_value = "micros", value_parser = parse_reset_resolution)]
    pub reset_resolution: ResetResolution,
    /// How a request is answered when the counter store fails: by the failure mode
    /// (`failure-mode`), or with an error (`error`: gRPC UNKNOWN, HTTP 500, as
    /// envoyproxy/ratelimit answers, so Envoy's failure_mode_deny decides).
    #[arg(long, env = "SLUICE_STORE_ERROR_ANSWER", default_value = "failure-mode", value_parser = parse_store_error_answer)]
    pub store_error_answer: StoreErrorAnswer,
    /// Which rate-limit headers to ask Envoy to add: off, draft03, ietf, or auto
    /// (off with --xds-server, whose Envoy Gateway has Envoy add its own; draft03
    /// otherwise).
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", default_value = "auto", value_parser = parse_header_choice)]
    pub response_headers: HeaderChoice,
    /// Log line format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Most counters the in-memory store holds.
    #[arg(long, env = "SLUICE_MAX_KEYS", default_value_t = 1_000_000)]
    pub max_keys: usize,
    /// Hash every descriptor value in counter keys and in the top-offenders view,
    /// keyed by the hash secret (required with this flag).
    #[arg(long, env = "SLUICE_HASH_KEYS")]
    pub hash_keys: bool,
    /// A file holding the secret that keys the hash of values in counter keys (with
    /// `--hash-keys`, and values over 64 bytes always): the same on every replica.
    /// Trailing white space is ignored; at least 16 bytes.
    #[arg(long, env = "SLUICE_HASH_SECRET_FILE")]
    pub hash_secret_file: Option<PathBuf>,
    /// The hash secret itself. Prefer `SLUICE_HASH_SECRET` or the file: a command
    /// line is visible to every user of the host.
    #[arg(long, env = "SLUICE_HASH_SECRET", hide_env_values = true, conflicts_with = "hash_secret_file", value_parser = parse_secret)]
    pub hash_secret: Option<Secret>,
    /// How often policy and TLS files are checked for changes.
    #[arg(long, env = "SLUICE_RELOAD_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// After SIGTERM, how long to keep serving with readiness off before refusing new
    /// connections, so Kubernetes removes the pod from its endpoints first.
    #[arg(long, env = "SLUICE_DRAIN_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub drain_delay: Duration,
    /// Longest wait for in-flight calls after SIGTERM.
    #[arg(long, env = "SLUICE_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// How often an HTTP/2 PING checks that a gRPC client is still there; 0s: never.
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// How long a keepalive PING may go unanswered before the connection is closed.
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// A gRPC connection with no call for this long is closed with GOAWAY; 0s: never.
    #[arg(long, env = "SLUICE_GRPC_IDLE_TIMEOUT", default_value = "1h", value_parser = parse_duration)]
    pub grpc_idle_timeout: Duration,
    /// Longest TLS and HTTP/2 handshake of a new connection, on either port.
    #[arg(long, env = "SLUICE_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub handshake_timeout: Duration,
    /// Most gRPC connections open at once; more are closed as soon as accepted. 0:
    /// three quarters of the process's open-file limit.
    #[arg(long, env = "SLUICE_GRPC_MAX_CONNECTIONS", default_value_t = 0)]
    pub grpc_max_connections: usize,
    /// Largest request the gRPC port and `POST /json` read (bytes, or with KiB or
    /// MiB); larger is refused (RESOURCE_EXHAUSTED, HTTP 413) before it is all read.
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES", default_value = "64KiB", value_parser = parse_bytes)]
    pub max_request_bytes: usize,
    /// Threads answering requests; 0 means one per CPU available to the process (its
    /// cgroup quota included). 1 spends about a fifth less CPU per Redis decision when
    /// sluice shares its cores (no wake-ups across threads;
    /// docs/performance-notes.md, "Worker threads").
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
}

/// The admin port's address as given, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAddr {
    Off,
    At(SocketAddr),
}

/// The admin API's address when `--admin-addr` is not given.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:8082";

fn parse_admin_addr(s: &str) -> Result<AdminAddr, String> {
    match s.trim() {
        "" | "off" => Ok(AdminAddr::Off),
        a => a
            .parse()
            .map(AdminAddr::At)
            .map_err(|e| format!("'{a}': {e}; expected HOST:PORT or off")),
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

fn parse_xds_url(s: &str) -> Result<XdsUrl, String> {
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

fn parse_secret(s: &str) -> Result<Secret, String> {
    Ok(Secret(s.to_string()))
}

impl Serve {
    /// The headers sluice asks Envoy to add. `auto` adds none when the policies come
    /// from an xDS server: that is Envoy Gateway, which always configures Envoy's
    /// filter with `enable_x_ratelimit_headers`, so Envoy writes the `x-ratelimit-*`
    /// headers from sluice's statuses and a second set from sluice would repeat
    /// each one. Everywhere else nothing else adds them, so `auto` is `draft03`.
    /// (envoyproxy/ratelimit's environment passes `off` unless
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`, as envoyproxy/ratelimit itself does.)
    pub fn header_style(&self) -> HeaderStyle {
        match self.response_headers {
            HeaderChoice::Style(style) => style,
            HeaderChoice::Auto if self.xds_server.is_some() => HeaderStyle::Off,
            HeaderChoice::Auto => HeaderStyle::Draft03,
        }
    }

    /// The gRPC port's TLS files, when it serves TLS.
    pub fn grpc_tls(&self) -> Option<TlsFiles> {
        let mut files = tls_files(
            &self.grpc_tls_cert,
            &self.grpc_tls_key,
            &self.grpc_tls_client_ca,
        )?;
        files.client_san = self.grpc_tls_client_san.clone();
        Some(files)
    }

    /// The admin port's TLS files, when it serves TLS.
    pub fn admin_tls(&self) -> Option<TlsFiles> {
        tls_files(
            &self.admin_tls_cert,
            &self.admin_tls_key,
            &self.admin_tls_client_ca,
        )
    }

    /// The HTTP port's TLS files, when it serves TLS.
    pub fn http_tls(&self) -> Option<TlsFiles> {
        tls_files(
            &self.http_tls_cert,
            &self.http_tls_key,
            &self.http_tls_client_ca,
        )
    }
}

fn tls_files(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    client_ca: &Option<PathBuf>,
) -> Option<TlsFiles> {
    Some(TlsFiles {
        cert: cert.clone()?,
        key: key.clone()?,
        client_ca: client_ca.clone(),
        client_san: None,
    })
}

fn parse_failure_mode(s: &str) -> Result<FailureMode, String> {
    match s {
        "open" => Ok(FailureMode::Open),
        "closed" => Ok(FailureMode::Closed),
        "local" => Ok(FailureMode::Local),
        _ => Err(format!("expected open, closed or local, got {s:?}")),
    }
}

fn parse_denied_spend(s: &str) -> Result<DeniedSpend, String> {
    match s {
        "nothing" => Ok(DeniedSpend::Nothing),
        "admitting-limits" => Ok(DeniedSpend::AdmittingLimits),
        _ => Err(format!("expected nothing or admitting-limits, got {s:?}")),
    }
}

fn parse_reset_resolution(s: &str) -> Result<ResetResolution, String> {
    match s {
        "micros" => Ok(ResetResolution::Micros),
        "seconds" => Ok(ResetResolution::Seconds),
        _ => Err(format!("expected micros or seconds, got {s:?}")),
    }
}

fn parse_store_error_answer(s: &str) -> Result<StoreErrorAnswer, String> {
    match s {
        "failure-mode" => Ok(StoreErrorAnswer::FailureMode),
        "error" => Ok(StoreErrorAnswer::Error),
        _ => Err(format!("expected failure-mode or error, got {s:?}")),
    }
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number from 0 to 1, got {s:?}")),
    }
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!(
            "expected fixed_window, sliding_window_log, sliding_window_counter, token_bucket or leaky_bucket, got {s:?}"
        )
    })
}

/// `--response-headers`: a header style, or `auto` to let the policy source decide
/// ([`Serve::header_style`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderChoice {
    Auto,
    Style(HeaderStyle),
}

fn parse_header_choice(s: &str) -> Result<HeaderChoice, String> {
    match s {
        "auto" => Ok(HeaderChoice::Auto),
        "off" => Ok(HeaderChoice::Style(HeaderStyle::Off)),
        "draft03" => Ok(HeaderChoice::Style(HeaderStyle::Draft03)),
        "ietf" => Ok(HeaderChoice::Style(HeaderStyle::Ietf)),
        _ => Err(format!("expected auto, off, draft03 or ietf, got {s:?}")),
    }
}

/// A duration longer than zero.
fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
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

/// A duration of whole seconds, at least one: Envoy reads quota TTLs in whole
/// seconds, so `1500ms` would silently become 1 s there.
pub fn parse_whole_seconds(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.subsec_nanos() != 0 || d.is_zero() {
        return Err(format!(
            "{s:?} is not a whole number of seconds of at least 1s (Envoy reads it in whole seconds)"
        ));
    }
    Ok(d)
}

/// Parses a duration flag with the policies' syntax (`250ms`, `10s`, `1.5s`, `1d`,
/// `1m30s`; [`crate::policy::duration`]), zero included.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::policy::duration::parse(s).map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15ms"), Ok(Duration::from_millis(15)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("5x").is_err());
        assert_eq!(parse_whole_seconds("15s"), Ok(Duration::from_secs(15)));
        assert!(parse_whole_seconds("1500ms").is_err());
        assert!(parse_whole_seconds("0s").is_err());
    }

    /// A flag takes every duration a policy takes (decimals, days), and still zero
    /// where zero means something; a bad one stops start-up naming the flag and the
    /// mistake.
    #[test]
    fn duration_flags_take_the_policies_syntax() {
        let serve = |flag: &str, value: &str| {
            let args = ["sluice", "serve", "--config", "a.yaml", flag, value];
            match Cli::try_parse_from(args) {
                Ok(Cli {
                    command: Command::Serve(s),
                    ..
                }) => Ok(s),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        let s = serve("--store-timeout", "1.5ms").unwrap();
        assert_eq!(s.store_timeout, Duration::from_micros(1_500));
        let s = serve("--grpc-idle-timeout", "1d").unwrap();
        assert_eq!(s.grpc_idle_timeout, Duration::from_secs(86_400));
        let s = serve("--shutdown-grace", "1m30s").unwrap();
        assert_eq!(s.shutdown_grace, Duration::from_secs(90));
        let s = serve("--drain-delay", "0s").unwrap();
        assert_eq!(s.drain_delay, Duration::ZERO);
        let s = serve("--reload-interval", "250us").unwrap();
        assert_eq!(s.reload_interval, Duration::from_micros(250));

        let err = serve("--store-timeout", "15 ms").unwrap_err();
        assert!(err.contains("--store-timeout"), "{err}");
        assert!(err.contains("unknown unit ' ms' in '15 ms'"), "{err}");
        let err = serve("--drain-delay", "2").unwrap_err();
        assert!(err.contains("'2' is not a duration"), "{err}");
        let err = serve("--store-timeout", "0.5us").unwrap_err();
        assert!(err.contains("whole microseconds"), "{err}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("2MiB"), Ok(2 * 1024 * 1024));
        for bad in ["", "KiB", "0", "0KiB", "64kb", "-1", "1.5MiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn serve_flags_have_spec_defaults() {
        let cli = Cli::try_parse_from(["sluice", "serve", "--config", "a.yaml"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.grpc_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(s.http_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(s.store_timeout, Duration::from_millis(15));
        assert_eq!(s.failure_mode, FailureMode::Open);
        assert_eq!(s.response_headers, HeaderChoice::Auto);
        assert_eq!(
            s.header_style(),
            HeaderStyle::Draft03,
            "no xDS: nobody else adds them"
        );
        assert_eq!(s.max_keys, 1_000_000);
        assert_eq!(s.rlqs_assignment_ttl, Duration::from_secs(15));
        assert_eq!(s.rlqs_abandon_after, Duration::from_secs(60));
        assert_eq!(s.max_request_bytes, 64 * 1024);
        assert_eq!(s.grpc_tls(), None);
        assert_eq!(s.http_tls(), None);
        assert_eq!(s.admin_addr, None, "the default, 127.0.0.1:8082");
        assert_eq!(s.grpc_keepalive_interval, Duration::from_secs(30));
        assert_eq!(s.grpc_keepalive_timeout, Duration::from_secs(10));
        assert_eq!(s.grpc_idle_timeout, Duration::from_secs(3600));
        assert_eq!(s.handshake_timeout, Duration::from_secs(10));
        assert_eq!(s.grpc_max_connections, 0);
        assert_eq!(s.default_algorithm, Algorithm::SlidingWindowCounter);
        assert_eq!(s.peak_window, crate::telemetry::DEFAULT_PEAK_WINDOW);
        let zero = [
            "sluice",
            "serve",
            "--config",
            "a.yaml",
            "--grpc-keepalive-timeout",
            "0s",
        ];
        assert!(Cli::try_parse_from(zero).is_err());
    }

    #[test]
    fn the_admin_port_can_be_moved_or_turned_off() {
        let parse = |v: &str| {
            let cli = Cli::try_parse_from(["sluice", "serve", "--config", "a", "--admin-addr", v]);
            match cli.map(|c| c.command) {
                Ok(Command::Serve(s)) => Ok(s.admin_addr),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(parse("off"), Ok(Some(AdminAddr::Off)));
        assert_eq!(parse(""), Ok(Some(AdminAddr::Off)));
        assert_eq!(
            parse("127.0.0.1:9"),
            Ok(Some(AdminAddr::At("127.0.0.1:9".parse().unwrap())))
        );
        let bad = parse("localhost").unwrap_err();
        assert!(bad.contains("expected HOST:PORT or off"), "{bad}");
    }

    #[test]
    fn a_bad_local_share_service_stops_start_up_with_the_expected_form() {
        let parse = |v: &str| {
            let cli = Cli::try_parse_from([
                "sluice",
                "serve",
                "--config",
                "a",
                "--local-share-service",
                v,
            ]);
            match cli.map(|c| c.command) {
                Ok(Command::Serve(s)) => Ok(s.local_share_service.map(|s| s.to_string())),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(parse("ns/sluice"), Ok(Some("ns/sluice".to_string())));
        let bad = parse("Sluice").unwrap_err();
        assert!(bad.contains("NAME or NAMESPACE/NAME"), "{bad}");
    }

    #[test]
    fn tls_flags_come_in_pairs() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["sluice", "serve", "--config", "a.yaml"].iter().chain(args))
        };
        assert!(parse(&["--grpc-tls-cert", "c.pem"]).is_err());
        assert!(parse(&["--grpc-tls-key", "k.pem"]).is_err());
        assert!(parse(&["--grpc-tls-client-ca", "ca.pem"]).is_err());
        assert!(parse(&["--http-tls-cert", "c.pem"]).is_err());
        let cli = parse(&[
            "--grpc-tls-cert",
            "c.pem",
            "--grpc-tls-key",
            "k.pem",
            "--grpc-tls-client-ca",
            "ca.pem",
        ])
        .unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(
            s.grpc_tls(),
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
                client_san: None,
            })
        );
        assert_eq!(s.http_tls(), None);
    }

    fn serve(args: &[&str]) -> Serve {
        let cli = Cli::try_parse_from([&["sluice", "serve"], args].concat()).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        *s
    }

    #[test]
    fn response_headers_auto_leaves_them_to_envoy_gateway() {
        let xds = ["--xds-server", "https://envoy-gateway:18001"];
        assert_eq!(serve(&xds).header_style(), HeaderStyle::Off);
        let files = ["--config", "a.yaml"];
        assert_eq!(serve(&files).header_style(), HeaderStyle::Draft03);
        // A style that is asked for wins, with or without xDS.
        for (flag, style) in [
            ("draft03", HeaderStyle::Draft03),
            ("ietf", HeaderStyle::Ietf),
            ("off", HeaderStyle::Off),
        ] {
            let s = serve(&[&xds[..], &["--response-headers", flag]].concat());
            assert_eq!(s.header_style(), style, "{flag}");
            let s = serve(&[&files[..], &["--response-headers", flag]].concat());
            assert_eq!(s.header_style(), style, "{flag}");
        }
        let bad = Cli::try_parse_from(["sluice", "serve", "--response-headers", "draft"]);
        let Err(err) = bad else {
            panic!("--response-headers draft was accepted")
        };
        let err = err.to_string();
        assert!(err.contains("expected auto, off, draft03 or ietf"), "{err}");
    }

    #[test]
    fn xds_urls() {
        let u = parse_xds_url("https://envoy-gateway:18001").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.url.as_str()),
            (true, "envoy-gateway", "https://envoy-gateway:18001")
        );
        let u = parse_xds_url("http://[::1]:5/").unwrap();
        assert_eq!((u.tls, u.host.as_str()), (false, "::1"));
        for bad in [
            "envoy-gateway:18001",
            "https://h",
            "grpc://h:1",
            "https://h:1/path",
            "https://u@h:1",
        ] {
            assert!(parse_xds_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_algorithm_is_checked() {
        let parse = |v: &str| {
            Cli::try_parse_from(["sluice", "serve", "--config", "a", "--default-algorithm", v])
        };
        let Command::Serve(s) = parse("fixed_window").unwrap().command else {
            panic!("not serve")
        };
        assert_eq!(s.default_algorithm, Algorithm::FixedWindow);
        let err = parse("gcra").unwrap_err().to_string();
        assert!(err.contains("expected fixed_window"), "{err}");
    }
}
