//! Tracing's settings: `serve` flags first, then OpenTelemetry's standard `OTEL_*`
//! variables, read once at start-up. A value that cannot be used stops start-up
//! with the variable's name and the reason; nothing falls back to a default
//! silently, because a trace pipeline that quietly sends nowhere is found out only
//! when someone needs a trace.
//!
//! Tracing is off unless asked for: `--tracing`, an OTLP endpoint (flag or
//! `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`), or `OTEL_TRACES_EXPORTER=otlp`.
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off whatever
//! else is set.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// The `serve` flags of tracing. Each wins over its `OTEL_*` variable.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Tracing")]
pub struct TracingArgs {
    /// Export OpenTelemetry traces of decisions over OTLP (also on when an OTLP
    /// endpoint is given; see docs/tracing.md).
    #[arg(long, env = "SLUICE_TRACING")]
    pub tracing: bool,
    /// The collector's OTLP base URL (http://HOST:PORT, or https:// for TLS;
    /// `/v1/traces` is added for http/protobuf). Default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
    /// OTEL_EXPORTER_OTLP_ENDPOINT, then localhost:4318 (4317 for grpc).
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default: `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`,
    /// else http/protobuf).
    #[arg(long, env = "SLUICE_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<String>,
    /// Headers sent with each export, `key=value,...` (default:
    /// `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`).
    #[arg(long, env = "SLUICE_OTLP_HEADERS", hide_env_values = true)]
    pub otlp_headers: Option<String>,
    /// PEM certificates of the authorities that sign an https:// collector's
    /// certificate, in place of the system's (default:
    /// `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`).
    #[arg(long, env = "SLUICE_OTLP_TLS_CA")]
    pub otlp_tls_ca: Option<PathBuf>,
    /// A PEM certificate (chain) presented to an https:// collector, with
    /// --otlp-tls-key (default: `OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_CERTIFICATE`).
    #[arg(long, env = "SLUICE_OTLP_TLS_CERT", requires = "otlp_tls_key")]
    pub otlp_tls_cert: Option<PathBuf>,
    /// The PEM private key of --otlp-tls-cert (default:
    /// `OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_KEY`).
    #[arg(long, env = "SLUICE_OTLP_TLS_KEY", requires = "otlp_tls_cert")]
    pub otlp_tls_key: Option<PathBuf>,
    /// The traces' `service.name` (default: OTEL_SERVICE_NAME, else `sluice`).
    #[arg(long, env = "SLUICE_TRACING_SERVICE_NAME")]
    pub tracing_service_name: Option<String>,
    /// More resource attributes, `key=value,...`, added to OTEL_RESOURCE_ATTRIBUTES.
    #[arg(long, env = "SLUICE_TRACING_RESOURCE_ATTRIBUTES")]
    pub tracing_resource_attributes: Option<String>,
    /// Sample this share (0 to 1) of the calls that arrive with no parent; a call
    /// whose parent was sampled is always traced, one whose parent was not never is
    /// (parentbased_traceidratio).
    /// Default: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, else
    /// parentbased_always_on.
    #[arg(long, env = "SLUICE_TRACING_SAMPLER_RATIO")]
    pub tracing_sampler_ratio: Option<String>,
    /// Most finished spans waiting for export; past it spans are dropped and counted
    /// (default: OTEL_BSP_MAX_QUEUE_SIZE, else 2048).
    #[arg(long, env = "SLUICE_TRACING_QUEUE_SIZE")]
    pub tracing_queue_size: Option<String>,
}

impl TracingArgs {
    /// The TLS files' flags and what each was given.
    fn tls_files(&self) -> impl Iterator<Item = (&'static str, Option<&PathBuf>)> {
        [
            ("--otlp-tls-ca", self.otlp_tls_ca.as_ref()),
            ("--otlp-tls-cert", self.otlp_tls_cert.as_ref()),
            ("--otlp-tls-key", self.otlp_tls_key.as_ref()),
        ]
        .into_iter()
    }
}

