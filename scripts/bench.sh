#!/usr/bin/env bash
# One command for the whole comparison, same run, same machine, same load generator:
#   ceiling         sluice-bench noop: a server that answers OK and does nothing
#   sluice-memory   sluice, counters in memory
#   sluice-redis1   sluice --redis on 1 local redis-server     (skipped, with a note,
#   sluice-redis3   sluice --redis on 3 local redis-servers     when this build refuses --redis)
#   sluice-redis-tls sluice --redis rediss:// on 1 local TLS redis-server (not in the
#                   default set: BENCH_TARGETS="sluice-redis1 sluice-redis-tls")
#   sluice-cluster  sluice --redis-cluster on a 3-node local Redis Cluster (not run by
#                   default: BENCH_TARGETS=sluice-cluster)
#   reference       envoyproxy/ratelimit on 1 local redis-server (built by
#                   scripts/build-reference.sh from the Go module proxy; skipped without go)
# for each scenario (closed loop: hot, uniform, zipf, layered; fixed rate: attack), then
# prints one table: rps, p50, p99, ratios to the ceiling, and CPU time per request of
# the target, of its Redis and of the load generator.
#
# Not in the default set, Envoy's usage-based limits (docs/costs.md), each on one key as
# in hot: check (the call before a request, its descriptor's hits_addend 0, on a key
# a charge made first), charge (the call at stream end, a cost of 8, under the limit)
# and charge-over (a cost of 8 on `user`, limited to 100/s: spent past the limit and
# owed). Run them beside hot:
#   BENCH_SCENARIOS="hot check charge charge-over" scripts/bench.sh
#
#   scripts/bench.sh [DURATION] [CONCURRENCY]
#
# Knobs (environment): BENCH_DURATION (5s per run), BENCH_WARMUP (1s), BENCH_CONCURRENCY
# (64), BENCH_CONNECTIONS (4), BENCH_KEYS (100000), BENCH_ZIPF_S (1.1),
# BENCH_ATTACK_RATE (10000 req/s: 10 % on the attacker = 1000/s, 10x its 100/s limit),
# BENCH_WORKERS (sluice's and the ceiling's --worker-threads, 1 by default: on these
# 2 cores the generator and Redis need the other one, and one worker gave the ceiling
# +35 %, sluice +6-34 % and the reference nothing (GOMAXPROCS=1); 0 = one per CPU, as
# `sluice serve` defaults to), BENCH_GOMAXPROCS (the reference's GOMAXPROCS; Go's default, one per CPU,
# when unset), REDIS_HZ (every redis-server's hz, 100 as docs/redis.md recommends; 10 is Redis's
# default, with which uniform keys see some store timeouts), BENCH_SCENARIOS,
# BENCH_TARGETS (space-separated subsets), BENCH_SWEEP (concurrencies,
# e.g. "16 32 64 128 256 512": the Redis targets and the reference run again at each,
# and a second table compares throughput at equal or lower p99), BENCH_REFERENCE=0 (skip
# building the reference), BENCH_REFERENCE_VERSION, BENCH_OUT (results directory),
# BENCH_SLUICE (another sluice binary to measure, e.g. an older build),
# BENCH_SLUICE_FLAGS (more `serve` flags for every sluice target, split on spaces:
# e.g. "--failure-mode local" to measure that mode's healthy path), BENCH_CLIENT
# (the generator's client, `h2` by default, or `tonic`), BENCH_GEN_THREADS (the generator's runtime
# threads, 1 by default: on 2 shared cores one thread spends about a third less CPU per
# request than one per core, and is far from its limit at these rates; 0 = one per core),
# BENCH_ROUNDS (1: run every scenario and target this many times over, in turn; the
# report then takes each ratio within its round and prints the median over the rounds,
# against the ceiling and against the reference; needs jq).
# Defaults take about 3 minutes (25 runs of warm-up + duration).
#
# Traffic stays on 127.0.0.1. Not part of scripts/test.sh or CI (timing is not a test).
# Figures are only worth keeping from a quiet machine: the script prints the load
# average before and after; the generator shares the machine's cores with the target.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-${BENCH_DURATION:-5s}}
concurrency=${2:-${BENCH_CONCURRENCY:-64}}
warmup=${BENCH_WARMUP:-1s}
connections=${BENCH_CONNECTIONS:-4}
client=${BENCH_CLIENT:-}
gen_threads=${BENCH_GEN_THREADS:-1}
rounds=${BENCH_ROUNDS:-1}
workers=${BENCH_WORKERS:-1}
gomaxprocs=${BENCH_GOMAXPROCS:-}
keys=${BENCH_KEYS:-100000}
zipf_s=${BENCH_ZIPF_S:-1.1}
attack_rate=${BENCH_ATTACK_RATE:-10000}
scenarios=${BENCH_SCENARIOS:-hot uniform zipf layered attack}
targets=${BENCH_TARGETS:-ceiling sluice-memory sluice-redis1 sluice-redis3 reference}
out=${BENCH_OUT:-target/bench/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
results=$out/results.jsonl
: >"$results"
notes=()
note() { notes+=("$*"); echo "bench: $*" >&2; }

echo "bench: building the dist binaries (the shipped profile: fat LTO)" >&2
cargo build --profile dist --workspace --bins >&2
bin=target/dist
sluice=${BENCH_SLUICE:-$bin/sluice}
# shellcheck disable=SC2206 # split on purpose: several flags in one variable
sluice_flags=(${BENCH_SLUICE_FLAGS:-})

# shellcheck source=scripts/lib.sh
. scripts/lib.sh


wants() { [[ " $targets " == *" $1 "* ]]; }

# Refuses to measure whatever a previous run may have left listening on our ports.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in 18081 18082 18084 18086 18088 18089 18090 18091 18092 18094 16379 16380 16381 16382 \
  16383 16390 16391 16392; do
  if in_use "$port"; then
    echo "bench: 127.0.0.1:$port is already in use (a previous run?); stop it first" >&2
    exit 1
  fi
done
load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" 'BEGIN { exit !(l > 1.0) }'; then
  note "load average $load1 at start: figures from this run are not representative"
fi

declare -A addr metrics_at target_pid redis_pid
bench_redis() {
  local port=$1
  start_redis "$port" "$out/redis-$port.log" || { note "redis-server on $port did not start"; return 1; }
  redis_pid[$port]=$started_pid
}

# start_sluice NAME GRPC_PORT HTTP_PORT [serve flags...]
start_sluice() {
  local name=$1 grpc=$2 http=$3
  shift 3
  "$sluice" serve --config benches/policy.yaml --grpc-addr "127.0.0.1:$grpc" \
    --http-addr "127.0.0.1:$http" --worker-threads "$workers" "$@" "${sluice_flags[@]}" >"$out/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  if wait_port "$grpc" "$pid"; then
    addr[$name]=127.0.0.1:$grpc
    target_pid[$name]=$pid
    metrics_at[$name]=127.0.0.1:$http
  else
    note "$name skipped: $(grep -v '^\s*$' "$out/$name.log" | tail -1)"
  fi
}

if wants ceiling; then
  "$bin/sluice-bench" noop --addr 127.0.0.1:18081 --worker-threads "$workers" \
    >"$out/ceiling.log" 2>&1 &
  pids+=($!)
  wait_port 18081 $! && addr[ceiling]=127.0.0.1:18081 && target_pid[ceiling]=$!
fi
wants sluice-memory && start_sluice sluice-memory 18082 18083

need_redis=0
for t in sluice-redis1 sluice-redis3 sluice-redis-tls sluice-cluster reference; do
  wants "$t" && need_redis=1
done
if [ "$need_redis" = 1 ] && ! command -v redis-server >/dev/null; then
  note "redis-server not found: Redis targets skipped (apt-get install redis-server)"
  need_redis=0
fi
if [ "$need_redis" = 1 ]; then
  if wants sluice-redis1 || wants sluice-redis3; then
    bench_redis 16379 && bench_redis 16380 && bench_redis 16381
    wants sluice-redis1 && start_sluice sluice-redis1 18084 18085 \
      --redis redis://127.0.0.1:16379
    wants sluice-redis3 && start_sluice sluice-redis3 18086 18087 \
      --redis redis://127.0.0.1:16379,redis://127.0.0.1:16380,redis://127.0.0.1:16381
  fi
  if wants sluice-redis-tls; then
    # sluice trusts the run's own CA through SSL_CERT_FILE, as docs/command-line.md tells users
    # of a private CA.
    if ! tls_certs "$out/tls"; then
      note "sluice-redis-tls skipped: openssl could not make the certificates"
    elif start_redis_tls 16383 "$out/tls" "$out/redis-16383.log"; then
      redis_pid[16383]=$started_pid
      SSL_CERT_FILE=$out/tls/ca.crt start_sluice sluice-redis-tls 18092 18093 \
        --redis rediss://127.0.0.1:16383
    else
      note "sluice-redis-tls skipped: the TLS redis-server did not start"
    fi
  fi
  if wants sluice-cluster; then
    # Three masters, no replicas, every slot assigned; each node keeps its
    # nodes.conf in a directory of its own.
    cluster_ok=1
    for port in 16390 16391 16392; do
      dir=$(mktemp -d)
      scratch+=("$dir")
      start_redis "$port" "$out/redis-$port.log" --cluster-enabled yes \
        --cluster-config-file nodes.conf --dir "$dir" || cluster_ok=0
      redis_pid[$port]=$started_pid
    done
    if [ "$cluster_ok" = 1 ] && redis-cli --cluster create 127.0.0.1:16390 127.0.0.1:16391 \
      127.0.0.1:16392 --cluster-replicas 0 --cluster-yes >"$out/cluster-create.log" 2>&1; then
      for _ in $(seq 1 100); do
        ok=0
        for port in 16390 16391 16392; do
          redis-cli -p "$port" cluster info 2>/dev/null | grep -q cluster_state:ok && ok=$((ok + 1))
        done
        [ "$ok" = 3 ] && break
        sleep 0.1
      done
      start_sluice sluice-cluster 18094 18095 \
        --redis-cluster redis://127.0.0.1:16390,redis://127.0.0.1:16391,redis://127.0.0.1:16392
    else
      note "sluice-cluster skipped: the cluster did not start, see $out/cluster-create.log"
    fi
  fi
  if wants reference; then
    if [ "${BENCH_REFERENCE:-1}" = 0 ]; then
      note "reference skipped: BENCH_REFERENCE=0"
    elif ! ref=$(scripts/build-reference.sh 2>"$out/reference-build.log"); then
      note "reference skipped: build failed, see $out/reference-build.log"
    elif bench_redis 16382; then
      rt=$out/reference-runtime
      mkdir -p "$rt/ratelimit/config"
      cp benches/reference/config/bench.yaml "$rt/ratelimit/config/"
      # Stats go to a Prometheus endpoint, like sluice's /metrics: with USE_STATSD=false
      # alone the reference logs every timer sample to stdout, which would slow it.
      env ${gomaxprocs:+GOMAXPROCS=$gomaxprocs} RUNTIME_ROOT="$rt" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
        RUNTIME_IGNOREDOTFILES=true USE_STATSD=false LOG_LEVEL=warn \
        USE_PROMETHEUS=true PROMETHEUS_ADDR=127.0.0.1:18091 \
        REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:16382 \
        HOST=127.0.0.1 PORT=18089 GRPC_HOST=127.0.0.1 GRPC_PORT=18088 \
        DEBUG_HOST=127.0.0.1 DEBUG_PORT=18090 \
        "$ref" >"$out/reference.log" 2>&1 &
      pids+=($!)
      if wait_port 18088 $!; then
        addr[reference]=127.0.0.1:18088
        target_pid[reference]=$!
        echo "bench: reference: $(basename "$ref")" >&2
      else
        note "reference skipped: did not start, see $out/reference.log"
      fi
    fi
  fi
fi

sleep 1
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -sr), sluice $(git describe --always --dirty)" \
  "${BENCH_SLUICE:+(measuring $BENCH_SLUICE)}"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# per run: warm-up $warmup + $duration; rounds $rounds; closed loop: $connections connections," \
  "$concurrency in flight; keys $keys; zipf s $zipf_s; attack: $attack_rate req/s," \
  "10 % on one key limited to 100/s; redis hz ${REDIS_HZ:-100};" \
  "sluice and ceiling worker threads $workers (0: one per CPU); reference GOMAXPROCS ${gomaxprocs:-default}"
