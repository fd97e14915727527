//! `sluice serve`'s flags in their groups, as `--help` and docs/flags.md show them;
//! each part of the server is handed its own group.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::*;
use crate::algorithm::Algorithm;
use crate::limiter::{DeniedSpend, OverrideCounter, StoreErrorAnswer};
use crate::policy::{DirFiles, FailureMode};
use crate::tls::TlsFiles;

/// Where the policies come from, and how often their files are read again.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Policies")]
pub struct PolicyArgs {
    /// A policy file or a directory of *.yaml/*.yml; repeatable. Reloaded on change.
    #[arg(long, env = "SLUICE_CONFIG", value_delimiter = ',')]
    pub config: Vec<PathBuf>,
    /// Which files of a --config directory are policies: `yaml` (its *.yaml and *.yml)
    /// or `all` (every file, in subdirectories too, as envoyproxy/ratelimit reads its
    /// runtime directory). Names starting with `.` are skipped either way.
    #[arg(long, env = "SLUICE_CONFIG_DIR_FILES", default_value = "yaml", value_parser = parse_dir_files)]
    pub config_dir_files: DirFiles,
    /// Also watch RateLimitPolicy resources in the cluster.
    #[arg(long, env = "SLUICE_KUBE")]
    pub kube: bool,
    /// Watch one namespace only (default: all).
    #[arg(long, env = "SLUICE_KUBE_NAMESPACE")]
    pub kube_namespace: Option<String>,
    /// Domains that policies in several namespaces may share.
    #[arg(long, env = "SLUICE_SHARED_DOMAINS", value_delimiter = ',')]
    pub shared_domains: Vec<String>,
    /// How often policy and TLS files are checked for changes (longer than zero).
    /// SIGHUP has them checked at once.
    #[arg(long, env = "SLUICE_RELOAD_INTERVAL", default_value = "500ms", value_parser = parse_nonzero_duration)]
    pub reload_interval: Duration,
}

/// Policies taken over xDS, as Envoy Gateway serves them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "xDS (Envoy Gateway)")]
pub struct XdsArgs {
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
    /// needed with https://. Read again at each connection, as are --xds-tls-cert
    /// and --xds-tls-key.
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
}

/// Where the counters live: in memory, or on Redis.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Counters")]
// The flags that put the counters on Redis, which every other `--redis-*` flag needs.
#[command(group(
    clap::ArgGroup::new("redis_store")
        .args(["redis", "redis_cluster", "redis_sentinel"])
        .multiple(true)
))]
pub struct StoreArgs {
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
    /// Prepended to every Redis key, so that several sluice fleets can share one
    /// Redis (no `{`). Only with --redis, --redis-cluster or --redis-sentinel.
    #[arg(
        long,
        env = "SLUICE_REDIS_KEY_PREFIX",
        default_value = "sluice:",
        requires = "redis_store",
        value_parser = parse_key_prefix
    )]
    pub redis_key_prefix: String,
    /// Longest wait for the counter store before the failure mode decides; longer
    /// than zero.
    #[arg(long, env = "SLUICE_STORE_TIMEOUT", default_value = "15ms", value_parser = parse_nonzero_duration)]
    pub store_timeout: Duration,
    /// Most counters the in-memory store holds (at least one for each of its 64
    /// shards); with Redis, most counters failure_mode local decides in memory
    /// while the store is away.
    #[arg(long, env = "SLUICE_MAX_KEYS", default_value = "1000000", value_parser = parse_max_keys)]
    pub max_keys: usize,
}

