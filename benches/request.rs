//! Sluice's own work on one request, without the network: the encoded
//! `RateLimitRequest` is read in place, decided on a `MemoryStore` (metrics on) and
//! the answer encoded as the gRPC frame, as `service::grpc` does for every call. The
//! policy and traffic are `scripts/bench.sh`'s (`benches/policy.yaml`): `hot` (one
//! key), `uniform` (100,000 client keys) and `layered` (an address out of 100,000, a
//! service and a tenant out of 100, one request).
//!
//! Criterion reports the (wall) time per request on one thread. The machine's load
//! still moves it by a few per cent, so compare two builds in interleaved runs. The
//! h2 and Tokio costs that end-to-end runs add are the same for any handler (the
//! ceiling pays them too), so they are left out.
//!
//! `check`, `charge`, `charge-over` and `rates` are built as Envoy sends them
//! (docs/costs.md, docs/rates.md), one key each as in `hot`. `check` is the call
//! before a request: the descriptor's own hits_addend 0, on an `api_key` whose
//! counter a charge made first. `charge` is the call at stream end: the descriptor's
//! own hits_addend the response's cost (8), on the same kind of key, under its
//! limit. `charge-over` charges 8 a `user` limited to 100 a second, so every charge
//! is past the limit: spent anyway, and owed. `denied` is a plain request on such a
//! key, the request it compares with: denied, spending nothing. `rates` is a plain
//! request on `account`, which has two rates on one key, decided in one store call.
//!
//! Beside each scenario, `ceiling/<scenario>` does what the do-nothing server
//! (`sluice-bench noop`) does for the same request: prost decodes it and an OK answer
//! is framed. The difference between the two is what sluice's decision adds, at best:
//! with warm caches and no network.
//!
//! `request/flood_idle` and `request/flood_live` measure the memory store's full
//! path: a store at `--max-keys` (100,000) under a stream of keys it has never seen,
//! one per request. In `flood_idle` the clock moves 15 us per request, so the
//! counters it holds were last used over a second (the rule's window) ago and each
//! new key takes the place of an idle or expired one; in `flood_live` the clock
//! stands still, so every counter held is in use and no new key finds room.
//!
//! `deadline` is what a call's `grpc-timeout` adds (Envoy always sends one): the
//! header read among Envoy's usual ones and the store wait worked out from the time
//! left.
//!
//! `algorithm/<name>` is one decision of a bucket alone (`algorithm::decide`, the
//! state fed back as a store commits it), the clock moving 1 µs per call at a rate
//! that never empties the bucket: the arithmetic a memory-store hit pays for it.
//!
//! `tracing/unsampled` and `tracing/sampled` are `request/hot` with tracing on, as
//! `service::grpc` runs it: the caller's `traceparent` read, the span made, and for
//! a sampled call the decision's attributes written and the span queued for an
//! export task that drops it. Tracing off is `request/hot` itself: the service's
//! one branch on its absent span.
//!
//! `scale/` measures what must not grow with a table or a log, each beside the
//! same work at a normal size: `penalty_room` and `penalty_full` are the denial of
//! a key the penalty table has never seen (then lifted, so the table keeps its
//! size), in a table with room and in one at its bound (100,000) whose every record
//! serves a sentence; `log_short` and `log_long`
//! are a memory-store decision of a sliding_window_log key holding 10 and 60,000
//! entries (one hit a millisecond, 10 a second and 60,000 a minute), and
//! `log_batch` a request of 64 such keys holding 5,000 each; `wildcards_10` and
//! `wildcards_10k` a descriptor matched against a level of 10 and 10,000 wildcard
//! values (`tenant-N-*`), the value taking the first pattern of the file.
//!
//! Run: `cargo bench --bench request`
//!
//! `SLUICE_COUNT=SCENARIO:N` runs N requests of one `request/` scenario on a clock
//! that moves 10 µs per request and exits, for `scripts/instructions.sh`: callgrind
//! counts the instructions of [`counted`] alone, a figure that, unlike time, does not
//! move with the machine's load, so two builds compare to a fraction of a per cent.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use criterion::measurement::WallTime;
use criterion::{criterion_group, BenchmarkGroup, Criterion, Throughput};
use futures::FutureExt;
use prost::Message;
use sluice::algorithm::{self, Algorithm, Limit, SECOND};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::hash::{stable_hash, ValueHash};
use sluice::limiter::key::Hashing;
use sluice::limiter::penalty::{BanInfo, Penalties};
use sluice::limiter::{Limiter, Settings};
use sluice::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    RateLimitDescriptor,
};
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::policy::{Penalty, Sentence};
use sluice::service::decode::Request;
use sluice::service::response::framed_response;
use sluice::service::{HeaderStyle, Service};
use sluice::store::{Fallback, Hit, MemoryStore, Mode, Spend};
use sluice::telemetry::Metrics;
use sluice_grpc::{frame, Deadline};

