//! A policy changed under counters that hold state: what a key already counted gets
//! after the change, for every algorithm, with the memory store and a real
//! redis-server (docs/policies.md, "Changing a policy under live counters").
//!
//! The limits are per hour or per day, so no window ends during a test.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use common::redis::{available, RedisServer};
use common::*;
use sluice::algorithm::SECOND;
use sluice::clock::ManualClock;
use sluice::limiter::{Descriptor, Limiter, Settings};
use sluice::policy::Policy;
use sluice::store::redis::Options;
use sluice::store::{MemoryStore, RedisStore, Store};

const WINDOWS: [&str; 3] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
];
const BUCKETS: [&str; 2] = ["token_bucket", "leaky_bucket"];
/// The store timeout: long enough that a loaded machine's stalls fail no call here.
const LOADED: Duration = Duration::from_secs(2);

fn compile(rule: &str) -> Policy {
    let text = format!("domain: d\ndescriptors:\n  - key: user\n{rule}\n");
    sluice::policy::compile(sluice::policy::parse_str("p.yaml", &text).expect("parses"))
        .expect("compiles")
}

/// `rate_limit: {unit, requests_per_unit, algorithm}` and `extra` fields.
fn rule(algorithm: &str, unit: &str, rpu: u64, extra: &str) -> String {
    format!(
        "    rate_limit: {{unit: {unit}, requests_per_unit: {rpu}, algorithm: {algorithm}}}{extra}"
    )
}

/// A limiter whose policy the test swaps, as a reload does.
struct Walk<S: Store> {
    limiter: Limiter<S>,
    policy: Arc<ArcSwap<Policy>>,
    /// The stores' clock, so that no window ends during a test.
    clock: ManualClock,
}

impl<S: Store> Walk<S> {
    fn new(store: S, clock: ManualClock) -> Self {
        let policy = Arc::new(ArcSwap::from_pointee(compile(&rule(
            "fixed_window",
            "hour",
            1,
            "",
        ))));
        let settings = Settings {
            store_timeout: LOADED,
            ..Settings::default()
        };
        let limiter =
            Limiter::new(policy.clone(), store, settings).with_clock(Arc::new(clock.clone()));
        Walk {
            limiter,
            policy,
            clock,
        }
    }

    fn set(&self, rule: &str) {
        self.policy.store(Arc::new(compile(rule)));
    }

    /// How many of `n` one-hit requests of `user` are admitted; no decision fails
    /// (a state read under another meaning would be a script error with Redis).
    async fn admitted(&self, user: &str, n: u64) -> u64 {
        let entries = [("user", user)];
        let mut ok = 0;
        for _ in 0..n {
            let o = self
                .limiter
                .decide("d", &[Descriptor::new(&entries, 1)])
                .await;
            assert!(o.failure.is_none(), "{user}: {o:?}");
            ok += u64::from(!o.over_limit);
        }
        ok
    }

    /// How long until a one-hit request of `user` is admitted, polled every 50 ms
    /// of the manual clock; `None` if not within 10 seconds.
    async fn admitted_within(&self, user: &str) -> Option<Duration> {
        let step = Duration::from_millis(50);
        let mut waited = Duration::ZERO;
        while waited <= Duration::from_secs(10) {
            if self.admitted(user, 1).await == 1 {
                return Some(waited);
            }
            self.clock.advance(step.as_micros() as u64);
            waited += step;
        }
        None
    }
}

async fn walk<S: Store>(store: &str, w: &Walk<S>) {
    for alg in WINDOWS.iter().chain(&BUCKETS) {
        let bucket = BUCKETS.contains(alg);
        let is = |what: &str| format!("{store} {alg}: {what}");

        // Lowered from 10 to 5 an hour after 8: a window's count carries, and a
        // bucket owes the 8 hits it took, so the key is over at once.
        let u = format!("{alg}-lower");
        w.set(&rule(alg, "hour", 10, ""));
        assert_eq!(w.admitted(&u, 8).await, 8);
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 3).await, 0, "{}", is("lowered"));

        // Raised from 5 to 10 after 5: a window's count carries, and a bucket owes
        // the 5 hits it took, so 5 more pass at once.
        let u = format!("{alg}-raise");
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 6).await, 5);
        w.set(&rule(alg, "hour", 10, ""));
        assert_eq!(w.admitted(&u, 10).await, 5, "{}", is("raised"));

        // Emptied at 5 an hour and made 5 a second, a bucket owes its 5 hits at the
        // new rate, one second's worth, not the rest of the hour.
        if bucket {
            let u = format!("{alg}-faster");
            w.set(&rule(alg, "hour", 5, ""));
            assert_eq!(w.admitted(&u, 6).await, 5);
            w.set(&rule(alg, "second", 5, ""));
            // Not at once (it still owes), and in well under the hour.
            let waited = w.admitted_within(&u).await;
            assert!(
                waited.is_some_and(|d| d > Duration::ZERO),
                "{}: {waited:?}",
                is("made faster")
            );
        }

        // Another algorithm: its own counter, from nothing.
        for other in WINDOWS.iter().chain(&BUCKETS).filter(|o| *o != alg) {
            let u = format!("{alg}-to-{other}");
            w.set(&rule(alg, "hour", 5, ""));
            assert_eq!(w.admitted(&u, 6).await, 5);
            w.set(&rule(other, "hour", 5, ""));
            assert_eq!(w.admitted(&u, 6).await, 5, "{}", is(other));
        }

        // Shadow mode counts: turned off, the key is over at once.
        let u = format!("{alg}-shadow");
        w.set(&rule(alg, "hour", 5, "\n    shadow_mode: true"));
        assert_eq!(w.admitted(&u, 8).await, 8);
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 3).await, 0, "{}", is("shadow mode off"));

        // Shadow mode turned on under a denied key (which Redis's over-limit cache
        // remembers): admitted at once.
        let u = format!("{alg}-shadow-on");
        assert_eq!(w.admitted(&u, 6).await, 5);
        w.set(&rule(alg, "hour", 5, "\n    shadow_mode: true"));
        assert_eq!(w.admitted(&u, 3).await, 3, "{}", is("shadow mode on"));
        w.set(&rule(alg, "hour", 5, ""));

        // `unlimited` counts nothing, and the counter is as it was after.
        let u = format!("{alg}-unlimited");
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 3).await, 3);
        w.set("    rate_limit: {unlimited: true}");
        assert_eq!(w.admitted(&u, 20).await, 20);
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 5).await, 2, "{}", is("limited again"));

        // A rule removed and added back finds its counter.
        let u = format!("{alg}-removed");
        assert_eq!(w.admitted(&u, 4).await, 4);
        w.set("    value: someone-else\n    rate_limit: {unit: hour, requests_per_unit: 1}");
        assert_eq!(w.admitted(&u, 5).await, 5, "no rule, no limit");
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 5).await, 1, "{}", is("added back"));

        // Made a list, the first limit keeps the counter; the new one starts empty.
        let u = format!("{alg}-list");
        w.set(&rule(alg, "hour", 5, ""));
        assert_eq!(w.admitted(&u, 3).await, 3);
        let list = format!(
            "    rate_limits:\n      - {{unit: hour, requests_per_unit: 5, algorithm: {alg}}}\n      - {{unit: day, requests_per_unit: 100, algorithm: {alg}}}"
        );
        w.set(&list);
        assert_eq!(w.admitted(&u, 5).await, 2, "{}", is("made a list"));
    }
}