/// How requests are decided and answered.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Decisions")]
pub struct DecisionArgs {
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
    /// `failure_mode: local`: HOST:PORT where the other replicas reach this one's
    /// HTTP port, advertised in the heartbeat. A replica cut off from a shard asks
    /// its peers whether they reach it, so that its share is reserved at once.
    /// Default: --http-addr when it is a specific IP; otherwise none (this replica
    /// asks no peer).
    #[arg(long, env = "SLUICE_LOCAL_SHARE_ADVERTISE", value_name = "HOST:PORT", value_parser = parse_advertise)]
    pub local_share_advertise: Option<String>,
    /// The algorithm of rate limits that name none: fixed_window,
    /// sliding_window_log, sliding_window_counter, token_bucket or leaky_bucket.
    #[arg(long, env = "SLUICE_DEFAULT_ALGORITHM", default_value = "sliding_window_counter", value_parser = parse_algorithm)]
    pub default_algorithm: Algorithm,
    /// What a request denied by one limit spends of its other limits: `nothing`, or
    /// its hits on each limit that admitted it (`admitting-limits`, as
    /// envoyproxy/ratelimit counts).
    #[arg(long, env = "SLUICE_DENIED_REQUESTS_SPEND", default_value = "nothing", value_parser = parse_denied_spend)]
    pub denied_requests_spend: DeniedSpend,
    /// Which counter a descriptor's limit override (Envoy Gateway's
    /// limit.fromMetadata) spends: one of its own per domain, entries and unit
    /// (`apart`), or the matched rule's when both count the same window the same
    /// way (`shared`, as envoyproxy/ratelimit counts).
    #[arg(long, env = "SLUICE_OVERRIDE_COUNTER", default_value = "apart", value_parser = parse_override_counter)]
    pub override_counter: OverrideCounter,
    /// How precisely `duration_until_reset` is answered: `micros`, `seconds`
    /// (rounded up, as envoyproxy/ratelimit answers), or `auto`: `seconds` when
    /// the response headers are off (Envoy's enable_x_ratelimit_headers writes
    /// x-ratelimit-reset from the whole seconds alone), `micros` otherwise.
    #[arg(long, env = "SLUICE_RESET_RESOLUTION", default_value = "auto", value_parser = parse_reset_resolution)]
    pub reset_resolution: ResetChoice,
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
    /// Also echo the request in every answer's dynamic_metadata: its `domain`, its
    /// `descriptors` (each entry as `key=value`) and `hitsAddend`, beside the
    /// `metadata` of the descriptors that passed (envoyproxy/ratelimit's
    /// RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "SLUICE_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
    /// Every limit counts but never denies: each descriptor's status still says
    /// OVER_LIMIT past its limit, the answer is always OK (envoyproxy/ratelimit's
    /// SHADOW_MODE).
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub shadow_mode: bool,
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
}

/// The gRPC, HTTP and admin ports, and their TLS.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Ports and TLS")]
pub struct ListenArgs {
    /// Address of the RateLimitService (and gRPC health). `[::]` is every address
    /// of both families (IPv4 only on a host without IPv6).
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "[::]:8081")]
    pub grpc_addr: SocketAddr,
    /// Address of /healthz, /readyz, /metrics, /json, /debug/* and
    /// /local-share/cut (the replicas' questions to each other, failure_mode local).
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "[::]:8080")]
    pub http_addr: SocketAddr,
    /// PEM certificate chain of the gRPC port; with --grpc-tls-key the port serves
    /// TLS only. Re-read when it changes. A certificate past its notAfter, or more
    /// than 5 minutes before its notBefore, is refused (at start: serve stops).
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
    /// WatchDecisions, Block, Unblock, ListBlocks, with reflection and health); `off`
    /// (or empty) disables it.
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
    /// A DNS name the client certificates of --admin-tls-client-ca must also carry
    /// among their subject alternative names.
    #[arg(
        long,
        env = "SLUICE_ADMIN_TLS_CLIENT_SAN",
        requires = "admin_tls_client_ca"
    )]
    pub admin_tls_client_san: Option<String>,
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
}