# Decisions a sluice target answered by its failure mode (store slow or unreachable)
# rather than by its counters, from its /metrics: a fast answer that skipped Redis must
# not pass for throughput.
failed_open() {
  local a=${metrics_at[$1]:-}
  if [ -z "$a" ] || ! command -v curl >/dev/null; then echo 0; return; fi
  curl -s "http://$a/metrics" |
    awk '/^sluice_requests_total/ && /outcome="failed_(open|closed)"/ { s += $NF } END { print s + 0 }'
}

hz=$(getconf CLK_TCK)
# The redis-server processes a target's counters live in.
redis_of() {
  case $1 in
    sluice-redis1) echo "${redis_pid[16379]:-}" ;;
    sluice-redis3) echo "${redis_pid[16379]:-} ${redis_pid[16380]:-} ${redis_pid[16381]:-}" ;;
    sluice-redis-tls) echo "${redis_pid[16383]:-}" ;;
    sluice-cluster) echo "${redis_pid[16390]:-} ${redis_pid[16391]:-} ${redis_pid[16392]:-}" ;;
    reference) echo "${redis_pid[16382]:-}" ;;
  esac
}

# run_one SCENARIO TARGET CONCURRENCY FILE [ROUND]: one load run, its JSON line
# (with "round" when given) appended to FILE.
run_one() {
  local scenario=$1 target=$2 conc=$3 into=$4 round=${5:-} before load_pid cpu0 rcpu0 cpu rcpu failed
  local gen=$scenario
  local -a args
  [ -n "${addr[$target]:-}" ] || return 0
  # charge-over is the generator's charge on a key far past its limit, reported under
  # its own name.
  [ "$scenario" = charge-over ] && gen=charge
  args=(--addr "${addr[$target]}" --target "$target" --scenario "$gen" --json
    --duration "$duration" --warmup "$warmup" --connections "$connections"
    --concurrency "$conc" --keys "$keys" --zipf-s "$zipf_s" --threads "$gen_threads")
  if [ -n "$client" ]; then args+=(--client "$client"); fi
  case $scenario in
    attack) args+=(--key user --rate "$attack_rate" --attack-share 0.1) ;;
    check | charge) args+=(--key api_key) ;;
    charge-over) args+=(--key user) ;;
  esac
  if [ "$scenario" = check ]; then
    # A check spends nothing, so keeps no counter: one charge makes the one it reads,
    # as the charges of earlier requests do in a real run.
    "$bin/sluice-bench" load --addr "${addr[$target]}" --scenario charge --key api_key \
      --requests 1 --warmup 0s --duration 1s --connections 1 --concurrency 1 >/dev/null ||
      note "$target/check: the charge that makes its counter failed"
  fi
  echo "bench: $target $scenario ($conc in flight)" >&2
  before=$(failed_open "$target")
  "$bin/sluice-bench" load "${args[@]}" >"$out/run.json" &
  load_pid=$!
  # CPU time of the target and of its Redis per measured request, sampled from the
  # end of the warm-up to the end of the run: a busy machine disturbs it far less
  # than throughput, and it is what a dedicated machine would spend per decision.
  sleep "$warmup"
  # shellcheck disable=SC2046 # redis_of lists pids, split on purpose
  cpu0=$(ticks "${target_pid[$target]:-}") rcpu0=$(ticks $(redis_of "$target"))
  if wait "$load_pid"; then
    # shellcheck disable=SC2046
    cpu=$(($(ticks "${target_pid[$target]:-}") - cpu0)) rcpu=$(($(ticks $(redis_of "$target")) - rcpu0))
    if command -v jq >/dev/null; then
      jq -c --argjson c "$cpu" --argjson r "$rcpu" --argjson hz "$hz" \
        '(.requests // 0) as $n | if $n > 0 then . + {cpu_us: ($c / $hz * 1e6 / $n),
          redis_cpu_us: ($r / $hz * 1e6 / $n)} else . end' "$out/run.json" >"$out/run2.json"
      mv "$out/run2.json" "$out/run.json"
    fi
    if [ "$gen" != "$scenario" ] && command -v jq >/dev/null; then
      jq -c --arg s "$scenario" '. + {scenario: $s}' "$out/run.json" >"$out/run2.json"
      mv "$out/run2.json" "$out/run.json"
    fi
    if [ -n "$round" ] && command -v jq >/dev/null; then
      jq -c --argjson n "$round" '. + {round: $n}' "$out/run.json" >"$out/run2.json"
      mv "$out/run2.json" "$out/run.json"
    fi
    failed=$(( $(failed_open "$target") - before ))
    if [ "$failed" -gt 0 ] && command -v jq >/dev/null; then
      jq -c --argjson f "$failed" '. + {failed_open: $f}' "$out/run.json" >>"$into"
    else
      cat "$out/run.json" >>"$into"
    fi
    if [ "$failed" -gt 0 ]; then
      note "$target/$scenario: $failed decisions by failure mode (store too slow)"
    fi
  else
    note "$target/$scenario: load generator failed"
  fi
}

