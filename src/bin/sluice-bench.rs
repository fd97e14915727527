//! `sluice-bench`: a load generator that speaks Envoy's RateLimitService over gRPC,
//! and a do-nothing server that always answers OK (the ceiling to compare against).
//!
//! ```text
//! sluice-bench noop --addr 127.0.0.1:18081
//! sluice-bench load --addr 127.0.0.1:8081 --keys 100000 --duration 10s
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Load generator for Envoy rate-limit services"
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
    },
    /// Send load and report throughput and latency.
    Load(Load),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// One key, every request.
    Hot,
    /// `--keys` keys, uniformly at random.
    Uniform,
    /// Three descriptors per request (edge, service, tenant).
    Layered,
}

#[derive(Parser, Clone)]
struct Load {
    /// The service's gRPC address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptor key the scenario sends.
    #[arg(long, default_value = "client")]
    key: String,
    #[arg(long, value_enum, default_value_t = Scenario::Hot)]
    scenario: Scenario,
    /// Distinct values for `uniform` and `layered`.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Requests in flight at once, spread over the connections (closed loop).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How long to send, after a 1 s warm-up.
    #[arg(long, default_value = "10s", value_parser = sluice::config::parse_duration)]
    duration: Duration,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// A label printed with the results.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(Debug, Default)]
struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _req: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: 1,
            ..Default::default()
        }))
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    match cli.command {
        Cmd::Noop { addr } => rt.block_on(async move {
            eprintln!("noop RateLimitService on {addr}");
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(Noop))
                .serve_with_shutdown(addr, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
            Ok(())
        }),
        Cmd::Load(load) => rt.block_on(run(load)),
    }
}

fn entry(key: &str, value: String) -> Entry {
    Entry {
        key: key.to_string(),
        value,
    }
}

fn make_request(load: &Load, rng: &mut impl Rng) -> RateLimitRequest {
    let one = |entries: Vec<Entry>| RateLimitDescriptor {
        entries,
        ..Default::default()
    };
    let descriptors = match load.scenario {
        Scenario::Hot => vec![one(vec![entry(&load.key, "hot".into())])],
        Scenario::Uniform => {
            let v = rng.random_range(0..load.keys.max(1));
            vec![one(vec![entry(&load.key, format!("k{v}"))])]
        }
        Scenario::Layered => {
            let v = rng.random_range(0..load.keys.max(1));
            vec![
                one(vec![entry(
                    "remote_address",
                    format!("10.0.{}.{}", v / 256 % 256, v % 256),
                )]),
                one(vec![entry("service", "checkout".into())]),
                one(vec![entry("tenant", format!("t{}", v % 100))]),
            ]
        }
    };
    RateLimitRequest {
        domain: load.domain.clone(),
        descriptors,
        hits_addend: 0,
    }
}

async fn run(load: Load) -> anyhow::Result<()> {
    let mut clients = Vec::new();
    for _ in 0..load.connections.max(1) {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", load.addr))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(RateLimitServiceClient::new(ch));
    }
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));

    let mut tasks = Vec::new();
    for i in 0..load.concurrency.max(1) {
        let mut client = clients[i % clients.len()].clone();
        let (load, measuring, stop) = (load.clone(), measuring.clone(), stop.clone());
        let (ok, over, errors, hist) = (ok.clone(), over.clone(), errors.clone(), hist.clone());
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut rng = rand::rngs::SmallRng::from_os_rng();
            while !stop.load(Ordering::Relaxed) {
                let req = make_request(&load, &mut rng);
                let t = Instant::now();
                let res = client.should_rate_limit(req).await;
                if !measuring.load(Ordering::Relaxed) {
                    continue;
                }
                let us = t.elapsed().as_micros() as u64;
                let _ = local.record(us.max(1));
                match res {
                    Ok(r) if r.get_ref().overall_code == 2 => over.fetch_add(1, Ordering::Relaxed),
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
            let _ = hist.lock().await.add(&local);
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(load.duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let h = hist.lock().await;
    let (ok, over, errors) = (
        ok.load(Ordering::Relaxed),
        over.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    let rps = (ok + over + errors) as f64 / elapsed;
    let (p50, p99, p999) = (
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
    );
    if load.json {
        println!(
            "{}",
            serde_json::json!({"label": load.label, "rps": rps.round(), "p50_us": p50, "p99_us": p99,
                "p999_us": p999, "ok": ok, "over_limit": over, "errors": errors})
        );
    } else {
        println!(
            "{:<24} {:>10.0} req/s  p50 {:>6} us  p99 {:>6} us  p99.9 {:>6} us  ok {} over {} errors {}",
            load.label, rps, p50, p99, p999, ok, over, errors
        );
    }
    Ok(())
}
