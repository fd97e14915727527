//! gRPC server reflection, v1 and v1alpha, for the services of the gRPC port, so
//! that `grpcurl list` and `grpcurl describe` work without proto files.
//!
//! tonic-reflection answers the requests; this module gives it the port's
//! descriptors and carries its tonic service over the lean server's streaming
//! calls: the request messages go in framed again as a request body, and the
//! response body's frames come back out as they are.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{stream, StreamExt};
use http_body::Frame;
use http_body_util::{BodyStream, StreamBody};
use tonic::codegen::Service;
use tonic::service::Routes;

use crate::grpc_server::{status_of, Code, GrpcError, Messages, Reply};

/// The reflection methods, one per version of the protocol.
pub const V1: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
pub const V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

/// `envoy/service/ratelimit/v3/rls.proto` and every file it imports, from
/// envoy-types' descriptors (tests/reflection.rs checks it and writes it again).
pub const RATELIMIT_DESCRIPTORS: &[u8] = include_bytes!("ratelimit.binpb");

/// Answers reflection requests about RateLimitService, Health and reflection itself.
#[derive(Clone)]
pub struct Reflection {
    routes: Routes,
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
            routes: Routes::new(v1).add_service(v1alpha),
        }
    }

    /// One reflection stream: `path` is [`V1`] or [`V1ALPHA`].
    pub async fn call(&self, path: &'static str, messages: Messages) -> Result<Reply, GrpcError> {
        let frames = messages.map(|m| m.map(|m| Frame::data(framed(&m))));
        let req = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(tonic::body::Body::new(StreamBody::new(frames)))
            .expect("a static request");
        let resp = match self.routes.clone().call(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
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

/// `message` behind its 5-byte gRPC prefix again.
fn framed(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.len());
    buf.put_u8(0);
    buf.put_u32(message.len() as u32);
    buf.put_slice(message);
    buf.freeze()
}
