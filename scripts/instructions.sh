#!/usr/bin/env bash
# Instructions per request of Sluice's own work (decode, decide on the memory store,
# encode), counted by callgrind in `benches/request`'s counting mode. A count, unlike
# criterion's time, does not move with the machine's load, so two builds compare to a
# fraction of a per cent even on a busy machine; it says nothing about cache misses or
# branch mispredictions, so a change that moves memory around still needs criterion.
#
#   scripts/instructions.sh [SCENARIO...]      (default: hot uniform layered)
#
# Knobs (environment): N (requests counted per scenario, 20000), BENCH_BIN (an already
# built `request` bench binary, e.g. an older build's, instead of building this
# tree's with `cargo bench --no-run`). Needs valgrind. Each scenario takes about a
# minute under callgrind.
#
# To compare two revisions, run it in a checkout of each and compare the columns.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
n=${N:-20000}
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(hot uniform layered)

bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
    bin=$(cargo bench --bench request --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
fi
[ -x "$bin" ] || { echo "instructions.sh: no bench binary (${bin:-none})" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-16s %14s\n' scenario instr/request
for scenario in "${scenarios[@]}"; do
    SLUICE_COUNT="$scenario:$n" valgrind --tool=callgrind --toggle-collect='request::counted' \
        --callgrind-out-file="$out/$scenario.out" "$bin" >/dev/null 2>"$out/$scenario.log" || {
        cat "$out/$scenario.log" >&2
        exit 1
    }
    total=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$scenario.out")
    [ -n "$total" ] && [ "$total" -gt 0 ] || {
        echo "instructions.sh: callgrind counted nothing for $scenario (is request::counted in the binary?)" >&2
        exit 1
    }
    awk -v s="$scenario" -v t="$total" -v n="$n" 'BEGIN { printf "%-16s %14.0f\n", s, t / n }'
done
