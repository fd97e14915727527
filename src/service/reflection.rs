//! gRPC server reflection, v1 and v1alpha, for the services of the gRPC port, so
//! that `grpcurl list` and `grpcurl describe` work without proto files.
//!
//! tonic-reflection answers the requests; this module gives it the port's
//! descriptors and carries its tonic service over the lean server's streaming
//! calls: the request messages go in framed again as a request body, and the
//! response body's frames come back out as they are.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{stream, StreamExt};
use http_body::Frame;
use http_body_util::{BodyStream, StreamBody};
use tonic::body::Body;
use tonic::codegen::Service;

use sluice_grpc::{status_of, Code, GrpcError, Messages, Reply};

/// The reflection methods, one per version of the protocol.
pub const V1: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
pub const V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

/// `envoy/service/ratelimit/v3/rls.proto`, `envoy/service/rate_limit_quota/v3/rlqs.proto`
/// and every file they import, from envoy-types' descriptors (tests/reflection.rs
/// checks it and writes it again).
pub const RATELIMIT_DESCRIPTORS: &[u8] = include_bytes!("ratelimit.binpb");

/// A tonic service as a function of its request.
type Answer =
    Arc<dyn Fn(http::Request<Body>) -> BoxFuture<'static, http::Response<Body>> + Send + Sync>;

/// Answers reflection requests about RateLimitService, RateLimitQuotaService, Health
/// and reflection itself.
#[derive(Clone)]
pub struct Reflection {
    v1: Answer,
    v1alpha: Answer,
}

impl std::fmt::Debug for Reflection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reflection")
    }
}

impl Default for Reflection {
    fn default() -> Self {
        Self::new()
    }
}

impl Reflection {
    pub fn new() -> Self {
        // Each version lists both, as the port serves both.
        let builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(RATELIMIT_DESCRIPTORS)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(
                    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
                )
        };
        // Both sets are compiled in; they decode (tests/reflection.rs).
        let v1 = builder().build_v1().expect("the port's descriptors decode");
        let v1alpha = builder()
            .build_v1alpha()
            .expect("the port's descriptors decode");
        Reflection {
            v1: answer(v1),
            v1alpha: answer(v1alpha),
        }
    }

    /// One reflection stream: `path` is [`V1`] or [`V1ALPHA`].
    pub async fn call(&self, path: &'static str, messages: Messages) -> Result<Reply, GrpcError> {
        let frames = messages.map(|m| m.map(|m| Frame::data(framed(&m))));
        let req = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(Body::new(StreamBody::new(frames)))
            .expect("a static request");
        let service = if path == V1 { &self.v1 } else { &self.v1alpha };
        let resp = service(req).await;
        // A trailers-only answer: the status is in the headers.
        if let Some(status) = status_of(resp.headers()) {
            status?;
            return Ok(Reply::Stream(stream::empty().boxed()));
        }
        let frames = BodyStream::new(resp.into_body());
        let messages = frames
            .map(|frame| match frame {
                Ok(frame) => match frame.into_data() {
                    // Already framed: tonic encodes each answer behind its prefix.
                    Ok(data) => Some(Ok(data)),
                    Err(frame) => match frame.trailers_ref().and_then(status_of) {
                        Some(Err(e)) => Some(Err(e)),
                        _ => None,
                    },
                },
                Err(status) => Some(Err(GrpcError::new(
                    Code::Internal,
                    status.message().to_string(),
                ))),
            })
            // The trailers end the stream.
            .take_while(|item| std::future::ready(item.is_some()))
            .filter_map(std::future::ready);
        Ok(Reply::Stream(messages.boxed()))
    }
}

/// Calls of a tonic server (its generated type cannot be named here).
fn answer<S>(service: S) -> Answer
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    Arc::new(move |req| {
        let call = service.clone().call(req);
        Box::pin(async move {
            match call.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        })
    })
}

/// `message` behind its 5-byte gRPC prefix again.
fn framed(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.len());
    buf.put_u8(0);
    buf.put_u32(message.len() as u32);
    buf.put_slice(message);
    buf.freeze()
}
