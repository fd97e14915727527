#!/usr/bin/env bash
# Traces end to end in a real Jaeger: curl -> Envoy (its OpenTelemetry tracer, every
# request sampled, spans over OTLP/gRPC to Jaeger) -> Sluice (the ratelimit filter's
# gRPC call carries Envoy's traceparent; Sluice exports its spans to the same Jaeger).
#
#   tests/e2e/tracing.sh          (scripts/test.sh runs it; needs scripts/install-jaeger.sh)
#
# Checks, through Jaeger's query API (/api/traces):
#   - over OTLP/HTTP, then over OTLP/gRPC: one trace holds Envoy's spans and Sluice's
#     ShouldRateLimit span, the child of Envoy's span of the rate-limit call, with
#     ratelimit.* attributes (domain, rule, algorithm, outcome, limit, remaining, hits)
#     matching the answer Envoy gave (a 429 on the third request)
#   - over OTLP/gRPC to an https:// receiver that requires a client certificate
#     (mutual TLS), the CA and Sluice's certificate given by OTEL_EXPORTER_OTLP_*
#     variables: the same trace
#   - with Redis as the store (a real redis-server): the decision span's child is the
#     store call, `EVALSHA decide` (kind client) with db.system.name=redis,
#     db.operation.name, db.stored_procedure.name, server.address and server.port
#     of the shard, inside the decision span's time
#   - no raw descriptor value in the trace: the user id sent in a header appears
#     nowhere in it, and Sluice's spans carry no client address
#   - the log line of a traced call carries its trace id
#   - the decision histogram's exemplar (OpenMetrics) names a trace Jaeger holds
#   - a collector that is down: calls are answered as fast as without tracing, the
#     lost spans are counted in sluice_trace_spans_total{result="failed"}
# Everything listens on 127.0.0.1 (free ports); every process started here is killed
# on exit. Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-trace-e2e.XXXXXX)
. tests/e2e/harness.sh
# prometheus_client's OpenMetrics parser checks the exposition with exemplars.
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
    log "pip install prometheus-client"
    python3 -m pip install -q prometheus-client >"$W/pip-prom.log" 2>&1 || tail -n 5 "$W/pip-prom.log"
fi
JAEGER=${JAEGER_BIN:-}
if [ -z "$JAEGER" ]; then
    JAEGER=$(bash scripts/install-jaeger.sh) || die "could not build Jaeger (scripts/install-jaeger.sh)"
fi
[ -x "$JAEGER" ] || die "no Jaeger binary at $JAEGER"

command -v redis-server >/dev/null || die "redis-server is not installed"
read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN P_OTLP_GRPC P_OTLP_HTTP P_QUERY P_QUERY_GRPC P_DOWN P_REDIS P_OTLP_TLS < <(free_ports 12)

# --- Certificates for the mutual-TLS receiver: a CA, Jaeger's (localhost) and Sluice's -----
(
    cd "$W" || exit 1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
        -out ca.crt -days 2 -subj /CN=collector-ca
    for who in jaeger sluice; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$who.key" \
            -out "$who.csr" -subj "/CN=$who"
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$who.ext"
        openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile "$who.ext" -out "$who.crt"
    done
) >"$W/certs.log" 2>&1 || { cat "$W/certs.log"; die "could not make the TLS certificates"; }

# --- Jaeger: OTLP in (gRPC and HTTP), traces in memory, the query API -----------------
cat >"$W/jaeger.yaml" <<EOF
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp, otlp/tls]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:$P_QUERY
    grpc:
      endpoint: 127.0.0.1:$P_QUERY_GRPC
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$P_OTLP_GRPC
      http:
        endpoint: 127.0.0.1:$P_OTLP_HTTP
  otlp/tls:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$P_OTLP_TLS
        tls:
          cert_file: $W/jaeger.crt
          key_file: $W/jaeger.key
          client_ca_file: $W/ca.crt
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
EOF
"$JAEGER" --config "$W/jaeger.yaml" >"$W/jaeger.log" 2>&1 &
pids+=($!)
QUERY="http://127.0.0.1:$P_QUERY"
wait_for "jaeger query API" 60 curl -fsS "$QUERY/api/services" || { tail -n 20 "$W/jaeger.log"; die "Jaeger did not start"; }
log "jaeger ready: OTLP grpc $P_OTLP_GRPC, http $P_OTLP_HTTP; query $QUERY"

