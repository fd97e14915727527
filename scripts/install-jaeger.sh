#!/usr/bin/env bash
# Builds, when missing or stale, the Jaeger the tracing test sends traces to:
#   - sluice-test-jaeger  github.com/jaegertracing/jaeger/cmd/jaeger (Jaeger v2, an
#                         OpenTelemetry Collector distribution with Jaeger's storage
#                         and query API), at the version tools/jaeger/go.mod pins,
#                         from the Go module proxy.
# Jaeger's own go.mod has a `replace`, so `go install …@version` refuses it; the
# project's small module tools/jaeger records it with `go get -tool` and builds it
# there. About 9 minutes cold on 2 cores (121 MB); a stamp beside the binary holds
# the hash of tools/jaeger's go.mod and go.sum, so an unchanged pin is not rebuilt.
# The binary goes to $(go env GOPATH)/bin (or $GOBIN). Prints the binary's path.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
log() { printf '[install-jaeger] %s\n' "$*" >&2; }
die() { printf '[install-jaeger] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (tools/jaeger/go.mod names the Go it needs)"
# Never let go fetch another toolchain behind our back: fail clearly instead.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
dir="$REPO/tools/jaeger"
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
out="$gobin/sluice-test-jaeger"
hash=$(cd "$dir" && cat go.mod go.sum | sha256sum | cut -c1-16)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$hash" ]; then
    log "already built from the current pin: $out"
else
    logf="${TMPDIR:-/tmp}/install-jaeger.log"
    log "building $out from $dir (log: $logf; about 9 minutes cold) ..."
    start=$(date +%s)
    if ! (cd "$dir" && go build -o "$out.tmp" github.com/jaegertracing/jaeger/cmd/jaeger \
            && mv -f "$out.tmp" "$out") >"$logf" 2>&1; then
        tail -n 25 "$logf" >&2
        die "could not build Jaeger (see $logf)"
    fi
    echo "$hash" >"$out.stamp"
    log "built in $(( $(date +%s) - start ))s"
fi
echo "$out"
