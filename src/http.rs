//! The HTTP side: `/healthz`, `/readyz`, `/metrics`, `POST /json`, `/debug/*`, and
//! `POST /local-share/cut`, where a peer cut off from a shard asks this replica
//! whether it reaches it (`peers`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::clock::rfc3339;
use crate::guard::{Activity, Answering};
use crate::service::decode::Request;
use crate::service::grpc::SHOULD_RATE_LIMIT_SPAN;
use crate::service::json::{parse_request, render_response};
use crate::service::response::response;
use crate::service::span;
use crate::service::Service;
use crate::store::{ShardStatus, Store};
use crate::trace::{self, Call, Tracer};

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct HttpState<S> {
    pub service: Arc<Service<S>>,
    /// False until the servers listen; false again on SIGTERM.
    pub ready: Arc<AtomicBool>,
    /// Largest `POST /json` body read (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// How long a `POST /json` body may take to arrive whole (`--handshake-timeout`,
    /// as a request head).
    pub body_timeout: std::time::Duration,
    /// The gRPC port's connection counts, for `/metrics`.
    pub connections: Arc<sluice_grpc::Stats>,
    /// The admin port's, when it is on.
    pub admin_connections: Option<Arc<sluice_grpc::Stats>>,
    /// False until the sources that must deliver first have (the first xDS version).
    pub loaded: Arc<AtomicBool>,
    /// The policy sources, for their refusals and the RateLimitPolicies' verdicts.
    pub hub: Arc<crate::source::hub::Hub>,
    /// Set when tracing is on: each `POST /json` decision gets the span a
    /// `ShouldRateLimit` call gets.
    pub tracer: Option<Arc<Tracer>>,
}

/// The router for `--http-addr`.
pub fn router<S: Store>(admin: Arc<HttpState<S>>) -> Router {
    // A body over the limit is refused as soon as its Content-Length says so
    // (`JsonBody`), or its bytes go past it.
    let json = post(json_request::<S>).layer(DefaultBodyLimit::max(admin.max_request_bytes));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<S>))
        // envoyproxy/ratelimit's health check, which Envoy Gateway's probes call.
        .route("/healthcheck", get(healthcheck::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/json", json)
        .route("/debug/policies", get(policies::<S>))
        .route("/debug/top", get(top::<S>))
        .route("/debug/blocks", get(blocks::<S>))
        .route("/debug/signals", get(signals::<S>))
        .route("/debug/store", get(store::<S>))
        .route(
            crate::peers::PATH,
            post(peer_cut_off::<S>).layer(DefaultBodyLimit::max(crate::peers::MAX_BYTES)),
        )
        .with_state(admin)
}

/// The metrics of `admin` at `path` alone, for `--prometheus-addr`.
pub fn metrics_router<S: Store>(admin: Arc<HttpState<S>>, path: &str) -> Router {
    Router::new()
        .route(path, get(metrics::<S>))
        .with_state(admin)
}

/// Ready once policies are loaded and the servers listen, until SIGTERM: "this
/// replica can answer". Never the store's health: every replica shares the store,
/// so a store outage would take them all out of the endpoints at once, and Envoy's
/// own failure mode would answer instead of the domain's (`/debug/store` and the
/// metrics show the store).
fn is_ready<S: Store>(admin: &HttpState<S>) -> bool {
    admin.ready.load(Ordering::SeqCst) && admin.loaded.load(Ordering::SeqCst)
}

async fn readyz<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    if is_ready(&admin) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

/// `/readyz` as envoyproxy/ratelimit answers its `/healthcheck`: `OK`, or 500.
async fn healthcheck<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    if is_ready(&admin) {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// The gRPC and admin ports' connection counts, into the metrics.
fn connection_counts<S>(state: &HttpState<S>) {
    let metrics = &state.service.metrics;
    let open = |c: &sluice_grpc::Stats| c.open.load(std::sync::atomic::Ordering::Relaxed);
    let grpc = &state.connections;
    metrics.set_connections("grpc", open(grpc), &grpc.closed());
    if let Some(admin) = &state.admin_connections {
        // tonic drops the admin port's clients that stop answering PINGs unseen.
        let closed: Vec<_> = admin
            .closed()
            .into_iter()
            .filter(|(reason, _)| *reason != "keepalive_timeout")
            .collect();
        metrics.set_connections("admin", open(admin), &closed);
    }
}

async fn metrics<S: Store>(
    State(admin): State<Arc<HttpState<S>>>,
    request_headers: axum::http::HeaderMap,
) -> Response {
    let store = admin.service.limiter.store();
    admin
        .service
        .metrics
        .set_store_state(store.name(), store.active_keys(), &store.evictions());
    admin
        .service
        .metrics
        .local()
        .set(&admin.service.limiter.local().status(), &store.shards());
    connection_counts(&admin);
    // Scrapes also drop expired penalty records (the map is bounded regardless).
    let penalties = admin.service.limiter.penalties();
    penalties.sweep();
    admin
        .service
        .metrics
        .set_active_bans(admin.service.limiter.denied_keys());
    // OpenMetrics (with exemplars) to a scraper that asks for it (Prometheus does by
    // default) while tracing is on; otherwise the format every scraper reads.
    let openmetrics = admin.service.metrics.has_exemplars()
        && request_headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        return (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            admin.service.metrics.render_openmetrics(),
        )
            .into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        admin.service.metrics.render(),
    )
        .into_response()
}

/// The span of a `POST /json` call, the child of the trace context its headers
/// carry (`traceparent` or B3, as a gRPC call's): `None` when tracing is off, which
/// reads no header.
struct JsonCall(Option<Call>);

impl<S: Store> FromRequestParts<Arc<HttpState<S>>> for JsonCall {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<HttpState<S>>,
    ) -> Result<Self, Self::Rejection> {
        let call = state
            .tracer
            .as_ref()
            .map(|t| t.call(SHOULD_RATE_LIMIT_SPAN, &parts.headers));
        Ok(JsonCall(call))
    }
}

