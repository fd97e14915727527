#!/usr/bin/env bash
# Redis commands per denied request when one key is attacked at 10x its limit:
#
#   scripts/attack-commands.sh [ALGORITHM...]     (default: all five)
#
# For each algorithm: one redis-server, sluice `--redis` with benches/policy.yaml
# whose `user` limit (100/s) uses that algorithm, and
# `sluice-bench load --scenario attack --key user --rate 1000 --attack-share 1.0`
# for 10 s (no warm-up, so every request is counted). The requests Redis decided are
# the attacker's requests minus those sluice denied from its over-limit cache
# (`sluice_denial_cache_answers_total`, read from /metrics around the load); the ones
# Redis decided and did not admit, per denied request, is the figure. (Decide calls,
# FCALL and EVALSHA,
# from `INFO commandstats` reset just before the load, are shown too; several
# requests may share one call, and one call reads a key shared by its requests once.)
# leaky_bucket holds requests (up to its burst) instead of denying them, so with the
# generator's 64 requests in flight the attacker is slowed, not denied: "no denials".
# ATTACK_SLUICE=PATH measures another sluice binary (it must export
# sluice_denial_cache_answers_total). Traffic stays on 127.0.0.1. Not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

algorithms=("$@")
[ ${#algorithms[@]} -gt 0 ] ||
  algorithms=(fixed_window sliding_window_log sliding_window_counter token_bucket leaky_bucket)
cargo build --profile dist --workspace --bins >&2
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
work=$(mktemp -d)
scratch+=("$work")
stat_of() { # stat_of COMMAND FIELD: 0 when the command never ran
  redis-cli -p 26393 INFO commandstats | tr -d '\r' |
    awk -F'[:,=]' -v c="cmdstat_$1" -v f="$2" '
      $1 == c { for (i = 2; i < NF; i += 2) if ($i == f) v = $(i + 1) }
      END { print v + 0 }'
}

cache_answers() {
  curl -sf http://127.0.0.1:18201/metrics |
    awk '$1 == "sluice_denial_cache_answers_total" { print $2 }'
}

start_redis 26393
echo "# $(date -u +%FT%TZ) sluice $(git describe --always --dirty), load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-24s %9s %9s %9s %9s %13s\n' algorithm admitted denied calls decided "cmds/denial"
for alg in "${algorithms[@]}"; do
  sed "s/rate_limit: {unit: second, requests_per_unit: 100}/rate_limit: {unit: second, requests_per_unit: 100, algorithm: $alg}/" \
    benches/policy.yaml >"$work/policy.yaml"
  grep -q "algorithm: $alg}" "$work/policy.yaml" || { echo "policy edit failed" >&2; exit 1; }
  redis-cli -p 26393 FLUSHALL >/dev/null
  "${ATTACK_SLUICE:-target/dist/sluice}" serve --config "$work/policy.yaml" --grpc-addr 127.0.0.1:18200 \
    --http-addr 127.0.0.1:18201 --redis redis://127.0.0.1:26393 >"$work/sluice.log" 2>&1 &
  sluice=$!
  pids+=("$sluice")
  wait_port 18200
  # Load the script before counting, so NOSCRIPT retries are not counted.
  target/dist/sluice-bench load --addr 127.0.0.1:18200 --scenario attack --key user \
    --rate 10 --attack-share 1.0 --duration 1s --warmup 0s >/dev/null
  sleep 1.1 # the warm-up hits leave the 1 s windows
  redis-cli -p 26393 CONFIG RESETSTAT >/dev/null
  cached_before=$(cache_answers)
  line=$(target/dist/sluice-bench load --addr 127.0.0.1:18200 --scenario attack --key user \
    --rate 1000 --attack-share 1.0 --duration 10s --warmup 0s --json)
  cached=$(($(cache_answers) - cached_before))
  kill "$sluice"
  wait "$sluice" 2>/dev/null || true
  admitted=$(jq '.attacker.ok' <<<"$line")
  denied=$(jq '.attacker.over_limit' <<<"$line")
  calls=$(($(stat_of fcall calls) + $(stat_of evalsha calls)))
  decided=$((admitted + denied - cached))
  printf '%-24s %9s %9s %9s %9s %13s\n' "$alg" "$admitted" "$denied" "$calls" \
    "$decided" "$(awk -v e="$decided" -v a="$admitted" -v d="$denied" \
      'BEGIN { if (d > 0) printf "%.4f", (e - a) / d; else print "no denials" }')"
done
