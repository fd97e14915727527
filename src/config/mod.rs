//! The command line, parsed once into typed settings (every `serve` flag also reads
//! `SLUICE_<FLAG>`). Nothing reads the environment after this.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::limiter::ResetResolution;
use crate::service::HeaderStyle;

mod groups;
mod values;

pub use groups::{
    ConnectionArgs, DecisionArgs, ListenArgs, MetricsArgs, PolicyArgs, RlqsArgs, ShutdownArgs,
    StoreArgs, XdsArgs,
};
pub use values::{
    parse_assignment_ttl, parse_bytes, parse_duration, AdminAddr, HeaderChoice, ResetChoice,
    Secret, XdsUrl, DEFAULT_ADMIN_ADDR,
};

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
        /// Which files of a directory are policies, as `serve --config-dir-files`
        /// says: `yaml` or `all` (every file, in subdirectories too).
        #[arg(long, default_value = "yaml", value_parser = values::parse_dir_files)]
        config_dir_files: crate::policy::DirFiles,
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
    /// Also read envoyproxy/ratelimit's environment variables (`erl`), as when
    /// started as `ratelimit`; a flag or SLUICE_* variable of the same setting wins.
    #[arg(long, env = "SLUICE_ENV_COMPAT", value_enum)]
    pub env_compat: Option<EnvCompat>,
    /// Log line format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub policies: PolicyArgs,
    #[command(flatten)]
    pub xds: XdsArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub decisions: DecisionArgs,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub rlqs: RlqsArgs,
    #[command(flatten)]
    pub shutdown: ShutdownArgs,
    /// OpenTelemetry tracing (off unless asked for; see docs/tracing.md).
    #[command(flatten)]
    pub tracing: crate::trace::TracingArgs,
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
        match self.decisions.response_headers {
            HeaderChoice::Style(style) => style,
            HeaderChoice::Auto if self.xds.xds_server.is_some() => HeaderStyle::Off,
            HeaderChoice::Auto => HeaderStyle::Draft03,
        }
    }

    /// How precisely `duration_until_reset` is answered. `auto` rounds it up to
    /// whole seconds when sluice adds no headers of its own: Envoy then writes
    /// them (`enable_x_ratelimit_headers`), and its `x-ratelimit-reset` is the
    /// reset's whole seconds alone, so a reset under a second would read 0 and a
    /// denied client would come back at once.
    pub fn reset_resolution(&self) -> ResetResolution {
        match self.decisions.reset_resolution {
            ResetChoice::Resolution(r) => r,
            ResetChoice::Auto if self.header_style() == HeaderStyle::Off => {
                ResetResolution::Seconds
            }
            ResetChoice::Auto => ResetResolution::Micros,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::values::*;
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::FailureMode;
    use crate::tls::TlsFiles;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15ms"), Ok(Duration::from_millis(15)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("15").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("5x").is_err());
        assert_eq!(parse_assignment_ttl("15s"), Ok(Duration::from_secs(15)));
        assert!(parse_assignment_ttl("1500ms").is_err());
        assert!(parse_assignment_ttl("0s").is_err());
        // Envoy reports every 5 s: a shorter TTL lapses before each next report.
        let short = parse_assignment_ttl("4s").unwrap_err();
        assert!(short.contains("at least 5s"), "{short}");
        assert_eq!(parse_assignment_ttl("5s"), Ok(Duration::from_secs(5)));
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
        assert_eq!(s.store.store_timeout, Duration::from_micros(1_500));
        let s = serve("--grpc-idle-timeout", "1d").unwrap();
        assert_eq!(s.connections.grpc_idle_timeout, Duration::from_secs(86_400));
        let s = serve("--shutdown-grace", "1m30s").unwrap();
        assert_eq!(s.shutdown.shutdown_grace, Duration::from_secs(90));
        let s = serve("--drain-delay", "0s").unwrap();
        assert_eq!(s.shutdown.drain_delay, Duration::ZERO);
        let s = serve("--reload-interval", "250us").unwrap();
        assert_eq!(s.policies.reload_interval, Duration::from_micros(250));

        let err = serve("--store-timeout", "15 ms").unwrap_err();
        assert!(err.contains("--store-timeout"), "{err}");
        assert!(err.contains("unknown unit ' ms' in '15 ms'"), "{err}");
        let err = serve("--drain-delay", "2").unwrap_err();
        assert!(err.contains("'2' is not a duration"), "{err}");
        let err = serve("--store-timeout", "0.5us").unwrap_err();
        assert!(err.contains("whole microseconds"), "{err}");
        // Zero would stop the file and TLS reloads (a timer cannot tick every 0 s).
        let err = serve("--reload-interval", "0s").unwrap_err();
        assert!(err.contains("--reload-interval"), "{err}");
        assert!(err.contains("must be longer than zero"), "{err}");
        // Zero would leave each decision to how soon Redis happens to answer.
        let err = serve("--store-timeout", "0ms").unwrap_err();
        assert!(
            err.contains("invalid value '0ms' for '--store-timeout <STORE_TIMEOUT>': \"0ms\" must be longer than zero"),
            "{err}"
        );
    }

    /// The admin port takes at least one connection; 0 is refused, not read as
    /// "derived" as for the other ports' caps.
    #[test]
    fn admin_max_connections() {
        let serve = |value: &str| {
            let args = ["sluice", "serve", "--admin-max-connections", value];
            Cli::try_parse_from(args).map_err(|e| e.to_string())
        };
        let Ok(Cli {
            command: Command::Serve(s),
            ..
        }) = serve("3")
        else {
            panic!("3 is taken");
        };
        assert_eq!(s.connections.admin_max_connections, 3);
        let e = serve("0").unwrap_err();
        assert!(e.contains("--admin-max-connections"), "{e}");
        assert!(e.contains("--admin-addr off turns it off"), "{e}");
        let e = serve("many").unwrap_err();
        assert!(e.contains("expected a number of connections"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("2MiB"), Ok(2 * 1024 * 1024));
        for bad in ["", "KiB", "0", "0KiB", "64kb", "-1", "1.5MiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        // --max-request-bytes: 4 GiB at most (a gRPC frame's length is 32 bits).
        assert_eq!(parse_request_bytes("4096MiB"), Ok(4 << 30));
        assert!(parse_request_bytes("0").is_err());
        for over in ["4097MiB", "4294967297", "18446744073709551615"] {
            let e = parse_request_bytes(over).unwrap_err();
            assert!(e.contains("over 4096MiB"), "{over}: {e}");
        }
        let args = ["sluice", "serve", "--max-request-bytes", "8192MiB"];
        let e = Cli::try_parse_from(args).unwrap_err().to_string();
        assert!(
            e.contains("--max-request-bytes") && e.contains("over 4096MiB"),
            "{e}"
        );
    }

    #[test]
    fn serve_flags_have_spec_defaults() {
        let cli = Cli::try_parse_from(["sluice", "serve", "--config", "a.yaml"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.listen.grpc_addr.to_string(), "[::]:8081");
        assert_eq!(s.listen.http_addr.to_string(), "[::]:8080");
        assert_eq!(s.store.store_timeout, Duration::from_millis(15));
        assert_eq!(s.decisions.failure_mode, FailureMode::Open);
        assert_eq!(s.decisions.response_headers, HeaderChoice::Auto);
        assert_eq!(
            s.header_style(),
            HeaderStyle::Draft03,
            "no xDS: nobody else adds them"
        );
        assert_eq!(s.store.max_keys, 1_000_000);
        assert_eq!(s.rlqs.rlqs_assignment_ttl, Duration::from_secs(15));
        assert_eq!(s.rlqs.rlqs_abandon_after, Duration::from_secs(60));
        assert_eq!(s.connections.max_request_bytes, 64 * 1024);
        assert_eq!(s.listen.grpc_tls(), None);
        assert_eq!(s.listen.http_tls(), None);
        assert_eq!(s.listen.admin_addr, None, "the default, 127.0.0.1:8082");
        assert_eq!(
            s.connections.grpc_keepalive_interval,
            Duration::from_secs(30)
        );
        assert_eq!(
            s.connections.grpc_keepalive_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(s.connections.grpc_idle_timeout, Duration::from_secs(3600));
        assert_eq!(s.connections.handshake_timeout, Duration::from_secs(10));
        assert_eq!(s.connections.grpc_max_connections, 0);
        assert_eq!(
            s.decisions.default_algorithm,
            Algorithm::SlidingWindowCounter
        );
        assert_eq!(s.metrics.peak_window, crate::telemetry::DEFAULT_PEAK_WINDOW);
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
                Ok(Command::Serve(s)) => Ok(s.listen.admin_addr),
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
        let bad = parse("localhost:8082").unwrap_err();
        assert!(bad.contains("expected IP:PORT"), "{bad}");
    }

    /// Values that used to panic (an axum route without `/`) or abort (tens of
    /// thousands of threads) at start are refused by the parser, saying why.
    #[test]
    fn a_metrics_path_and_a_thread_count_are_checked_at_parse() {
        let parse = |args: &[&str]| {
            let mut all = vec!["sluice", "serve", "--config", "p.yaml"];
            all.extend(args);
            match Cli::try_parse_from(all) {
                Ok(Cli {
                    command: Command::Serve(s),
                    ..
                }) => Ok((
                    s.metrics.prometheus_path.clone(),
                    s.connections.worker_threads,
                )),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        for path in ["metrics", "", "/m?x=1", "/:id", "/a/*rest", "/{x}", "/m}"] {
            let e = parse(&["--prometheus-path", path]).unwrap_err();
            assert!(e.contains("is not a path"), "{e}");
        }
        assert_eq!(parse(&["--prometheus-path", "/m"]).unwrap().0, "/m");
        let e = parse(&["--worker-threads", "20000"]).unwrap_err();
        assert!(e.contains("more than 1024 threads"), "{e}");
        assert_eq!(parse(&["--worker-threads", "1024"]).unwrap().1, 1024);
        assert_eq!(parse(&[]).unwrap().1, 0);
        let e = Cli::try_parse_from(["sluice", "serve", "--config", "p", "--max-keys", "0"])
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one counter"), "{e}");
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
                Ok(Command::Serve(s)) => Ok(s.decisions.local_share_service.map(|s| s.to_string())),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(parse("ns/sluice"), Ok(Some("ns/sluice".to_string())));
        let bad = parse("Sluice").unwrap_err();
        assert!(bad.contains("NAME or NAMESPACE/NAME"), "{bad}");
    }

    #[test]
    fn an_advertised_address_is_host_and_port() {
        let parse = |v: &str| {
            let args = [
                "sluice",
                "serve",
                "--config",
                "a",
                "--local-share-advertise",
                v,
            ];
            match Cli::try_parse_from(args).map(|c| c.command) {
                Ok(Command::Serve(s)) => Ok(s.decisions.local_share_advertise),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(parse("10.1.2.3:8080"), Ok(Some("10.1.2.3:8080".into())));
        assert_eq!(parse("[fd00::7]:8080"), Ok(Some("[fd00::7]:8080".into())));
        // A pod's IPv6 address and the port, joined as the chart joins them.
        assert_eq!(parse("fd00::7:8080"), Ok(Some("[fd00::7]:8080".into())));
        assert_eq!(
            parse("sluice-0.sluice:8080"),
            Ok(Some("sluice-0.sluice:8080".into()))
        );
        for bad in [
            "10.1.2.3",
            "http://10.1.2.3:8080",
            "a@b:1",
            "10.1.2.3:0",
            ":8080",
            "h:p",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("expected HOST:PORT"), "{bad}: {e}");
        }
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
            s.listen.grpc_tls(),
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
                client_san: None,
            })
        );
        assert_eq!(s.listen.http_tls(), None);
    }

    #[test]
    fn a_client_san_needs_its_ports_client_ca() {
        let admin = ["--admin-tls-cert", "c.pem", "--admin-tls-key", "k.pem"];
        for port in ["grpc", "admin"] {
            let args = [
                "sluice".to_string(),
                "serve".into(),
                "--config".into(),
                "a.yaml".into(),
                format!("--{port}-tls-cert"),
                "c.pem".into(),
                format!("--{port}-tls-key"),
                "k.pem".into(),
                format!("--{port}-tls-client-san"),
                "ops.example.com".into(),
            ];
            let e = Cli::try_parse_from(&args).unwrap_err().to_string();
            assert!(e.contains(&format!("--{port}-tls-client-ca")), "{e}");
        }
        let with_ca = [
            &admin[..],
            &["--admin-tls-client-ca", "ca.pem"],
            &["--admin-tls-client-san", "ops.example.com"],
        ]
        .concat();
        let s = serve(&[&["--config", "a.yaml"][..], &with_ca].concat());
        assert_eq!(
            s.listen.admin_tls(),
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
                client_san: Some("ops.example.com".into()),
            })
        );
        assert_eq!(s.listen.grpc_tls(), None);
    }

    fn serve(args: &[&str]) -> Serve {
        let cli = Cli::try_parse_from([&["sluice", "serve"], args].concat()).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        *s
    }

    #[test]
    fn reset_resolution_auto_is_whole_seconds_when_envoy_writes_the_headers() {
        let xds = ["--xds-server", "https://envoy-gateway:18001"];
        let files = ["--config", "a.yaml"];
        assert_eq!(serve(&xds).reset_resolution(), ResetResolution::Seconds);
        assert_eq!(serve(&files).reset_resolution(), ResetResolution::Micros);
        let off = serve(&[&files[..], &["--response-headers", "off"]].concat());
        assert_eq!(off.reset_resolution(), ResetResolution::Seconds);
        let ietf = serve(&[&xds[..], &["--response-headers", "ietf"]].concat());
        assert_eq!(ietf.reset_resolution(), ResetResolution::Micros);
        // A resolution that is asked for wins.
        for (flag, resolution) in [
            ("micros", ResetResolution::Micros),
            ("seconds", ResetResolution::Seconds),
        ] {
            for base in [&xds, &files] {
                let s = serve(&[&base[..], &["--reset-resolution", flag]].concat());
                assert_eq!(s.reset_resolution(), resolution, "{flag}");
            }
        }
        let bad = Cli::try_parse_from(["sluice", "serve", "--reset-resolution", "millis"]);
        assert!(bad.is_err());
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
        assert_eq!(s.decisions.default_algorithm, Algorithm::FixedWindow);
        let err = parse("gcra").unwrap_err().to_string();
        assert!(err.contains("expected fixed_window"), "{err}");
    }
}
