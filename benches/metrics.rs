//! The cost of metrics on the decision path: `Limiter::decide` on a `MemoryStore`
//! followed by `Metrics::record`, with metrics on and off (`Metrics::disabled()`),
//! on one thread and on two threads at once (both threads share one limiter, one
//! store and one `Metrics`, so any shared lock or contended counter would show up as
//! a gap between "on" and "off" that grows with the second thread).
//!
//! Traffic: 90 % of decisions are admitted (10,000 client addresses under a huge
//! limit), 10 % are denied (1,000 users over a limit of 5 per minute), so the deny
//! ratio ring and the top-offenders sketch both work.
//!
//! Criterion reports on-CPU time per decision (so other processes on a busy machine
//! do not count); an interleaved A/B run at the end prints CPU and wall time.
//!
//! Run: `cargo bench --bench metrics`

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use criterion::{criterion_group, Criterion, Throughput};
use sluice::clock::SystemClock;
use sluice::limiter::{Descriptor, Limiter, Settings};
use sluice::store::MemoryStore;
use sluice::telemetry::Metrics;

const POLICY: &str = r#"
domain: bench
descriptors:
  - key: remote_address
    layer: edge
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

struct Path {
    limiter: Limiter<MemoryStore>,
    metrics: Metrics,
    ips: Vec<String>,
    users: Vec<String>,
}

impl Path {
    fn new(metrics: Metrics) -> Path {
        let docs = sluice::policy::parse_str("bench.yaml", POLICY).expect("parses");
        let policy = sluice::policy::compile(docs).expect("compiles");
        let store = MemoryStore::new(Arc::new(SystemClock), 1_000_000);
        Path {
            limiter: Limiter::new(
                Arc::new(ArcSwap::from_pointee(policy)),
                store,
                Settings::default(),
            ),
            metrics,
            ips: (0..10_000)
                .map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256))
                .collect(),
            users: (0..1_000).map(|i| format!("user-{i}")).collect(),
        }
    }

    /// One decision and its metrics, as `Service::should_rate_limit` does them.
    fn one(&self, rt: &tokio::runtime::Runtime, i: usize) -> bool {
        let started = Instant::now();
        let entries = if i % 10 == 9 {
            [("user", self.users[(i / 10) % self.users.len()].as_str())]
        } else {
            [("remote_address", self.ips[i % self.ips.len()].as_str())]
        };
        let descriptors = [Descriptor::new(&entries[..], 1)];
        let outcome = rt.block_on(self.limiter.decide("bench", &descriptors));
        self.metrics.record("bench", &outcome, started.elapsed());
        outcome.over_limit
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

/// Time this thread has spent on a CPU, so that other processes on a busy machine do
/// not count (`CLOCK_THREAD_CPUTIME_ID`).
fn cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Runs `iters` decisions on this thread; (on-CPU time, wall time).
fn run(
    path: &Path,
    rt: &tokio::runtime::Runtime,
    iters: u64,
    offset: usize,
    step: usize,
) -> (Duration, Duration) {
    let cpu = cpu_time();
    let wall = Instant::now();
    for i in 0..iters as usize {
        std::hint::black_box(path.one(rt, i * step + offset));
    }
    let wall = wall.elapsed();
    let cpu = match (cpu, cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => wall,
    };
    (cpu, wall)
}

/// `iters` decisions on each of `threads` threads at once; per thread (cpu, wall).
fn concurrent(path: &Path, threads: usize, iters: u64) -> Vec<(Duration, Duration)> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let rt = runtime();
                    barrier.wait();
                    run(path, &rt, iters, t, threads)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    })
}

/// Criterion measures the on-CPU time per decision of one thread, alone or while a
/// second thread decides on the same limiter, store and metrics at the same time.
fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30)
        .throughput(Throughput::Elements(1));
    for (name, make) in [
        ("metrics_off", Metrics::disabled as fn() -> Metrics),
        ("metrics_on", Metrics::new as fn() -> Metrics),
    ] {
        for threads in [1, 2] {
            let path = Path::new(make());
            group.bench_function(format!("{threads}_thread/{name}"), |b| {
                b.iter_custom(|iters| {
                    let per_thread = concurrent(&path, threads, iters);
                    per_thread.iter().map(|(cpu, _)| *cpu).sum::<Duration>() / threads as u32
                })
            });
        }
    }
    group.finish();
}

/// On a shared machine the load changes while criterion measures one variant after
/// the other; this runs them interleaved (off, on, off, on, ...) in short rounds and
/// prints the totals, which is the fairer comparison.
fn interleaved() {
    const ROUNDS: usize = 40;
    const OPS: u64 = 20_000;
    println!("\ninterleaved A/B, {ROUNDS} rounds of {OPS} decisions per thread per variant:");
    for threads in [1, 2] {
        let paths = [Path::new(Metrics::disabled()), Path::new(Metrics::new())];
        let mut cpu = [Duration::ZERO; 2];
        let mut wall = [Duration::ZERO; 2];
        for _ in 0..ROUNDS {
            for (v, path) in paths.iter().enumerate() {
                for (c, w) in concurrent(path, threads, OPS) {
                    cpu[v] += c;
                    wall[v] += w;
                }
            }
        }
        let ops = (ROUNDS as u64 * OPS * threads as u64) as f64;
        let ns = |d: Duration| d.as_nanos() as f64 / ops;
        println!(
            "  {threads} thread(s): cpu/decision off {:.0} ns, on {:.0} ns ({:+.1} %); \
             wall/decision off {:.0} ns, on {:.0} ns ({:+.1} %)",
            ns(cpu[0]),
            ns(cpu[1]),
            (ns(cpu[1]) / ns(cpu[0]) - 1.0) * 100.0,
            ns(wall[0]),
            ns(wall[1]),
            (ns(wall[1]) / ns(wall[0]) - 1.0) * 100.0,
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    // Only under `cargo bench` (which passes --bench), not under `cargo test`.
    if std::env::args().any(|a| a == "--bench") {
        interleaved();
    }
    Criterion::default().configure_from_args().final_summary();
}