# --- upstream, and the policy ----------------------------------------------------------
start_upstream "$P_UP"
mkdir -p "$W/policies"
cat >"$W/policies/trace.yaml" <<'EOF'
domain: trace-e2e
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: user_id
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window}
EOF

SLUICE_ARGS=()
SLUICE_WAIT=30
# traced_sluice LOGNAME ENV...: sluice with tracing set by the ENV assignments (and
# the flags in SLUICE_ARGS).
traced_sluice() {
    local name=$1
    shift
    SLUICE_ENV=("$@" "RUST_LOG=info,sluice::service=debug")
    start_sluice "$name" --config "$W/policies" "${SLUICE_ARGS[@]}"
}

# --- Envoy: every request traced, to Jaeger over OTLP/gRPC -----------------------------
{
    envoy_listener "$P_ADMIN" "$P_ENVOY"
    cat <<EOF
                generate_request_id: true
                tracing:
                  random_sampling: {value: 100}
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: {cluster_name: jaeger}
                        timeout: 1s
                      service_name: e2e-envoy
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      rate_limits:
                        - actions: [{remote_address: {}}]
                        - actions: [{request_headers: {header_name: x-user-id, descriptor_key: user_id}}]
                      routes:
                        - match: {prefix: "/"}
                          route: {cluster: upstream}
EOF
    envoy_ratelimit_filters trace-e2e false
    envoy_cluster sluice "$P_GRPC" grpc
    envoy_cluster jaeger "$P_OTLP_GRPC" grpc
    envoy_cluster upstream "$P_UP"
} >"$W/envoy.yaml"
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" || die "envoy did not become ready"
URL="http://127.0.0.1:$P_ENVOY"

# check_trace LABEL USER [REDIS_PORT]: three requests as USER (the third is over the
# limit), then the trace of the 429 in Jaeger, checked by tests/e2e/tracing-check.py
# (with the store call's span when Sluice counts on the Redis at REDIS_PORT).
check_trace() {
    local label=$1 user=$2 redis_port=${3:-} codes="" i
    for i in 1 2 3; do
        codes+="$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' -H "x-user-id: $user" "$URL/t/$label") "
    done
    if [ "$codes" != "200 200 429 " ]; then
        bad "$label: want '200 200 429' through Envoy, got '$codes'"
        return
    fi
    # Redis 7 has functions, which Sluice's decide calls then go by.
    local command=EVALSHA
    [ "$(redis-server --version | sed -n 's/.* v=\([0-9]*\).*/\1/p')" -ge 7 ] && command=FCALL
    python3 tests/e2e/tracing-check.py "$QUERY" "$label" "$user" "$W/sluice-$label.log" \
        "http://127.0.0.1:$P_HTTP/metrics" ${redis_port:+"$redis_port" "$command"} >"$W/$label.check" 2>&1
    while read -r line; do
        case $line in
            ok:*) ok "$label: ${line#ok: }" ;;
            *) bad "$label: $line" ;;
        esac
    done <"$W/$label.check"
}

# --- 1. OTLP/HTTP (the default protocol) ----------------------------------------------
traced_sluice sluice-otlp-http OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$P_OTLP_HTTP" \
    OTEL_SERVICE_NAME=sluice-e2e OTEL_BSP_SCHEDULE_DELAY=100 ||
    die "sluice (OTLP/HTTP) did not become ready"
check_trace otlp-http "alice-7731-secret"
stop_sluice