/// How spans leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// Which calls are traced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// This share of traces, by trace id, whatever the parent says.
    Ratio(f64),
    /// Follow a remote parent's decision; without one, the inner sampler decides.
    ParentBased(Root),
}

/// What decides for a call that arrives without a parent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
}

/// Tracing's settings, when it is on.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub protocol: Protocol,
    /// The full URL spans are sent to (for http/protobuf, with its `/v1/traces`).
    pub endpoint: String,
    pub headers: Vec<(String, String)>,
    /// TLS to the collector: set when the endpoint is https://.
    pub tls: Option<Tls>,
    /// Longest one export may take.
    pub timeout: Duration,
    /// Resource attributes, `service.name` among them.
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
    pub queue_size: usize,
    pub batch_size: usize,
    /// Longest a finished span waits before its batch is sent.
    pub schedule_delay: Duration,
}

/// The files of TLS to the collector, each with the flag or variable that named it.
/// Read when tracing starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// Authorities trusted in place of the system's.
    pub ca: Option<(&'static str, PathBuf)>,
    /// The client certificate and its key, both or neither.
    pub cert: Option<(&'static str, PathBuf)>,
    pub key: Option<(&'static str, PathBuf)>,
}

/// A setting that cannot be used, named by its flag or variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct ConfigError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

fn bad(name: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// The settings `args` and the environment (`env`, a variable's value if set and
/// not empty) ask for; `None` when tracing is off.
pub fn settings(
    args: &TracingArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Settings>, ConfigError> {
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let given = checked_flags(args)?;
    if let Some(v) = get("OTEL_SDK_DISABLED") {
        match v.trim().to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            _ => return Err(bad("OTEL_SDK_DISABLED", &v, "expected true or false")),
        }
    }
    let exporter = get("OTEL_TRACES_EXPORTER");
    match exporter.as_deref().map(str::trim) {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(_) => {
            let v = exporter.unwrap_or_default();
            return Err(bad(
                "OTEL_TRACES_EXPORTER",
                &v,
                "sluice exports traces over OTLP only: expected otlp or none",
            ));
        }
    }
    // (flag or variable name, value) of the endpoint, and whether it is a base URL.
    let endpoint = match (
        &args.otlp_endpoint,
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ) {
        (Some(v), _) => Some(("--otlp-endpoint", v.clone(), true)),
        (None, Some(v)) => Some(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v, false)),
        (None, None) => {
            get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|v| ("OTEL_EXPORTER_OTLP_ENDPOINT", v, true))
        }
    };
    if !args.tracing && endpoint.is_none() && exporter.is_none() {
        if !given.is_empty() {
            tracing::warn!(
                "{} given, but tracing is off: add --tracing (or an OTLP endpoint) to trace",
                given.join(", ")
            );
        }
        return Ok(None);
    }

    let protocol = match &args.otlp_protocol {
        Some(v) => self::protocol("--otlp-protocol", v)?,
        None => match signal_or_shared(
            &get,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            Some((name, v)) => self::protocol(name, &v)?,
            None => Protocol::HttpProtobuf,
        },
    };
    let endpoint = match endpoint {
        Some((name, v, base)) => self::endpoint(name, &v, protocol, base)?,
        None => match protocol {
            Protocol::Grpc => "http://localhost:4317".to_string(),
            Protocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_string(),
        },
    };

    let headers = match &args.otlp_headers {
        Some(v) => header_pairs("--otlp-headers", v)?,
        None => {
            let mut h = match get("OTEL_EXPORTER_OTLP_HEADERS") {
                Some(v) => header_pairs("OTEL_EXPORTER_OTLP_HEADERS", &v)?,
                None => Vec::new(),
            };
            if let Some(v) = get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
                // The signal's own headers win over the shared ones of the same name.
                for (k, v) in header_pairs("OTEL_EXPORTER_OTLP_TRACES_HEADERS", &v)? {
                    h.retain(|(old, _)| !old.eq_ignore_ascii_case(&k));
                    h.push((k, v));
                }
            }
            h
        }
    };

    let tls = tls(args, &get, &endpoint)?;

    compression(signal_or_shared(
        &get,
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ))?;

    let timeout = match signal_or_shared(
        &get,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ) {
        Some((name, v)) => Duration::from_millis(millis(name, &v)?.max(1)),
        None => Duration::from_secs(10),
    };

    let mut resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(v) => pairs("OTEL_RESOURCE_ATTRIBUTES", &v)?,
        None => Vec::new(),
    };
    if let Some(v) = &args.tracing_resource_attributes {
        for (k, v) in pairs("--tracing-resource-attributes", v)? {
            resource.retain(|(old, _)| *old != k);
            resource.push((k, v));
        }
    }
    let service = args
        .tracing_service_name
        .clone()
        .or_else(|| get("OTEL_SERVICE_NAME"))
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| "sluice".to_string());
    resource.retain(|(k, _)| k != "service.name");
    resource.insert(0, ("service.name".to_string(), service));

    let sampler = match &args.tracing_sampler_ratio {
        Some(v) => Sampler::ParentBased(Root::Ratio(ratio("--tracing-sampler-ratio", v)?)),
        None => sampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))?,
    };

    let queue_size = match &args.tracing_queue_size {
        Some(v) => count("--tracing-queue-size", v)?,
        None => match get("OTEL_BSP_MAX_QUEUE_SIZE") {
            Some(v) => count("OTEL_BSP_MAX_QUEUE_SIZE", &v)?,
            None => 2048,
        },
    };
    let batch_size = match get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
        Some(v) => count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &v)?,
        None => 512,
    }
    .min(queue_size);
    let schedule_delay = match get("OTEL_BSP_SCHEDULE_DELAY") {
        Some(v) => Duration::from_millis(millis("OTEL_BSP_SCHEDULE_DELAY", &v)?),
        None => Duration::from_secs(5),
    };

    Ok(Some(Settings {
        protocol,
        endpoint,
        headers,
        tls,
        timeout,
        resource,
        sampler,
        queue_size,
        batch_size,
        schedule_delay,
    }))
}

