//! The gRPC port's calls, served by [`sluice_grpc`]:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, the standard
//! Rate Limit Quota Service's `StreamRateLimitQuotas` (see [`super::rlqs`]), the
//! health service `grpc.health.v1.Health` (`Check` and `Watch`) and server
//! reflection (v1 and v1alpha, see [`super::reflection`]).

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message;
use tokio::sync::watch;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::algorithm::SECOND;
use crate::clock::Every;
use crate::store::Store;
use crate::trace::{self, Call, Tracer};
use sluice_grpc::{frame, Code, Deadline, GrpcError, Handler, Kind, Messages, Reply};

use super::decode::{decode_lossy, Request};
use super::reflection::{self, Reflection};
use super::response::framed_response;
use super::rlqs::{self, Quotas};
use super::Service;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The span of a `ShouldRateLimit` call, named as OpenTelemetry's RPC conventions
/// name a server span (`package.Service/Method`). A `POST /json` decision's span has
/// the same name: it is the same decision.
pub const SHOULD_RATE_LIMIT_SPAN: &str =
    "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The service name health checks may ask about, besides "" (the whole server).
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The gRPC face of a [`Service`]. `serving` is the health status: true while
/// running, false once shutdown begins.
#[derive(Debug)]
pub struct Grpc<S> {
    pub service: Arc<Service<S>>,
    pub serving: watch::Receiver<bool>,
    reflection: Reflection,
    quotas: Arc<Quotas<S>>,
    /// Set when tracing is on; `None` costs the request path one branch.
    tracer: Option<Arc<Tracer>>,
    /// Oversized requests are logged at most once a minute: a client sends its
    /// next one at once.
    oversized_log: Every,
    /// So are undecodable ones.
    invalid_log: Every,
}

impl<S: Store> Grpc<S> {
    /// The port's calls; RLQS shares demand among this process's streams only
    /// (see [`Grpc::with_quotas`]).
    pub fn new(service: Arc<Service<S>>, serving: watch::Receiver<bool>) -> Self {
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(crate::clock::SystemClock);
        let demand = Arc::new(crate::store::MemoryDemand::new(clock.clone()));
        let quotas = Quotas::new(service.clone(), demand, clock, rlqs::Settings::default());
        Grpc {
            service,
            serving,
            reflection: Reflection::new(),
            quotas: Arc::new(quotas),
            tracer: None,
            oversized_log: Every::new(60 * SECOND),
            invalid_log: Every::new(60 * SECOND),
        }
    }

    /// Traces each `ShouldRateLimit` call with `tracer`.
    pub fn with_tracer(mut self, tracer: Option<Arc<Tracer>>) -> Self {
        self.tracer = tracer;
        self
    }

    /// Serves RLQS with `quotas` (its settings and demand table).
    pub fn with_quotas(mut self, quotas: Quotas<S>) -> Self {
        self.quotas = Arc::new(quotas);
        self
    }
}

/// The methods of the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    ShouldRateLimit,
    HealthCheck,
    HealthWatch,
    ReflectionV1,
    ReflectionV1Alpha,
    StreamRateLimitQuotas,
}

impl<S: Store> Handler for Grpc<S> {
    type Method = Method;

    fn route(&self, path: &str) -> Option<(Method, Kind)> {
        Some(match path {
            SHOULD_RATE_LIMIT => (Method::ShouldRateLimit, Kind::Unary),
            HEALTH_CHECK => (Method::HealthCheck, Kind::Unary),
            HEALTH_WATCH => (Method::HealthWatch, Kind::Unary),
            reflection::V1 => (Method::ReflectionV1, Kind::Streaming),
            reflection::V1ALPHA => (Method::ReflectionV1Alpha, Kind::Streaming),
            rlqs::STREAM_RATE_LIMIT_QUOTAS => (Method::StreamRateLimitQuotas, Kind::Streaming),
            _ => return None,
        })
    }

    /// An RLQS report carries every bucket of its Envoy at once: the stream takes
    /// one as large as it may track, however small `--max-request-bytes` is.
    fn max_message(&self, method: Method, max: usize) -> usize {
        match method {
            Method::StreamRateLimitQuotas => max.max(self.quotas.settings.max_report_bytes()),
            _ => max,
        }
    }

