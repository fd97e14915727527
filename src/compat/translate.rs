//! The sections of an environment's translation into flags, each a group of
//! envoyproxy/ratelimit's variables: addresses, gRPC TLS, logging, where the
//! policy comes from, metrics, what the answers look like and tracing. Redis is
//! in `redis.rs`.

use std::collections::BTreeMap;

use super::variables::{Treatment::Ignored, HARMLESS, VARIABLES};
use super::{hide_passwords, refuse, Refusal, Translation};

/// `LOG_LEVEL=debug` and `trace`: Sluice's own crates at that level, the rest at info.
const OWN_DEBUG: &str = "info,sluice=debug,sluice_grpc=debug,sluice_redis=debug";
const OWN_TRACE: &str = "info,sluice=trace,sluice_grpc=trace,sluice_redis=trace";

pub(super) struct Translate<'a> {
    pub(super) env: &'a BTreeMap<String, String>,
    pub(super) out: Translation,
}

impl Translate<'_> {
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub(super) fn truthy(&self, name: &str) -> Result<bool, Refusal> {
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
    pub(super) fn flag(&mut self, flag: &str, value: Option<String>) {
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

    pub(super) fn run(&mut self) -> Result<(), Refusal> {
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

    /// envoyproxy/ratelimit's hosts default to `0.0.0.0`, where Go listens on every
    /// address, IPv6's too: `[::]` here (Sluice's own default when neither is set),
    /// so that a pod of an IPv6 cluster is reached by its probes and Envoy.
    fn addresses(&mut self) {
        for (host, port, flag, default_port) in [
            ("HOST", "PORT", "--http-addr", "8080"),
            ("GRPC_HOST", "GRPC_PORT", "--grpc-addr", "8081"),
        ] {
            if self.get(host).is_none() && self.get(port).is_none() {
                continue;
            }
            let h = every_address(self.get(host).unwrap_or("0.0.0.0")).to_string();
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

    fn metrics(&mut self) -> Result<(), Refusal> {
        if self.truthy("USE_PROMETHEUS")? {
            let addr = self.get("PROMETHEUS_ADDR").unwrap_or(":9090");
            let addr = match addr.rsplit_once(':') {
                Some((host, port)) if host.is_empty() || host == "0.0.0.0" => {
                    format!("[::]:{port}")
                }
                _ => addr.to_string(),
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
        self.flag("--override-counter", Some("shared".into()));
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

/// Go's `0.0.0.0` (every address, both families) as a sluice host.
fn every_address(host: &str) -> &str {
    if host == "0.0.0.0" {
        "::"
    } else {
        host
    }
}

fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
