//! envoyproxy/ratelimit's variables, each with what Sluice does with it (the table
//! docs/envoy-gateway.md repeats), and the values of ignored ones that need no
//! warning.

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
    var!("HOST", Honoured, "with `PORT`: `--http-addr HOST:PORT`; unset or `0.0.0.0` is `[::]`, every address of both families, as Go listens"),
    var!("PORT", Honoured, "with `HOST`: `--http-addr HOST:PORT`"),
    var!("GRPC_HOST", Honoured, "with `GRPC_PORT`: `--grpc-addr HOST:PORT`; unset or `0.0.0.0` is `[::]`, every address of both families, as Go listens"),
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
    var!("PROMETHEUS_ADDR", Honoured, "`--prometheus-addr` (default `:9090`; `:PORT` and `0.0.0.0:PORT` are `[::]:PORT`, both families)"),
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
    var!("BACKEND_TYPE", Honoured, "`redis` needs `REDIS_URL`; unset: Redis when `REDIS_URL` is set, otherwise counters in memory; any other value (`memcache`) is refused"),
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
    var!("TRACING_SAMPLING_RATE", Honoured, "`--tracing-sampler-ratio` (0 to 1): the share of calls with no parent that are traced; a call Envoy sampled always is, one it did not never is"),
];

/// Values of ignored variables that need no warning: envoyproxy/ratelimit's
/// defaults and settings that change nothing.
pub(super) const HARMLESS: &[(&str, &str)] = &[
    ("USE_STATSD", "false"),
    ("USE_DOG_STATSD", "false"),
    ("DISABLE_STATS", "false"),
    ("REDIS_PERSECOND", "false"),
    ("MEMCACHE_TLS", "false"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
    ("QUOTA_MODE", "false"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_list_every_variable_as_treated_here() {
        let doc = include_str!("../../docs/envoy-gateway.md");
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
