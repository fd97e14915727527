#!/usr/bin/env bash
# The load generator's two HTTP/2 clients side by side (`--client tonic` and the
# default `--client h2`): req/s, the generator's CPU per request and the target's CPU
# per request, against the ceiling (sluice-bench noop) and sluice with its memory
# store, scenarios hot and layered, runs interleaved.
#
#   scripts/client-cost.sh [DURATION] [RUNS]       (defaults 5s, 3)
#
# Prints one line per run: target scenario client rps generator_cpu_us target_cpu_us.
# Traffic stays on 127.0.0.1 (ports 28201-28204, or CLIENT_COST_PORT..+3).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

duration=${1:-5s}
runs=${2:-3}
port=${CLIENT_COST_PORT:-28201}
bench=target/dist/sluice-bench
secs=${duration%s}

# run TARGET_PID NAME SCENARIO CLIENT: one load run; the target's CPU is sampled over
# the measured span only (after the 1 s warm-up).
run() {
  local pid=$1 name=$2 scenario=$3 client=$4 out t0 t1
  out=$(mktemp)
  "$bench" load --addr "127.0.0.1:$port" --scenario "$scenario" --client "$client" \
    --warmup 1s --duration "$duration" --json >"$out" &
  sleep 1
  t0=$(ticks "$pid")
  sleep "$secs"
  t1=$(ticks "$pid")
  wait $!
  python3 - "$out" "$name" "$scenario" "$client" $((t1 - t0)) "$secs" <<'PY'
import json, sys
out, name, scenario, client, ticks, secs = sys.argv[1:]
r = json.load(open(out))
target_us = int(ticks) * 1e4 / (r["rps"] * float(secs))
print(f"{name:<7} {scenario:<8} {client:<6} {r['rps']:>8.0f} req/s  "
      f"generator {r['generator_cpu_us']:5.2f} us/req  target {target_us:5.2f} us/req  "
      f"errors {r['errors']}")
PY
  rm -f "$out"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for target in ceiling sluice; do
  if [ "$target" = ceiling ]; then
    "$bench" noop --addr "127.0.0.1:$port" 2>/dev/null &
  else
    target/dist/sluice serve --config benches/policy.yaml \
      --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$((port + 1))" 2>/dev/null &
  fi
  pid=$!
  pids+=("$pid")
  wait_port "$port" "$pid"
  for scenario in hot layered; do
    for _ in $(seq 1 "$runs"); do
      for client in tonic h2; do
        run "$pid" "$target" "$scenario" "$client"
      done
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  port=$((port + 2))
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
