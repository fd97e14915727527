#!/usr/bin/env bash
# Throughput and latency of sluice (memory store) beside a do-nothing server that
# always answers OK (the ceiling), same machine, same load generator, one run.
#   scripts/bench.sh [duration] [concurrency]
# Traffic stays on 127.0.0.1. Not part of scripts/test.sh (timing is not a test).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
concurrency=${2:-64}
cargo build --release --bins >/dev/null
bin=target/release
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$bin/sluice-bench" noop --addr 127.0.0.1:18081 2>/dev/null & pids+=($!)
"$bin/sluice" serve --config benches/policy.yaml --grpc-addr 127.0.0.1:18082 \
  --http-addr 127.0.0.1:18083 2>/dev/null & pids+=($!)
sleep 1

load() { "$bin/sluice-bench" load --duration "$duration" --concurrency "$concurrency" "$@"; }
echo "# $(date -u +%FT%TZ) $(nproc) cores, duration $duration, concurrency $concurrency"
for scenario in hot uniform layered; do
  load --addr 127.0.0.1:18081 --scenario "$scenario" --label "ceiling/$scenario"
  load --addr 127.0.0.1:18082 --scenario "$scenario" --label "sluice-memory/$scenario"
done