/// An endpoint URL checked, with `/v1/traces` added to a base URL for HTTP.
/// The tracing flags given, each checked whether or not tracing is on, so that a
/// bad value is refused rather than ignored until the day tracing is turned on.
fn checked_flags(args: &TracingArgs) -> Result<Vec<&'static str>, ConfigError> {
    let mut given = Vec::new();
    if let Some(v) = &args.otlp_protocol {
        protocol("--otlp-protocol", v)?;
        given.push("--otlp-protocol");
    }
    if let Some(v) = &args.otlp_headers {
        header_pairs("--otlp-headers", v)?;
        given.push("--otlp-headers");
    }
    given.extend(
        args.tls_files()
            .filter_map(|(flag, path)| path.and(Some(flag))),
    );
    if args.tracing_service_name.is_some() {
        given.push("--tracing-service-name");
    }
    if let Some(v) = &args.tracing_resource_attributes {
        pairs("--tracing-resource-attributes", v)?;
        given.push("--tracing-resource-attributes");
    }
    if let Some(v) = &args.tracing_sampler_ratio {
        ratio("--tracing-sampler-ratio", v)?;
        given.push("--tracing-sampler-ratio");
    }
    if let Some(v) = &args.tracing_queue_size {
        count("--tracing-queue-size", v)?;
        given.push("--tracing-queue-size");
    }
    Ok(given)
}

/// The signal's own variable if set, else the shared one (as the exporter reads
/// them), with the name of the one read.
fn signal_or_shared(
    get: &dyn Fn(&str) -> Option<String>,
    signal: &'static str,
    shared: &'static str,
) -> Option<(&'static str, String)> {
    [signal, shared]
        .into_iter()
        .find_map(|name| get(name).map(|v| (name, v)))
}