/// Limits and timers of the connections, and the threads that answer them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct ConnectionArgs {
    /// How often an HTTP/2 PING checks that a gRPC client is still there (on the gRPC
    /// and admin ports); 0s: never.
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// How long a keepalive PING may go unanswered before the connection is closed.
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// A connection to the gRPC or admin port with no call for this long is closed
    /// (the gRPC port's with GOAWAY); 0s: never.
    #[arg(long, env = "SLUICE_GRPC_IDLE_TIMEOUT", default_value = "1h", value_parser = parse_duration)]
    pub grpc_idle_timeout: Duration,
    /// Longest TLS and HTTP/2 handshake of a new connection, on every port (the
    /// gRPC, admin and HTTP ports); and longest a request message to the gRPC port
    /// may take to arrive once begun (a unary call's from its headers), after which
    /// the call is answered DEADLINE_EXCEEDED.
    #[arg(long, env = "SLUICE_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub handshake_timeout: Duration,
    /// Most gRPC connections open at once; more are closed as soon as accepted. 0:
    /// three quarters of the process's open-file limit (its soft limit is raised to
    /// the hard one at start).
    #[arg(long, env = "SLUICE_GRPC_MAX_CONNECTIONS", default_value_t = 0)]
    pub grpc_max_connections: usize,
    /// Most connections open at once on each HTTP port (--http-addr,
    /// --prometheus-addr); more are closed as soon as accepted. Counted from accept,
    /// TLS handshakes included. 0: an eighth of the process's open-file limit. A
    /// connection silent for --handshake-timeout (mid request or between requests,
    /// not while Sluice holds a /json call for its turn) is closed, as is one whose
    /// request head (or /json body) is not whole within it, answered 408.
    #[arg(long, env = "SLUICE_HTTP_MAX_CONNECTIONS", default_value_t = 0)]
    pub http_max_connections: usize,
    /// Most connections open at once on the admin port (--admin-addr); more are
    /// closed as soon as accepted. Counted from accept, TLS handshakes included.
    #[arg(long, env = "SLUICE_ADMIN_MAX_CONNECTIONS", default_value = "64", value_parser = parse_admin_max_connections)]
    pub admin_max_connections: usize,
    /// Largest request the gRPC port and `POST /json` read (bytes, or with KiB or
    /// MiB); larger is refused (RESOURCE_EXHAUSTED, HTTP 413) before it is all read.
    /// RLQS reports may be larger: up to one of 10,000 buckets.
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES", default_value = "64KiB", value_parser = parse_request_bytes)]
    pub max_request_bytes: usize,
    /// Most bytes of unfinished gRPC request messages held at once, over all
    /// connections (bytes, or with KiB or MiB): past it, a message that has to wait
    /// for its rest is refused (RESOURCE_EXHAUSTED). One that arrives whole, as
    /// Envoy's do (a message over 16 KiB comes in several frames and is counted
    /// while it arrives), is not counted. At least --max-request-bytes.
    #[arg(long, env = "SLUICE_GRPC_MAX_BUFFERED_REQUEST_BYTES", default_value = "64MiB", value_parser = parse_request_bytes)]
    pub grpc_max_buffered_request_bytes: usize,
    /// Threads answering requests; 0 means one per CPU available to the process (its
    /// cgroup quota included). 1 spends less CPU per Redis decision when sluice
    /// shares its cores: no wake-ups across threads (docs/performance-notes.md,
    /// "Worker threads").
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value = "0", value_parser = parse_worker_threads)]
    pub worker_threads: usize,
}

/// What /metrics shows, and where else it is served.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Also serve /metrics here, with envoyproxy/ratelimit's
    /// `ratelimit_service_rate_limit_*` series beside sluice's (what Envoy Gateway's
    /// dashboards read).
    #[arg(long, env = "SLUICE_PROMETHEUS_ADDR")]
    pub prometheus_addr: Option<SocketAddr>,
    /// The path of --prometheus-addr's metrics.
    #[arg(long, env = "SLUICE_PROMETHEUS_PATH", default_value = "/metrics", value_parser = parse_http_path)]
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
}

/// The Rate Limit Quota Service's assignments.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Rate Limit Quota Service")]
pub struct RlqsArgs {
    /// Rate Limit Quota Service: how long each quota assignment stays in force in
    /// Envoy (whole seconds, at least 5s: Envoy reports every 5 s).
    #[arg(long, env = "SLUICE_RLQS_ASSIGNMENT_TTL", default_value = "15s", value_parser = parse_assignment_ttl)]
    pub rlqs_assignment_ttl: Duration,
    /// Rate Limit Quota Service: a bucket reported idle for this long is abandoned
    /// (Envoy drops it until a request falls into it again), but not before its
    /// quota has refilled; `0s` abandons it at its first idle report.
    #[arg(long, env = "SLUICE_RLQS_ABANDON_AFTER", default_value = "60s", value_parser = parse_duration)]
    pub rlqs_abandon_after: Duration,
}

/// What happens after SIGTERM.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Shutdown")]
pub struct ShutdownArgs {
    /// After SIGTERM, how long to keep serving with readiness off before refusing new
    /// connections, so Kubernetes removes the pod from its endpoints first.
    #[arg(long, env = "SLUICE_DRAIN_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub drain_delay: Duration,
    /// Longest wait for in-flight calls after SIGTERM. A second SIGTERM or SIGINT
    /// ends the process at once.
    #[arg(long, env = "SLUICE_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

impl ListenArgs {
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
        let mut files = tls_files(
            &self.admin_tls_cert,
            &self.admin_tls_key,
            &self.admin_tls_client_ca,
        )?;
        files.client_san = self.admin_tls_client_san.clone();
        Some(files)
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
