//! envoyproxy/ratelimit's environment (`--env-compat erl`, or the binary started as
//! `ratelimit`, as Envoy Gateway's Deployment runs `/bin/ratelimit`): its variables
//! become `serve` flags before the command line is parsed, so Sluice can stand in
//! that container unchanged.
//!
//! Every variable envoyproxy/ratelimit reads is in [`VARIABLES`], with what Sluice
//! does with it: honoured (it becomes a flag), accepted and ignored (a warning once
//! at start-up when it is set to something that matters), or refused (start-up stops
//! with the reason, where ignoring it would weaken security or lose limits). A
//! `SLUICE_*` variable of the same setting wins over the envoyproxy/ratelimit one,
//! and so does a flag on the command line. docs/envoy-gateway.md lists the same
//! table (a test keeps the two in step).

use std::collections::BTreeMap;

/// What Sluice does with a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Becomes a flag, or matches what Sluice always does.
    Honoured,
    /// Read and not acted on; a warning when set to a value that would matter.
    Ignored,
    /// Start-up stops when it asks for something Sluice does not do.
    Refused,
}

/// One of envoyproxy/ratelimit's variables.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    pub treatment: Treatment,
    /// What it becomes, or why not.
    pub note: &'static str,
}

use Treatment::{Honoured, Ignored, Refused};

macro_rules! var {
    ($name:literal, $t:ident, $note:literal) => {
        Variable {
            name: $name,
            treatment: $t,
            note: $note,
        }
    };
}

