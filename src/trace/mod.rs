//! OpenTelemetry traces of calls: one span per call, the child of the trace
//! context the caller sent (W3C or B3, [`context`]), exported over OTLP (gRPC or
//! HTTP/protobuf) through a bounded queue that never makes a call wait
//! ([`export`]). Configured from flags and the standard `OTEL_*` variables
//! ([`config`]).
//!
//! Off by default, and then nothing here runs: the server holds no [`Tracer`], and
//! the request path's only cost is the branch on that `Option`. This module knows
//! nothing of rate limits; the service writes its `ratelimit.*` attributes onto a
//! [`Call`] (`service/span.rs`).
//!
//! Built on the `opentelemetry` API and SDK (ids, samplers, the span model) and
//! `opentelemetry-otlp`'s exporter, the crates every OTel backend is tested with;
//! not on `tracing-opentelemetry`, which would turn every `tracing` span into an
//! OTel one: the request path has no `tracing` spans to bridge, and this keeps the
//! one span per call explicit, with its parent set from the headers.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{self as sdk, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub mod config;
pub mod context;
pub mod export;
pub mod headers;
mod tls;

pub use config::{settings, ConfigError, Settings, TracingArgs};
pub use export::Counters;

/// Makes the spans of calls, when tracing is on.
#[derive(Debug)]
pub struct Tracer {
    tracer: sdk::SdkTracer,
    /// The sampler follows a parent's decision (`parentbased_*`).
    parent_based: bool,
    /// Kept so the tracer's processor lives as long as the server.
    _provider: SdkTracerProvider,
    stopper: export::Stopper,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("tracing: {0}")]
pub struct StartError(String);

impl Tracer {
    /// Starts the export task (on the current Tokio runtime) and the tracer.
    /// Nothing connects yet: an unreachable collector shows when the first batch
    /// fails.
    pub fn start(settings: &Settings, counters: Counters) -> Result<Tracer, StartError> {
        Ok(Tracer::start_with(settings, exporter(settings)?, counters))
    }

    /// [`Tracer::start`] with another exporter than OTLP's (tests and benchmarks);
    /// `settings`' endpoint and protocol are not used.
    pub fn start_with<E: sdk::SpanExporter + 'static>(
        settings: &Settings,
        mut exporter: E,
        counters: Counters,
    ) -> Tracer {
        let resource = Resource::builder_empty()
            .with_attributes(
                settings
                    .resource
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        exporter.set_resource(&resource);
        let (queue, stopper) = export::start(
            exporter,
            settings.queue_size,
            settings.batch_size,
            settings.schedule_delay,
            counters,
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler(settings.sampler))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("sluice");
        Tracer {
            tracer,
            parent_based: matches!(settings.sampler, config::Sampler::ParentBased(_)),
            _provider: provider,
            stopper,
        }
    }

    /// A server span named `name`, the child of the context in `headers` if any.
    pub fn call(&self, name: impl Into<Cow<'static, str>>, headers: &http::HeaderMap) -> Call {
        self.call_with_parent(name, context::incoming(headers))
    }

    /// A server span named `name`, the child of `incoming`'s parent if any (a
    /// stream's messages each get one, all children of the context the stream
    /// opened with).
    pub fn call_with_parent(
        &self,
        name: impl Into<Cow<'static, str>>,
        incoming: Option<context::Incoming>,
    ) -> Call {
        let remote = |trace_id: [u8; 16], span_id: [u8; 8], sampled: bool| {
            Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(trace_id),
                SpanId::from_bytes(span_id),
                if sampled {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::default()
                },
                true,
                TraceState::default(),
            ))
        };
        let cx = match incoming {
            Some(context::Incoming::Parent(p)) => remote(p.trace_id, p.span_id, p.sampled),
            // The caller decided not to sample but named no span: a parent-based
            // sampler hears so from an unsampled parent of fresh ids. Its span records
            // nothing, so those ids appear nowhere.
            Some(context::Incoming::Unsampled) if self.parent_based => remote(
                (rand::random::<u128>() | 1).to_be_bytes(),
                (rand::random::<u64>() | 1).to_be_bytes(),
                false,
            ),
            _ => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &cx);
        // Only a sampled call makes child spans, so only it keeps the tracer.
        let tracer = {
            use opentelemetry::trace::Span as _;
            span.is_recording().then(|| self.tracer.clone())
        };
        Call { span, tracer }
    }

    /// Sends the spans still queued (at most `grace`) and stops exporting.
    pub async fn stop(&self, grace: Duration) {
        self.stopper.stop(grace).await;
    }
}

/// One call's span; it ends when dropped.
#[derive(Debug)]
pub struct Call {
    span: sdk::Span,
    /// For child spans; `None` unless sampled.
    tracer: Option<sdk::SdkTracer>,
}

impl Call {
    /// Whether this call is sampled: only then are attributes worth computing.
    pub fn recording(&self) -> bool {
        use opentelemetry::trace::Span as _;
        self.span.is_recording()
    }