fn protocol(name: &str, v: &str) -> Result<Protocol, ConfigError> {
    match v.trim() {
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "grpc" => Ok(Protocol::Grpc),
        _ => Err(bad(
            name,
            v,
            "expected grpc or http/protobuf (http/json is not supported)",
        )),
    }
}

fn endpoint(name: &str, v: &str, protocol: Protocol, base: bool) -> Result<String, ConfigError> {
    let v = v.trim();
    let url = url::Url::parse(v).map_err(|e| bad(name, v, format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(name, v, "expected an http:// or https:// URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad(name, v, "the URL names no host"));
    }
    Ok(match protocol {
        Protocol::HttpProtobuf if base => {
            format!("{}/v1/traces", v.trim_end_matches('/'))
        }
        _ => v.to_string(),
    })
}

/// TLS to the collector for an https:// `endpoint`: each file from its flag, else
/// its variable (the signal's own first). A flag with an http:// endpoint would go
/// unused, so it is refused; the variables are then ignored, as the OpenTelemetry
/// specification has them apply to secure connections only.
fn tls(
    args: &TracingArgs,
    get: &dyn Fn(&str) -> Option<String>,
    endpoint: &str,
) -> Result<Option<Tls>, ConfigError> {
    let file = |flag: &'static str,
                given: &Option<PathBuf>,
                signal: &'static str,
                shared: &'static str| {
        match given {
            Some(path) => Some((flag, path.clone())),
            None => signal_or_shared(get, signal, shared)
                .map(|(name, v)| (name, PathBuf::from(v.trim()))),
        }
    };
    if !endpoint.starts_with("https://") {
        if let Some((flag, Some(path))) = args.tls_files().find(|(_, p)| p.is_some()) {
            return Err(bad(
                flag,
                &path.display().to_string(),
                format!("TLS needs an https:// endpoint; spans go to {endpoint}"),
            ));
        }
        return Ok(None);
    }
    let tls = Tls {
        ca: file(
            "--otlp-tls-ca",
            &args.otlp_tls_ca,
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        cert: file(
            "--otlp-tls-cert",
            &args.otlp_tls_cert,
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        ),
        key: file(
            "--otlp-tls-key",
            &args.otlp_tls_key,
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ),
    };
    match (&tls.cert, &tls.key) {
        (Some((name, path)), None) | (None, Some((name, path))) => Err(bad(
            name,
            &path.display().to_string(),
            "a client certificate needs its key and a key its certificate",
        )),
        _ => Ok(Some(tls)),
    }
}

/// `key=value,...` with percent-encoded values, as the OTel variables write them.
fn pairs(name: &str, v: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for item in v.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((k, val)) = item.split_once('=') else {
            return Err(bad(name, v, format!("{item:?} is not key=value")));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(bad(name, v, format!("{item:?} has an empty key")));
        }
        let val = percent_encoding::percent_decode_str(val.trim())
            .decode_utf8()
            .map_err(|_| bad(name, v, format!("{item:?}: the value is not UTF-8")))?;
        out.push((k.to_string(), val.into_owned()));
    }
    Ok(out)
}

/// [`pairs`] that are valid HTTP headers. Errors do not repeat the value: headers
/// carry credentials.
fn header_pairs(name: &str, v: &str) -> Result<Vec<(String, String)>, ConfigError> {
    const HIDDEN: &str = "(not shown)";
    let headers = pairs(name, v)
        .map_err(|_| bad(name, HIDDEN, "expected key=value,... with UTF-8 values"))?;
    for (k, val) in &headers {
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(val).is_err()
        {
            return Err(bad(
                name,
                HIDDEN,
                format!("{k:?} is not a valid HTTP header"),
            ));
        }
    }
    Ok(headers)
}

fn sampler(name: Option<String>, arg: Option<String>) -> Result<Sampler, ConfigError> {
    let ratio_arg = || match &arg {
        Some(v) => ratio("OTEL_TRACES_SAMPLER_ARG", v),
        None => Ok(1.0),
    };
    let Some(name) = name else {
        return Ok(Sampler::ParentBased(Root::AlwaysOn));
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::Ratio(ratio_arg()?),
        "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
        "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
        "parentbased_traceidratio" => Sampler::ParentBased(Root::Ratio(ratio_arg()?)),
        _ => {
            return Err(bad(
                "OTEL_TRACES_SAMPLER",
                &name,
                "expected always_on, always_off, traceidratio, parentbased_always_on, \
                 parentbased_always_off or parentbased_traceidratio",
            ))
        }
    })
}

