#!/usr/bin/env bash
# CPU profile of sluice under load, as a flamegraph (SVG) and a flat perf report.
#
#   scripts/profile.sh [memory|redis] [SCENARIO] [OUT_PREFIX]
#
# Starts sluice (in memory, or on one local redis-server), drives it with
# `sluice-bench load --scenario SCENARIO` (default hot) for 12 s, samples sluice with
# `perf record --call-graph dwarf` for 5 s of it, and writes OUT_PREFIX.svg (needs
# `inferno-flamegraph`: `cargo install inferno`) and OUT_PREFIX.txt (top symbols,
# self time). PROFILE_FLAGS adds sluice flags (e.g. "--worker-threads 1"); PROFILE_KEEP=1
# keeps the folded stacks (OUT_PREFIX.folded) for other cuts of the samples. Needs perf and kernel.perf_event_paranoid <= 2. Traffic stays on
# 127.0.0.1. Not part of scripts/test.sh (a profile is not a test).
set -euo pipefail
cd "$(dirname "$0")/.."

store=${1:-redis}
scenario=${2:-hot}
prefix=${3:-target/profile/$store-$scenario}
mkdir -p "$(dirname "$prefix")"
command -v perf >/dev/null || { echo "profile: perf not found" >&2; exit 1; }

cargo build --profile dist --workspace --bins >&2
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

flags=()
if [ "$store" = redis ]; then
  start_redis 26391
  flags=(--redis redis://127.0.0.1:26391)
fi
target/dist/sluice serve --config benches/policy.yaml --grpc-addr 127.0.0.1:18194 \
  --http-addr 127.0.0.1:18195 "${flags[@]}" ${PROFILE_FLAGS:-} >"${TMPDIR:-/tmp}/sluice-profile.log" 2>&1 &
sluice_pid=$!
pids+=("$sluice_pid")
wait_port 18194

target/dist/sluice-bench load --addr 127.0.0.1:18194 --scenario "$scenario" \
  --duration 10s --warmup 2s >"$prefix.load.txt" &
pids+=($!)
sleep 4
perf record -F 499 --call-graph dwarf,8192 -p "$sluice_pid" -o "$prefix.perf.data" \
  -- sleep 5 >/dev/null 2>&1
perf report -i "$prefix.perf.data" --no-children -g none --sort symbol --stdio 2>/dev/null |
  grep -E '^ +[0-9.]+%' | awk '{$1 = $1; sub(/ - -$/, ""); print}' | head -60 >"$prefix.txt" || true
if command -v inferno-collapse-perf >/dev/null; then
  perf script -i "$prefix.perf.data" 2>/dev/null | inferno-collapse-perf >"$prefix.folded"
  inferno-flamegraph --minwidth 0.2 --title "sluice $store $scenario" <"$prefix.folded" \
    >"$prefix.svg"
  # Where the time goes: each sample goes to the innermost frame of a known layer.
  awk '{
    n = $NF; total += n; line = $0; sub(/ [0-9]+$/, "", line); m = split(line, f, ";")
    c = "other (kernel, libc, allocator below no known frame)"
    for (i = m; i >= 1; i--) {
      s = f[i]
      if (s ~ /^redis::|combine::/) { c = "redis-rs client"; break }
      if (s ~ /sluice_grpc::/) { c = "gRPC: h2, hyper, tonic, prost"; break }
      if (s ~ /sluice::store::redis|sluice_redis::/) { c = "sluice Redis store"; break }
      if (s ~ /sluice::store/) { c = "sluice memory store"; break }
      if (s ~ /sluice::telemetry/) { c = "sluice metrics"; break }
      if (s ~ /sluice::/) { c = "sluice limiter, policy, service"; break }
      if (s ~ /^<?(h2|hyper|hyper_util|tonic|prost|tower|envoy_types)::/) { c = "gRPC: h2, hyper, tonic, prost"; break }
      if (s ~ /^<?tokio::runtime::time/) { c = "Tokio timers"; break }
      if (s ~ /^<?tokio::(runtime|sync)|futures_channel/) { c = "Tokio scheduler, wake-ups, channels"; break }
    }
    cat[c] += n
  } END { for (c in cat) printf "%5.1f%%  %s\n", 100 * cat[c] / total, c }' "$prefix.folded" |
    sort -rn >"$prefix.summary.txt"
  [ -n "${PROFILE_KEEP:-}" ] || rm -f "$prefix.folded"
  echo "profile: $prefix.svg, $prefix.summary.txt" >&2
fi
rm -f "$prefix.perf.data"

wait "${pids[-1]}" || true
cat "$prefix.load.txt" >&2
echo "profile: $prefix.txt" >&2