    /// An oversized `ShouldRateLimit`, or one refused as unfinished while
    /// `--grpc-max-buffered-request-bytes` are held, is counted and logged: Envoy
    /// answers it by its `failure_mode_deny`, and nothing else would tell the
    /// operator why.
    fn refused(&self, method: Method, error: &GrpcError) {
        if method != Method::ShouldRateLimit || error.code != Code::ResourceExhausted {
            return;
        }
        self.service.metrics.oversized_request();
        if self.oversized_log.due(self.quotas.clock.now()) {
            tracing::warn!(
                error = %error.message,
                "ShouldRateLimit request refused (sluice_oversized_requests_total)"
            );
        }
    }

    /// A `ShouldRateLimit` whose client had given up before it was read is not
    /// decided (nothing is counted), only counted here.
    fn abandoned(&self, method: Method) {
        if method == Method::ShouldRateLimit {
            self.service.metrics.abandoned_call();
        }
    }

    async fn call(
        &self,
        method: Method,
        message: Bytes,
        deadline: Option<Deadline>,
    ) -> Result<Reply, GrpcError> {
        match method {
            Method::ShouldRateLimit => self.should_rate_limit(&message, deadline, None).await,
            Method::HealthCheck => {
                health_service(&message)?;
                Ok(Reply::One(health(*self.serving.borrow())))
            }
            Method::HealthWatch => {
                health_service(&message)?;
                // The current status first, then each change.
                let changes = futures::stream::unfold(
                    (self.serving.clone(), true),
                    |(mut rx, first)| async move {
                        if !first && rx.changed().await.is_err() {
                            return None;
                        }
                        let serving = *rx.borrow_and_update();
                        Some((Ok(health(serving)), (rx, false)))
                    },
                );
                Ok(Reply::Stream(changes.boxed()))
            }
            Method::ReflectionV1 | Method::ReflectionV1Alpha | Method::StreamRateLimitQuotas => {
                Err(GrpcError::new(
                    Code::Internal,
                    "a streaming method called as unary",
                ))
            }
        }
    }

    async fn call_with_headers(
        &self,
        method: Method,
        message: Bytes,
        deadline: Option<Deadline>,
        headers: &http::HeaderMap,
    ) -> Result<Reply, GrpcError> {
        match (&self.tracer, method) {
            (Some(tracer), Method::ShouldRateLimit) => {
                let call = tracer.call(SHOULD_RATE_LIMIT_SPAN, headers);
                self.traced(call, &message, deadline).await
            }
            _ => self.call(method, message, deadline).await,
        }
    }

    async fn stream_with_headers(
        &self,
        method: Method,
        messages: Messages,
        deadline: Option<Deadline>,
        headers: &http::HeaderMap,
    ) -> Result<Reply, GrpcError> {
        match (&self.tracer, method) {
            (Some(tracer), Method::StreamRateLimitQuotas) => {
                let parent = trace::context::incoming(headers);
                let traced = rlqs::Traced {
                    tracer: tracer.clone(),
                    parent,
                };
                Ok(rlqs::serve_traced(
                    self.quotas.clone(),
                    messages,
                    Some(traced),
                ))
            }
            _ => self.stream(method, messages, deadline).await,
        }
    }

    async fn stream(
        &self,
        method: Method,
        messages: Messages,
        _deadline: Option<Deadline>,
    ) -> Result<Reply, GrpcError> {
        let path = match method {
            Method::StreamRateLimitQuotas => {
                return Ok(rlqs::serve(self.quotas.clone(), messages));
            }
            Method::ReflectionV1 => reflection::V1,
            Method::ReflectionV1Alpha => reflection::V1ALPHA,
            _ => {
                return Err(GrpcError::new(
                    Code::Internal,
                    "a unary method called as streaming",
                ))
            }
        };
        self.reflection.call(path, messages).await
    }
}

impl<S: Store> Grpc<S> {
    /// `ShouldRateLimit` in its span: the decision's attributes on it, the gRPC
    /// status, and the trace id on the logs written meanwhile.
    async fn traced(
        &self,
        mut call: Call,
        message: &[u8],
        deadline: Option<Deadline>,
    ) -> Result<Reply, GrpcError> {
        if !call.recording() {
            return self.should_rate_limit(message, deadline, None).await;
        }
        call.set("rpc.system", "grpc");
        call.set("rpc.service", SERVICE_NAME);
        call.set("rpc.method", "ShouldRateLimit");
        let answer = match call.trace_id() {
            Some(id) => {
                let log = tracing::info_span!("ShouldRateLimit", trace_id = %trace::hex(id));
                tracing::Instrument::instrument(
                    self.should_rate_limit(message, deadline, Some(&mut call)),
                    log,
                )
                .await
            }
            None => {
                self.should_rate_limit(message, deadline, Some(&mut call))
                    .await
            }
        };
        let code = match &answer {
            Ok(_) => Code::Ok,
            Err(e) => {
                let failed = trace::grpc_server_failed(e.code as i64);
                super::span::unanswered(&mut call, failed, e.message.clone());
                e.code
            }
        };
        call.set("rpc.grpc.status_code", code as i64);
        answer
    }

