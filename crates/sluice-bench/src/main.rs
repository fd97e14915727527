//! `sluice-bench`: a load generator that speaks Envoy's RateLimitService over gRPC, a
//! do-nothing server that always answers OK (the ceiling to compare against), a
//! memory meter for the in-memory store and a report table.
//!
//! ```text
//! sluice-bench noop --addr 127.0.0.1:18081
//! sluice-bench load --addr 127.0.0.1:8081 --scenario zipf --keys 100000 --duration 10s
//! sluice-bench load --addr 127.0.0.1:8081 --scenario attack --rate 10000 --json
//! sluice-bench load --addr 127.0.0.1:8081 --scenario charge --key api_key --cost 8
//! sluice-bench report results.jsonl
//! sluice-bench memory --keys 1000000
//! ```

/// The allocator `sluice` runs with: the ceiling then differs from sluice only in
/// doing nothing, `memory` counts the allocator's overhead as sluice pays it, and the
/// generator spends less on its own allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod client;
mod codec;
mod load;
mod memory;
mod report;
mod workload;
mod zipf;

use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::bytes::Bytes;
use prost::Message;
use sluice_grpc::{frame, Code, Deadline, GrpcError, Handler, Kind, Reply};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Load generator and meters for Envoy rate-limit services"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a RateLimitService that always answers OK: the ceiling.
    Noop {
        #[arg(long, default_value = "127.0.0.1:18081")]
        addr: SocketAddr,
        /// Serve through tonic instead of sluice's own gRPC server.
        #[arg(long)]
        tonic: bool,
        /// Runtime threads, as `sluice serve --worker-threads` (0: one per CPU), so that
        /// the ceiling runs as the server it is compared with.
        #[arg(long, default_value_t = 0)]
        worker_threads: usize,
    },
    /// Send load and report throughput, latency percentiles and outcomes.
    Load(load::Load),
    /// Print one table from `load --json` lines, with ratios to the ceiling.
    Report(report::Report),
    /// Resident memory per active key of the in-memory store, per algorithm.
    Memory(memory::Memory),
}

#[derive(Debug, Default)]
struct Noop;

/// Decodes the request and encodes the answer, as the tonic noop does, so that the
/// two differ only in the server around them.
impl Handler for Noop {
    type Method = ();

    fn route(&self, path: &str) -> Option<((), Kind)> {
        (path == "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .then_some(((), Kind::Unary))
    }

    async fn call(&self, _: (), message: Bytes, _: Option<Deadline>) -> Result<Reply, GrpcError> {
        RateLimitRequest::decode(message)
            .map_err(|e| GrpcError::new(Code::InvalidArgument, e.to_string()))?;
        let r = RateLimitResponse {
            overall_code: codec::OK,
            ..Default::default()
        };
        Ok(Reply::One(frame(&r)))
    }
}

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _req: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: codec::OK,
            ..Default::default()
        }))
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Noop {
            addr,
            tonic,
            worker_threads,
        } => runtime(worker_threads)?.block_on(async move {
            let stop = async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            };
            // The bound address is printed, so `--addr 127.0.0.1:0` lets the caller
            // learn a port no other process can take first.
            if tonic {
                // TCP_NODELAY as tonic sets it when it binds the address itself.
                let incoming =
                    tonic::transport::server::TcpIncoming::bind(addr)?.with_nodelay(Some(true));
                eprintln!(
                    "noop RateLimitService (tonic) on {}",
                    incoming.local_addr()?
                );
                tonic::transport::Server::builder()
                    .add_service(RateLimitServiceServer::new(Noop))
                    .serve_with_incoming_shutdown(incoming, stop)
                    .await?;
            } else {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                eprintln!("noop RateLimitService on {}", listener.local_addr()?);
                sluice_grpc::serve(listener, Noop, stop).await;
            }
            Ok(())
        }),
        Cmd::Load(l) => runtime(l.threads)?.block_on(load::run(l)),
        Cmd::Report(r) => report::run(r),
        Cmd::Memory(m) => memory::run(m),
    }
}

/// A multi-thread runtime with `threads` workers (0: Tokio's default, one per CPU).
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if threads > 0 {
        rt.worker_threads(threads);
    }
    rt.build()
}