/// The connection a request came on, to mark it answering the request while the
/// request is held ([`crate::serve_http`] hands it to each request): `None` for a
/// router served some other way.
struct Connection(Option<Arc<Activity>>);

impl<S: Send + Sync> FromRequestParts<S> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let info = parts.extensions.get::<ConnectInfo<Answering>>();
        Ok(Connection(info.map(|ConnectInfo(Answering(a))| a.clone())))
    }
}

/// A `POST /json` body, or a peer's question. One whose Content-Length is over
/// `--max-request-bytes` is refused unread: hyper answers `Expect: 100-continue`
/// only once a body is read, and axum's `Bytes` would wait for bytes it then
/// refuses. One not whole within its bound is given up: a client sending a byte
/// now and then would hold its connection for ever.
enum JsonBody {
    Read(Bytes),
    TooLarge,
    TimedOut,
    Failed(BytesRejection),
}

impl<S: Store> FromRequest<Arc<HttpState<S>>> for JsonBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(
        request: axum::extract::Request,
        state: &Arc<HttpState<S>>,
    ) -> Result<Self, Self::Rejection> {
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > state.max_request_bytes as u64) {
            return Ok(JsonBody::TooLarge);
        }
        let read = Bytes::from_request(request, state);
        Ok(match tokio::time::timeout(state.body_timeout, read).await {
            Ok(Ok(body)) => JsonBody::Read(body),
            Ok(Err(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => JsonBody::TooLarge,
            Ok(Err(e)) => JsonBody::Failed(e),
            Err(_) => JsonBody::TimedOut,
        })
    }
}

async fn json_request<S: Store>(
    State(admin): State<Arc<HttpState<S>>>,
    JsonCall(call): JsonCall,
    Connection(connection): Connection,
    body: JsonBody,
) -> Response {
    // Read whole: from here its connection waits on Sluice (a leaky_bucket turn
    // may be seconds away), and its silence must not close it.
    let _answer = connection.as_ref().map(Activity::begin);
    let _in_flight = admin.service.enter();
    // Tracing off, or a call not sampled: decided as without tracing.
    let Some(mut call) = call.filter(Call::recording) else {
        return json_answer(&admin, body, None).await;
    };
    call.set("http.request.method", "POST");
    call.set("http.route", "/json");
    let answer = match call.trace_id() {
        // Log lines written meanwhile carry the trace id, as a gRPC call's do.
        Some(id) => {
            let log = tracing::info_span!("ShouldRateLimit", trace_id = %trace::hex(id));
            tracing::Instrument::instrument(json_answer(&admin, body, Some(&mut call)), log).await
        }
        None => json_answer(&admin, body, Some(&mut call)).await,
    };
    call.set(
        "http.response.status_code",
        i64::from(answer.status().as_u16()),
    );
    answer
}