const KEYS: usize = 100_000;

// The allocator sluice runs on.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keys the flood scenarios' store holds (`--max-keys`).
const FLOOD_MAX_KEYS: usize = 100_000;

/// Distinct keys a flood cycles through: so many more than the store holds that a
/// key comes round again only long after it was dropped (or never kept).
const FLOOD_KEYS: usize = 1_000_000;

fn service(settings: Settings) -> Service<MemoryStore> {
    service_on(Arc::new(SystemClock), 1_000_000, settings)
}

fn service_on(clock: Arc<dyn Clock>, max_keys: usize, settings: Settings) -> Service<MemoryStore> {
    let text = include_str!("policy.yaml");
    let docs = sluice::policy::parse_str("policy.yaml", text).expect("parses");
    let policy = sluice::policy::compile(docs).expect("compiles");
    let store = MemoryStore::new(clock, max_keys);
    let limiter = Limiter::new(Arc::new(ArcSwap::from_pointee(policy)), store, settings);
    Service::new(limiter, HeaderStyle::Draft03, Arc::new(Metrics::new()))
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value,
        }],
        ..Default::default()
    }
}

/// The limiter's settings of a `request/` scenario: `layered-hashed` is `layered`
/// under `--hash-keys`, every value hashed with the keyed hash.
fn scenario_settings(scenario: &str) -> Settings {
    match scenario {
        "layered-hashed" => Settings {
            hashing: Hashing {
                all: true,
                hash: ValueHash::from_secret(b"a benchmark's secret").expect("long enough"),
            },
            ..Settings::default()
        },
        _ => Settings::default(),
    }
}

/// The cost a charge scenario reports at stream end, as a response's tokens.
const COST: u64 = 8;

/// A descriptor as Envoy sends it from a rate limit with its own `hits_addend` (a
/// check's 0 before the request, a charge's cost at stream end).
fn costed(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(hits),
        ..descriptor(key, value.into())
    }
}

/// The encoded requests of a scenario, as the load generator sends them.
fn requests(scenario: &str) -> Vec<Vec<u8>> {
    // A fixed shuffle, so consecutive requests do not touch neighbouring keys.
    (0..KEYS)
        .map(|i| encoded(scenario, (i * 7919) % KEYS))
        .collect()
}

/// Request `i` of a scenario, encoded.
fn encoded(scenario: &str, i: usize) -> Vec<u8> {
    let descriptors = match scenario {
        "hot" => vec![descriptor("client", "c0".into())],
        "check" => vec![costed("api_key", "k0", 0)],
        "charge" => vec![costed("api_key", "k0", COST)],
        "charge-over" => vec![costed("user", "u0", COST)],
        "denied" => vec![descriptor("user", "u0".into())],
        "rates" => vec![descriptor("account", "a0".into())],
        "uniform" => vec![descriptor("client", format!("c{i}"))],
        // Envoy Gateway's per-tenant limits: a `limit` override on every request.
        "overridden" => vec![RateLimitDescriptor {
            limit: Some(RateLimitOverride {
                requests_per_unit: 1_000_000_000,
                unit: 1,
            }),
            ..descriptor("client", format!("c{i}"))
        }],
        _ => vec![
            descriptor(
                "remote_address",
                format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
            ),
            descriptor("service", "checkout".into()),
            descriptor("tenant", format!("t{}", i % 100)),
        ],
    };
    RateLimitRequest {
        domain: "bench".into(),
        descriptors,
        hits_addend: 0,
    }
    .encode_to_vec()
}

/// Decodes, decides and encodes one request; the answer's length.
fn one(service: &Service<MemoryStore>, message: &[u8]) -> usize {
    answer(service, message).len()
}

/// Decodes, decides and encodes one request; the answer as a gRPC frame.
fn answer(service: &Service<MemoryStore>, message: &[u8]) -> bytes::Bytes {
    let req = Request::decode(message).expect("the fast reader reads it");
    let outcome = service
        .should_rate_limit(&req, None)
        .now_or_never()
        .expect("the memory store answers at once")
        .expect("valid");
    framed_response(&outcome, service.headers, None)
}

