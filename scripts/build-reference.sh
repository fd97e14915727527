#!/usr/bin/env bash
# Builds envoyproxy/ratelimit (the reference Go service) for the benchmark, from the Go
# module proxy, and prints the binary's path. Bench only: never part of scripts/test.sh
# or CI. The binary is cached in target/ref/, so a second run is instant.
#   scripts/build-reference.sh [VERSION]
# VERSION defaults to $BENCH_REFERENCE_VERSION or the pseudo-version below (upstream's
# main of 2026-01-22, commit 3fb702589d36; upstream tags no releases after v1.4.0).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-${BENCH_REFERENCE_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}}
pkg=github.com/envoyproxy/ratelimit/src/service_cmd
dir=$PWD/target/ref
bin=$dir/ratelimit-$version
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "build-reference: go not found" >&2; exit 1; }
mkdir -p "$dir"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
start=$(date +%s)
# 1. Plain `go install pkg@version` (works while upstream's go.mod has no replace
#    directives, which is the case for the default version).
if GOBIN=$dir/gobin go install "$pkg@$version" >&2; then
  mv "$dir/gobin/service_cmd" "$bin"
else
  # 2. A module of our own that requires it: replace directives of a dependency are
  #    ignored rather than refused there.
  echo "build-reference: go install refused; building through a wrapper module" >&2
  wrap=$dir/wrap
  rm -rf "$wrap" && mkdir -p "$wrap"
  (cd "$wrap" && go mod init sluice-bench/reference >&2 &&
    go get "$pkg@$version" >&2 &&
    go build -o "$bin" "$pkg" >&2)
fi
echo "build-reference: built envoyproxy/ratelimit $version with $(go version | cut -d' ' -f3)" \
  "in $(( $(date +%s) - start ))s" >&2
echo "$bin"
