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
//! Run: `cargo bench --bench metrics`

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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
        let descriptors = [Descriptor {
            entries: &entries[..],
            hits: 1,
        }];
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

/// `iters` decisions on each of `threads` threads at once; the time for one thread's.
fn concurrent(path: &Path, threads: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let rt = runtime();
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters as usize {
                        std::hint::black_box(path.one(&rt, i * threads + t));
                    }
                    start.elapsed()
                })
            })
            .collect();
        barrier.wait();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    for (name, make) in [
        ("metrics_off", Metrics::disabled as fn() -> Metrics),
        ("metrics_on", Metrics::new as fn() -> Metrics),
    ] {
        let path = Path::new(make());
        let rt = runtime();
        let mut i = 0usize;
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("1_thread/{name}"), |b| {
            b.iter(|| {
                i += 1;
                path.one(&rt, i)
            })
        });
        let path = Path::new(make());
        group.throughput(Throughput::Elements(2));
        group.bench_function(format!("2_threads/{name}"), |b| {
            b.iter_custom(|iters| concurrent(&path, 2, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
