#!/usr/bin/env bash
# Installs Envoy Gateway's binary (the control plane itself, for
# tests/e2e/envoy-gateway-real.sh) from the Go module proxy, when missing:
#
#   CGO_ENABLED=0 go install github.com/envoyproxy/gateway/cmd/envoy-gateway@EG_VERSION
#
# Pure Go; ~1 GB of modules and about 10-20 minutes on 2 cores, so scripts/test.sh
# starts this in the background at its top and waits for it before the test.
# The binary goes to $(go env GOPATH)/bin (or $GOBIN); one already there built from
# EG_VERSION's module is kept. Prints the binary's path; the build's log is in
# ${TMPDIR:-/tmp}/install-envoy-gateway.log.
set -euo pipefail

log() { printf '[install-envoy-gateway] %s\n' "$*" >&2; }
die() { printf '[install-envoy-gateway] ERROR: %s\n' "$*" >&2; exit 1; }

EG_VERSION=${EG_VERSION:-v1.9.1}
command -v go >/dev/null || die "go is not on PATH (Envoy Gateway $EG_VERSION needs Go 1.26.7 or later)"
# Never let go fetch another toolchain behind our back: fail clearly instead.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
out="$gobin/envoy-gateway"
have=$(go version -m "$out" 2>/dev/null | awk '$1 == "mod" && $2 == "github.com/envoyproxy/gateway" {print $3; exit}' || true)
if [ "$have" = "$EG_VERSION" ]; then
    log "already installed: $out ($EG_VERSION)"
else
    logf="${TMPDIR:-/tmp}/install-envoy-gateway.log"
    log "go install github.com/envoyproxy/gateway/cmd/envoy-gateway@$EG_VERSION (log: $logf) ..."
    start=$(date +%s)
    if ! GOBIN="$gobin" nice -n 10 go install "github.com/envoyproxy/gateway/cmd/envoy-gateway@$EG_VERSION" >"$logf" 2>&1; then
        tail -n 25 "$logf" >&2
        die "could not build Envoy Gateway $EG_VERSION (see $logf)"
    fi
    log "built in $(($(date +%s) - start))s"
fi
echo "$out"
