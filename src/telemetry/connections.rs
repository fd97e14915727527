//! The ports' connections and certificates: how many connections the gRPC and
//! admin ports have open, why sluice closed some, and how each port's TLS reloads
//! went.

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::{counter_vec, int_counter, int_gauge_vec, registered};

#[derive(Debug)]
pub(super) struct ConnectionStats {
    pub(super) tls_reloads: IntCounterVec,
    pub(super) tls_expiry: IntGaugeVec,
    pub(super) tls_refused: IntGaugeVec,
    pub(super) grpc_connections: IntGaugeVec,
    pub(super) grpc_closed: IntCounterVec,
    pub(super) http_refused: IntCounter,
    pub(super) http_timed_out: IntCounter,
}

impl ConnectionStats {
    pub(super) fn new(registry: &Registry) -> ConnectionStats {
        let tls_reloads = registered(
            registry,
            counter_vec(
                "sluice_tls_reloads_total",
                "TLS certificate reloads by port (grpc, http, admin) and result (ok, error: the last good certificate kept serving).",
                &["port", "result"],
            ),
        );
        let tls_expiry = registered(
            registry,
            int_gauge_vec(
                "sluice_tls_certificate_expiry_timestamp_seconds",
                "When the certificate a TLS port (grpc, http, admin) serves expires (its notAfter), in seconds since the Unix epoch.",
                &["port"],
            ),
        );
        let tls_refused = registered(
            registry,
            int_gauge_vec(
                "sluice_tls_refused",
                "1 while the last change of a TLS port's (grpc, http, admin) files was refused and the last good certificate serves on; 0 once a change loads.",
                &["port"],
            ),
        );
        let grpc_connections = registered(
            registry,
            int_gauge_vec(
                "sluice_grpc_connections",
                "Connections open on a gRPC port: grpc (the rate limit services), admin (--admin-addr).",
                &["port"],
            ),
        );
        let grpc_closed = registered(
            registry,
            counter_vec(
                "sluice_grpc_connections_closed_total",
                "Connections sluice closed on a gRPC port (grpc, admin): refused (--grpc-max-connections, --admin-max-connections), handshake_failed, handshake_timeout, keepalive_timeout (grpc only: a PING went unanswered), idle (--grpc-idle-timeout).",
                &["port", "reason"],
            ),
        );
        let http_refused = registered(
            registry,
            int_counter(
                "sluice_http_connections_refused_total",
                "Connections to an HTTP port (--http-addr, --prometheus-addr) closed as soon as accepted: --http-max-connections were open.",
            ),
        );
        let http_closed = registered(
            registry,
            counter_vec(
                "sluice_http_connections_closed_total",
                "Connections sluice closed on an HTTP port (--http-addr, --prometheus-addr): request_timeout (a request head, or a POST /json or /local-share/cut body, not whole within --handshake-timeout; answered 408).",
                &["reason"],
            ),
        );
        let http_timed_out = http_closed.with_label_values(&["request_timeout"]);
        ConnectionStats {
            tls_reloads,
            tls_expiry,
            tls_refused,
            grpc_connections,
            grpc_closed,
            http_refused,
            http_timed_out,
        }
    }
}
