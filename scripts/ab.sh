#!/usr/bin/env bash
# Before/after of two sluice builds on one Redis, interleaved so both see the same
# machine load:
#
#   scripts/ab.sh OLD_BINARY NEW_BINARY [SCENARIO] [ROUNDS] [DURATION]
#
# Starts one redis-server and both builds (`--redis`, benches/policy.yaml), then runs
# `sluice-bench load --scenario SCENARIO` (default hot) against old, new, old, new, ...
# for ROUNDS rounds (default 3) of DURATION (default 4s) each, and prints each run and
# the median req/s, p99 and CPU time per request of each build and of Redis (user +
# system time from /proc, which a busy machine disturbs far less than throughput).
# Set AB_STORE=memory to compare without Redis; AB_GEN_THREADS sets the generator's
# threads (1, as scripts/bench.sh), AB_CONCURRENCY its calls in flight (64), AB_SHARDS
# the redis-servers both builds shard over (1; Redis CPU is their sum; with
# AB_ONE_SERVER=1 the shards are databases of one redis-server). Traffic stays
# on 127.0.0.1. AB_WORKERS sets both builds' --worker-threads (scripts/bench.sh uses 1).
# AB_TLS=1 serves the shards over TLS only (rediss://, a CA of the run's own trusted
# through SSL_CERT_FILE).
# Each Redis run also prints, from the shards' INFO commandstats, the time Redis spent
# inside the decide script per request (wall time of the calls, so a descheduled
# redis-server inflates it) and script calls per request (how full calls were), and
# the decisions a build answered by its failure mode (store timeouts), when any.
# Not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

old=${1:?old binary}
new=${2:?new binary}
scenario=${3:-hot}
rounds=${4:-3}
duration=${5:-4s}
store=${AB_STORE:-redis}
cargo build --profile dist -p sluice-bench >&2

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

flags=()
redis=()
ports=()
if [ "$store" = redis ]; then
  urls=()
  for i in $(seq 0 $((${AB_SHARDS:-1} - 1))); do
    if [ -n "${AB_ONE_SERVER:-}" ]; then
      # Every shard on one redis-server (database i): the calls of N shards, the
      # cost of one process.
      if [ "$i" = 0 ]; then
        start_redis 26392
        ports+=(26392)
        redis+=("$started_pid")
      fi
      urls+=("redis://127.0.0.1:26392/$i")
      continue
    fi
    if [ -n "${AB_TLS:-}" ]; then
      if [ "$i" = 0 ]; then
        tls_dir=$(mktemp -d)
        tls_certs "$tls_dir" || { echo "ab: openssl could not make the certificates" >&2; exit 1; }
        export SSL_CERT_FILE=$tls_dir/ca.crt
      fi
      start_redis_tls $((26392 + i)) "$tls_dir"
      urls+=("rediss://127.0.0.1:$((26392 + i))")
      ports+=($((26392 + i)))
      redis+=("$started_pid")
      continue
    fi
    start_redis $((26392 + i))
    urls+=("redis://127.0.0.1:$((26392 + i))")
    ports+=($((26392 + i)))
    redis+=("$started_pid")
  done
  flags=(--redis "$(IFS=,; echo "${urls[*]}")")
fi
[ -n "${AB_WORKERS:-}" ] && flags+=(--worker-threads "$AB_WORKERS")
"$old" serve --config benches/policy.yaml --grpc-addr 127.0.0.1:18196 \
  --http-addr 127.0.0.1:18197 "${flags[@]}" >/dev/null 2>&1 &
pids+=($!)
declare -A pid
pid[old]=$!
"$new" serve --config benches/policy.yaml --grpc-addr 127.0.0.1:18198 \
  --http-addr 127.0.0.1:18199 "${flags[@]}" >/dev/null 2>&1 &
pids+=($!)
pid[new]=$!
hz=$(getconf CLK_TCK)
wait_port 18196
wait_port 18198

echo "# $(date -u +%FT%TZ) $store/$scenario, shards ${AB_SHARDS:-1}, workers ${AB_WORKERS:-default}, $rounds rounds of $duration, load $(cut -d' ' -f1 /proc/loadavg)"
# Script calls (FCALL, EVALSHA and EVAL) so far and the microseconds Redis spent inside
# them, summed over the shards.
calls() {
  local n=0 us=0 port c u
  for port in "${ports[@]}"; do
    read -r c u < <(redis-cli -p "$port" ${AB_TLS:+--tls --cacert "$SSL_CERT_FILE"} info commandstats | tr -d '\r' |
      awk -F'[=,:]' '/^cmdstat_(eval(sha)?|fcall):/ {c += $3; u += $5} END {print c + 0, u + 0}')
    n=$((n + c))
    us=$((us + u))
  done
  echo "$n $us"
}
# Decisions a build answered by its failure mode (store too slow or down) so far.
failed() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '/^sluice_requests_total/ && /outcome="failed_(open|closed)"/ { s += $NF } END { print s + 0 }'
}
declare -A rps p99 cpu rcpu
for r in $(seq 1 "$rounds"); do
  for t in old:18196 new:18198; do
    name=${t%%:*}
    before=$(ticks "${pid[$name]}")
    rbefore=$(ticks "${redis[@]}")
    read -r cbefore ubefore < <(calls)
    fbefore=$(failed $((${t##*:} + 1)))
    line=$(target/dist/sluice-bench load --addr "127.0.0.1:${t##*:}" --threads "${AB_GEN_THREADS:-1}" \
      --scenario "$scenario" --duration "$duration" --warmup 0s --concurrency "${AB_CONCURRENCY:-64}")
    used=$(($(ticks "${pid[$name]}") - before))
    rused=$(($(ticks "${redis[@]}") - rbefore))
    read -r cafter uafter < <(calls)
    fmode=$(($(failed $((${t##*:} + 1))) - fbefore))
    done_=$(awk '{for (i=1;i<=NF;i++) if ($i=="ok" || $i=="over") s += $(i+1)} END {print s}' <<<"$line")
    per=$(awk -v t="$used" -v hz="$hz" -v n="$done_" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    rper=$(awk -v t="$rused" -v hz="$hz" -v n="$done_" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    extra=
    [ "$store" = redis ] && extra=" redis ${rper}us/req$(awk -v c=$((cafter - cbefore)) \
      -v u=$((uafter - ubefore)) -v n="$done_" 'BEGIN {printf " (in scripts %.1fus) calls %.3f/req", u / n, c / n}')"
    [ "$fmode" -gt 0 ] && extra+=" failure-mode $fmode"
    echo "$name $line cpu ${per}us/req$extra"
    rps[$name]+="$(awk '{for (i=1;i<=NF;i++) if ($i=="req/s") print $(i-1)}' <<<"$line") "
    p99[$name]+="$(awk '{for (i=1;i<=NF;i++) if ($i=="p99") print $(i+1)}' <<<"$line") "
    cpu[$name]+="$per "
    rcpu[$name]+="$rper "
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for name in old new; do
  echo "median $name: $(median <<<"${rps[$name]}") req/s, p99 $(median <<<"${p99[$name]}") us," \
    "sluice CPU $(median <<<"${cpu[$name]}") us/request, redis CPU $(median <<<"${rcpu[$name]}") us/request"
done