/// The overall code of one request's answer.
fn code(service: &Service<MemoryStore>, message: &[u8]) -> i32 {
    let framed = answer(service, message);
    // Past the gRPC frame's prefix: a flag byte and the length.
    RateLimitResponse::decode(&framed[5..])
        .expect("decodes")
        .overall_code
}

/// Makes the counters a scenario's requests find in a long run, and checks that the
/// scenario is answered as it says (a check admitted, a charge past its limit
/// denied), so its figure is of the path it names.
fn prepare(service: &Service<MemoryStore>, scenario: &str, requests: &[Vec<u8>], tick: impl Fn()) {
    if scenario == "check" {
        // A check spends nothing, so keeps no counter: its key's charge makes it.
        one(service, &encoded("charge", 0));
    }
    for r in requests {
        tick();
        one(service, r);
    }
    let expected = match scenario {
        "charge-over" | "denied" => Code::OverLimit,
        _ => Code::Ok,
    };
    assert_eq!(
        code(service, &requests[0]),
        expected as i32,
        "{scenario} is answered as it should be"
    );
}

/// What the do-nothing server does for one request; the answer's length.
fn noop(message: &[u8]) -> usize {
    RateLimitRequest::decode(message).expect("decodes");
    frame(&RateLimitResponse {
        overall_code: Code::Ok as i32,
        ..Default::default()
    })
    .len()
}

fn settings(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .sample_size(30)
        .throughput(Throughput::Elements(1));
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("request");
    settings(&mut group);
    for scenario in [
        "hot",
        "uniform",
        "overridden",
        "layered",
        "layered-hashed",
        "check",
        "charge",
        "charge-over",
        "denied",
        "rates",
    ] {
        let service = service(scenario_settings(scenario));
        let requests = requests(scenario.trim_end_matches("-hashed"));
        // Every key exists before measuring, as in a long run.
        prepare(&service, scenario, &requests, || {});
        let mut i = 0;
        group.bench_function(scenario, |b| {
            b.iter(|| {
                i = (i + 1) % requests.len();
                std::hint::black_box(one(&service, &requests[i]))
            })
        });
    }
    for (scenario, step) in [("flood_idle", 15), ("flood_live", 0)] {
        let clock = ManualClock::new(SystemClock.now());
        let service = service_on(Arc::new(clock.clone()), FLOOD_MAX_KEYS, Settings::default());
        let requests: Vec<Vec<u8>> = (0..FLOOD_KEYS)
            .map(|i| {
                RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![descriptor("client", format!("f{i}"))],
                    hits_addend: 0,
                }
                .encode_to_vec()
            })
            .collect();
        // The store is full before measuring.
        for r in &requests[..2 * FLOOD_MAX_KEYS] {
            clock.advance(step);
            one(&service, r);
        }
        // Only keys past the fill come round, so none of them is held when it does.
        let fresh = &requests[2 * FLOOD_MAX_KEYS..];
        let mut i = 0;
        group.bench_function(scenario, |b| {
            b.iter(|| {
                i = (i + 1) % fresh.len();
                clock.advance(step);
                std::hint::black_box(one(&service, &fresh[i]))
            })
        });
    }
    group.finish();

    // One value hashed, as the counter key writes it: the unkeyed FNV-1a that keys
    // used before, against the keyed SipHash they use now.
    let mut group = c.benchmark_group("hash");
    settings(&mut group);
    let value = b"10.123.45.67";
    let mut out = String::with_capacity(64);
    group.bench_function("fnv1a", |b| {
        b.iter(|| {
            use std::fmt::Write;
            out.clear();
            let _ = write!(out, "#{:016x}", stable_hash(std::hint::black_box(value)));
            std::hint::black_box(out.len())
        })
    });
    let keyed = ValueHash::from_secret(b"a benchmark's secret").expect("long enough");
    group.bench_function("siphash", |b| {
        b.iter(|| {
            out.clear();
            keyed.push_hex(&mut out, std::hint::black_box(value));
            std::hint::black_box(out.len())
        })
    });
    group.finish();

    let mut group = c.benchmark_group("ceiling");
    settings(&mut group);
    for scenario in ["hot", "uniform", "layered"] {
        let requests = requests(scenario);
        let mut i = 0;
        group.bench_function(scenario, |b| {
            b.iter(|| {
                i = (i + 1) % requests.len();
                std::hint::black_box(noop(&requests[i]))
            })
        });
    }
    group.finish();
}