#[tokio::test]
async fn with_the_memory_store_counters_carry_across_changes_as_documented() {
    let clock = ManualClock::new(1_700_000_000 * SECOND);
    let store = MemoryStore::new(Arc::new(clock.clone()), 10_000);
    walk("memory", &Walk::new(store, clock)).await;
}

#[tokio::test]
async fn with_redis_counters_carry_across_changes_as_documented() {
    if !available() {
        return;
    }
    let redis = RedisServer::start().await;
    let clock = ManualClock::new(1_700_000_000 * SECOND);
    let mut opts = Options::new(vec![redis.url()], false);
    opts.call_timeout = LOADED;
    opts.fixed_clock = Some(Arc::new(clock.clone()));
    let store = RedisStore::new(opts, None).expect("store");
    walk("redis", &Walk::new(store, clock)).await;
}

/// The file source and a real redis-server, end to end: a limit lowered in the file
/// denies a key already past it as soon as the reload is served, a change of
/// algorithm starts the key afresh, and a bucket made faster owes its hits at the
/// new rate; no script fails on a key of another algorithm.
#[tokio::test]
async fn a_file_edit_under_traffic_takes_effect_at_once_with_redis() {
    if !available() {
        return;
    }
    let redis = RedisServer::start().await;
    let file_per = |alg: &str, unit: &str, rpu: u32| {
        format!(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{unit: {unit}, requests_per_unit: {rpu}, algorithm: {alg}, name: {alg}}}\n"
        )
    };
    let file = |alg: &str, rpu: u32| file_per(alg, "hour", rpu);
    let server = Server::start(
        &file("fixed_window", 10),
        &[
            "--redis",
            &redis.url(),
            "--reload-interval",
            "100ms",
            "--store-timeout",
            "2s",
        ],
    );
    let mut c = server.client().await;
    let over =
        |r: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse| r.overall_code == 2;
    for _ in 0..8 {
        let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
        assert!(!over(&r));
    }
    std::fs::write(server.policy_path(), file("fixed_window", 5)).unwrap();
    serves(&server, "fixed_window", 5).await;
    let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
    assert!(over(&r), "8 counted, 5 allowed: {r:?}");

    std::fs::write(server.policy_path(), file("token_bucket", 5)).unwrap();
    serves(&server, "token_bucket", 5).await;
    for i in 0..5 {
        let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
        assert!(!over(&r), "a fresh bucket, request {i}: {r:?}");
    }
    let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
    assert!(over(&r));

    // Made 6 a second: the bucket owes the 5 hits it took, at the new rate, not the
    // rest of the hour, so the sixth passes at once and more follow within seconds.
    std::fs::write(server.policy_path(), file_per("token_bucket", "second", 6)).unwrap();
    serves(&server, "token_bucket", 6).await;
    let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
    assert!(!over(&r), "5 owed of 6: {r:?}");
    for _ in 0..3 {
        eventually(
            Duration::from_secs(5),
            "the bucket refills at 6 a second",
            || {
                let mut c = c.clone();
                async move {
                    let r = call(&mut c, request("d", vec![desc(&[("user", "u")])])).await;
                    !over(&r)
                }
            },
        )
        .await;
    }
    let shard = redis.url().trim_start_matches("redis://").to_string();
    let labels = [
        ("store", "redis"),
        ("shard", shard.as_str()),
        ("kind", "script"),
    ];
    let errors = server.metric("sluice_store_errors_total", &labels);
    assert_eq!(errors, Some(0.0), "no script failed");
}

/// Waits until `server` answers with the limit of `rpu` named `name` (a check of
/// another key, which spends nothing).
async fn serves(server: &Server, name: &str, rpu: u32) {
    let c = server.client().await;
    eventually(Duration::from_secs(5), "the edit is served", || {
        let mut c = c.clone();
        async move {
            let r = call(&mut c, request("d", vec![desc_hits(&[("user", "x")], 0)])).await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .is_some_and(|l| l.requests_per_unit == rpu && l.name == name)
        }
    })
    .await;
}
