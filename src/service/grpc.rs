//! The gRPC port's calls, served by [`crate::grpc_server`]:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and the standard
//! health service `grpc.health.v1.Health` (`Check` and `Watch`).

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use futures::StreamExt;
use prost::Message;
use tokio::sync::watch;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::grpc_server::{frame, Code, GrpcError, Handler, Reply};
use crate::store::Store;

use super::decode::Request;
use super::response::framed_response;
use super::Service;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The service name health checks may ask about, besides "" (the whole server).
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The gRPC face of a [`Service`]. `serving` is the health status: true while
/// running, false once shutdown begins.
#[derive(Debug)]
pub struct Grpc<S> {
    pub service: Arc<Service<S>>,
    pub serving: watch::Receiver<bool>,
}

impl<S: Store> Handler for Grpc<S> {
    async fn call(&self, path: &str, message: Bytes) -> Result<Reply, GrpcError> {
        match path {
            SHOULD_RATE_LIMIT => {
                // Read in place; prost decodes what the fast reader leaves to it.
                let decoded;
                let req = match Request::decode(&message) {
                    Some(req) => req,
                    None => {
                        decoded = RateLimitRequest::decode(&message[..]).map_err(|e| {
                            GrpcError::new(
                                Code::InvalidArgument,
                                format!("undecodable RateLimitRequest: {e}"),
                            )
                        })?;
                        Request::of(&decoded)
                    }
                };
                match self.service.should_rate_limit(&req).await {
                    Ok(outcome) => Ok(Reply::One(framed_response(&outcome, self.service.headers))),
                    Err(bad) => Err(GrpcError::new(Code::InvalidArgument, bad.0)),
                }
            }
            HEALTH_CHECK => {
                health_service(&message)?;
                Ok(Reply::One(health(*self.serving.borrow())))
            }
            HEALTH_WATCH => {
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
            _ => Err(GrpcError::unimplemented(path)),
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
        "" | SERVICE_NAME => Ok(()),
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