/// An error answer, written on the call's span when it is traced: the server's
/// failure (5xx), or the refusal of a request (4xx).
fn json_error(status: StatusCode, error: String, call: Option<&mut Call>) -> Response {
    if let Some(call) = call {
        span::unanswered(call, status.is_server_error(), error.clone());
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// The answer to a body not whole in time, which closes its connection: the rest
/// of the body is not read, so it cannot serve another request.
fn body_timed_out<S>(admin: &HttpState<S>, call: Option<&mut Call>) -> Response {
    admin.service.metrics.body_timed_out();
    let error = format!(
        "request body not whole within {:?} (--handshake-timeout)",
        admin.body_timeout
    );
    let mut answer = json_error(StatusCode::REQUEST_TIMEOUT, error, call);
    let close = header::HeaderValue::from_static("close");
    answer.headers_mut().insert(header::CONNECTION, close);
    answer
}

/// Decides a `POST /json` body and writes its answer; the decision goes onto `call`.
async fn json_answer<S: Store>(
    admin: &HttpState<S>,
    body: JsonBody,
    mut call: Option<&mut Call>,
) -> Response {
    let body = match body {
        JsonBody::Read(b) => b,
        JsonBody::TooLarge => {
            admin.service.metrics.oversized_request();
            let error = format!(
                "request body larger than {} bytes (--max-request-bytes)",
                admin.max_request_bytes
            );
            return json_error(StatusCode::PAYLOAD_TOO_LARGE, error, call);
        }
        JsonBody::TimedOut => return body_timed_out(admin, call),
        JsonBody::Failed(e) => return json_error(e.status(), e.body_text(), call),
    };
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => {
            // A 400 like the service's own refusals, and counted as they are.
            admin.service.metrics.bad_request();
            return json_error(StatusCode::BAD_REQUEST, e.0, call);
        }
    };
    let req = Request::of(&req);
    let decided = match call.as_deref_mut() {
        None => admin.service.should_rate_limit(&req, None).await,
        Some(call) => {
            admin
                .service
                .should_rate_limit_traced(&req, None, call)
                .await
        }
    };
    match decided {
        Ok(outcome) => match outcome.error_answer() {
            Some(error) => json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("counter store failed: {error}"),
                call,
            ),
            None => {
                let status = if outcome.over_limit {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::OK
                };
                let echo = admin.service.echo_request.then_some(&req);
                let resp = response(&outcome, admin.service.headers, echo);
                (status, Json(render_response(&resp))).into_response()
            }
        },
        Err(e) => json_error(StatusCode::BAD_REQUEST, e.0, call),
    }
}

async fn policies<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    let policy = admin.service.limiter.policy();
    let mut domains: Vec<_> = policy.domains.values().collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    // Rule paths repeat across domains (each may have a `tenant`): name the domain.
    let mut domain_of = vec![""; policy.rules.len()];
    for (domain, first) in policy.rules_by_domain() {
        for id in first.limit_ids() {
            domain_of[id] = domain;
        }
    }
    let rules: Vec<_> = policy
        .rules
        .iter()
        .map(|r| {
            json!({
                "domain": domain_of[r.id],
                "path": r.path,
                "stat_key": r.stat_key,
                "name": r.name,
                "layer": r.layer.as_str(),
                "requests_per_unit": r.requests_per_unit,
                "algorithm": r.limit.map(|l| l.algorithm.as_str()),
                "window_seconds": r.limit.map(|l| l.window as f64 / 1e6),
                "unlimited": r.limit.is_none(),
                "shadow_mode": r.shadow_mode,
                "quota_mode": r.quota_mode,
            })
        })
        .collect();
    let status = admin.hub.status();
    // Each loaded document: where it came from, its domain's rules and its status.
    let mut policies: Vec<_> = policy
        .sources
        .iter()
        .map(|s| {
            let rules: Vec<&str> = policy
                .domain(&s.domain)
                .map(|d| {
                    rule_ids(d)
                        .into_iter()
                        .map(|r| policy.rule(r).path.as_str())
                        .collect()
                })
                .unwrap_or_default();
            json!({
                "source": s.source,
                "origin": crate::source::hub::origin(s),
                "form": if s.resource.is_some() { "RateLimitPolicy" } else { "envoy" },
                "resource": s.resource,
                "line": s.line,
                "domain": s.domain,
                "rules": rules,
                "status": source_status(s, &status),
            })
        })
        .collect();
    // RateLimitPolicies serving nothing (Conflicted, or Invalid with no last good
    // version here) are listed too, with why.
    for (key, outcome) in status.outcomes.iter() {
        if policy.sources.iter().any(|s| &s.source == key) {
            continue;
        }
        policies.push(json!({
            "source": key,
            "origin": "kubernetes",
            "form": "RateLimitPolicy",
            "resource": key,
            "line": null,
            "domain": outcome.domain,
            "rules": [],
            "status": verdict_status("refused", &outcome.verdict),
        }));
    }
    let refused: Vec<_> = status
        .refused
        .iter()
        .map(|(source, error)| json!({"source": source, "error": error}))
        .collect();
    Json(json!({
        "domains": domains.iter().map(|d| &d.name).collect::<Vec<_>>(),
        "sources": policy.sources.iter().map(|s| json!({"source": s.source, "domain": s.domain})).collect::<Vec<_>>(),
        "rules": rules,
        "policies": policies,
        "refused": refused,
    }))
    .into_response()
}