/// The headers Envoy's rate limit filter sends with each call.
fn envoy_headers() -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "20m"),
        ("x-envoy-internal", "true"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-envoy-expected-rq-timeout-ms", "20"),
        ("user-agent", "envoy/1.40.0"),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    h
}

fn deadline(c: &mut Criterion) {
    let mut group = c.benchmark_group("deadline");
    settings(&mut group);
    let headers = envoy_headers();
    group.bench_function("grpc-timeout", |b| {
        b.iter(|| {
            let t = Deadline::timeout(std::hint::black_box(&headers))
                .expect("valid")
                .expect("present");
            std::hint::black_box(sluice::service::store_wait(t))
        })
    });
    group.finish();
}

fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    settings(&mut group);
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        // benches/policy.yaml's token_bucket: 10^9 a second, as deep.
        let limit = Limit {
            algorithm,
            requests: 1_000_000_000,
            window: SECOND,
            burst: 1_000_000_000,
            phase: 0,
        };
        let mut state = None;
        let mut now = 1_700_000_000 * SECOND;
        group.bench_function(algorithm.as_str(), |b| {
            b.iter(|| {
                now += 1;
                // Opaque, as a policy's limit is: no division by a known constant.
                let limit = std::hint::black_box(&limit);
                let d = algorithm::decide(limit, state.as_ref(), now, 1);
                if let Some(next) = d.next {
                    state = Some(next);
                }
                std::hint::black_box(d.verdict.remaining)
            })
        });
    }
    group.finish();
}

/// An exporter that drops every batch: the export task's cost without a collector.
#[derive(Debug)]
struct Discard;

impl opentelemetry_sdk::trace::SpanExporter for Discard {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        std::hint::black_box(batch);
        Ok(())
    }
}

fn tracing(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracing");
    settings(&mut group);
    // The export task runs on a worker of its own, as the server's runtime runs it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let args = sluice::trace::TracingArgs {
        tracing: true,
        tracing_queue_size: Some("65536".into()),
        ..Default::default()
    };
    let env = |name: &str| (name == "OTEL_BSP_SCHEDULE_DELAY").then(|| "100".to_string());
    let trace_settings = sluice::trace::settings(&args, &env)
        .expect("valid")
        .expect("on");
    let counter = |name: &str| prometheus::IntCounter::new(name, name).expect("valid");
    let counters = sluice::trace::Counters {
        exported: counter("exported"),
        dropped: counter("dropped"),
        failed: counter("failed"),
    };
    let tracer = sluice::trace::Tracer::start_with(&trace_settings, Discard, counters.clone());
    let service = service(Settings::default());
    let requests = requests("hot");
    one(&service, &requests[0]);
    // `unsampled`: Envoy did not sample the request (flags 00), so neither does a
    // parent-based sampler; `sampled`: the span is recorded, attributed and queued.
    for (name, flags) in [("unsampled", "00"), ("sampled", "01")] {
        let mut headers = envoy_headers();
        let parent = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
        headers.insert("traceparent", parent.parse().expect("valid"));
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % requests.len();
                let mut call = tracer.call(
                    "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                    &headers,
                );
                let req = Request::decode(&requests[i]).expect("the fast reader reads it");
                let outcome = service
                    .should_rate_limit_traced(&req, None, &mut call)
                    .now_or_never()
                    .expect("the memory store answers at once")
                    .expect("valid");
                std::hint::black_box(framed_response(&outcome, service.headers, None).len())
            })
        });
    }
    group.finish();
    assert_eq!(counters.dropped.get(), 0, "the queue kept up");
}

/// A denial of a key never seen, counted towards a penalty, and the key lifted
/// again: in a table with room, and in one at its bound whose every record is
/// banned (where the key is not counted, and its lift finds nothing).
fn penalties(group: &mut BenchmarkGroup<'_, WallTime>) {
    let info = || BanInfo {
        domain: "bench".into(),
        rule: "client".into(),
        key: "k".into(),
    };
    let penalty = |violations| Penalty {
        violations,
        within: 60 * SECOND,
        sentence: Sentence::Ban(3600 * SECOND),
        block: None,
    };
    for (name, banned) in [("penalty_room", 1_000), ("penalty_full", 100_000)] {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let table = Penalties::new(Arc::new(clock.clone()), 100_000);
        for i in 0..banned {
            table.deny(&format!("banned-{i}"), &penalty(1), clock.now(), info);
        }
        let keys: Vec<String> = (0..FLOOD_KEYS).map(|i| format!("new-{i}")).collect();
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                let started = table.deny(&keys[i], &penalty(5), clock.now(), info);
                // Gone again, so the table keeps its size.
                table.lift(&keys[i]);
                std::hint::black_box(started)
            })
        });
    }
}

