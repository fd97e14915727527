#!/usr/bin/env bash
# Redis CPU per decide-script call, for the working tree and/or git revisions:
#
#   scripts/lua-cost.sh [REV ...]        (REV "." = working tree, a directory = its
#                                         *.lua files; default "."; "fcall:REV" = REV
#                                         loaded as a function library, as scripts.rs
#                                         builds it, and called by FCALL)
#
# Starts a private redis-server on a free loopback port (PORT to choose one), loads
# each revision's decide script (common.lua + algorithms.lua + decide.lua, as
# scripts.rs concatenates them), and for each case runs N (default 50000) EVALSHA
# calls with redis-benchmark (-P 16 -c 2) while `perf stat -e task-clock` (or, without
# perf, /proc CPU ticks) counts redis-server's CPU time. CPU time, not throughput, so
# a busy machine disturbs it little. ROUNDS (default 3) rounds, revisions interleaved
# within each round; prints the median µs per call. Not part of scripts/test.sh.
#
# Cases (ARGV as scripts.rs sends them; 10^9 requests per 1 s window, burst 10^9, so
# every call admits and writes, except sc-deny): one hit of each algorithm with the
# server clock, sl with a fixed now (so the log stays one entry instead of growing by
# one per call), three sc hits on three keys, and one denied sc hit (requests 0:
# nothing written). The *-full cases decide one hot key at its limit (1,000 per minute,
# server clock, filled by 1,000 calls first, so a log holds 1,000 entries): one
# request per call, or 16 coalesced in one call (x16), every one denied. check-x16
# is 16 checks (cost 0) of one hot sc key coalesced in one call, the key made first.
set -euo pipefail
cd "$(dirname "$0")/.."

revs=("$@")
[ ${#revs[@]} -eq 0 ] && revs=(.)
n=${N:-50000}
rounds=${ROUNDS:-3}

port=${PORT:-}
if [ -z "$port" ]; then
  for p in $(seq 26900 26990); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
  done
fi
[ -n "$port" ] || { echo "lua-cost: no free port" >&2; exit 1; }

redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --loglevel warning >/dev/null 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null || true; wait $rpid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
cli() { redis-cli -p "$port" "$@"; }

# A revision from before the scripts moved to lua/ has them one level up.
lua_of() {
  if [ "$1" = . ]; then cat "src/store/redis/lua/$2.lua"
  elif [ -d "$1" ]; then cat "$1/$2.lua"
  else git show "$1:src/store/redis/lua/$2.lua" 2>/dev/null || git show "$1:src/store/redis/$2.lua"; fi
}
source_of() {
  local f
  for f in common algorithms decide; do lua_of "${1#fcall:}" $f; done
}
# The library of scripts.rs's `Library::of_decide`, under a name of this run's.
library_of() {
  echo "#!lua name=$2"
  lua_of "$1" common
  lua_of "$1" algorithms
  echo "local function decide(KEYS, ARGV)"
  lua_of "$1" decide
  echo "end"
  echo "redis.register_function('$2', decide)"
}
declare -A sha layout by
i=0
for r in "${revs[@]}"; do
  i=$((i + 1))
  layout[$r]=hits
  if source_of "$r" | grep -q 'distinct limits'; then layout[$r]=limits; fi
  case $r in
    fcall:*)
      by[$r]=FCALL
      sha[$r]=$(cli FUNCTION LOAD REPLACE "$(library_of "${r#fcall:}" "lua_cost_$i")") ;;
    *)
      by[$r]=EVALSHA
      sha[$r]=$(cli SCRIPT LOAD "$(source_of "$r")") ;;
  esac
done

# Arguments in the layout of each revision's decide.lua: limits once per call (since
# the per-call limit table), or all six values per hit (before).
limit() { echo "$1" 1000000000 1000000 1000000000 e; }
hit() { echo "$1" 1000000000 1000000 1000000000 1 e; }
times() { local i; for i in $(seq 1 "$1"); do echo -n "$2 "; done; }
# Coalesced calls as the store sends them under load: u10, ten requests of one sc hit
# on random keys (uniform); l10, ten layered requests (fw on a random key, tb on one
# hot key, sc on a random key). Random keys are redis-benchmark's __rand_int__ (-r).
# l1 is one such layered request alone, fw3 three fw hits on three keys. CASES (a
# space-separated list) runs only those cases.
cases=(fw sc tb lb sl sc3 fw3 sc-deny u10 l1 l10 fw-full sl-full fw-full-x16 sl-full-x16 check-x16)
if [ -n "${CASES:-}" ]; then read -ra cases <<<"$CASES"; fi
full() { echo "$1" 1000 60000000 1000 e; }
args_of() {
  if [ "$2" = limits ]; then
    case $1 in
      fw | sc | tb) echo "1 k1 '' 1 $(limit "$1") 1 1" ;;
      # A leaky_bucket hit carries its caller's longest wait: -1, none.
      lb) echo "1 k1 '' 1 $(limit lb) 1 1 -1" ;;
      sl) echo "1 k1 1700000000000000 1 $(limit sl) 1 1" ;;
      sc3) echo "3 k1 k2 k3 '' 1 $(limit sc) 3 1 1 1" ;;
      fw3) echo "3 k1 k2 k3 '' 1 $(limit fw) 3 1 1 1" ;;
      l1) echo "3 a:__rand_int__ hot t:__rand_int__ '' 3 $(limit fw) $(limit tb) $(limit sc) 3 1 2 3" ;;
      sc-deny) echo "1 k1 '' 1 sc 0 1000000 0 e 1 1" ;;
      u10) echo "10 $(times 10 'u:__rand_int__') '' 1 $(limit sc) $(times 10 '1 1')" ;;
      l10) echo "30 $(times 10 'a:__rand_int__ hot t:__rand_int__') '' 3 $(limit fw) $(limit tb) $(limit sc) $(times 10 '3 1 2 3')" ;;
      fw-full | sl-full) echo "1 hot '' 1 $(full "${1%-full}") 1 1" ;;
      fw-full-x16 | sl-full-x16) echo "16 $(times 16 hot) '' 1 $(full "${1%-full-x16}") $(times 16 '1 1')" ;;
      check-x16) echo "16 $(times 16 hot) '' 1 $(limit sc) $(times 16 '1 -1 0')" ;;
      check-fill) echo "1 hot '' 1 $(limit sc) 1 1" ;;
    esac
    return
  fi
  case $1 in
    fw | sc | tb | lb) echo "1 k1 '' 0 $(hit "$1")" ;;
    sl) echo "1 k1 1700000000000000 0 $(hit sl)" ;;
    sc3) echo "3 k1 k2 k3 '' 0 $(hit sc) $(hit sc) $(hit sc)" ;;
    fw3) echo "3 k1 k2 k3 '' 0 $(hit fw) $(hit fw) $(hit fw)" ;;
    l1) echo "3 a:__rand_int__ hot t:__rand_int__ '' g 3 0 $(hit fw) $(hit tb) $(hit sc)" ;;
    sc-deny) echo "1 k1 '' 0 sc 0 1000000 0 1 e" ;;
    u10) echo "10 $(times 10 'u:__rand_int__') '' g $(times 10 "1 0 $(hit sc)")" ;;
    l10) echo "30 $(times 10 'a:__rand_int__ hot t:__rand_int__') '' g $(times 10 "3 0 $(hit fw) $(hit tb) $(hit sc)")" ;;
    *full* | check*) echo "lua-cost: $1 needs a revision with the per-call limit table" >&2; exit 1 ;;
  esac
}

