//! Sluice's own admin API (`proto/sluice/admin/v1/admin.proto`): Explain,
//! ListPolicies, WatchOffenders, WatchDecisions and the block list, served by tonic on
//! `--admin-addr` ([`serve`]). Off the request path: only WatchDecisions' tap sits
//! on it (`service::tap`).
//!
//! - `explain.rs`: the request in, the explanation out.
//! - `policies.rs`: ListPolicies.
//! - `feed.rs`: the two streams.
//! - `blocks.rs`: Block, Unblock and ListBlocks.
//! - `incoming.rs`, `conn.rs`: the port's connections and their limits.

use std::sync::Arc;

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status};

use crate::service::{HeaderStyle, Service};
use crate::source::hub::Hub;
use crate::store::Store;

mod blocks;
mod conn;
pub mod explain;
mod feed;
mod incoming;
pub mod policies;
pub mod serve;
mod traced;

pub use incoming::Limits;

/// The messages and the `Admin` service, generated from `proto/` by build.rs.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("sluice.admin.v1");
}

/// The admin API's encoded descriptors, for reflection.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_admin_v1.binpb"));

/// The fully qualified service name, as health and reflection report it.
pub const SERVICE_NAME: &str = "sluice.admin.v1.Admin";

/// Most WatchOffenders and WatchDecisions streams open at once, of both kinds, over
/// all connections: each costs Envoy's calls (a watcher's sample of each decision,
/// a snapshot every 100 ms on the runtime the calls run on), so the port's clients
/// cannot slow them by opening streams, and a few operators' `sluice top` fit.
pub const MAX_WATCHES: usize = 16;

/// The Admin service over a running [`Service`].
pub struct Admin<S> {
    service: Arc<Service<S>>,
    hub: Arc<Hub>,
    stop: watch::Receiver<bool>,
    /// Places for watch streams, [`MAX_WATCHES`]; a stream holds one until it ends.
    watches: Arc<Semaphore>,
}

impl<S> Admin<S> {
    /// Streams end when `stop` turns true. `hub` tells which sources' latest
    /// changes were refused.
    pub fn new(service: Arc<Service<S>>, hub: Arc<Hub>, stop: watch::Receiver<bool>) -> Self {
        Admin {
            service,
            hub,
            stop,
            watches: Arc::new(Semaphore::new(MAX_WATCHES)),
        }
    }

    /// A place for one more watch stream, or why there is none.
    fn watch_place(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.watches.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_WATCHES} watch streams (WatchOffenders, WatchDecisions: sluice top) are open, the most at once; end one and ask again"
            ))
        })
    }
}

/// Explains a request against `service`'s policy and store: the server's Explain,
/// and `sluice explain --config` on a store of its own.
pub async fn explain_with<S: Store>(
    service: &Service<S>,
    req: pb::ExplainRequest,
    style: HeaderStyle,
) -> Result<pb::Explanation, crate::service::BadRequest> {
    let req = explain::Request::from_pb(req);
    let view = req.view();
    let descriptors = explain::checked(&view)?;
    let explained = service.limiter.explain(&req.domain, &descriptors).await;
    let hashed = service.limiter.hashing().all;
    let mut pb = explain::to_pb(&req.domain, &descriptors, &explained, style, hashed);
    let local = service.limiter.local();
    for d in &mut pb.descriptors {
        if let Some(unsettled) = local.counter(&d.counter_key) {
            d.local = true;
            d.local_unsettled = unsettled;
        }
    }
    Ok(pb)
}

#[tonic::async_trait]
impl<S: Store> pb::admin_server::Admin for Admin<S> {
    async fn explain(
        &self,
        request: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        explain_with(&self.service, request.into_inner(), self.service.headers)
            .await
            .map(Response::new)
            .map_err(|e| Status::invalid_argument(e.0))
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::Policies>, Status> {
        let policy = self.service.limiter.policy();
        Ok(Response::new(policies::list(
            &policy,
            &self.hub.status(),
            &request.into_inner().domain,
        )))
    }

    type WatchOffendersStream = feed::Feed<pb::TopSnapshot>;

    async fn watch_offenders(
        &self,
        request: Request<pb::Filter>,
    ) -> Result<Response<Self::WatchOffendersStream>, Status> {
        let place = self.watch_place()?;
        let service = self.service.clone();
        let bans = move || service.limiter.sentences();
        let feed = feed::offenders(
            request.into_inner(),
            self.service.metrics.clone(),
            bans,
            self.stop.clone(),
        );
        Ok(Response::new(feed::holding(feed, place)))
    }

    type WatchDecisionsStream = feed::Feed<pb::Decision>;

    async fn watch_decisions(
        &self,
        request: Request<pb::Filter>,
    ) -> Result<Response<Self::WatchDecisionsStream>, Status> {
        let place = self.watch_place()?;
        let feed = feed::decisions(request.into_inner(), &self.service.tap, self.stop.clone());
        Ok(Response::new(feed::holding(feed, place)))
    }

    async fn block(
        &self,
        request: Request<pb::BlockRequest>,
    ) -> Result<Response<pb::Sentence>, Status> {
        blocks::block(&self.service.limiter, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn unblock(
        &self,
        request: Request<pb::UnblockRequest>,
    ) -> Result<Response<pb::UnblockResponse>, Status> {
        blocks::unblock(&self.service.limiter, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_blocks(
        &self,
        request: Request<pb::ListBlocksRequest>,
    ) -> Result<Response<pb::Sentences>, Status> {
        Ok(Response::new(blocks::list(
            &self.service.limiter,
            &request.into_inner(),
        )))
    }
}
