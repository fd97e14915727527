//! The cost of compiling the policy when RateLimitPolicy objects change: every
//! change resolves all objects (who owns each domain, which policy conflicts with
//! which) and compiles what serves, so its cost grows with the number of policies.
//! Each object here is one tenant's policy in one shared domain, the case where a
//! domain holds the most documents.
//!
//! Run: `cargo bench --bench policy`

use std::collections::HashSet;

use criterion::{criterion_group, BenchmarkId, Criterion};
use sluice::policy::{compile, parse_resource_spec};
use sluice::source::hub::{resolve, Candidate};

/// `n` tenants' policies of domain `shared`, each with a tenant-wide limit and
/// two per-route limits below it.
fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| {
            let spec = serde_json::json!({
                "domain": "shared",
                "descriptors": [{
                    "key": "tenant",
                    "value": format!("t{i}"),
                    "rateLimit": {"unit": "second", "requestsPerUnit": 100},
                    "descriptors": [
                        {"key": "path", "value": "/a", "rateLimit": {"unit": "second", "requestsPerUnit": 10}},
                        {"key": "path", "value": "/b", "rateLimit": {"unit": "minute", "requestsPerUnit": 60}}
                    ]
                }]
            });
            let name = format!("tenant-{i}");
            Candidate {
                namespace: "team".into(),
                name: name.clone(),
                created: format!("2026-01-01T00:{:02}:{:02}Z", i / 60 % 60, i % 60),
                generation: 1,
                domain: Some("shared".into()),
                current: parse_resource_spec("team", &name, &spec),
                last_good: None,
                claimed: None,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("policies");
    group.sample_size(10);
    let shared = HashSet::from(["shared".to_string()]);
    for n in [10, 100, 300, 1000] {
        let all = candidates(n);
        group.bench_with_input(BenchmarkId::new("one_domain", n), &all, |b, all| {
            b.iter(|| {
                let (docs, outcomes) = resolve(&[], all, &shared);
                assert_eq!(outcomes.len(), n);
                compile(docs).expect("compiles")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