# µs of redis-server CPU per call of script $1 with args $2; with $3, first 1,000
# calls with those args, one at a time (so each at a time of its own). $call is
# EVALSHA, or FCALL for a function. FLUSHALL keeps the functions.
measure() {
  local a f
  eval "a=($2)"
  cli FLUSHALL >/dev/null
  if cli "$call" "$1" "${a[@]}" | grep -q ERR; then
    echo "lua-cost: $(cli "$call" "$1" "${a[@]}")" >&2
    exit 1
  fi
  if [ -n "${3:-}" ]; then
    eval "f=($3)"
    redis-benchmark -p "$port" -n 1000 -P 1 -c 1 -q "$call" "$1" "${f[@]}" >/dev/null 2>&1
  fi
  if command -v perf >/dev/null && perf stat -x, -e task-clock -p "$rpid" -o /tmp/lua-cost.$$ \
    -- redis-benchmark -p "$port" -n "$n" -P 16 -c 2 -r 100000 -q "$call" "$1" "${a[@]}" >/dev/null 2>&1; then
    awk -F, -v n="$n" '/task-clock/ {printf "%.2f", $1 * 1000 / n}' /tmp/lua-cost.$$
    rm -f /tmp/lua-cost.$$
  else
    local hz t0 t1
    hz=$(getconf CLK_TCK)
    t0=$(awk '{print $14 + $15}' "/proc/$rpid/stat")
    redis-benchmark -p "$port" -n "$n" -P 16 -c 2 -r 100000 -q "$call" "$1" "${a[@]}" >/dev/null 2>&1
    t1=$(awk '{print $14 + $15}' "/proc/$rpid/stat")
    awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$n" 'BEGIN {printf "%.2f", d * 1e6 / hz / n}'
  fi
}

declare -A runs
for _ in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    for r in "${revs[@]}"; do
      fill=""
      case $c in
        *-full*) fill=$(args_of "${c%-x16}" "${layout[$r]}") ;;
        check-x16) fill=$(args_of check-fill "${layout[$r]}") ;;
      esac
      call=${by[$r]}
      runs[$c/$r]+="$(measure "${sha[$r]}" "$(args_of "$c" "${layout[$r]}")" "$fill") "
    done
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
printf '%-8s' case
for r in "${revs[@]}"; do printf ' %12s' "$r"; done
printf '   (µs of redis-server CPU per call, median of %s x %s calls)\n' "$rounds" "$n"
for c in "${cases[@]}"; do
  printf '%-8s' "$c"
  for r in "${revs[@]}"; do printf ' %12s' "$(echo "${runs[$c/$r]}" | median)"; done
  echo
done