    /// The trace id, when sampled (for exemplars and logs).
    pub fn trace_id(&self) -> Option<[u8; 16]> {
        use opentelemetry::trace::Span as _;
        let cx = self.span.span_context();
        cx.is_sampled().then(|| cx.trace_id().to_bytes())
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        use opentelemetry::trace::Span as _;
        self.span.set_attribute(KeyValue::new(key, value));
    }

    pub fn event(&mut self, name: &'static str, attributes: Vec<KeyValue>) {
        use opentelemetry::trace::Span as _;
        self.span.add_event(name, attributes);
    }

    /// A child span of this call, of kind client, that ran from `started` to
    /// `ended` (a store call, timed where it was made). Nothing when not sampled.
    pub fn child(
        &self,
        name: impl Into<Cow<'static, str>>,
        started: SystemTime,
        ended: SystemTime,
        attributes: Vec<KeyValue>,
        error: Option<String>,
    ) {
        use opentelemetry::trace::Span as _;
        let Some(tracer) = &self.tracer else { return };
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let mut span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(tracer, &cx);
        if let Some(message) = error {
            span.set_status(Status::error(message));
        }
        span.end_with_timestamp(ended);
    }

    /// Marks the call failed, with a message for the trace.
    pub fn error(&mut self, message: String) {
        use opentelemetry::trace::Span as _;
        self.span.set_status(Status::error(message));
    }
}

/// Whether a gRPC server call that answered `code` failed, as OpenTelemetry's
/// conventions for servers have it: only the server's own faults (UNKNOWN,
/// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS) are error
/// spans. A request refused (INVALID_ARGUMENT, NOT_FOUND, ...) is the caller's
/// fault, and counted as the server's error it would page for a client's bug.
pub fn grpc_server_failed(code: i64) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

/// Formats a trace id as the 32 hex digits backends show.
pub fn hex(id: [u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(id))
}

fn sampler(s: config::Sampler) -> sdk::Sampler {
    use config::{Root, Sampler as S};
    let root = |r: Root| match r {
        Root::AlwaysOn => sdk::Sampler::AlwaysOn,
        Root::AlwaysOff => sdk::Sampler::AlwaysOff,
        Root::Ratio(r) => sdk::Sampler::TraceIdRatioBased(r),
    };
    match s {
        S::AlwaysOn => sdk::Sampler::AlwaysOn,
        S::AlwaysOff => sdk::Sampler::AlwaysOff,
        S::Ratio(r) => sdk::Sampler::TraceIdRatioBased(r),
        S::ParentBased(r) => sdk::Sampler::ParentBased(Box::new(root(r))),
    }
}

fn exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, StartError> {
    // The exporter reads the headers' variables from the process's environment.
    let headers = Arc::new(headers::Headers::new(&settings.headers, &|name| {
        std::env::var(name).ok()
    }));
    let built = match settings.protocol {
        config::Protocol::Grpc => {
            for (k, v) in &settings.headers {
                tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(
                    k.to_ascii_lowercase().as_bytes(),
                )
                .map_err(|_| StartError(format!("{k:?} is not a gRPC metadata key")))?;
                tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(v.as_str())
                    .map_err(|_| StartError(format!("the value of {k:?} is not valid metadata")))?;
            }
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_interceptor(move |req| Ok(headers.apply_grpc(req)));
            match &settings.tls {
                None => builder,
                // A channel of Sluice's own: the exporter's TLS setting sits
                // behind a feature of its own, for what tonic's channel does.
                Some(t) => {
                    let tls = tls::tonic_config(t).map_err(StartError)?;
                    let channel =
                        tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
                            .and_then(|e| e.tls_config(tls))
                            .map_err(|e| {
                                StartError(format!(
                                    "TLS to {}: {}",
                                    settings.endpoint,
                                    crate::errors::chain(&e)
                                ))
                            })?
                            .timeout(settings.timeout)
                            .connect_lazy();
                    builder.with_channel(channel)
                }
            }
            .build()
        }
        config::Protocol::HttpProtobuf => {
            let inner: Box<dyn opentelemetry_http::HttpClient> = match &settings.tls {
                None => Box::new(
                    opentelemetry_http::hyper::HyperClient::with_default_connector(
                        settings.timeout,
                        None,
                    ),
                ),
                Some(t) => {
                    let connector = hyper_rustls::HttpsConnectorBuilder::new()
                        .with_tls_config(tls::client_config(t).map_err(StartError)?)
                        .https_only()
                        .enable_http1()
                        .build();
                    Box::new(opentelemetry_http::hyper::HyperClient::new(
                        connector,
                        settings.timeout,
                        None,
                    ))
                }
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_http_client(headers::Client { inner, headers })
                .build()
        }
    };
    built.map_err(|e| StartError(format!("the OTLP exporter to {}: {e}", settings.endpoint)))
}