fn ratio(name: &str, v: &str) -> Result<f64, ConfigError> {
    match v.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(bad(name, v, "expected a number from 0 to 1")),
    }
}

/// Checks an OTLP compression variable: `none`, or `gzip`, which this build
/// cannot do, so it says it sends spans uncompressed rather than ignore it.
fn compression(var: Option<(&str, String)>) -> Result<(), ConfigError> {
    let Some((name, v)) = var else {
        return Ok(());
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(()),
        "gzip" => {
            tracing::warn!(
                "{name}=gzip: sluice sends spans uncompressed (it is built without gzip)"
            );
            Ok(())
        }
        _ => Err(bad(name, &v, "expected gzip or none")),
    }
}

/// The most spans a queue or batch may hold: far past any collector's batch, and
/// short of what the queue (tokio's channel) can be made with.
pub const MAX_SPANS: usize = 1 << 20;

fn count(name: &str, v: &str) -> Result<usize, ConfigError> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_SPANS).contains(&n) => Ok(n),
        _ => Err(bad(
            name,
            v,
            format!("expected a whole number above 0, at most {MAX_SPANS}"),
        )),
    }
}

fn millis(name: &str, v: &str) -> Result<u64, ConfigError> {
    v.trim()
        .parse::<u64>()
        .map_err(|_| bad(name, v, "expected a whole number of milliseconds"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(args: &TracingArgs, vars: &[(&str, &str)]) -> Result<Option<Settings>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        settings(args, &|name| vars.get(name).cloned())
    }

    fn on() -> TracingArgs {
        TracingArgs {
            tracing: true,
            ..TracingArgs::default()
        }
    }

    #[test]
    fn an_https_endpoint_takes_tls_files_from_flags_then_variables() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/shared/ca.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/c.key"),
        ];
        let s = run(&on(), &vars).unwrap().unwrap();
        assert_eq!(s.endpoint, "https://collector:4318/v1/traces");
        let path = |name, p: &str| Some((name, PathBuf::from(p)));
        assert_eq!(
            s.tls,
            Some(Tls {
                ca: path("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces/ca.pem"),
                cert: path("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem"),
                key: path("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/c.key"),
            })
        );
        let flags = TracingArgs {
            otlp_tls_ca: Some("/flag/ca.pem".into()),
            ..on()
        };
        let s = run(&flags, &vars).unwrap().unwrap();
        assert_eq!(s.tls.unwrap().ca, path("--otlp-tls-ca", "/flag/ca.pem"));
        // The system's authorities, no client certificate.
        let s = run(&on(), &vars[..1]).unwrap().unwrap();
        assert_eq!(s.tls, Some(Tls::default()));
        // Plain http: no TLS, and the variables (for secure connections) unread.
        let mut plain = vars;
        plain[0].1 = "http://collector:4318";
        assert_eq!(run(&on(), &plain).unwrap().unwrap().tls, None);
    }

    #[test]
    fn tls_files_that_cannot_be_used_are_refused() {
        // A flag with an http:// endpoint would go unused.
        let flags = TracingArgs {
            otlp_tls_ca: Some("/ca.pem".into()),
            ..on()
        };
        let e = run(&flags, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap_err();
        assert_eq!(e.name, "--otlp-tls-ca");
        assert!(e.reason.contains("needs an https:// endpoint"), "{e}");
        // A certificate without its key.
        let e = run(
            &on(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.name, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE");
        assert!(e.reason.contains("needs its key"), "{e}");
    }

    #[test]
    fn tracing_is_off_unless_asked_for() {
        assert_eq!(run(&TracingArgs::default(), &[]), Ok(None));
        assert_eq!(
            run(&TracingArgs::default(), &[("OTEL_SERVICE_NAME", "x")]),
            Ok(None)
        );
        let s = run(&TracingArgs::default(), &[("OTEL_TRACES_EXPORTER", "otlp")]);
        assert!(s.unwrap().is_some());
        let s = run(
            &TracingArgs::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
        );
        assert!(s.unwrap().is_some());
        // Disabled whatever else says otherwise.
        assert_eq!(run(&on(), &[("OTEL_SDK_DISABLED", "true")]), Ok(None));
        assert_eq!(run(&on(), &[("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
    }

    #[test]
    fn the_defaults_follow_the_opentelemetry_specification() {
        let s = run(&on(), &[]).unwrap().unwrap();
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(s.sampler, Sampler::ParentBased(Root::AlwaysOn));
        assert_eq!(s.timeout, Duration::from_secs(10));
        assert_eq!(s.resource, vec![("service.name".into(), "sluice".into())]);
        assert_eq!((s.queue_size, s.batch_size), (2048, 512));
        let s = run(&on(), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://localhost:4317");
    }

    #[test]
    fn endpoints_base_and_per_signal() {
        let s = run(
            &on(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://collector:4318/v1/traces");
        let s = run(
            &on(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://collector:4318/custom",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://collector:4318/custom");
        let args = TracingArgs {
            otlp_endpoint: Some("http://flag:4317".into()),
            otlp_protocol: Some("grpc".into()),
            ..TracingArgs::default()
        };
        let s = run(
            &args,
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://env:4317")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.protocol, s.endpoint.as_str()),
            (Protocol::Grpc, "http://flag:4317")
        );
    }

    #[test]
    fn headers_resource_and_service_name() {
        let s = run(
            &on(),
            &[
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20a,x-tenant=1",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=2"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.name=from-attrs,deployment.environment=prod",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.headers,
            vec![
                ("authorization".into(), "Bearer a".into()),
                ("X-Tenant".into(), "2".into())
            ]
        );
        assert_eq!(
            s.resource,
            vec![
                ("service.name".into(), "from-attrs".into()),
                ("deployment.environment".into(), "prod".into())
            ]
        );
        let s = run(
            &on(),
            &[
                ("OTEL_SERVICE_NAME", "rl"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.resource, vec![("service.name".into(), "rl".into())]);
    }

    #[test]
    fn samplers() {
        let sampler = |vars: &[(&str, &str)]| run(&on(), vars).unwrap().unwrap().sampler;
        assert_eq!(
            sampler(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.01")
            ]),
            Sampler::ParentBased(Root::Ratio(0.01))
        );
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "traceidratio")]),
            Sampler::Ratio(1.0)
        );
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "always_off")]),
            Sampler::AlwaysOff
        );
        let args = TracingArgs {
            tracing: true,
            tracing_sampler_ratio: Some("0.25".into()),
            ..TracingArgs::default()
        };
        let s = run(&args, &[("OTEL_TRACES_SAMPLER", "always_off")])
            .unwrap()
            .unwrap();
        assert_eq!(s.sampler, Sampler::ParentBased(Root::Ratio(0.25)));
    }

    #[test]
    fn a_bad_value_is_an_error_naming_it() {
        for (name, value, says) in [
            ("OTEL_SDK_DISABLED", "maybe", "true or false"),
            ("OTEL_TRACES_EXPORTER", "zipkin", "OTLP only"),
            (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "http/json",
                "grpc or http/protobuf",
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "collector:4318",
                "http:// or https:// URL",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url", "not a URL"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "key=value"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "bad header=1",
                "valid HTTP header",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "milliseconds"),
            ("OTEL_RESOURCE_ATTRIBUTES", "=x", "empty key"),
            (
                "OTEL_TRACES_SAMPLER",
                "jaeger_remote",
                "parentbased_traceidratio",
            ),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "above 0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "-1", "milliseconds"),
        ] {
            let err = run(&on(), &[(name, value)]).unwrap_err();
            assert!(
                err.to_string().contains(says) && err.to_string().starts_with(name),
                "{name}={value}: {err}"
            );
        }
        let err = run(
            &on(),
            &[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ],
        )
        .unwrap_err();
        assert_eq!(err.name, "OTEL_TRACES_SAMPLER_ARG");
        let args = TracingArgs {
            tracing: true,
            tracing_sampler_ratio: Some("half".into()),
            ..TracingArgs::default()
        };
        assert_eq!(run(&args, &[]).unwrap_err().name, "--tracing-sampler-ratio");
    }

    /// A compression variable is read: an unknown value refused with its name,
    /// gzip (which this build lacks) taken with a warning, not ignored.
    #[test]
    fn compression_variables_are_checked() {
        for name in [
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ] {
            let err = run(&on(), &[(name, "zstd")]).unwrap_err();
            assert_eq!(err.name, name);
            assert!(err.reason.contains("gzip or none"), "{err}");
            for good in ["gzip", "none", "GZIP"] {
                assert!(run(&on(), &[(name, good)]).unwrap().is_some(), "{good}");
            }
        }
        // The signal's own wins, as the exporter reads them.
        let both = [
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
        ];
        assert!(run(&on(), &both).is_ok());
    }

    /// A queue or batch too large to make is refused at start-up, naming its flag
    /// or variable, rather than panic (the queue) or ask the allocator for it whole
    /// (the batch).
    #[test]
    fn a_queue_past_the_most_spans_is_refused() {
        let huge = "18446744073709551615";
        let args = TracingArgs {
            tracing: true,
            tracing_queue_size: Some(huge.into()),
            ..TracingArgs::default()
        };
        assert_eq!(run(&args, &[]).unwrap_err().name, "--tracing-queue-size");
        for name in ["OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"] {
            let err = run(&on(), &[(name, "1000000000")]).unwrap_err();
            assert_eq!(err.name, name);
            assert!(err.reason.contains("1048576"), "{err}");
        }
        let s = run(&on(), &[("OTEL_BSP_MAX_QUEUE_SIZE", "1048576")]);
        assert_eq!(s.unwrap().unwrap().queue_size, MAX_SPANS);
    }

    /// A tracing flag's bad value is refused with tracing off too, rather than
    /// wait for the day tracing is turned on; a good one leaves tracing off.
    #[test]
    fn flags_are_checked_with_tracing_off() {
        let off = |f: fn(&mut TracingArgs)| {
            let mut args = TracingArgs::default();
            f(&mut args);
            run(&args, &[])
        };
        type Set = fn(&mut TracingArgs);
        let cases: [(Set, &str); 5] = [
            (
                |a| a.tracing_sampler_ratio = Some("2".into()),
                "--tracing-sampler-ratio",
            ),
            (
                |a| a.tracing_queue_size = Some("many".into()),
                "--tracing-queue-size",
            ),
            (
                |a| a.otlp_protocol = Some("http/json".into()),
                "--otlp-protocol",
            ),
            (
                |a| a.otlp_headers = Some("novalue".into()),
                "--otlp-headers",
            ),
            (
                |a| a.tracing_resource_attributes = Some("=x".into()),
                "--tracing-resource-attributes",
            ),
        ];
        for (set, name) in cases {
            assert_eq!(off(set).unwrap_err().name, name);
        }
        assert_eq!(
            off(|a| a.tracing_sampler_ratio = Some("0.5".into())),
            Ok(None)
        );
    }
}
