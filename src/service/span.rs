//! A decision written onto its call's span: `ratelimit.*` attributes for the
//! request and the descriptor that decided it, and one `ratelimit.descriptor`
//! event per descriptor; and a child span per store call ([`StoreSpans`]).
//!
//! Never a descriptor's value: values are what clients send (addresses, user ids,
//! API keys), and traces are kept longer and read more widely than the service's
//! own state. A span names the rule (its keys from the root, `tenant/path`, as the
//! metrics do), the entries' keys, the algorithm and the numbers; which client it
//! was is left to the request's own logs and spans upstream.

use opentelemetry::{Array, KeyValue, StringValue, Value};

use crate::limiter::{Ban, Outcome, Status};
use crate::policy::FailureMode;
use crate::store::{Probe, StoreCall};
use crate::trace::Call;

/// A call that ended without a decision, on its span: an error when Sluice failed
/// (`failed`), else the refusal and why (`ratelimit.refusal`). OpenTelemetry's
/// conventions for servers hold a caller's bad request no error of the server's,
/// so a client's bug does not show as Sluice's error rate.
pub fn unanswered(call: &mut Call, failed: bool, message: String) {
    if failed {
        call.error(message);
    } else {
        call.set("ratelimit.refusal", message);
    }
}

/// Turns each store call of a sampled request into a client span under the
/// request's, named and attributed as OpenTelemetry's database conventions say
/// for Redis (`FCALL decide`, `db.system.name`, `db.operation.name`,
/// `db.stored_procedure.name`, `server.address`, `server.port`). No key: keys
/// hold descriptor values.
pub struct StoreSpans<'a>(pub &'a Call);

impl Probe for StoreSpans<'_> {
    fn call(&self, c: &StoreCall<'_>) {
        let mut attributes = Vec::with_capacity(8);
        attributes.push(KeyValue::new("db.system.name", c.system));
        attributes.push(KeyValue::new("db.operation.name", c.operation));
        attributes.push(KeyValue::new("db.stored_procedure.name", c.script));
        if let Some(host) = c.host {
            attributes.push(KeyValue::new("server.address", host.to_string()));
        }
        if let Some(port) = c.port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes.push(KeyValue::new("ratelimit.store.keys", c.keys as i64));
        if let Some(e) = c.error {
            let kind = e.kind().map_or("backing_off", |k| k.as_str());
            attributes.push(KeyValue::new("error.type", kind));
        }
        self.0.child(
            format!("{} {}", c.operation, c.script),
            c.started,
            c.ended,
            attributes,
            c.error.map(|e| e.to_string()),
        );
    }
}

/// What became of one descriptor, as `sluice_requests_total`'s `outcome` label says.
pub(crate) fn outcome_of(outcome: &Outcome, s: &Status) -> &'static str {
    let shadow = outcome.rule(s).is_some_and(|r| r.shadow_mode);
    match (&outcome.failure, s.verdict) {
        _ if s.rule.is_none() && s.limit_override.is_none() => "unmatched",
        _ if s.ban == Ban::Active => "banned",
        _ if s.ban == Ban::Blocked => "blocked",
        _ if s.shed => "shed",
        // Without a verdict: the failure mode answered it.
        (Some(f), None) if f.mode != FailureMode::Closed => "failed_open",
        (Some(_), None) => "failed_closed",
        (_, Some(v)) if !v.admitted && shadow => "shadow_over_limit",
        // As `sluice_requests_total`: an over quota in an admitted request is no
        // denial, and no `ok` either.
        _ if s.over_limit
            && !outcome.over_limit
            && outcome.rule(s).is_some_and(|r| r.quota_mode) =>
        {
            "quota_over_limit"
        }
        _ if s.over_limit => "over_limit",
        _ => "ok",
    }
}

