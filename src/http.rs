//! The HTTP side: `/healthz`, `/readyz`, `/metrics`, `POST /json`, `/debug/*`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::service::json::{parse_request, render_response};
use crate::service::response::response;
use crate::service::Service;
use crate::store::Store;

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct Admin<S> {
    pub service: Arc<Service<S>>,
    /// False until policies are loaded and the servers listen; false again on SIGTERM.
    pub ready: Arc<AtomicBool>,
}

/// The router for `--http-addr`.
pub fn router<S: Store>(admin: Arc<Admin<S>>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/json", post(json_request::<S>))
        .route("/debug/policies", get(policies::<S>))
        .with_state(admin)
}

async fn readyz<S: Store>(State(admin): State<Arc<Admin<S>>>) -> Response {
    if admin.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics<S: Store>(State(admin): State<Arc<Admin<S>>>) -> Response {
    let store = admin.service.limiter.store();
    admin
        .service
        .metrics
        .set_store_state(store.name(), store.active_keys(), store.evictions());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        admin.service.metrics.render(),
    )
        .into_response()
}

async fn json_request<S: Store>(State(admin): State<Arc<Admin<S>>>, body: Bytes) -> Response {
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e.0}))).into_response(),
    };
    match admin.service.should_rate_limit(&req).await {
        Ok(outcome) => {
            let status = if outcome.over_limit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let resp = response(&outcome, admin.service.headers);
            (status, Json(render_response(&resp))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, Json(json!({"error": e.0}))).into_response(),
    }
}

async fn policies<S: Store>(State(admin): State<Arc<Admin<S>>>) -> Response {
    let policy = admin.service.limiter.policy();
    let mut domains: Vec<_> = policy.domains.values().collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    let rules: Vec<_> = policy
        .rules
        .iter()
        .map(|r| {
            json!({
                "path": r.path,
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
    Json(json!({
        "domains": domains.iter().map(|d| &d.name).collect::<Vec<_>>(),
        "sources": policy.sources.iter().map(|s| json!({"source": s.source, "domain": s.domain})).collect::<Vec<_>>(),
        "rules": rules,
    }))
    .into_response()
}