# --- 2. OTLP/gRPC -------------------------------------------------------------------------
traced_sluice sluice-otlp-grpc OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$P_OTLP_GRPC" \
    OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_SERVICE_NAME=sluice-e2e OTEL_BSP_SCHEDULE_DELAY=100 ||
    die "sluice (OTLP/gRPC) did not become ready"
check_trace otlp-grpc "bob-4410-secret"
stop_sluice

# --- 2b. OTLP/gRPC over mutual TLS --------------------------------------------------------
traced_sluice sluice-otlp-grpc-tls OTEL_EXPORTER_OTLP_ENDPOINT="https://localhost:$P_OTLP_TLS" \
    OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_CERTIFICATE="$W/ca.crt" \
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE="$W/sluice.crt" OTEL_EXPORTER_OTLP_CLIENT_KEY="$W/sluice.key" \
    OTEL_SERVICE_NAME=sluice-e2e OTEL_BSP_SCHEDULE_DELAY=100 ||
    die "sluice (OTLP/gRPC over TLS) did not become ready"
check_trace otlp-grpc-tls "erin-6620-secret"
stop_sluice

# --- 3. Redis as the store: the store call is a child span ------------------------------
start_redis "$P_REDIS" || die "redis-server did not start"
# `localhost`, not 127.0.0.1: the check below also finds no client address in
# Sluice's spans, and the shard's name is what server.address carries.
SLUICE_ARGS=(--redis "redis://localhost:$P_REDIS" --store-timeout 1s)
traced_sluice sluice-redis OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$P_OTLP_HTTP" \
    OTEL_SERVICE_NAME=sluice-e2e OTEL_BSP_SCHEDULE_DELAY=100 ||
    die "sluice (Redis) did not become ready"
check_trace redis "dave-5102-secret" "$P_REDIS"
stop_sluice
SLUICE_ARGS=()

# --- 4. a collector that is down --------------------------------------------------------
traced_sluice sluice-down OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$P_DOWN" \
    OTEL_TRACES_SAMPLER=always_on OTEL_BSP_SCHEDULE_DELAY=100 OTEL_EXPORTER_OTLP_TIMEOUT=500 ||
    die "sluice (collector down) did not become ready"
# Each user's first request: a 200 that Sluice decided (a fast error would pass too,
# as Envoy does not deny when the check fails, so Sluice's decisions are counted).
user_ok() {
    curl -fsS "http://127.0.0.1:$P_HTTP/metrics" |
        awk '/^sluice_requests_total\{.*outcome="ok",rule="user_id"\}/ { s += $NF } END { print s + 0 }'
}
decided=$(user_ok)
read -r slow failed < <(for i in $(seq 1 40); do
    curl -sS --max-time 10 -o /dev/null -w '%{http_code} %{time_total}\n' -H "x-user-id: carol-$i" "$URL/down"
done | awk '$2 > 0.5 { n++ } $1 != 200 { f++ } END { print n + 0, f + 0 }')
now=$(user_ok)
[ "$slow" = 0 ] && [ "$failed" = 0 ] && [ "$((now - decided))" = 40 ] &&
    ok "collector down: 40 requests through Envoy, each a 200 that sluice decided, none slower than 0.5 s" ||
    bad "collector down: of 40 requests $slow took over 0.5 s, $failed were not 200, sluice decided $decided -> $now"
FAILED_SPANS='sluice_trace_spans_total{result="failed"}'
if wait_for "failed spans counted" 20 at_least "$FAILED_SPANS" 1; then
    ok "collector down: lost spans counted, $FAILED_SPANS $(metric "$FAILED_SPANS")"
else
    bad "collector down: $FAILED_SPANS is '$(metric "$FAILED_SPANS")', want >= 1"
fi
if grep -q "trace export failed" "$W/sluice-down.log"; then
    ok "collector down: a warning in the log"
else
    bad "collector down: no 'trace export failed' warning in the log"
fi
stop_sluice

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
