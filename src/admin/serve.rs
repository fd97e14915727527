//! The admin port: tonic with the Admin service, gRPC health and reflection, in
//! plain text or over the same reloading TLS as the other ports (`src/tls`), with
//! the gRPC port's limits on its connections (`incoming.rs`, `conn.rs`).

use std::sync::Arc;

use sluice_grpc::{Accept, Stats};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;

use crate::store::Store;
use crate::tls::Tls;
use crate::trace::Tracer;

use super::conn::CallsLayer;
use super::incoming::{Incoming, Limits};
use super::traced::TraceLayer;
use super::{pb, Admin, DESCRIPTORS, SERVICE_NAME};

/// Serves `admin` on `listener` until its stop signal turns true, counting its
/// connections in `stats`.
pub async fn run<S: Store>(
    admin: Admin<S>,
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    limits: Limits,
    stats: Arc<Stats>,
    tracer: Option<Arc<Tracer>>,
) -> Result<(), tonic::transport::Error> {
    let stop = admin.stop.clone();
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // Both sets are compiled in and decode (tests/admin.rs lists them).
    let v1 = reflection()
        .build_v1()
        .expect("the admin descriptors decode");
    let v1alpha = reflection()
        .build_v1alpha()
        .expect("the admin descriptors decode");
    let admin = pb::admin_server::AdminServer::new(admin);
    let router = Server::builder()
        .http2_keepalive_interval(limits.keepalive_interval)
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // The span outside the calls layer, so that it records the code the calls
        // layer gives the client (a refused message's RESOURCE_EXHAUSTED).
        .layer(TraceLayer(tracer))
        .layer(CallsLayer)
        .add_service(admin)
        .add_service(health_service)
        .add_service(v1)
        .add_service(v1alpha);
    let incoming = Incoming::new(Accept::new(listener, "admin"), limits, tls, stats);
    let incoming = futures::stream::unfold(incoming, |mut i| async move {
        let conn = i.next().await;
        Some((Ok::<_, std::io::Error>(conn), i))
    });
    router
        .serve_with_incoming_shutdown(incoming, stopped(stop))
        .await
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
