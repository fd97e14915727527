//! `envoy.service.ratelimit.v3.RateLimitService` over tonic.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::store::Store;

use super::response::response;
use super::Service;

/// The gRPC face of a [`Service`].
#[derive(Debug)]
pub struct Grpc<S>(pub Arc<Service<S>>);

#[tonic::async_trait]
impl<S: Store> RateLimitService for Grpc<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        match self.0.should_rate_limit(&req).await {
            Ok(outcome) => Ok(Response::new(response(&outcome, self.0.headers))),
            Err(bad) => Err(Status::invalid_argument(bad.0)),
        }
    }
}