/// Writes `outcome` of a request to `domain` with these descriptors' keys onto
/// `call`.
pub fn decision<'a>(
    call: &mut Call,
    domain: &str,
    keys: impl Iterator<Item = &'a [(&'a str, &'a str)]>,
    outcome: &Outcome,
) {
    call.set("ratelimit.domain", domain.to_string());
    call.set(
        "ratelimit.outcome",
        if outcome.over_limit {
            "over_limit"
        } else {
            "ok"
        },
    );
    call.set("ratelimit.descriptors", outcome.statuses.len() as i64);
    if !outcome.domain_known {
        call.set("ratelimit.domain_known", false);
    }
    if let Some(f) = &outcome.failure {
        call.set("ratelimit.failure_mode", f.mode.as_str());
        call.set("ratelimit.store", f.store);
    } else if outcome.local {
        // Only a Redis outage has a domain decide in memory.
        call.set("ratelimit.failure_mode", "local");
        call.set("ratelimit.store", "redis");
    }
    // The descriptor that decided: the first one over its limit, else the one with
    // the least room left.
    let deciding = outcome
        .statuses
        .iter()
        .position(|s| s.over_limit)
        .or_else(|| {
            outcome
                .statuses
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let remaining = match s.verdict {
                        Some(v) => v.remaining,
                        // Answered by the failure mode (`open`): no room is left
                        // of it, as its answer says.
                        None if outcome.failure.is_some()
                            && outcome.rule(s).is_some_and(|r| r.limit.is_some()) =>
                        {
                            0
                        }
                        None => return None,
                    };
                    Some((i, remaining))
                })
                .min_by_key(|(_, r)| *r)
                .map(|(i, _)| i)
        });
    let mut keys = keys;
    for (i, s) in outcome.statuses.iter().enumerate() {
        let mut attributes = Vec::with_capacity(8);
        attributes.push(KeyValue::new("ratelimit.descriptor.index", i as i64));
        if let Some(entries) = keys.next() {
            // Keys only: `remote_address`, never the address.
            let names = entries
                .iter()
                .map(|(k, _)| StringValue::from(k.to_string()))
                .collect();
            attributes.push(KeyValue::new(
                "ratelimit.descriptor.keys",
                Value::Array(Array::String(names)),
            ));
        }
        let what = outcome_of(outcome, s);
        attributes.push(KeyValue::new("ratelimit.descriptor.outcome", what));
        attributes.push(KeyValue::new("ratelimit.hits", s.hits as i64));
        let rule = outcome.rule(s);
        if let Some(rule) = rule {
            attributes.push(KeyValue::new("ratelimit.rule", rule.path.clone()));
            if let Some(name) = &rule.name {
                attributes.push(KeyValue::new("ratelimit.rule.name", name.clone()));
            }
            if let Some(limit) = &rule.limit {
                attributes.push(KeyValue::new(
                    "ratelimit.algorithm",
                    limit.algorithm.as_str(),
                ));
                attributes.push(KeyValue::new("ratelimit.limit", limit.requests as i64));
            }
        }
        if let Some(v) = s.verdict {
            attributes.push(KeyValue::new(
                "ratelimit.remaining",
                v.remaining.min(i64::MAX as u64) as i64,
            ));
        }
        if Some(i) == deciding {
            call.set("ratelimit.hits", s.hits as i64);
            call.set("ratelimit.descriptor.outcome", what);
            if let Some(rule) = rule {
                call.set("ratelimit.rule", rule.path.clone());
                if let Some(limit) = &rule.limit {
                    call.set("ratelimit.algorithm", limit.algorithm.as_str());
                    call.set("ratelimit.limit", limit.requests as i64);
                }
            }
            if let Some(v) = s.verdict {
                call.set(
                    "ratelimit.remaining",
                    v.remaining.min(i64::MAX as u64) as i64,
                );
            }
        }
        call.event("ratelimit.descriptor", attributes);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::pb::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor::Entry, RateLimitDescriptor,
    };
    use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use bytes::Bytes;
    use opentelemetry::trace::{SpanId, SpanKind, Status as SpanStatus, TraceId};
    use opentelemetry::Value;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};
    use prost::Message;
    use tokio::sync::watch;

    use crate::clock::ManualClock;
    use crate::limiter::{test_limiter, Limiter};
    use crate::service::grpc::{Grpc, Method};
    use crate::service::{HeaderStyle, Service};
    use crate::store::{Board, Hit, MemoryStore, Probe, Store, StoreCall, StoreError, Verdicts};
    use crate::telemetry::Metrics;
    use crate::trace::{Counters, Tracer, TracingArgs};
    use sluice_grpc::{Handler, Reply};

    const POLICY: &str = "domain: shop\ndescriptors:\n  - key: user_id\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    const SECRET: &str = "alice-7731-secret";

    #[derive(Debug, Clone, Default)]
    struct Collector(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collector {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    struct Fixture<S: Store = MemoryStore> {
        grpc: Grpc<S>,
        tracer: Arc<Tracer>,
        spans: Collector,
        metrics: Arc<Metrics>,
        _serving: watch::Sender<bool>,
    }

    fn fixture(env: &[(&str, &str)]) -> Fixture {
        let clock = ManualClock::new(1_000 * crate::algorithm::SECOND);
        fixture_on(test_limiter(POLICY, &clock, Default::default()), env)
    }

    fn fixture_on<S: Store>(limiter: Limiter<S>, env: &[(&str, &str)]) -> Fixture<S> {
        let metrics = Arc::new(Metrics::new());
        let service = Arc::new(Service::new(limiter, HeaderStyle::Off, metrics.clone()));
        let (serving, rx) = watch::channel(true);
        let args = TracingArgs {
            tracing: true,
            ..TracingArgs::default()
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let settings = crate::trace::settings(&args, &get).unwrap().unwrap();
        let [exported, dropped, failed] = metrics.trace_spans();
        let spans = Collector::default();
        let counters = Counters {
            exported,
            dropped,
            failed,
        };
        let tracer = Arc::new(Tracer::start_with(&settings, spans.clone(), counters));
        let grpc = Grpc::new(service, rx).with_tracer(Some(tracer.clone()));
        Fixture {
            grpc,
            tracer,
            spans,
            metrics,
            _serving: serving,
        }
    }

    fn message(user: &str) -> Bytes {
        let desc = |k: &str, v: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: k.into(),
                value: v.into(),
            }],
            ..Default::default()
        };
        RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![desc("remote_address", "10.1.2.3"), desc("user_id", user)],
            hits_addend: 1,
        }
        .encode_to_vec()
        .into()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    async fn call<S: Store>(f: &Fixture<S>, h: &http::HeaderMap) -> RateLimitResponse {
        let reply = f
            .grpc
            .call_with_headers(Method::ShouldRateLimit, message(SECRET), None, h)
            .await
            .expect("answered");
        let Reply::One(framed) = reply else {
            panic!("a unary reply")
        };
        RateLimitResponse::decode(&framed[5..]).unwrap()
    }

    /// The spans exported once the queue is flushed.
    async fn exported<S: Store>(f: &Fixture<S>) -> Vec<SpanData> {
        f.tracer.stop(Duration::from_secs(5)).await;
        f.spans.0.lock().unwrap().clone()
    }

    fn attr(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[tokio::test]
    async fn a_sampled_call_is_the_child_of_its_traceparent_with_the_decision() {
        let f = fixture(&[]);
        let h = headers(&[("traceparent", PARENT)]);
        let codes: Vec<i32> = [call(&f, &h).await, call(&f, &h).await, call(&f, &h).await]
            .iter()
            .map(|r| r.overall_code)
            .collect();
        assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 3);
        let last = &spans[2];
        assert_eq!(
            last.name,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(last.span_kind, SpanKind::Server);
        assert_eq!(
            last.span_context.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            last.parent_span_id,
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert!(last.parent_span_is_remote);
        for (key, want) in [
            ("ratelimit.domain", Value::from("shop")),
            ("ratelimit.outcome", Value::from("over_limit")),
            ("ratelimit.rule", Value::from("user_id")),
            ("ratelimit.algorithm", Value::from("fixed_window")),
            ("ratelimit.limit", Value::I64(2)),
            ("ratelimit.remaining", Value::I64(0)),
            ("ratelimit.hits", Value::I64(1)),
            ("ratelimit.descriptors", Value::I64(2)),
            ("rpc.grpc.status_code", Value::I64(0)),
        ] {
            assert_eq!(attr(last, key), Some(want), "{key}");
        }
        assert_eq!(last.events.len(), 2, "one event per descriptor");
        // No descriptor value anywhere in any span.
        for s in &spans {
            let text = format!("{:?} {:?}", s.attributes, s.events);
            assert!(!text.contains(SECRET), "{text}");
            assert!(!text.contains("10.1.2.3"), "{text}");
            assert!(text.contains("remote_address"), "the keys are named");
        }
        assert_eq!(
            attr(&spans[0], "ratelimit.outcome"),
            Some(Value::from("ok"))
        );
        // The decision histogram's exemplar names the trace.
        let om = f.metrics.render_openmetrics();
        assert!(
            om.contains("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"}"),
            "{om}"
        );
    }

    #[tokio::test]
    async fn b3_headers_name_the_parent_too() {
        let f = fixture(&[]);
        let h = headers(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")]);
        call(&f, &h).await;
        let h = headers(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-sampled", "1"),
        ]);
        call(&f, &h).await;
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 2);
        assert_eq!(
            spans[0].span_context.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            spans[1].span_context.trace_id(),
            TraceId::from_hex("0000000000000000a3ce929d0e0e4736").unwrap()
        );
    }

    #[tokio::test]
    async fn a_parent_that_was_not_sampled_exports_nothing_and_decides_the_same() {
        let f = fixture(&[]);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let r = call(&f, &headers(&[("traceparent", unsampled)])).await;
        assert_eq!(r.overall_code, 1);
        assert!(exported(&f).await.is_empty());
        assert!(!f.metrics.render_openmetrics().contains("trace_id"));
    }

    #[tokio::test]
    async fn a_decision_not_to_sample_without_ids_exports_nothing() {
        let f = fixture(&[]);
        for deny in [[("b3", "0")], [("x-b3-sampled", "0")]] {
            let r = call(&f, &headers(&deny)).await;
            assert_eq!(r.overall_code, 1, "decided the same");
        }
        assert!(exported(&f).await.is_empty());
        // A sampler that ignores parents samples it as it would any call.
        let f = fixture(&[("OTEL_TRACES_SAMPLER", "always_on")]);
        call(&f, &headers(&[("b3", "0")])).await;
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID, "a root");
    }

    /// `--tracing-sampler-ratio 1` (`parentbased_traceidratio`) traces every call
    /// that comes with no parent, and none whose parent was not sampled.
    #[tokio::test]
    async fn the_ratio_is_of_calls_with_no_parent() {
        let ratio = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "1"),
        ];
        let f = fixture(&ratio);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        call(&f, &headers(&[("traceparent", unsampled)])).await;
        assert!(exported(&f).await.is_empty());
        let f = fixture(&ratio);
        call(&f, &http::HeaderMap::new()).await;
        assert_eq!(exported(&f).await.len(), 1);
    }

    #[tokio::test]
    async fn without_a_parent_the_root_sampler_decides() {
        let f = fixture(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]);
        call(&f, &http::HeaderMap::new()).await;
        assert!(exported(&f).await.is_empty());
        let f = fixture(&[]);
        call(&f, &headers(&[("traceparent", "garbage")])).await;
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 1, "a malformed header starts a new trace");
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
    }

    /// A refused request is the caller's fault: no error status (OpenTelemetry's
    /// conventions for a gRPC server), and the reason on the span.
    #[tokio::test]
    async fn a_refused_call_says_why_and_is_no_error_span() {
        let f = fixture(&[]);
        let h = headers(&[("traceparent", PARENT)]);
        let bad = RateLimitRequest {
            domain: String::new(),
            ..Default::default()
        }
        .encode_to_vec();
        let err = f
            .grpc
            .call_with_headers(Method::ShouldRateLimit, bad.into(), None, &h)
            .await
            .err()
            .expect("refused");
        assert_eq!(err.code, sluice_grpc::Code::InvalidArgument);
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].status, SpanStatus::Unset);
        assert_eq!(attr(&spans[0], "rpc.grpc.status_code"), Some(Value::I64(3)));
        assert!(attr(&spans[0], "ratelimit.refusal").is_some());
    }

    /// A memory store that reports one call to a Redis at 10.0.0.7:6379 when
    /// probed, and counts how it was asked.
    struct Remote {
        store: MemoryStore,
        probed: std::sync::atomic::AtomicUsize,
        plain: std::sync::atomic::AtomicUsize,
        /// Every call fails, as a shard that refuses connections does.
        down: std::sync::atomic::AtomicBool,
    }

    impl Board for Remote {}

    impl Store for Remote {
        async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
            self.plain.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.store.decide(hits).await
        }

        async fn decide_within(
            &self,
            hits: &[Hit],
            _: Duration,
            probe: Option<&dyn Probe>,
        ) -> Result<Verdicts, StoreError> {
            let Some(probe) = probe else {
                return self.decide(hits).await;
            };
            self.probed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::failed(
                    crate::store::ErrorKind::Connection,
                    "connect: refused",
                ));
            }
            let started = std::time::SystemTime::now();
            let result = self.store.decide(hits).await;
            probe.call(&StoreCall {
                system: "redis",
                host: Some("10.0.0.7"),
                port: Some(6379),
                operation: "EVALSHA",
                script: "decide",
                keys: hits.len(),
                started,
                ended: started + Duration::from_micros(250),
                error: None,
            });
            result
        }

        async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
            self.store.peek(hits).await
        }

        fn active_keys(&self) -> usize {
            0
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    fn remote_fixture(env: &[(&str, &str)]) -> Fixture<Remote> {
        remote_fixture_of(POLICY, env)
    }

    fn remote_fixture_of(policy: &str, env: &[(&str, &str)]) -> Fixture<Remote> {
        let clock = ManualClock::new(1_000 * crate::algorithm::SECOND);
        let docs = crate::policy::parse_str("p.yaml", policy).expect("parses");
        let policy = crate::policy::compile(docs).expect("compiles");
        let policy = Arc::new(arc_swap::ArcSwap::from_pointee(policy));
        let store = Remote {
            store: MemoryStore::new(Arc::new(clock.clone()), 1000),
            probed: Default::default(),
            plain: Default::default(),
            down: Default::default(),
        };
        let limiter = Limiter::new(policy, store, Default::default()).with_clock(Arc::new(clock));
        fixture_on(limiter, env)
    }

    #[tokio::test]
    async fn each_store_call_of_a_sampled_call_is_a_client_span_under_it() {
        let f = remote_fixture(&[]);
        call(&f, &headers(&[("traceparent", PARENT)])).await;
        let store = f.grpc.service.limiter.store();
        assert_eq!(store.probed.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(store.plain.load(std::sync::atomic::Ordering::SeqCst), 0);
        let spans = exported(&f).await;
        assert_eq!(spans.len(), 2, "the decision and its store call");
        let server = spans
            .iter()
            .find(|s| s.span_kind == SpanKind::Server)
            .unwrap();
        let client = spans
            .iter()
            .find(|s| s.span_kind == SpanKind::Client)
            .unwrap();
        assert_eq!(client.name, "EVALSHA decide");
        assert_eq!(
            client.span_context.trace_id(),
            server.span_context.trace_id()
        );
        assert_eq!(client.parent_span_id, server.span_context.span_id());
        assert_eq!(
            client.end_time.duration_since(client.start_time).unwrap(),
            Duration::from_micros(250),
            "timed where the store made the call"
        );
        for (key, want) in [
            ("db.system.name", Value::from("redis")),
            ("db.operation.name", Value::from("EVALSHA")),
            ("db.stored_procedure.name", Value::from("decide")),
            ("server.address", Value::from("10.0.0.7")),
            ("server.port", Value::I64(6379)),
            ("ratelimit.store.keys", Value::I64(2)),
        ] {
            assert_eq!(attr(client, key), Some(want), "{key}");
        }
        let text = format!("{:?} {:?}", client.attributes, client.name);
        assert!(
            !text.contains(SECRET) && !text.contains("10.1.2.3"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_call_answered_by_the_failure_mode_names_the_rule_it_lifted() {
        let f = remote_fixture(&[]);
        let store = f.grpc.service.limiter.store();
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let answer = call(&f, &headers(&[("traceparent", PARENT)])).await;
        assert_eq!(answer.overall_code, 1, "OK: the domain fails open");
        let spans = exported(&f).await;
        let server = spans
            .iter()
            .find(|s| s.span_kind == SpanKind::Server)
            .unwrap();
        // Both descriptors were lifted, with no room left: the first decides.
        for (key, want) in [
            ("ratelimit.outcome", Value::from("ok")),
            ("ratelimit.failure_mode", Value::from("open")),
            ("ratelimit.store", Value::from("redis")),
            ("ratelimit.rule", Value::from("remote_address")),
            ("ratelimit.descriptor.outcome", Value::from("failed_open")),
            ("ratelimit.limit", Value::I64(100)),
            ("ratelimit.hits", Value::I64(1)),
        ] {
            assert_eq!(attr(server, key), Some(want), "{key}");
        }
    }

    #[tokio::test]
    async fn a_call_decided_in_memory_during_an_outage_says_so() {
        let policy = format!("failure_mode: local\n{POLICY}");
        let f = remote_fixture_of(&policy, &[]);
        let store = f.grpc.service.limiter.store();
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        // Answered from this replica's share of the limits (the share of 2 a
        // minute, over the replicas assumed, is none: denied).
        call(&f, &headers(&[("traceparent", PARENT)])).await;
        let spans = exported(&f).await;
        let server = spans
            .iter()
            .find(|s| s.span_kind == SpanKind::Server)
            .unwrap();
        assert_eq!(
            attr(server, "ratelimit.failure_mode"),
            Some(Value::from("local"))
        );
        assert_eq!(attr(server, "ratelimit.store"), Some(Value::from("redis")));
    }

    #[tokio::test]
    async fn an_unsampled_call_asks_the_store_without_a_probe() {
        let f = remote_fixture(&[]);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let r = call(&f, &headers(&[("traceparent", unsampled)])).await;
        assert_eq!(r.overall_code, 1);
        let store = f.grpc.service.limiter.store();
        assert_eq!(store.probed.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(store.plain.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(exported(&f).await.is_empty());
    }
}