/// The status `/debug/policies` shows for one document of the serving policy:
/// `loaded`, or `last_good` when its source's latest change was refused (the
/// error says why) or its RateLimitPolicy is `Invalid` and its last good version
/// serves. A RateLimitPolicy also shows its `Accepted` condition's reason.
fn source_status(
    source: &crate::policy::SourceInfo,
    status: &crate::source::hub::Status,
) -> serde_json::Value {
    use crate::source::hub::{standing, Standing};
    match standing(source, status) {
        Standing::Loaded => json!({"state": "loaded"}),
        Standing::Refused(error) => json!({"state": "last_good", "error": error}),
        Standing::Verdict(verdict) => verdict_status("last_good", verdict),
    }
}

/// A RateLimitPolicy's status: `loaded` when accepted, else `unaccepted` (what its
/// document is doing: serving its last good version, or refused) with the reason and
/// message of its `Accepted` condition.
fn verdict_status(unaccepted: &str, verdict: &crate::source::hub::Acceptance) -> serde_json::Value {
    use crate::source::hub::Acceptance;
    match verdict {
        Acceptance::Accepted => json!({"state": "loaded", "accepted": true, "reason": "Accepted"}),
        Acceptance::Invalid(m) => {
            json!({"state": unaccepted, "accepted": false, "reason": "Invalid", "message": m})
        }
        Acceptance::Conflicted(m) => {
            json!({"state": unaccepted, "accepted": false, "reason": "Conflicted", "message": m})
        }
    }
}

/// Ids of every rule in a domain's tree, in id order.
fn rule_ids(domain: &crate::policy::Domain) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack = vec![&domain.root];
    while let Some(node) = stack.pop() {
        out.extend(node.rule);
        for level in node.children.values() {
            stack.extend(level.exact.values());
            stack.extend(level.wildcards.iter().map(|(_, n)| n));
            stack.extend(level.any.as_deref());
        }
    }
    out.sort_unstable();
    out
}

/// `/debug/signals`: per domain and rule, the signals of abuse read from the
/// traffic: machine-regular keys.
async fn signals<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    use crate::telemetry::signals::{regular, spike, subnet};
    let subnets = |all: &[subnet::Subnet]| {
        all.iter()
            .enumerate()
            .map(|(i, n)| json!({"rank": i + 1, "subnet": n.subnet, "denials": n.denials, "addresses": n.addresses}))
            .collect::<Vec<_>>()
    };
    let all = admin.service.metrics.signals();
    let spike_json = |s: &crate::telemetry::RuleSignals, d: &crate::telemetry::DenialSpike| {
        json!({
            "domain": s.domain,
            "rule": s.rule,
            "recent_denials": d.recent,
            "baseline_per_minute": d.baseline,
            "ratio": d.ratio,
        })
    };
    let spikes: Vec<serde_json::Value> = all
        .iter()
        .filter_map(|s| s.spike.filter(|d| d.is_spike()).map(|d| spike_json(s, &d)))
        .collect();
    let rules: Vec<serde_json::Value> = all
        .iter()
        .map(|s| {
            json!({
                "domain": s.domain,
                "rule": s.rule,
                "regular_keys": s.regular.iter().map(|r| json!({
                    "domain": s.domain,
                    "rule": s.rule,
                    "key": r.key,
                    "requests": r.requests,
                    "mean_interval_seconds": r.mean_interval,
                    "cv": r.cv,
                })).collect::<Vec<_>>(),
                "denial_spike": s.spike.map(|d| spike_json(s, &d)),
                "subnets_by_denials": subnets(&s.subnets.by_denials),
                "subnets_by_addresses": subnets(&s.subnets.by_addresses),
            })
        })
        .collect();
    Json(json!({
        "regular": {"intervals": regular::INTERVALS, "max_cv": regular::MAX_CV},
        "window_seconds": crate::telemetry::ratio::WINDOW_SECS,
        "spike": {
            "baseline_minutes": spike::BASELINE_MINUTES,
            "ratio": spike::SPIKE_RATIO,
            "min_denials": spike::MIN_DENIALS,
        },
        "denial_spikes": spikes,
        "rules": rules,
    }))
    .into_response()
}

