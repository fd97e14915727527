#!/usr/bin/env bash
# Copies the CustomResourceDefinition(s) from crds/ (the one source of truth, generated
# from the Rust types; `sluice crd` prints the same) into the Helm chart's crds/
# directory, which Helm installs before the chart's templates.
#
#   scripts/sync-chart-crds.sh          copy
#   scripts/sync-chart-crds.sh --check  exit 1 if the chart's copy differs (tests use it)
#
# A copy rather than a symlink: `helm package` and chart repositories need real files,
# and a symlink leaving the chart directory is not followed everywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
src=crds
dst=charts/sluice/crds
check=0
[ "${1:-}" = --check ] && check=1

shopt -s nullglob
files=("$src"/*.yaml)
if [ ${#files[@]} -eq 0 ]; then
    echo "sync-chart-crds: no $src/*.yaml in this tree yet; nothing to copy"
    exit 0
fi
status=0
for f in "${files[@]}"; do
    t="$dst/$(basename "$f")"
    if [ "$check" = 1 ]; then
        if ! cmp -s "$f" "$t"; then
            echo "sync-chart-crds: $t differs from $f; run scripts/sync-chart-crds.sh" >&2
            status=1
        fi
    else
        mkdir -p "$dst"
        cp "$f" "$t"
        echo "sync-chart-crds: $f -> $t"
    fi
done
# No stale CRDs in the chart that crds/ no longer has.
for t in "$dst"/*.yaml; do
    if [ ! -e "$src/$(basename "$t")" ]; then
        if [ "$check" = 1 ]; then
            echo "sync-chart-crds: $t has no source in $src/" >&2
            status=1
        else
            rm -f "$t"
            echo "sync-chart-crds: removed stale $t"
        fi
    fi
done
exit $status