    /// A request that is not a `RateLimitRequest` at all: counted as the other
    /// `INVALID_ARGUMENT` answers are, and logged at most once a minute, since Envoy
    /// answers its client by `failure_mode_deny` and nothing else would tell why.
    fn undecodable(&self, e: prost::DecodeError) -> GrpcError {
        self.service.metrics.bad_request();
        let error = format!("undecodable RateLimitRequest: {e}");
        if self.invalid_log.due(self.quotas.clock.now()) {
            tracing::warn!(
                error = %error,
                "undecodable ShouldRateLimit request refused (sluice_invalid_requests_total)"
            );
        }
        GrpcError::new(Code::InvalidArgument, error)
    }

    async fn should_rate_limit(
        &self,
        message: &[u8],
        deadline: Option<Deadline>,
        call: Option<&mut Call>,
    ) -> Result<Reply, GrpcError> {
        // Read in place; prost decodes what the fast reader leaves to it, a string
        // that is not UTF-8 repaired rather than refused (see `decode`).
        let decoded;
        let req = match Request::decode(message) {
            Some(req) => req,
            None => {
                decoded = decode_lossy(message).map_err(|e| self.undecodable(e))?;
                Request::of(&decoded)
            }
        };
        // envoyproxy/ratelimit's total_requests and response_time: every call that
        // decoded, timed to its answer. The clock is read only when they are kept.
        let metrics = &self.service.metrics;
        let latency = &self.service.latency;
        let started = metrics.erl_enabled().then(|| latency.raw());
        let answer = self.answer(&req, deadline, call).await;
        if let Some(started) = started {
            metrics.erl_call(latency.delta(started, latency.raw()));
        }
        answer
    }

    /// Decides a decoded request and writes its answer.
    async fn answer(
        &self,
        req: &Request<'_>,
        deadline: Option<Deadline>,
        call: Option<&mut Call>,
    ) -> Result<Reply, GrpcError> {
        // Past its deadline the caller has given up: nothing is counted for it.
        let left = match deadline.map(|d| d.remaining()) {
            Some(left) if left.is_zero() => {
                self.service.metrics.expired_call();
                return Err(GrpcError::new(
                    Code::DeadlineExceeded,
                    "the call's grpc-timeout passed before it was decided",
                ));
            }
            left => left,
        };
        let decided = match call {
            None => self.service.should_rate_limit(req, left).await,
            Some(call) => self.service.should_rate_limit_traced(req, left, call).await,
        };
        match decided {
            Ok(outcome) => match outcome.error_answer() {
                // envoyproxy/ratelimit's answer to a Redis error: a plain Go error,
                // which gRPC sends as UNKNOWN; Envoy's failure_mode_deny decides.
                Some(error) => Err(GrpcError::new(
                    Code::Unknown,
                    format!("counter store failed: {error}"),
                )),
                None => {
                    let echo = self.service.echo_request.then_some(req);
                    Ok(Reply::One(framed_response(
                        &outcome,
                        self.service.headers,
                        echo,
                    )))
                }
            },
            Err(bad) => Err(GrpcError::new(Code::InvalidArgument, bad.0)),
        }
    }
}

/// Checks that a health request names a service this port serves.
fn health_service(message: &[u8]) -> Result<(), GrpcError> {
    let req = HealthCheckRequest::decode(message).map_err(|e| {
        GrpcError::new(
            Code::InvalidArgument,
            format!("undecodable HealthCheckRequest: {e}"),
        )
    })?;
    match req.service.as_str() {
        // `ratelimit` is envoyproxy/ratelimit's name for itself, which probes written
        // for it use.
        "" | SERVICE_NAME | "ratelimit" | super::rlqs::SERVICE_NAME => Ok(()),
        // tonic-health's words, which clients may already match on.
        _ => Err(GrpcError::new(Code::NotFound, "service not registered")),
    }
}

fn health(serving: bool) -> Bytes {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    frame(&HealthCheckResponse {
        status: status as i32,
    })
}
