#!/usr/bin/env bash
# End to end as in Envoy Gateway, with Sluice as its rate limit service:
#   curl -> Envoy 1.40 (the listener, rate limit filter, route descriptors and
#   `ratelimit_cluster` Envoy Gateway generates) -> Sluice started as `ratelimit` with
#   Envoy Gateway's environment -> limits over xDS from the test xDS server
#   (tools/test-xds: go-control-plane's snapshot cache over mTLS, as Envoy Gateway's).
#
#   tests/e2e/envoy-gateway.sh    (scripts/test.sh runs it)
#
# Checks: the header rule answers 429 with the x-ratelimit-* headers Envoy adds and no
# x-envoy-ratelimited; a tenant's own limit from request metadata (the descriptor
# `limit` override) applies to that tenant alone, others keep the rule's limit; a
# request cost (hits_addend) spends that many;
# /healthcheck answers as the probes expect; the Prometheus address has the series
# Envoy Gateway's dashboards read.
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Needs envoy, curl, openssl, python3 (yaml), go (for tools/test-xds); Redis when
# redis-server is there (else counters in memory). Prints PASS/FAIL per check and
# `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-eg-e2e.XXXXXX)
. tests/e2e/harness.sh
command -v openssl >/dev/null || die "openssl is not installed"
XDS=$(bash scripts/install-test-xds.sh) || die "could not build tools/test-xds"
mkdir -p "$W/bin" "$W/certs"
# Envoy Gateway runs /bin/ratelimit: Sluice under that name.
ln -s "$SLUICE" "$W/bin/ratelimit"

read -r P_UP P_GRPC P_HTTP P_PROM P_XDS P_CTL P_ENVOY P_ADMIN P_REDIS < <(free_ports 9)

# --- certificates, as Envoy Gateway's certgen makes them -----------------------------
# RSA 2048, PKCS#1 keys, no extended key usage; the Secret envoy-rate-limit's tls.crt
# has CN "*" and SAN *.envoy-gateway-system (and localhost here).
(
    cd "$W/certs" || exit 1
    gen() { openssl genrsa -traditional -out "$1.key" 2048; }
    leaf() {
        gen "$1"
        openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
        printf 'keyUsage=digitalSignature,dataEncipherment,keyEncipherment,nonRepudiation\nsubjectAltName=%s\n' "$3" >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
    }
    gen ca
    openssl req -x509 -new -key ca.key -subj "/CN=envoy-gateway" -days 2 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=keyEncipherment,digitalSignature,keyCertSign" -out ca.crt
    leaf envoy-gateway envoy-gateway "DNS:envoy-gateway,DNS:localhost"
    leaf tls '*' "DNS:*.envoy-gateway-system,DNS:localhost"
) >"$W/certs.log" 2>&1 || die "could not make certificates (see $W/certs.log)"

start_upstream "$P_UP"

# --- Envoy Gateway's xDS server, config and Envoy ------------------------------------
python3 tests/e2e/envoy-gateway-ratelimit.py "$W/ratelimit-config.yaml" "$W/envoy.yaml" \
    "$P_ENVOY" "$P_ADMIN" "$P_GRPC" "$P_UP" "$W/certs" 2>"$W/config.err" \
    || { cat "$W/config.err"; die "could not write Envoy Gateway's config"; }
"$XDS" -listen "127.0.0.1:$P_XDS" -control "127.0.0.1:$P_CTL" \
    -cert "$W/certs/envoy-gateway.crt" -key "$W/certs/envoy-gateway.key" -ca "$W/certs/ca.crt" \
    "$W/ratelimit-config.yaml" >"$W/xds.log" 2>&1 &
pids+=($!)
wait_for "xDS server" 10 grep -q listening "$W/xds.log" || die "the xDS server did not start"

REDIS_ENV=()
if command -v redis-server >/dev/null; then
    start_redis "$P_REDIS" || die "redis did not start"
    REDIS_ENV=(REDIS_SOCKET_TYPE=tcp "REDIS_URL=127.0.0.1:$P_REDIS")
fi

# Envoy Gateway's environment for the ratelimit container; addresses on loopback.
C=$W/certs
env -i PATH="$PATH" \
    RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_IGNOREDOTFILES=true RUNTIME_WATCH_ROOT=false \
    LOG_LEVEL=info USE_STATSD=false CONFIG_TYPE=GRPC_XDS_SOTW \
    CONFIG_GRPC_XDS_SERVER_URL="localhost:$P_XDS" CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit \
    GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT="$C/tls.crt" GRPC_SERVER_TLS_KEY="$C/tls.key" \
    GRPC_SERVER_TLS_CA_CERT="$C/ca.crt" CONFIG_GRPC_XDS_SERVER_USE_TLS=true \
    CONFIG_GRPC_XDS_CLIENT_TLS_CERT="$C/tls.crt" CONFIG_GRPC_XDS_CLIENT_TLS_KEY="$C/tls.key" \
    CONFIG_GRPC_XDS_SERVER_TLS_CACERT="$C/ca.crt" FORCE_START_WITHOUT_INITIAL_CONFIG=true \
    "${REDIS_ENV[@]}" USE_PROMETHEUS=true PROMETHEUS_ADDR="127.0.0.1:$P_PROM" \
    PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml \
    HOST=127.0.0.1 PORT="$P_HTTP" GRPC_HOST=127.0.0.1 GRPC_PORT="$P_GRPC" NO_COLOR=1 \
    "$W/bin/ratelimit" >"$W/sluice.log" 2>&1 &
