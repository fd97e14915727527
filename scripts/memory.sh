#!/usr/bin/env bash
# Memory per active key, per algorithm, in both stores.
#   scripts/memory.sh [KEYS]
# 1. In memory: `sluice-bench memory` fills a MemoryStore with KEYS counters per
#    algorithm, each in a fresh process, and reports resident-set growth / KEYS.
# 2. In Redis: sluice --redis on a scratch redis-server (127.0.0.1:16391, no
#    persistence), benches/memory-policy.yaml (one rule per algorithm); for each
#    algorithm: FLUSHALL, then KEYS requests on KEYS distinct values (each counter
#    created once, by the algorithm's script), then used_memory growth / KEYS, the
#    number of Redis keys per counter and `MEMORY USAGE` of sample keys. Skipped with
#    a note while this build refuses --redis. sluice runs with --store-timeout 2s, so
#    that no counter is skipped by failing open on a slow answer.
# Knobs: MEMORY_KEYS (default 200000 for Redis, 1000000 in memory), MEMORY_HITS (1),
# MEMORY_SLUICE (another sluice binary for the Redis part).
# Not part of scripts/test.sh or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-${MEMORY_KEYS:-}}
hits=${MEMORY_HITS:-1}
algorithms="fixed_window sliding_window_counter sliding_window_log token_bucket leaky_bucket"

cargo build --profile dist --workspace --bins >&2
bin=target/dist
sluice=${MEMORY_SLUICE:-$bin/sluice}
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
out=$(mktemp -d)
scratch+=("$out")

echo "## In memory"
"$bin/sluice-bench" memory --keys "${keys:-1000000}" --hits "$hits"

echo
echo "## In Redis"
redis_keys=${keys:-200000}
if ! command -v redis-server >/dev/null; then
  echo "pending: redis-server not found (apt-get install redis-server)"
  exit 0
fi
port=16391
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$out" \
  --loglevel warning >"$out/redis.log" 2>&1 &
pids+=($!)
wait_port "$port" $! || { echo "redis-server did not start"; cat "$out/redis.log"; exit 1; }
cli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }

"$sluice" serve --config benches/memory-policy.yaml --grpc-addr 127.0.0.1:18093 \
  --http-addr 127.0.0.1:18094 --redis "redis://127.0.0.1:$port" --store-timeout 2s \
  >"$out/sluice.log" 2>&1 &
pid=$!
pids+=("$pid")
if ! wait_port 18093 "$pid"; then
  echo "pending: this build of sluice does not serve with --redis yet:"
  echo "  $(grep -v '^\s*$' "$out/sluice.log" | tail -1)"
  echo "  run scripts/memory.sh again once the Redis store is merged."
  exit 0
fi

used() { cli INFO memory | tr -d '\r' | sed -n 's/^used_memory://p'; }
printf '%-24s %10s %12s %14s %12s  %s\n' algorithm counters redis_keys bytes/counter \
  sample_usage "sample key"
for algorithm in $algorithms; do
  cli FLUSHALL >/dev/null
  before=$(used)
  for _ in $(seq 1 "$hits"); do
    "$bin/sluice-bench" load --addr 127.0.0.1:18093 --scenario uniform --sequential \
      --key "$algorithm" --keys "$redis_keys" --requests "$redis_keys" --warmup 0s \
      --duration 300s --concurrency 16 --json >"$out/load.json"
    errors=$(jq .errors "$out/load.json")
    [ "$errors" = 0 ] || echo "warning: $algorithm: $errors errors: $(jq -r .first_error "$out/load.json")"
  done
  after=$(used)
  dbsize=$(cli DBSIZE)
  # MEMORY USAGE of 20 random keys (SAMPLES 0: every element counted), averaged.
  total=0
  for _ in $(seq 1 20); do
    sample=$(cli RANDOMKEY)
    bytes=$(cli MEMORY USAGE "$sample" SAMPLES 0)
    total=$(( total + ${bytes:-0} ))
  done
  usage=$(( total / 20 ))
  printf '%-24s %10s %12s %14s %12s  %s\n' "$algorithm" "$redis_keys" "$dbsize" \
    "$(( (after - before) / redis_keys ))" "$usage" "$sample"
done
echo "# bytes/counter: growth of INFO used_memory / counters (keys, values, the dict"
echo "# and expiry entries); sample_usage: mean MEMORY USAGE of 20 random keys, the"
echo "# last of which is shown."