# Rounds: the whole set again, so each ratio is also taken within each round and the
# report adds the median over the rounds.
for r in $(seq 1 "$rounds"); do
  [ "$rounds" -gt 1 ] && echo "bench: round $r of $rounds" >&2
  for scenario in $scenarios; do
    for target in $targets; do
      run_one "$scenario" "$target" "$concurrency" "$results" "$([ "$rounds" -gt 1 ] && echo "$r")"
    done
  done
done

# Equal or lower p99 (BENCH_SWEEP): the Redis targets and the reference again at each
# of these concurrencies, targets interleaved; the report sets each reference point
# beside the most each sluice target did at a p99 no higher.
sweep=${BENCH_SWEEP:-}
if [ -n "$sweep" ]; then
  : >"$out/sweep.jsonl"
  for scenario in $scenarios; do
    [ "$scenario" = attack ] && continue
    for c in $sweep; do
      for target in sluice-redis1 sluice-redis3 reference; do
        if wants "$target"; then run_one "$scenario" "$target" "$c" "$out/sweep.jsonl"; fi
      done
    done
  done
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin/sluice-bench" report "$results" | tee "$out/table.txt"
if [ -n "$sweep" ]; then
  echo "# equal or lower p99: $sweep in flight"
  "$bin/sluice-bench" report --against reference "$out/sweep.jsonl" | tee "$out/matched.txt"
fi
for n in "${notes[@]}"; do echo "# note: $n"; done
echo "# results: $results"
