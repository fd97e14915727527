#!/usr/bin/env bash
# Builds, when missing or stale, the xDS server the xDS tests run against:
#   - sluice-test-xds  tools/test-xds: go-control-plane's snapshot cache behind ADS
#                      (versions pinned in tools/test-xds/go.mod), serving
#                      RateLimitConfig files the way Envoy Gateway's xDS server does.
#   - Envoy Gateway's module (github.com/envoyproxy/gateway, EG_VERSION), from the Go
#     module proxy into Go's module cache, for its translator's RateLimitConfig
#     outputs (internal/xds/translator/testdata/out/ratelimit-config/), which the
#     xDS tests serve as data.
# The binary goes to $(go env GOPATH)/bin (or $GOBIN); a stamp beside it holds the
# hash of the sources it was built from, so an unchanged tool is not rebuilt. Prints
# the binary's path.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
log() { printf '[install-test-xds] %s\n' "$*" >&2; }
die() { printf '[install-test-xds] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (tools/test-xds/go.mod names the Go it needs)"
# Never let go fetch another toolchain behind our back: fail clearly instead.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
dir="$REPO/tools/test-xds"
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
out="$gobin/sluice-test-xds"
hash=$(cd "$dir" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$hash" ]; then
    log "already built from current sources: $out"
else
    logf="${TMPDIR:-/tmp}/install-test-xds.log"
    log "building $out from $dir (log: $logf) ..."
    start=$(date +%s)
    if ! (cd "$dir" && go build -o "$out.tmp" . && mv -f "$out.tmp" "$out") >"$logf" 2>&1; then
        tail -n 25 "$logf" >&2
        die "could not build sluice-test-xds (see $logf)"
    fi
    echo "$hash" >"$out.stamp"
    log "built in $(( $(date +%s) - start ))s"
fi
EG_VERSION=${EG_VERSION:-v1.9.1}
if ! go mod download -json "github.com/envoyproxy/gateway@$EG_VERSION" >/dev/null 2>&1; then
    die "could not download github.com/envoyproxy/gateway@$EG_VERSION from the Go module proxy"
fi
log "Envoy Gateway $EG_VERSION's translator outputs in $(go env GOMODCACHE)"
echo "$out"