/// Memory-store decisions of sliding_window_log keys whose logs hold `entries`, one
/// hit a millisecond on each: one key at a time, or `keys` in one request.
fn logs(group: &mut BenchmarkGroup<'_, WallTime>) {
    for (name, keys, entries) in [
        ("log_short", 1, 10),
        ("log_long", 1, 60_000),
        ("log_batch", 64, 5_000),
    ] {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let store = MemoryStore::new(Arc::new(clock.clone()), 1_000_000);
        // `entries` admitted a window, one a millisecond: the log stays that long.
        let limit = Limit {
            algorithm: Algorithm::SlidingWindowLog,
            requests: entries,
            window: entries * 1000,
            burst: entries,
            phase: 0,
        };
        let hits: Vec<Hit> = (0..keys)
            .map(|k| Hit {
                key: format!("bench|log={k}"),
                placement: 0,
                limit,
                hits: 1,
                mode: Mode::Enforce,
                spend: Spend::IfAdmitted,
                fallback: Fallback::Admit,
                max_delay: algorithm::NO_DEADLINE,
            })
            .collect();
        for _ in 0..entries {
            clock.advance(1000);
            assert!(store.decide_now(&hits).admitted);
        }
        group.bench_function(name, |b| {
            b.iter(|| {
                clock.advance(1000);
                std::hint::black_box(store.decide_now(&hits).admitted)
            })
        });
    }
}

/// A descriptor matched against `n` wildcard values of one key, taking the first.
fn wildcards(group: &mut BenchmarkGroup<'_, WallTime>) {
    for (name, n) in [("wildcards_10", 10), ("wildcards_10k", 10_000)] {
        let mut text = String::from("domain: bench\ndescriptors:\n");
        for i in 0..n {
            text += &format!(
                "  - {{key: tenant, value: \"tenant-{i}-*\", rate_limit: {{unit: second, requests_per_unit: 10}}}}\n"
            );
        }
        let docs = sluice::policy::parse_str("wildcards.yaml", &text).expect("parses");
        let policy = sluice::policy::compile(docs).expect("compiles");
        let domain = policy.domain("bench").expect("the domain");
        let entries = [("tenant", "tenant-0-eu")];
        assert!(domain.find(&entries[..]).is_some());
        group.bench_function(name, |b| {
            b.iter(|| std::hint::black_box(domain.find(std::hint::black_box(&entries[..]))))
        });
    }
}

fn scale(c: &mut Criterion) {
    let mut group = c.benchmark_group("scale");
    settings(&mut group);
    penalties(&mut group);
    logs(&mut group);
    wildcards(&mut group);
    group.finish();
}

criterion_group!(benches, bench, deadline, algorithms, tracing, scale);

fn main() {
    if let Ok(spec) = std::env::var("SLUICE_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

/// `SCENARIO:N` (`SLUICE_COUNT`): every key made first, as in `request/`, then N
/// requests through [`counted`].
fn count(spec: &str) {
    let (scenario, n) = spec
        .split_once(':')
        .and_then(|(s, n)| Some((s, n.parse::<usize>().ok()?)))
        .expect("SLUICE_COUNT is SCENARIO:N, e.g. hot:20000");
    let clock = ManualClock::new(1_700_000_000 * SECOND);
    let service = service_on(
        Arc::new(clock.clone()),
        1_000_000,
        scenario_settings(scenario),
    );
    let requests = requests(scenario.trim_end_matches("-hashed"));
    prepare(&service, scenario, &requests, || clock.advance(10));
    println!("{}", counted(&service, &clock, &requests, n));
}

/// The requests callgrind counts (`--toggle-collect`); kept out of line so its
/// name survives LTO.
#[inline(never)]
fn counted(
    service: &Service<MemoryStore>,
    clock: &ManualClock,
    requests: &[Vec<u8>],
    n: usize,
) -> usize {
    let mut bytes = 0;
    for i in 0..n {
        clock.advance(10);
        bytes += one(service, &requests[i % requests.len()]);
    }
    bytes
}
