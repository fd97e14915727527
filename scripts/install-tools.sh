#!/usr/bin/env bash
# Installs, when missing, the gRPC clients the tests of the gRPC port call
# (tests/grpc_clients.rs):
#   - grpcurl            go install github.com/fullstorydev/grpcurl/cmd/grpcurl@GRPCURL_VERSION
#   - grpc-health-probe  go install github.com/grpc-ecosystem/grpc-health-probe@PROBE_VERSION
#   - grpcio (Python)    pip install grpcio==GRPCIO_VERSION
#
# Go binaries go to $(go env GOPATH)/bin (or $GOBIN). Idempotent: a binary already built
# from the wanted version is left alone, and so is an importable grpcio.
set -euo pipefail

GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
PROBE_VERSION=${PROBE_VERSION:-v0.4.63}
GRPCIO_VERSION=${GRPCIO_VERSION:-1.85.3}

log() { printf '[install-tools] %s\n' "$*" >&2; }
die() { printf '[install-tools] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (needed for grpcurl and grpc-health-probe)"
export GOTOOLCHAIN=local
GOBIN_DIR="$(go env GOBIN)"
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$(go env GOPATH)/bin"
mkdir -p "$GOBIN_DIR"

# go_install BINARY MODULE PACKAGE VERSION
go_install() {
    local bin=$1 module=$2 package=$3 version=$4 have
    have=$(go version -m "$GOBIN_DIR/$bin" 2>/dev/null | awk -v m="$module" '$1=="mod" && $2==m {print $3; exit}' || true)
    if [ "$have" = "$version" ]; then
        log "$bin $version already installed"
        return
    fi
    log "go install $package@$version"
    GOBIN="$GOBIN_DIR" go install "$package@$version"
}

go_install grpcurl github.com/fullstorydev/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"
go_install grpc-health-probe github.com/grpc-ecosystem/grpc-health-probe \
    github.com/grpc-ecosystem/grpc-health-probe "$PROBE_VERSION"

if python3 -c 'import grpc' 2>/dev/null; then
    log "python grpcio $(python3 -c 'import grpc; print(grpc.__version__)') already installed"
else
    log "pip install grpcio==$GRPCIO_VERSION"
    python3 -m pip install -q "grpcio==$GRPCIO_VERSION"
fi