/// Every variable of envoyproxy/ratelimit's settings, and Envoy Gateway's
/// `GRPC_SERVER_TLS_CA_CERT`.
pub const VARIABLES: &[Variable] = &[
    var!("HOST", Honoured, "with `PORT`: `--http-addr HOST:PORT`"),
    var!("PORT", Honoured, "with `HOST`: `--http-addr HOST:PORT`"),
    var!("GRPC_HOST", Honoured, "with `GRPC_PORT`: `--grpc-addr HOST:PORT`"),
    var!("GRPC_PORT", Honoured, "with `GRPC_HOST`: `--grpc-addr HOST:PORT`"),
    var!("DEBUG_HOST", Ignored, "sluice's `/debug/*` is on the HTTP port"),
    var!("DEBUG_PORT", Ignored, "sluice's `/debug/*` is on the HTTP port"),
    var!("GRPC_UDS", Refused, "the gRPC port is TCP only"),
    var!("GRPC_MAX_CONNECTION_AGE", Ignored, "connections are not aged out"),
    var!("GRPC_MAX_CONNECTION_AGE_GRACE", Ignored, "connections are not aged out"),
    var!("GRPC_SERVER_USE_TLS", Honoured, "`true`: TLS on the gRPC port from `GRPC_SERVER_TLS_CERT` and `GRPC_SERVER_TLS_KEY` (both required); re-read when the files change"),
    var!("GRPC_SERVER_TLS_CERT", Honoured, "`--grpc-tls-cert`, with `GRPC_SERVER_USE_TLS=true`"),
    var!("GRPC_SERVER_TLS_KEY", Honoured, "`--grpc-tls-key`, with `GRPC_SERVER_USE_TLS=true`"),
    var!("GRPC_CLIENT_TLS_CACERT", Honoured, "`--grpc-tls-client-ca`: client certificates required and verified, with `GRPC_SERVER_USE_TLS=true`"),
    var!("GRPC_CLIENT_TLS_SAN", Honoured, "`--grpc-tls-client-san`: the client certificate must also carry this DNS name, with `GRPC_CLIENT_TLS_CACERT`"),
    var!("GRPC_SERVER_TLS_CA_CERT", Ignored, "set by Envoy Gateway, read by neither envoyproxy/ratelimit nor sluice; to require Envoy's client certificate, also set `GRPC_CLIENT_TLS_CACERT` to the same file"),
    var!("LOG_LEVEL", Honoured, "the log filter (`RUST_LOG` wins when set): `trace`, `debug` (sluice's own lines; its libraries stay at `info`), `info`, `warn`, `error` (`fatal`, `panic`: `error`)"),
    var!("LOG_FORMAT", Honoured, "`--log-format` (`text` or `json`)"),
    var!("CONFIG_TYPE", Honoured, "`FILE`: `--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY --config-dir-files all` (every file in it and its subdirectories, whatever its name); `GRPC_XDS_SOTW`: `--xds-server`"),
    var!("FORCE_START_WITHOUT_INITIAL_CONFIG", Honoured, "`--xds-start-without-config`"),
    var!("CONFIG_GRPC_XDS_NODE_ID", Honoured, "`--xds-node-id` (default `default`, as there)"),
    var!("CONFIG_GRPC_XDS_NODE_METADATA", Ignored, "the node carries no metadata"),
    var!("CONFIG_GRPC_XDS_SERVER_URL", Honoured, "`--xds-server http://HOST:PORT` (`https://` with `CONFIG_GRPC_XDS_SERVER_USE_TLS`; default `localhost:18000`)"),
    var!("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Ignored, "reconnects back off from 0.5 s to 30 s with jitter"),
    var!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Ignored, "no extra headers are sent"),
    var!("CONFIG_GRPC_XDS_SERVER_USE_TLS", Honoured, "`https://` in `--xds-server`"),
    var!("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Honoured, "`--xds-tls-cert`"),
    var!("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Honoured, "`--xds-tls-key`"),
    var!("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Honoured, "`--xds-tls-ca` (needed with TLS: the system's authorities are not used)"),
    var!("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Honoured, "`--xds-tls-server-name`"),
    var!("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Ignored, "reconnects back off from 0.5 s to 30 s with jitter"),
    var!("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Ignored, "reconnects back off from 0.5 s to 30 s with jitter"),
    var!("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Ignored, "reconnects back off from 0.5 s to 30 s with jitter"),
    var!("XDS_CLIENT_BACKOFF_JITTER", Ignored, "reconnects back off from 0.5 s to 30 s with jitter"),
    var!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Honoured, "`--xds-max-message-bytes`"),
    var!("USE_STATSD", Ignored, "no statsd; `true` (envoyproxy/ratelimit's default) warns only when set"),
    var!("USE_DOG_STATSD", Ignored, "no statsd"),
    var!("USE_DOG_STATSD_MOGRIFIERS", Ignored, "no statsd"),
    var!("STATSD_HOST", Ignored, "no statsd"),
    var!("STATSD_PORT", Ignored, "no statsd"),
    var!("EXTRA_TAGS", Ignored, "no statsd"),
    var!("STATS_FLUSH_INTERVAL", Ignored, "metrics are read at scrape time"),
    var!("DISABLE_STATS", Ignored, "metrics are always kept"),
    var!("USE_PROMETHEUS", Honoured, "`true`: `--prometheus-addr PROMETHEUS_ADDR`"),
    var!("PROMETHEUS_ADDR", Honoured, "`--prometheus-addr` (default `:9090`)"),
    var!("PROMETHEUS_PATH", Honoured, "`--prometheus-path` (default `/metrics`)"),
    var!("PROMETHEUS_MAPPER_YAML", Ignored, "the series are named as Envoy Gateway's mapping names them"),
    var!("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Ignored, "`ratelimit_service_response_time_seconds` and `sluice_decision_seconds` are in seconds"),
    var!("RUNTIME_ROOT", Honoured, "with `CONFIG_TYPE=FILE`: the policy directory's root"),
    var!("RUNTIME_SUBDIRECTORY", Honoured, "with `CONFIG_TYPE=FILE`: the policy directory's second part"),
    var!("RUNTIME_APPDIRECTORY", Honoured, "with `CONFIG_TYPE=FILE`: the policy directory's last part (default `config`)"),
    var!("RUNTIME_IGNOREDOTFILES", Honoured, "files and directories whose names start with `.` are always skipped, as with `true` (with `false`, envoyproxy/ratelimit would load a mounted ConfigMap's files twice, through `..data` and its target)"),
    var!("RUNTIME_WATCH_ROOT", Honoured, "the directory is polled whichever way it changes; either way the files under `RUNTIME_APPDIRECTORY` are the policies"),
    var!("EXPIRATION_JITTER_MAX_SECONDS", Ignored, "counters expire with their window"),
    var!("LOCAL_CACHE_SIZE_IN_BYTES", Ignored, "the over-limit cache is always on and bounded"),
    var!("NEAR_LIMIT_RATIO", Honoured, "`--near-limit-ratio`, for `ratelimit_service_rate_limit_near_limit`"),
    var!("CACHE_KEY_PREFIX", Honoured, "`--redis-key-prefix`"),
    var!("BACKEND_TYPE", Honoured, "`redis` (the default), which needs `REDIS_URL`; `memcache` is refused"),
    var!("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Honoured, "`true`: `--denied-requests-spend nothing`; unset or `false`: `admitting-limits` (a denied request still spends its hits on the limits that admitted it)"),
    var!("LIMIT_RESPONSE_HEADERS_ENABLED", Honoured, "`--response-headers off`, or `draft03` when `true` (`x-ratelimit-*` names)"),
    var!("LIMIT_LIMIT_HEADER", Ignored, "header names are fixed"),
    var!("LIMIT_REMAINING_HEADER", Ignored, "header names are fixed"),
    var!("LIMIT_RESET_HEADER", Ignored, "header names are fixed"),
    var!("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Honoured, "readiness waits for the first xDS version unless `FORCE_START_WITHOUT_INITIAL_CONFIG`"),
    var!("REDIS_SOCKET_TYPE", Honoured, "`tcp`, or `unix` with a socket's path in `REDIS_URL` (`SINGLE` only)"),
    var!("REDIS_TYPE", Honoured, "`SINGLE`: `--redis`; `CLUSTER`: `--redis-cluster`; `SENTINEL`: `--redis-sentinel` with `--redis-sentinel-master`"),
    var!("REDIS_URL", Honoured, "`host:port` (comma-separated for a cluster), or a `redis://` URL; for `SENTINEL`, the master's name then the sentinels' `host:port`s"),
    var!("REDIS_POOL_SIZE", Ignored, "two connections per shard decide, coalescing queued requests; a few more carry the rest"),
    var!("REDIS_AUTH", Honoured, "the password (or `user:password`) in the Redis URL"),
    var!("REDIS_TLS", Honoured, "`rediss://`; the authorities are the system's (`SSL_CERT_FILE`) unless `REDIS_TLS_CACERT`; a trusted certificate the server presents as its own is accepted as pinned (self-signed, even marked CA)"),
    var!("REDIS_TLS_CLIENT_CERT", Honoured, "with `REDIS_TLS_CLIENT_KEY`: `?tls_cert=` in each `rediss://` URL (also Sentinel and Cluster): the client certificate presented to Redis"),
    var!("REDIS_TLS_CLIENT_KEY", Honoured, "with `REDIS_TLS_CLIENT_CERT`: `?tls_key=` in each `rediss://` URL"),
    var!("REDIS_TLS_CACERT", Honoured, "`?tls_ca=` in each `rediss://` URL: the authorities (or pinned certificate) trusted for Redis, in place of the system's"),
    var!("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Honoured, "`true`: `?tls_skip_hostname=true` in each `rediss://` URL: the certificate need not name the server, but must still chain to (or be) a trusted one"),
    var!("REDIS_PIPELINE_WINDOW", Ignored, "concurrent requests share calls on their own"),
    var!("REDIS_PIPELINE_LIMIT", Ignored, "concurrent requests share calls on their own"),
    var!("REDIS_CLUSTER_PIPELINE_PARALLELISM", Ignored, "concurrent requests share calls on their own"),
    var!("REDIS_PERSECOND", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_SOCKET_TYPE", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_TYPE", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_URL", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_POOL_SIZE", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_AUTH", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_TLS", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_SENTINEL_AUTH", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_PIPELINE_WINDOW", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_PIPELINE_LIMIT", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_TIMEOUT", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Ignored, "per-second limits share the one Redis"),
    var!("REDIS_SENTINEL_AUTH", Honoured, "the sentinels' password (or `user:password`) in their URLs"),
    var!("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Ignored, "shards that fail are backed off on their own"),
    var!("REDIS_TIMEOUT", Ignored, "`--store-timeout` (15 ms) bounds each decision; past it the call is answered with an error"),
    var!("REDIS_POOL_ON_EMPTY_BEHAVIOR", Ignored, "requests queue for their shard's calls, bounded by `--store-timeout`"),
    var!("REDIS_STARTUP_INITIAL_INTERVAL", Ignored, "sluice starts while Redis is down; until it is reached, calls are answered with an error (`--store-error-answer error`)"),
    var!("REDIS_STARTUP_MAX_INTERVAL", Ignored, "sluice starts while Redis is down; until it is reached, calls are answered with an error (`--store-error-answer error`)"),
    var!("REDIS_STARTUP_MAX_ELAPSED_TIME", Ignored, "sluice starts while Redis is down; until it is reached, calls are answered with an error (`--store-error-answer error`)"),
    var!("MEMCACHE_HOST_PORT", Ignored, "no memcache"),
    var!("MEMCACHE_MAX_IDLE_CONNS", Ignored, "no memcache"),
    var!("MEMCACHE_SRV", Ignored, "no memcache"),
    var!("MEMCACHE_SRV_REFRESH", Ignored, "no memcache"),
    var!("MEMCACHE_TLS", Ignored, "no memcache"),
    var!("MEMCACHE_TLS_CLIENT_CERT", Ignored, "no memcache"),
    var!("MEMCACHE_TLS_CLIENT_KEY", Ignored, "no memcache"),
    var!("MEMCACHE_TLS_CACERT", Ignored, "no memcache"),
    var!("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Ignored, "no memcache"),
    var!("SHADOW_MODE", Honoured, "`--shadow-mode`: every limit counts and never denies; each descriptor's status stays its own, the answer is OK"),
    var!("QUOTA_MODE", Ignored, "`quota_mode` is per descriptor"),
    var!("RESPONSE_DYNAMIC_METADATA", Honoured, "`true`: `--response-dynamic-metadata` (the request's `domain`, `descriptors` and `hitsAddend` in `dynamic_metadata`); the `metadata` of the descriptors that passed is returned either way"),
    var!("MERGE_DOMAIN_CONFIG", Honoured, "documents of one domain always merge"),
    var!("TRACING_ENABLED", Honoured, "`true`: `--tracing` (OTLP to `OTEL_EXPORTER_OTLP_ENDPOINT`; see docs/tracing.md)"),
    var!("TRACING_SERVICE_NAME", Honoured, "`--tracing-service-name`, with `TRACING_ENABLED=true`"),
    var!("TRACING_SERVICE_NAMESPACE", Honoured, "the `service.namespace` resource attribute, with `TRACING_ENABLED=true`"),
    var!("TRACING_SERVICE_INSTANCE_ID", Honoured, "the `service.instance.id` resource attribute, with `TRACING_ENABLED=true`"),
    var!("TRACING_EXPORTER_PROTOCOL", Honoured, "`http` (the default): `--otlp-protocol http/protobuf`; `grpc`: `--otlp-protocol grpc`"),
    var!("TRACING_SAMPLING_RATE", Honoured, "`--tracing-sampler-ratio` (0 to 1): the share of calls without a sampled parent that are traced; a call Envoy sampled always is"),
];

/// Values of ignored variables that need no warning: envoyproxy/ratelimit's
/// defaults and settings that change nothing.
const HARMLESS: &[(&str, &str)] = &[
    ("USE_STATSD", "false"),
    ("USE_DOG_STATSD", "false"),
    ("DISABLE_STATS", "false"),
    ("REDIS_PERSECOND", "false"),
    ("MEMCACHE_TLS", "false"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ("QUOTA_MODE", "false"),
];

/// `LOG_LEVEL=debug` and `trace`: Sluice's own crates at that level, the rest at info.
const OWN_DEBUG: &str = "info,sluice=debug,sluice_grpc=debug,sluice_redis=debug";
const OWN_TRACE: &str = "info,sluice=trace,sluice_grpc=trace,sluice_redis=trace";

/// Why envoyproxy/ratelimit's environment cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value}: {reason}")]
pub struct Refusal {
    pub name: String,
    pub value: String,
    pub reason: String,
}

/// The flags an environment stands for, and what to say about it at start-up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// `serve` flags and values, in order.
    pub args: Vec<String>,
    /// The log filter `LOG_LEVEL` asks for.
    pub log_level: Option<String>,
    /// One warning per ignored variable that is set.
    pub warnings: Vec<String>,
}

impl Translation {
    /// The flags as start-up logs them: passwords replaced by `***`, since logs
    /// travel further than the environment they came from.
    pub fn shown_args(&self) -> String {
        let shown: Vec<String> = self.args.iter().map(|a| hide_passwords(a)).collect();
        shown.join(" ")
    }
}

/// `text` with the password of every URL in it (`scheme://user:PASSWORD@host`, and
/// the `pass=`/`password=` of a query, as in a `unix://` URL) replaced by `***`.
pub fn hide_passwords(text: &str) -> String {
    let parts: Vec<String> = text.split(',').map(hide_url_password).collect();
    parts.join(",")
}

fn hide_url_password(part: &str) -> String {
    let Some(start) = part.find("://").map(|i| i + 3) else {
        return part.to_string();
    };
    let (head, rest) = part.split_at(start);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{head}{authority}{tail}")
}

/// Names other software sets too, left out of [`unread`]: `GRPC_PORT` and
/// `GRPC_HOST` are also what Kubernetes injects for a Service named `grpc`.
const GENERIC: &[&str] = &[
    "HOST",
    "PORT",
    "GRPC_HOST",
    "GRPC_PORT",
    "LOG_LEVEL",
    "LOG_FORMAT",
];

/// Without `--env-compat erl`: the warning for envoyproxy/ratelimit's variables
/// that are set in `env` and would change what is served if they were read (a
/// container image swapped under a Deployment keeps its environment: `REDIS_URL`
/// unread means counters in memory, per replica). `None` when none is set.
pub fn unread(env: &BTreeMap<String, String>) -> Option<String> {
    let set: Vec<&str> = VARIABLES
        .iter()
        .filter(|v| v.treatment != Ignored && !GENERIC.contains(&v.name))
        .filter(|v| env.get(v.name).is_some_and(|val| !val.trim().is_empty()))
        .map(|v| v.name)
        .collect();
    if set.is_empty() {
        return None;
    }
    Some(format!(
        "envoyproxy/ratelimit's {} {} set but not read: add --env-compat erl \
         (SLUICE_ENV_COMPAT=erl) to read them, or give their settings as flags",
        set.join(", "),
        if set.len() == 1 { "is" } else { "are" }
    ))
}

/// Translates `env` (every variable of the process). Fails on the first refused
/// setting.
pub fn translate(env: &BTreeMap<String, String>) -> Result<Translation, Refusal> {
    let mut t = Translate {
        env,
        out: Translation::default(),
    };
    t.run()?;
    Ok(t.out)
}

struct Translate<'a> {
    env: &'a BTreeMap<String, String>,
    out: Translation,
}

impl Translate<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn truthy(&self, name: &str) -> Result<bool, Refusal> {
        match self.get(name) {
            None => Ok(false),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "1" | "t" | "true" | "yes" | "on" => Ok(true),
                "0" | "f" | "false" | "no" | "off" => Ok(false),
                _ => Err(refuse(name, v, "expected true or false")),
            },
        }
    }

    /// Adds `flag value` unless the same setting's `SLUICE_*` variable is set.
    fn flag(&mut self, flag: &str, value: Option<String>) {
        let sluice = format!(
            "SLUICE_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_ascii_uppercase()
        );
        if self.env.contains_key(&sluice) {
            return;
        }
        self.out.args.push(flag.to_string());
        if let Some(v) = value {
            self.out.args.push(v);
        }
    }

    fn run(&mut self) -> Result<(), Refusal> {
        self.refusals()?;
        self.addresses();
        self.grpc_tls()?;
        self.logging()?;
        self.config()?;
        self.redis()?;
        self.metrics()?;
        self.behaviour()?;
        self.tracing()?;
        self.warnings();
        Ok(())
    }

    fn refusals(&self) -> Result<(), Refusal> {
        if let Some(v) = self.get("GRPC_UDS") {
            return Err(refuse(
                "GRPC_UDS",
                v,
                "the gRPC port is TCP only; use GRPC_HOST and GRPC_PORT",
            ));
        }
        if let Some(v) = self.get("BACKEND_TYPE") {
            if !v.eq_ignore_ascii_case("redis") {
                return Err(refuse(
                    "BACKEND_TYPE",
                    v,
                    "only redis (or no variable: counters in memory) is supported",
                ));
            }
            // Counters in memory would be a quiet change of meaning: each replica
            // would count on its own.
            if self.get("REDIS_URL").is_none() {
                return Err(refuse(
                    "BACKEND_TYPE",
                    v,
                    "needs REDIS_URL (leave BACKEND_TYPE unset for counters in memory)",
                ));
            }
        }
        Ok(())
    }

    fn addresses(&mut self) {
        for (host, port, flag, default_port) in [
            ("HOST", "PORT", "--http-addr", "8080"),
            ("GRPC_HOST", "GRPC_PORT", "--grpc-addr", "8081"),
        ] {
            if self.get(host).is_none() && self.get(port).is_none() {
                continue;
            }
            let h = self.get(host).unwrap_or("0.0.0.0").to_string();
            let p = self.get(port).unwrap_or(default_port).to_string();
            self.flag(flag, Some(join_host_port(&h, &p)));
        }
    }

    /// TLS on the gRPC port, as envoyproxy/ratelimit serves it: the certificate files
    /// count only with `GRPC_SERVER_USE_TLS=true`, and a client authority makes client
    /// certificates required.
    fn grpc_tls(&mut self) -> Result<(), Refusal> {
        let files = [
            ("GRPC_SERVER_TLS_CERT", "--grpc-tls-cert"),
            ("GRPC_SERVER_TLS_KEY", "--grpc-tls-key"),
            ("GRPC_CLIENT_TLS_CACERT", "--grpc-tls-client-ca"),
        ];
        if !self.truthy("GRPC_SERVER_USE_TLS")? {
            let vars = files.iter().map(|(var, _)| *var);
            for var in vars.chain(["GRPC_CLIENT_TLS_SAN"]) {
                if let Some(v) = self.get(var) {
                    self.out.warnings.push(format!(
                        "{var}={v} is ignored: the gRPC port serves plain text unless GRPC_SERVER_USE_TLS=true"
                    ));
                }
            }
            return Ok(());
        }
        for (var, _) in &files[..2] {
            if self.get(var).is_none() {
                return Err(refuse(
                    "GRPC_SERVER_USE_TLS",
                    "true",
                    &format!("{var} is not set; TLS needs a certificate and its key"),
                ));
            }
        }
        for (var, flag) in files {
            if let Some(v) = self.get(var).map(String::from) {
                self.flag(flag, Some(v));
            }
        }
        if let Some(san) = self.get("GRPC_CLIENT_TLS_SAN").map(String::from) {
            if self.get("GRPC_CLIENT_TLS_CACERT").is_some() {
                self.flag("--grpc-tls-client-san", Some(san));
            } else {
                self.out.warnings.push(format!(
                    "GRPC_CLIENT_TLS_SAN={san} is ignored: no client certificate is asked for without GRPC_CLIENT_TLS_CACERT"
                ));
            }
        }
        Ok(())
    }

    fn logging(&mut self) -> Result<(), Refusal> {
        if let Some(v) = self.get("LOG_LEVEL") {
            // envoyproxy/ratelimit's debug shows its own lines; here the libraries
            // below (h2, hyper, tonic) would log every frame, so they stay at info.
            let level = match v.to_ascii_lowercase().as_str() {
                "trace" => OWN_TRACE,
                "debug" => OWN_DEBUG,
                "info" => "info",
                "warn" | "warning" => "warn",
                "error" | "fatal" | "panic" => "error",
                _ => {
                    return Err(refuse(
                        "LOG_LEVEL",
                        v,
                        "expected trace, debug, info, warn or error",
                    ))
                }
            };
            self.out.log_level = Some(level.into());
        }
        if let Some(v) = self.get("LOG_FORMAT") {
            let format = v.to_ascii_lowercase();
            if format != "text" && format != "json" {
                return Err(refuse("LOG_FORMAT", v, "expected text or json"));
            }
            self.flag("--log-format", Some(format));
        }
        Ok(())
    }

    fn config(&mut self) -> Result<(), Refusal> {
        let kind = self
            .get("CONFIG_TYPE")
            .unwrap_or("FILE")
            .to_ascii_uppercase();
        match kind.as_str() {
            "FILE" => {
                let root = self
                    .get("RUNTIME_ROOT")
                    .unwrap_or("/srv/runtime_data/current");
                let mut dir = std::path::PathBuf::from(root);
                if let Some(sub) = self.get("RUNTIME_SUBDIRECTORY") {
                    dir.push(sub);
                }
                dir.push(self.get("RUNTIME_APPDIRECTORY").unwrap_or("config"));
                self.flag("--config", Some(dir.display().to_string()));
                // goruntime loads every file under it, whatever its name.
                self.flag("--config-dir-files", Some("all".into()));
                Ok(())
            }
            "GRPC_XDS_SOTW" => {
                let server = self
                    .get("CONFIG_GRPC_XDS_SERVER_URL")
                    .unwrap_or("localhost:18000")
                    .to_string();
                let tls = self.truthy("CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
                let url = if server.contains("://") {
                    server
                } else {
                    format!("{}://{server}", if tls { "https" } else { "http" })
                };
                self.flag("--xds-server", Some(url));
                let node = self
                    .get("CONFIG_GRPC_XDS_NODE_ID")
                    .unwrap_or("default")
                    .to_string();
                self.flag("--xds-node-id", Some(node));
                for (var, flag) in [
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-tls-cert"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-tls-key"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-tls-ca"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-tls-server-name"),
                    (
                        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                        "--xds-max-message-bytes",
                    ),
                ] {
                    if let Some(v) = self.get(var) {
                        let v = v.to_string();
                        self.flag(flag, Some(v));
                    }
                }
                if self.truthy("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
                    self.flag("--xds-start-without-config", None);
                }
                Ok(())
            }
            _ => Err(refuse(
                "CONFIG_TYPE",
                &kind,
                "expected FILE or GRPC_XDS_SOTW",
            )),
        }
    }

    fn redis(&mut self) -> Result<(), Refusal> {
        let Some(url) = self.get("REDIS_URL").map(String::from) else {
            return Ok(());
        };
        let socket = self.get("REDIS_SOCKET_TYPE").map(str::to_ascii_lowercase);
        let unix = match socket.as_deref() {
            Some("tcp") => false,
            Some("unix") => true,
            Some(other) => return Err(refuse("REDIS_SOCKET_TYPE", other, "expected tcp or unix")),
            // envoyproxy/ratelimit's default is unix; a host:port is meant as TCP.
            None => url.starts_with('/'),
        };
        let tls = self.truthy("REDIS_TLS")?;
        let tls = if tls {
            Some(self.redis_tls_files()?)
        } else {
            for var in [
                "REDIS_TLS_CACERT",
                "REDIS_TLS_CLIENT_CERT",
                "REDIS_TLS_CLIENT_KEY",
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            ] {
                let skip_off =
                    var == "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" && !self.truthy(var)?;
                if let Some(v) = self.get(var).filter(|_| !skip_off) {
                    self.out.warnings.push(format!(
                        "{var}={v} is ignored: Redis is spoken in plain text unless REDIS_TLS=true"
                    ));
                }
            }
            None
        };
        let tls = tls.as_deref();
        let auth = self.get("REDIS_AUTH").map(String::from);
        if unix {
            let single = self
                .get("REDIS_TYPE")
                .is_none_or(|t| t.eq_ignore_ascii_case("SINGLE"));
            if !single || url.contains(',') {
                return Err(refuse(
                    "REDIS_SOCKET_TYPE",
                    "unix",
                    "a Unix socket is one standalone Redis (REDIS_TYPE=SINGLE, one path)",
                ));
            }
            self.flag("--redis", Some(unix_url(&url, auth.as_deref())));
            if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(String::from) {
                self.flag("--redis-key-prefix", Some(prefix));
            }
            return Ok(());
        }
        let urls: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| redis_url(u, tls, auth.as_deref()))
            .collect();
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or("SINGLE")
            .to_ascii_uppercase();
        match kind.as_str() {
            "SINGLE" if urls.len() == 1 => self.flag("--redis", Some(urls.join(","))),
            "SINGLE" => {
                return Err(refuse(
                    "REDIS_URL",
                    &url,
                    "REDIS_TYPE=SINGLE takes one address",
                ))
            }
            "CLUSTER" => self.flag("--redis-cluster", Some(urls.join(","))),
            "SENTINEL" => {
                // `master,sentinel,...`: REDIS_AUTH is the master's password,
                // REDIS_SENTINEL_AUTH the sentinels'; REDIS_TLS is for both.
                let mut parts = url.split(',').map(str::trim).filter(|u| !u.is_empty());
                let (Some(master), Some(first)) = (parts.next(), parts.next()) else {
                    return Err(refuse("REDIS_URL", &url, "REDIS_TYPE=SENTINEL takes the master's name, then the sentinels: NAME,HOST:PORT,..."));
                };
                let sentinel_auth = self.get("REDIS_SENTINEL_AUTH").map(String::from);
                let sentinels: Vec<String> = std::iter::once(first)
                    .chain(parts)
                    .map(|u| redis_url(u, tls, sentinel_auth.as_deref()))
                    .collect();
                self.flag("--redis-sentinel", Some(sentinels.join(",")));
                self.flag(
                    "--redis-sentinel-master",
                    Some(redis_url(master, tls, auth.as_deref())),
                );
            }
            _ => {
                return Err(refuse(
                    "REDIS_TYPE",
                    &kind,
                    "expected SINGLE, CLUSTER or SENTINEL",
                ))
            }
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(String::from) {
            self.flag("--redis-key-prefix", Some(prefix));
        }
        Ok(())
    }

    /// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY` and
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` as the query of a `rediss://` URL
    /// (empty when none is set).
    fn redis_tls_files(&self) -> Result<String, Refusal> {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let mut query = Vec::new();
        if let Some(ca) = self.get("REDIS_TLS_CACERT") {
            query.push(format!(
                "tls_ca={}",
                utf8_percent_encode(ca, NON_ALPHANUMERIC)
            ));
        }
        match (
            self.get("REDIS_TLS_CLIENT_CERT"),
            self.get("REDIS_TLS_CLIENT_KEY"),
        ) {
            (Some(cert), Some(key)) => {
                query.push(format!(
                    "tls_cert={}",
                    utf8_percent_encode(cert, NON_ALPHANUMERIC)
                ));
                query.push(format!(
                    "tls_key={}",
                    utf8_percent_encode(key, NON_ALPHANUMERIC)
                ));
            }
            (None, None) => {}
            (Some(v), None) => {
                return Err(refuse(
                    "REDIS_TLS_CLIENT_CERT",
                    v,
                    "REDIS_TLS_CLIENT_KEY is not set; a client certificate needs its key",
                ))
            }
            (None, Some(v)) => {
                return Err(refuse(
                    "REDIS_TLS_CLIENT_KEY",
                    v,
                    "REDIS_TLS_CLIENT_CERT is not set; a client key needs its certificate",
                ))
            }
        }
        if self.truthy("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? {
            query.push("tls_skip_hostname=true".into());
        }
        Ok(if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        })
    }

    fn metrics(&mut self) -> Result<(), Refusal> {
        if self.truthy("USE_PROMETHEUS")? {
            let addr = self.get("PROMETHEUS_ADDR").unwrap_or(":9090");
            let addr = match addr.strip_prefix(':') {
                Some(port) => format!("0.0.0.0:{port}"),
                None => addr.to_string(),
            };
            self.flag("--prometheus-addr", Some(addr));
            if let Some(path) = self.get("PROMETHEUS_PATH").map(String::from) {
                self.flag("--prometheus-path", Some(path));
            }
        }
        if let Some(ratio) = self.get("NEAR_LIMIT_RATIO").map(String::from) {
            self.flag("--near-limit-ratio", Some(ratio));
        }
        Ok(())
    }

    fn behaviour(&mut self) -> Result<(), Refusal> {
        let headers = if self.truthy("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            "draft03"
        } else {
            // Envoy Gateway's Envoy adds the x-ratelimit-* headers itself
            // (enable_x_ratelimit_headers): sluice must not add them a second time.
            "off"
        };
        self.flag("--response-headers", Some(headers.into()));
        if self.truthy("RESPONSE_DYNAMIC_METADATA")? {
            self.flag("--response-dynamic-metadata", None);
        }
        if self.truthy("SHADOW_MODE")? {
            self.flag("--shadow-mode", None);
        }
        // envoyproxy/ratelimit's answers where sluice's own defaults differ.
        self.flag("--default-algorithm", Some("fixed_window".into()));
        let spend = if self.truthy("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
            "nothing"
        } else {
            "admitting-limits"
        };
        self.flag("--denied-requests-spend", Some(spend.into()));
        self.flag("--reset-resolution", Some("seconds".into()));
        self.flag("--store-error-answer", Some("error".into()));
        Ok(())
    }

    fn warnings(&mut self) {
        for v in VARIABLES.iter().filter(|v| v.treatment == Ignored) {
            let Some(value) = self.env.get(v.name) else {
                continue;
            };
            if value.is_empty()
                || HARMLESS
                    .iter()
                    .any(|(n, h)| *n == v.name && value.eq_ignore_ascii_case(h))
            {
                continue;
            }
            let value = if v.name.ends_with("_AUTH") {
                "***".to_string()
            } else {
                hide_passwords(value)
            };
            self.out
                .warnings
                .push(format!("{}={value} is ignored: {}", v.name, v.note));
        }
    }
}

impl Translate<'_> {
    /// envoyproxy/ratelimit's tracing, as Envoy Gateway's `rateLimit.telemetry.tracing`
    /// sets it; the endpoint is OpenTelemetry's own `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// which sluice reads as such. The other variables count only with
    /// `TRACING_ENABLED=true`, as there.
    fn tracing(&mut self) -> Result<(), Refusal> {
        if !self.truthy("TRACING_ENABLED")? {
            return Ok(());
        }
        self.flag("--tracing", None);
        let protocol = match self.get("TRACING_EXPORTER_PROTOCOL") {
            None => "http/protobuf",
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "http" => "http/protobuf",
                "grpc" => "grpc",
                _ => {
                    return Err(refuse(
                        "TRACING_EXPORTER_PROTOCOL",
                        v,
                        "expected http or grpc",
                    ))
                }
            },
        };
        self.flag("--otlp-protocol", Some(protocol.into()));
        if let Some(v) = self.get("TRACING_SERVICE_NAME").map(String::from) {
            self.flag("--tracing-service-name", Some(v));
        }
        let mut resource = Vec::new();
        for (var, attribute) in [
            ("TRACING_SERVICE_NAMESPACE", "service.namespace"),
            ("TRACING_SERVICE_INSTANCE_ID", "service.instance.id"),
        ] {
            if let Some(v) = self.get(var) {
                let v =
                    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC);
                resource.push(format!("{attribute}={v}"));
            }
        }
        if !resource.is_empty() {
            self.flag("--tracing-resource-attributes", Some(resource.join(",")));
        }
        if let Some(v) = self.get("TRACING_SAMPLING_RATE") {
            match v.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => {
                    let v = v.trim().to_string();
                    self.flag("--tracing-sampler-ratio", Some(v));
                }
                _ => {
                    return Err(refuse(
                        "TRACING_SAMPLING_RATE",
                        v,
                        "expected a number from 0 to 1",
                    ))
                }
            }
        }
        Ok(())
    }
}

/// A refusal, printed at start-up: a URL's password is not shown.
fn refuse(name: &str, value: &str, reason: &str) -> Refusal {
    Refusal {
        name: name.to_string(),
        value: hide_passwords(value),
        reason: reason.to_string(),
    }
}

fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A socket path as a `unix://` URL, `REDIS_AUTH` (`password` or `user:password`)
/// in its query.
fn unix_url(path: &str, auth: Option<&str>) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let mut url = format!("unix://{}", path.trim());
    if let Some(auth) = auth {
        let (user, pass) = match auth.split_once(':') {
            Some((u, p)) => (Some(u), p),
            None => (None, auth),
        };
        url.push('?');
        if let Some(user) = user {
            url.push_str(&format!(
                "user={}&",
                utf8_percent_encode(user, NON_ALPHANUMERIC)
            ));
        }
        url.push_str(&format!(
            "pass={}",
            utf8_percent_encode(pass, NON_ALPHANUMERIC)
        ));
    }
    url
}

/// `host:port` (or a URL as given) as a Redis URL with `auth` (`password` or
/// `user:password`, as envoyproxy/ratelimit splits it), over TLS when `tls` gives
/// the TLS files' query (maybe empty).
fn redis_url(addr: &str, tls: Option<&str>, auth: Option<&str>) -> String {
    if addr.contains("://") {
        return addr.to_string();
    }
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let userinfo = match auth {
        None => String::new(),
        Some(a) => match a.split_once(':') {
            Some((user, pass)) => format!("{}:{}@", encode(user), encode(pass)),
            None => format!(":{}@", encode(a)),
        },
    };
    format!("{scheme}://{userinfo}{addr}{}", tls.unwrap_or_default())
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What Envoy Gateway's Deployment sets (the TLS of the gRPC port aside).
    fn envoy_gateway() -> BTreeMap<String, String> {
        env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis.svc:6379"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ])
    }

    #[test]
    fn envoy_gateways_tracing_becomes_these_flags() {
        // What `rateLimit.telemetry.tracing` with `samplingRate: 50` adds.
        let mut vars = envoy_gateway();
        vars.extend(env(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9f-x2x"),
            ("TRACING_SAMPLING_RATE", "0.5"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-svc.observability:4318",
            ),
        ]));
        let t = translate(&vars).unwrap();
        let at = t.args.iter().position(|a| a == "--tracing").unwrap();
        assert_eq!(
            t.args[at..],
            [
                "--tracing",
                "--otlp-protocol",
                "http/protobuf",
                "--tracing-service-name",
                "envoy-ratelimit",
                "--tracing-resource-attributes",
                "service.namespace=envoy%2Dgateway%2Dsystem,service.instance.id=envoy%2Dratelimit%2D7d9f%2Dx2x",
                "--tracing-sampler-ratio",
                "0.5",
            ]
        );
        assert_eq!(
            t.warnings.len(),
            2,
            "no warning for tracing: {:?}",
            t.warnings
        );
        // The flags parse into settings naming the same things.
        let mut argv = vec!["sluice".to_string(), "serve".to_string()];
        argv.extend(t.args.iter().cloned());
        let cli = <crate::config::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let crate::config::Command::Serve(serve) = cli.command else {
            panic!("not serve")
        };
        let get = |k: &str| vars.get(k).cloned();
        let s = crate::trace::settings(&serve.tracing, &get)
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://otel-svc.observability:4318/v1/traces");
        assert_eq!(
            s.resource,
            [
                ("service.name", "envoy-ratelimit"),
                ("service.namespace", "envoy-gateway-system"),
                ("service.instance.id", "envoy-ratelimit-7d9f-x2x"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(
            s.sampler,
            crate::trace::config::Sampler::ParentBased(crate::trace::config::Root::Ratio(0.5))
        );
        // Off unless enabled; a bad value is refused.
        let mut off = envoy_gateway();
        off.insert("TRACING_SAMPLING_RATE".into(), "0.5".into());
        assert!(!translate(&off)
            .unwrap()
            .args
            .contains(&"--tracing".to_string()));
        let mut bad = vars.clone();
        bad.insert("TRACING_SAMPLING_RATE".into(), "50".into());
        assert_eq!(translate(&bad).unwrap_err().name, "TRACING_SAMPLING_RATE");
        bad.insert("TRACING_SAMPLING_RATE".into(), "0.5".into());
        bad.insert("TRACING_EXPORTER_PROTOCOL".into(), "zipkin".into());
        assert_eq!(
            translate(&bad).unwrap_err().name,
            "TRACING_EXPORTER_PROTOCOL"
        );
    }

    #[test]
    fn envoy_gateways_environment_becomes_these_flags() {
        let t = translate(&envoy_gateway()).unwrap();
        assert_eq!(
            t.args,
            [
                "--xds-server",
                "https://envoy-gateway:18001",
                "--xds-node-id",
                "envoy-ratelimit",
                "--xds-tls-cert",
                "/certs/tls.crt",
                "--xds-tls-key",
                "/certs/tls.key",
                "--xds-tls-ca",
                "/certs/ca.crt",
                "--xds-start-without-config",
                "--redis",
                "redis://redis.redis.svc:6379",
                "--prometheus-addr",
                "0.0.0.0:19001",
                "--response-headers",
                "off",
                "--default-algorithm",
                "fixed_window",
                "--denied-requests-spend",
                "admitting-limits",
                "--reset-resolution",
                "seconds",
                "--store-error-answer",
                "error",
            ]
        );
        assert_eq!(t.log_level.as_deref(), Some("info"));
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        assert!(t.warnings[0].starts_with("GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt is ignored"));
        assert!(t.warnings[1].starts_with("PROMETHEUS_MAPPER_YAML="));
    }

    #[test]
    fn envoy_gateways_grpc_tls_becomes_the_tls_flags() {
        let mut e = envoy_gateway();
        for (k, v) in [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ] {
            e.insert(k.into(), v.into());
        }
        let t = translate(&e).unwrap();
        assert_eq!(
            t.args[..4],
            [
                "--grpc-tls-cert",
                "/certs/tls.crt",
                "--grpc-tls-key",
                "/certs/tls.key"
            ]
        );
        assert!(!t.args.iter().any(|a| a == "--grpc-tls-client-ca"));
        // The client authority makes client certificates required.
        e.insert("GRPC_CLIENT_TLS_CACERT".into(), "/certs/ca.crt".into());
        let t = translate(&e).unwrap();
        assert_eq!(t.args[4..6], ["--grpc-tls-client-ca", "/certs/ca.crt"]);
        // A SLUICE_* variable of the same setting wins.
        e.insert("SLUICE_GRPC_TLS_CERT".into(), "/mine.crt".into());
        let t = translate(&e).unwrap();
        assert_eq!(t.args[..2], ["--grpc-tls-key", "/certs/tls.key"]);
    }

    #[test]
    fn grpc_tls_without_a_certificate_is_refused_and_files_without_tls_are_ignored() {
        let mut e = envoy_gateway();
        e.insert("GRPC_SERVER_USE_TLS".into(), "true".into());
        e.insert("GRPC_SERVER_TLS_CERT".into(), "/certs/tls.crt".into());
        let r = translate(&e).unwrap_err();
        assert_eq!(r.name, "GRPC_SERVER_USE_TLS");
        assert!(
            r.to_string().contains("GRPC_SERVER_TLS_KEY is not set"),
            "{r}"
        );

        e.insert("GRPC_SERVER_USE_TLS".into(), "false".into());
        let t = translate(&e).unwrap();
        assert!(!t.args.iter().any(|a| a.starts_with("--grpc-tls")));
        assert!(
            t.warnings
                .iter()
                .any(|w| w.starts_with("GRPC_SERVER_TLS_CERT=/certs/tls.crt is ignored")),
            "{:?}",
            t.warnings
        );

        e.insert("GRPC_CLIENT_TLS_SAN".into(), "envoy".into());
        let t = translate(&e).unwrap();
        assert!(!t.args.iter().any(|a| a == "--grpc-tls-client-san"));
        assert!(
            t.warnings
                .iter()
                .any(|w| w.starts_with("GRPC_CLIENT_TLS_SAN=envoy is ignored")),
            "{:?}",
            t.warnings
        );
        // With TLS but no client authority, no name is checked either: said so.
        for (k, v) in [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ] {
            e.insert(k.into(), v.into());
        }
        let t = translate(&e).unwrap();
        assert!(!t.args.iter().any(|a| a == "--grpc-tls-client-san"));
        assert!(t
            .warnings
            .iter()
            .any(|w| w.contains("without GRPC_CLIENT_TLS_CACERT")));
    }

    #[test]
    fn grpc_client_tls_san_names_the_client_with_its_authority() {
        let mut e = envoy_gateway();
        for (k, v) in [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.envoy-gateway-system"),
        ] {
            e.insert(k.into(), v.into());
        }
        let t = translate(&e).unwrap();
        assert_eq!(
            t.args[4..8],
            [
                "--grpc-tls-client-ca",
                "/certs/ca.crt",
                "--grpc-tls-client-san",
                "envoy.envoy-gateway-system"
            ]
        );
    }

    #[test]
    fn redis_types_auth_and_tls() {
        let t = translate(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:7000, b:7001"),
            ("REDIS_AUTH", "user:p@ss/w"),
            ("REDIS_TLS", "true"),
            ("CACHE_KEY_PREFIX", "eg:"),
        ]))
        .unwrap();
        let at = t.args.iter().position(|a| a == "--redis-cluster").unwrap();
        assert_eq!(
            t.args[at + 1],
            "rediss://user:p%40ss%2Fw@a:7000,rediss://user:p%40ss%2Fw@b:7001"
        );
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--redis-key-prefix", "eg:"]));
        let t = translate(&env(&[("REDIS_URL", "r:6379"), ("REDIS_AUTH", "secret")])).unwrap();
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--redis", "redis://:secret@r:6379"]));
        // envoyproxy/ratelimit's default socket type: a path is a Unix socket.
        let t = translate(&env(&[
            ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            ("REDIS_AUTH", "u:p&w"),
        ]))
        .unwrap();
        assert!(t.args.windows(2).any(|w| w
            == [
                "--redis",
                "unix:///var/run/nutcracker/ratelimit.sock?user=u&pass=p%26w"
            ]));
        for (pairs, name) in [
            (
                vec![
                    ("REDIS_URL", "/var/run/redis.sock"),
                    ("REDIS_TYPE", "CLUSTER"),
                ],
                "REDIS_SOCKET_TYPE",
            ),
            (
                vec![("REDIS_URL", "mymaster"), ("REDIS_TYPE", "SENTINEL")],
                "REDIS_URL",
            ),
            (vec![("REDIS_URL", "a:1,b:2")], "REDIS_URL"),
            (
                vec![
                    ("REDIS_URL", "a:1"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_CLIENT_CERT", "/c"),
                ],
                "REDIS_TLS_CLIENT_CERT",
            ),
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
            (vec![("BACKEND_TYPE", "redis")], "BACKEND_TYPE"),
            (
                vec![("BACKEND_TYPE", "redis"), ("REDIS_URL", "")],
                "BACKEND_TYPE",
            ),
        ] {
            assert_eq!(translate(&env(&pairs)).unwrap_err().name, name, "{pairs:?}");
        }
    }

    #[test]
    fn redis_tls_files_go_in_every_rediss_url() {
        let tls = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/certs/cert.pem"),
            ("REDIS_TLS_CLIENT_CERT", "/certs/cert.pem"),
            ("REDIS_TLS_CLIENT_KEY", "/certs/my key.pem"),
        ];
        let q = "?tls_ca=%2Fcerts%2Fcert%2Epem&tls_cert=%2Fcerts%2Fcert%2Epem&tls_key=%2Fcerts%2Fmy%20key%2Epem";
        let value = |t: &Translation, flag: &str| {
            let at = t.args.iter().position(|a| a == flag).expect(flag);
            t.args[at + 1].clone()
        };
        let mut e = env(&tls);
        e.insert("REDIS_URL".into(), "localhost:16361".into());
        e.insert("REDIS_AUTH".into(), "password123".into());
        let t = translate(&e).unwrap();
        assert_eq!(
            value(&t, "--redis"),
            format!("rediss://:password123@localhost:16361{q}")
        );
        e.insert("REDIS_TYPE".into(), "cluster".into());
        e.insert("REDIS_URL".into(), "a:1,b:2".into());
        let t = translate(&e).unwrap();
        assert_eq!(
            value(&t, "--redis-cluster"),
            format!("rediss://:password123@a:1{q},rediss://:password123@b:2{q}")
        );
        e.insert("REDIS_TYPE".into(), "sentinel".into());
        e.insert("REDIS_URL".into(), "mymaster,s:26379".into());
        let t = translate(&e).unwrap();
        assert_eq!(
            value(&t, "--redis-sentinel"),
            format!("rediss://s:26379{q}")
        );
        assert_eq!(
            value(&t, "--redis-sentinel-master"),
            format!("rediss://:password123@mymaster{q}")
        );
        // Without REDIS_TLS the files are not used, and said so.
        let mut e = env(&tls);
        e.insert("REDIS_URL".into(), "r:6379".into());
        e.remove("REDIS_TLS");
        let t = translate(&e).unwrap();
        assert_eq!(value(&t, "--redis"), "redis://r:6379");
        assert_eq!(
            t.warnings
                .iter()
                .filter(|w| w.contains("unless REDIS_TLS=true"))
                .count(),
            3,
            "{:?}",
            t.warnings
        );
    }

    #[test]
    fn redis_tls_skip_hostname_verification_goes_in_the_url() {
        let value = |t: &Translation, flag: &str| {
            let at = t.args.iter().position(|a| a == flag).expect(flag);
            t.args[at + 1].clone()
        };
        let mut e = env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "10.0.0.5:6380"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/c/ca.pem"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ]);
        let t = translate(&e).unwrap();
        assert_eq!(
            value(&t, "--redis"),
            "rediss://10.0.0.5:6380?tls_ca=%2Fc%2Fca%2Epem&tls_skip_hostname=true"
        );
        e.insert(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(),
            "false".into(),
        );
        let t = translate(&e).unwrap();
        assert_eq!(
            value(&t, "--redis"),
            "rediss://10.0.0.5:6380?tls_ca=%2Fc%2Fca%2Epem"
        );
        // Without TLS: ignored, and said so only when it would have mattered.
        e.remove("REDIS_TLS");
        let t = translate(&e).unwrap();
        assert!(
            t.warnings.iter().all(|w| !w.contains("SKIP_HOSTNAME")),
            "{:?}",
            t.warnings
        );
        e.insert("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(), "true".into());
        let t = translate(&e).unwrap();
        assert_eq!(value(&t, "--redis"), "redis://10.0.0.5:6380");
        assert!(
            t.warnings.iter().any(|w| w.contains("SKIP_HOSTNAME")),
            "{:?}",
            t.warnings
        );
        e.insert("REDIS_TLS".into(), "true".into());
        e.insert(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(),
            "maybe".into(),
        );
        let refusal = translate(&e).unwrap_err();
        assert_eq!(refusal.name, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION");
    }

    #[test]
    fn redis_sentinel_takes_the_master_then_the_sentinels() {
        let t = translate(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster, s1:26379,s2:26379"),
            ("REDIS_AUTH", "p@ss"),
            ("REDIS_SENTINEL_AUTH", "watch"),
        ]))
        .unwrap();
        let value = |flag: &str| {
            let at = t.args.iter().position(|a| a == flag).expect(flag);
            t.args[at + 1].clone()
        };
        assert_eq!(
            value("--redis-sentinel"),
            "redis://:watch@s1:26379,redis://:watch@s2:26379"
        );
        assert_eq!(value("--redis-sentinel-master"), "redis://:p%40ss@mymaster");
        assert!(!t.args.iter().any(|a| a == "--redis"));
        let t = translate(&env(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379"),
            ("REDIS_TLS", "true"),
        ]))
        .unwrap();
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--redis-sentinel", "rediss://s1:26379"]));
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--redis-sentinel-master", "rediss://mymaster"]));
    }

    #[test]
    fn file_mode_addresses_headers_and_shadow() {
        let t = translate(&env(&[
            ("RUNTIME_ROOT", "/srv/runtime_data/current"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("PORT", "9080"),
            ("GRPC_HOST", "::"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("SHADOW_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("LOG_FORMAT", "JSON"),
        ]))
        .unwrap();
        assert_eq!(
            t.args,
            [
                "--http-addr",
                "0.0.0.0:9080",
                "--grpc-addr",
                "[::]:8081",
                "--log-format",
                "json",
                "--config",
                "/srv/runtime_data/current/ratelimit/config",
                "--config-dir-files",
                "all",
                "--near-limit-ratio",
                "0.9",
                "--response-headers",
                "draft03",
                "--response-dynamic-metadata",
                "--shadow-mode",
                "--default-algorithm",
                "fixed_window",
                "--denied-requests-spend",
                "admitting-limits",
                "--reset-resolution",
                "seconds",
                "--store-error-answer",
                "error",
            ]
        );
    }

    #[test]
    fn stop_cache_key_increment_when_overlimit_keeps_denied_requests_free() {
        let spend = |e: &[(&str, &str)]| {
            let t = translate(&env(e)).unwrap();
            let at = t
                .args
                .iter()
                .position(|a| a == "--denied-requests-spend")
                .expect("set");
            t.args[at + 1].clone()
        };
        assert_eq!(spend(&[]), "admitting-limits");
        assert_eq!(
            spend(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")]),
            "admitting-limits"
        );
        assert_eq!(
            spend(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")]),
            "nothing"
        );
        let r = translate(&env(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "sure")]));
        assert_eq!(
            r.unwrap_err().name,
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"
        );
        // Sluice's own variables choose otherwise.
        let t = translate(&env(&[
            ("SLUICE_DEFAULT_ALGORITHM", "token_bucket"),
            ("SLUICE_STORE_ERROR_ANSWER", "failure-mode"),
        ]))
        .unwrap();
        assert!(!t
            .args
            .iter()
            .any(|a| a == "--default-algorithm" || a == "--store-error-answer"));
    }

    #[test]
    fn a_sluice_variable_wins_over_its_envoyproxy_ratelimit_twin() {
        let mut e = envoy_gateway();
        e.insert("SLUICE_RESPONSE_HEADERS".into(), "ietf".into());
        e.insert("SLUICE_XDS_NODE_ID".into(), "mine".into());
        let t = translate(&e).unwrap();
        assert!(!t
            .args
            .iter()
            .any(|a| a == "--response-headers" || a == "--xds-node-id"));
    }

    #[test]
    fn ignored_variables_warn_once_unless_harmless() {
        let t = translate(&env(&[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
            ("REDIS_POOL_SIZE", "10"),
            ("DISABLE_STATS", "false"),
        ]))
        .unwrap();
        let names: Vec<&str> = t
            .warnings
            .iter()
            .map(|w| w.split('=').next().unwrap())
            .collect();
        assert_eq!(names, ["USE_STATSD", "STATSD_HOST", "REDIS_POOL_SIZE"]);
        for bad in [
            ("LOG_LEVEL", "loud"),
            ("CONFIG_TYPE", "CONSUL"),
            ("USE_PROMETHEUS", "maybe"),
        ] {
            assert_eq!(translate(&env(&[bad])).unwrap_err().name, bad.0);
        }
    }

    #[test]
    fn passwords_are_not_shown_in_the_logged_flags_warnings_or_refusals() {
        let t = translate(&env(&[
            ("REDIS_URL", "127.0.0.1:28379"),
            ("REDIS_AUTH", "S3cr3t"),
        ]))
        .unwrap();
        let shown = t.shown_args();
        assert!(
            shown.contains("--redis redis://:***@127.0.0.1:28379"),
            "{shown}"
        );
        let t = translate(&env(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_AUTH", "u:MasterPw"),
            ("REDIS_SENTINEL_AUTH", "SentinelPw"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
            ("REDIS_PERSECOND_AUTH", "PerSecondPw"),
            ("REDIS_PERSECOND_URL", "redis://:UrlPw@p:6379"),
        ]))
        .unwrap();
        let shown = format!("{} {}", t.shown_args(), t.warnings.join(" "));
        for secret in ["MasterPw", "SentinelPw", "PerSecondPw", "UrlPw"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("rediss://:***@s1:26379?tls_ca=%2Fca%2Epem,rediss://:***@s2:26379"),
            "{shown}"
        );
        assert!(shown.contains("rediss://u:***@mymaster"), "{shown}");
        let t = translate(&env(&[
            ("REDIS_URL", "/run/r.sock"),
            ("REDIS_AUTH", "u:SockPw"),
        ]))
        .unwrap();
        assert!(
            t.shown_args()
                .contains("unix:///run/r.sock?user=u&pass=***"),
            "{}",
            t.shown_args()
        );
        let refused = translate(&env(&[("REDIS_URL", "redis://:RefusedPw@a:1,b:2")])).unwrap_err();
        assert!(!refused.to_string().contains("RefusedPw"), "{refused}");
        // The flags themselves keep the passwords.
        assert!(t.args.iter().any(|a| a.contains("SockPw")));
    }

    #[test]
    fn log_level_debug_is_sluices_own_debug_lines_only() {
        use tracing::Level;
        use tracing_subscriber::layer::SubscriberExt;
        let filter = |level| translate(&env(&[("LOG_LEVEL", level)])).unwrap().log_level;
        let debug = filter("debug").unwrap();
        let logs = tracing_subscriber::registry().with(tracing_subscriber::EnvFilter::new(debug));
        tracing::subscriber::with_default(logs, || {
            assert!(tracing::enabled!(target: "sluice::source::file", Level::DEBUG));
            assert!(tracing::enabled!(target: "sluice_grpc::connection", Level::DEBUG));
            assert!(!tracing::enabled!(target: "h2::codec::framed_read", Level::DEBUG));
            assert!(tracing::enabled!(target: "h2::codec::framed_read", Level::INFO));
        });
        let trace = filter("TRACE").unwrap();
        let logs = tracing_subscriber::registry().with(tracing_subscriber::EnvFilter::new(trace));
        tracing::subscriber::with_default(logs, || {
            assert!(tracing::enabled!(target: "sluice_redis::pool", Level::TRACE));
            assert!(!tracing::enabled!(target: "hyper::proto", Level::DEBUG));
        });
        assert_eq!(filter("warning").as_deref(), Some("warn"));
        assert_eq!(filter("fatal").as_deref(), Some("error"));
    }

    #[test]
    fn docs_list_every_variable_as_treated_here() {
        let doc = include_str!("../docs/envoy-gateway.md");
        for v in VARIABLES {
            let treatment = match v.treatment {
                Honoured => "honoured",
                Ignored => "accepted, ignored",
                Refused => "refused",
            };
            let row = format!("| `{}` | {treatment} | {} |", v.name, v.note);
            assert!(doc.contains(&row), "docs/envoy-gateway.md lacks: {row}");
        }
    }

    #[test]
    fn every_variable_is_listed_once() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
    }
}