/// `/debug/blocks`: every sentence in force (blocks, bans, tightenings), longest
/// first; `shared` when they come from a store every replica shares.
async fn blocks<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    use crate::telemetry::secs;
    let limiter = &admin.service.limiter;
    let list = limiter.sentences();
    Json(json!({
        "shared": limiter.store().shares_sentences(),
        "sentences": list.iter().map(|b| json!({
            "domain": b.info.domain,
            "rule": b.info.rule,
            "key": b.info.key,
            "counter": b.counter,
            "kind": b.kind.as_str(),
            "source": b.source.as_str(),
            "remaining_seconds": secs(b.remaining),
            "factor": f64::from(b.factor_ppm) / 1e6,
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `/debug/top`: per domain and rule, the deny ratio and the keys denied most over
/// the last minute, and the keys serving a penalty ban.
async fn top<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    use crate::telemetry::secs;
    let bans = admin.service.limiter.sentences();
    let mut rules: Vec<serde_json::Value> = Vec::new();
    let tops = admin.service.metrics.top_offenders();
    let mut seen = std::collections::HashSet::new();
    for t in &tops {
        seen.insert((t.domain.as_str(), t.rule.as_str()));
    }
    let ban_json = |b: &crate::limiter::penalty::ActiveBan| json!({"key": b.info.key, "remaining_seconds": secs(b.remaining)});
    for t in &tops {
        rules.push(json!({
            "domain": t.domain,
            "rule": t.rule,
            "decided": t.decided,
            "denied": t.denied,
            "deny_ratio": if t.decided > 0 { t.denied as f64 / t.decided as f64 } else { 0.0 },
            "spent": t.spent,
            "refunded": t.refunded,
            "top": t.top.iter().enumerate().map(|(i, (key, n))| json!({"rank": i + 1, "key": key, "denials": n})).collect::<Vec<_>>(),
            "banned": bans.iter().filter(|b| b.info.domain == t.domain && b.info.rule == t.rule).map(ban_json).collect::<Vec<_>>(),
        }));
    }
    // Bans of rules with no denial in the window (the ban outlasts it).
    let mut rest: std::collections::BTreeMap<(&str, &str), Vec<serde_json::Value>> =
        Default::default();
    for b in &bans {
        let at = (b.info.domain.as_str(), b.info.rule.as_str());
        if !seen.contains(&at) {
            rest.entry(at).or_default().push(ban_json(b));
        }
    }
    for ((domain, rule), banned) in rest {
        rules.push(json!({
            "domain": domain,
            "rule": rule,
            "decided": 0,
            "denied": 0,
            "deny_ratio": 0.0,
            "spent": 0,
            "refunded": 0,
            "top": [],
            "banned": banned,
        }));
    }
    Json(json!({
        "window_seconds": crate::telemetry::ratio::WINDOW_SECS,
        "rules": rules,
        "bans": bans.iter().map(|b| json!({
            "domain": b.info.domain,
            "rule": b.info.rule,
            "key": b.info.key,
            "remaining_seconds": secs(b.remaining),
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `POST /local-share/cut`: a peer is cut off from a shard. This replica probes the
/// shard now and, if it reaches it, holds the peer's share until the word lapses.
/// It asks for no more trust than `/debug/store`: what it does can only make this
/// replica admit less, for a couple of seconds, and only for a live peer.
async fn peer_cut_off<S: Store>(
    State(admin): State<Arc<HttpState<S>>>,
    body: JsonBody,
) -> Response {
    let bad =
        |error: String| (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response();
    let body = match body {
        JsonBody::Read(b) => b,
        JsonBody::TooLarge => {
            let error = format!("a question is at most {} bytes", crate::peers::MAX_BYTES);
            return json_error(StatusCode::PAYLOAD_TOO_LARGE, error, None);
        }
        JsonBody::TimedOut => return body_timed_out(&admin, None),
        JsonBody::Failed(e) => return json_error(e.status(), e.body_text(), None),
    };
    let question: crate::peers::Question = match serde_json::from_slice(&body) {
        Ok(q) => q,
        Err(e) => return bad(format!("expected {{\"replica\": ID, \"shard\": N}}: {e}")),
    };
    let limiter = &admin.service.limiter;
    let id = &question.replica;
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return bad("replica: 1 to 64 letters, digits, '-' or '_'".to_string());
    }
    if id == limiter.local().replica_id() {
        return bad("replica: that is this replica".to_string());
    }
    let store = limiter.store();
    let shards = store.shards().len();
    if !store.can_be_away() || shards == 0 {
        return bad("this replica's counters are in memory: it has no shard to reach".to_string());
    }
    if !store.probes_shards() {
        return bad(
            "this replica's store is a Redis Cluster: one probe cannot answer for its nodes"
                .to_string(),
        );
    }
    if question.shard >= shards {
        return bad(format!(
            "shard: {} is not a shard here (this replica has {shards})",
            question.shard
        ));
    }
    let reach = limiter.peer_cut_off(id, question.shard).await;
    Json(crate::peers::Reply {
        reached: reach.reached,
        reserved: reach.reserved,
    })
    .into_response()
}

/// `/debug/store`: per shard (or cluster), its state, latest error and back-off
/// deadline.
async fn store<S: Store>(State(admin): State<Arc<HttpState<S>>>) -> Response {
    let store = admin.service.limiter.store();
    let now = SystemTime::now();
    let statuses = store.shards();
    let shards: Vec<_> = statuses.iter().map(|s| shard(s, now)).collect();
    let local = admin.service.limiter.local().status();
    let shard_name = |i: usize| statuses.get(i).map_or("", |s| s.name.as_str());
    let us = |us: u64| us as f64 / 1e6;
    Json(json!({
        "store": store.name(),
        "shards": shards,
        "local": {
            "replica": admin.service.limiter.local().replica_id(),
            "replicas": local.replicas,
            "replicas_from": local.source.as_str(),
            "missing_replicas": local.missing,
            "decisions": local.decisions,
            "unsettled_counters": local.unsettled_counters,
            "max_counters": local.max_counters,
            "refused": local.refused,
            "counters": local.counters.iter().map(|c| json!({
                "key": c.key,
                "unsettled": c.unsettled,
            })).collect::<Vec<_>>(),
            "advertise": local.advertise,
            "peers": local.peers.iter().map(|p| json!({
                "replica": p.id,
                "address": p.address,
            })).collect::<Vec<_>>(),
            "cut_off": local.cut_off.iter().map(|c| json!({
                "shard": shard_name(c.shard),
                "standing": c.standing.as_str(),
                "seconds": us(c.for_us),
                "answered_in_seconds": c.answered_in.map(us),
                "reached_by": c.reached_by,
            })).collect::<Vec<_>>(),
            "withheld": local.withheld,
            "held": local.held.iter().map(|h| json!({
                "replica": h.id,
                "shards": h.shards.iter().map(|&s| shard_name(s)).collect::<Vec<_>>(),
                "remaining_seconds": us(h.left),
            })).collect::<Vec<_>>(),
        },
    }))
    .into_response()
}

fn shard(s: &ShardStatus, now: SystemTime) -> serde_json::Value {
    // Seconds from `a` to `b`, 0 if `b` is earlier (the wall clock may step).
    let between =
        |a: SystemTime, b: SystemTime| b.duration_since(a).map_or(0.0, |d| d.as_secs_f64());
    let mut v = json!({
        "name": s.name,
        "state": s.state.as_str(),
        "last_error": s.last_error.as_ref().map(|e| json!({
            "kind": e.kind.as_str(),
            "message": e.message,
            "at": rfc3339(e.at),
            "seconds_ago": between(e.at, now),
        })),
        "backoff_until": s.backoff_until.map(rfc3339),
        "backoff_remaining_seconds": s.backoff_until.map(|u| between(now, u)),
    });
    if !s.nodes.is_empty() {
        v["nodes"] = json!(s.nodes);
    }
    v
}