pids+=($!)
if wait_for /healthcheck 20 curl -fsS "http://127.0.0.1:$P_HTTP/healthcheck" &&
    [ "$(curl -sS "http://127.0.0.1:$P_HTTP/healthcheck")" = OK ]; then
    ok "/healthcheck on the HTTP port answers OK (the probes' path)"
else
    tail -n 20 "$W/sluice.log"
    die "sluice as ratelimit did not become healthy"
fi
wait_for "the xDS version" 20 grep -q "xDS version accepted" "$W/sluice.log" || die "no xDS version accepted (see $W/sluice.log)"

start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" || die "envoy did not start"

# req NAME CURL_ARGS...: the status code; headers in $W/NAME.h
req() {
    local name=$1
    shift
    curl -sS -o /dev/null -D "$W/$name.h" -w '%{http_code}' "$@" "http://127.0.0.1:$P_ENVOY/"
}
header() { grep -i "^$2:" "$W/$1.h" | head -1 | cut -d' ' -f2- | tr -d '\r'; }

# --- checks --------------------------------------------------------------------------
codes=""
for i in 1 2 3 4; do codes+="$(req user$i -H 'x-user-id: one') "; done
if [ "$codes" = "200 200 200 429 " ] && [ -n "$(header user4 x-ratelimit-limit)" ] &&
    [ "$(header user4 x-ratelimit-remaining)" = 0 ] && [ -n "$(header user4 x-ratelimit-reset)" ] &&
    [ -z "$(header user4 x-envoy-ratelimited)" ]; then
    ok "header rule (3 a day): $codes, 429 with x-ratelimit-limit '$(header user4 x-ratelimit-limit)' and no x-envoy-ratelimited"
else
    bad "header rule: want '200 200 200 429' with x-ratelimit-* headers, got '$codes'"; cat "$W/user4.h"
fi

gold=""
for i in 1 2 3 4 5; do gold+="$(req gold$i -H 'x-tenant: acme' -H 'x-plan: gold') "; done
free=""
for i in 1 2 3; do free+="$(req free$i -H 'x-tenant: beta') "; done
if [ "$gold" = "200 200 200 200 429 " ] && [ "$free" = "200 200 429 " ] &&
    header gold1 x-ratelimit-limit | grep -q '^4'; then
    ok "per-tenant limit from metadata (limit override): gold tenant $gold(4 a day), other tenant $free(the rule's 2)"
else
    bad "per-tenant override: want gold '200 200 200 200 429' and other '200 200 429', got '$gold' / '$free'"
    cat "$W/gold1.h"
fi

heavy=""
for i in 1 2 3; do heavy+="$(req heavy$i -H 'x-heavy: yes') "; done
if [ "$heavy" = "200 200 429 " ] && [ "$(header heavy1 x-ratelimit-remaining)" = 2 ]; then
    ok "request cost (hits_addend 2) on a limit of 4 a day: $heavy, 2 left after the first"
else
    bad "request cost: want '200 200 429' with 2 remaining after the first, got '$heavy' / $(header heavy1 x-ratelimit-remaining)"
fi

handshakes=$(curl -fsS "http://127.0.0.1:$P_ADMIN/stats?filter=^cluster.ratelimit_cluster.ssl.handshake$" | awk '{print $2}')
plain_errors=$(curl -fsS "http://127.0.0.1:$P_ADMIN/stats?filter=^cluster.ratelimit_cluster.ssl.connection_error$" | awk '{print $2}')
if [ "${handshakes:-0}" -ge 1 ] 2>/dev/null && [ "${plain_errors:-0}" = 0 ]; then
    ok "ratelimit_cluster as Envoy Gateway generates it (TLS, client certificate): $handshakes TLS handshake(s) with sluice's GRPC_SERVER_USE_TLS port, no TLS errors"
else
    bad "ratelimit_cluster: want TLS handshakes and no TLS errors, got '${handshakes}' and '${plain_errors}'"
fi

metrics=$(curl -sS "http://127.0.0.1:$P_PROM/metrics")
route='httproute/default/backend/rule/0/match/0/*'
want="ratelimit_service_rate_limit_over_limit{domain=\"default/eg/http\",key1=\"${route}_${route}\",key2=\"rule-0-match-0_rule-0-match-0\"} 1"
if grep -qxF "$want" <<<"$metrics"; then
    ok "PROMETHEUS_ADDR has Envoy Gateway's dashboard series: $want"
else
    bad "no '$want' on the Prometheus address"; grep ratelimit_service <<<"$metrics" | head
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
