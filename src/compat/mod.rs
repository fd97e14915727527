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

mod redis;
mod translate;
mod variables;

// `self::`, as the crate also depends on the `redis` crate.
pub use self::redis::hide_passwords;
pub use variables::{Treatment, Variable, VARIABLES};

use translate::Translate;
use variables::Treatment::Ignored;

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

/// A refusal, printed at start-up: a URL's password is not shown.
fn refuse(name: &str, value: &str, reason: &str) -> Refusal {
    Refusal {
        name: name.to_string(),
        value: hide_passwords(value),
        reason: reason.to_string(),
    }
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
                "[::]:19001",
                "--response-headers",
                "off",
                "--default-algorithm",
                "fixed_window",
                "--denied-requests-spend",
                "admitting-limits",
                "--override-counter",
                "shared",
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
    fn gos_every_address_is_ipv6s_too_and_a_given_address_stays() {
        let t = translate(&env(&[
            ("HOST", "0.0.0.0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "0.0.0.0:9091"),
        ]))
        .unwrap();
        for pair in [
            ["--http-addr", "[::]:8080"],
            ["--grpc-addr", "127.0.0.1:8081"],
            ["--prometheus-addr", "[::]:9091"],
        ] {
            assert!(t.args.windows(2).any(|w| w == pair), "{pair:?} in {t:?}");
        }
        let t = translate(&env(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "10.0.0.1:9091"),
        ]))
        .unwrap();
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--prometheus-addr", "10.0.0.1:9091"]));
        // Neither host nor port: sluice's own defaults, `[::]:8080` and `[::]:8081`
        // (config's `serve_flags_have_spec_defaults`).
        assert!(
            !t.args
                .iter()
                .any(|a| a == "--http-addr" || a == "--grpc-addr"),
            "{t:?}"
        );
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
                "[::]:9080",
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
                "--override-counter",
                "shared",
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
}
