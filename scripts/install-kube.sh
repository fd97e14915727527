#!/usr/bin/env bash
# Installs, when missing, what the Kubernetes tests need:
#   - etcd 3.4        Debian package etcd-server (apt-get)
#   - sluice-test-apiserver
#                     k8s.io/apiextensions-apiserver v0.33.13 (pinned in
#                     tools/test-apiserver/go.mod) + root discovery and OpenAPI, built
#                     from tools/test-apiserver. The stock `go install
#                     k8s.io/apiextensions-apiserver@v0.33.13` binary serves no /apis,
#                     so kubectl cannot discover anything with it (see
#                     docs/kubernetes-testing.md).
#   - helm            go install helm.sh/helm/v3/cmd/helm@HELM_VERSION
#   - etcd 3.5        only with INSTALL_ETCD35=1: built from tools/etcd (go.etcd.io/etcd/server/v3
#                     v3.5.21); needed only for streaming lists / watch-progress requests.
# kubectl is not installed: the machine's versioned kubectl.1.NN binaries are used
# (scripts/kube-apiserver.sh picks one).
#
# Binaries go to $(go env GOPATH)/bin (or $GOBIN). Idempotent: what is already there at
# the wanted version is left alone. Each install is timed; a summary is printed.
#
# Environment:
#   HELM_VERSIONS     helm versions to try in order (default below)
#   SKIP_HELM=1       do not install helm
#   INSTALL_ETCD35=1  also build etcd 3.5 (as $GOBIN/etcd-3.5)
set -euo pipefail

# First entry is the pinned version; the others are fall-backs tried only when a build
# fails (the failure is logged). All are listed by `go list -m -versions helm.sh/helm/v3`.
HELM_VERSIONS=${HELM_VERSIONS:-"v3.21.4 v3.19.5 v3.18.6"}
# Kubernetes version reported by the API server (/version); matches the pinned
# k8s.io/apiextensions-apiserver v0.33.13 in tools/test-apiserver/go.mod.
KUBE_VERSION=v1.33.13

REPO=$(cd "$(dirname "$0")/.." && pwd -P)

log() { printf '[install-kube] %s\n' "$*" >&2; }
die() { printf '[install-kube] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (Go >= 1.24 is needed to build the API server and helm)"
# Never let go fetch another toolchain behind our back: fail clearly instead.
export GOTOOLCHAIN=local
GOBIN_DIR="$(go env GOBIN)"
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$(go env GOPATH)/bin"
mkdir -p "$GOBIN_DIR"
LOGDIR="${TMPDIR:-/tmp}/install-kube-logs"
mkdir -p "$LOGDIR"

summary=()

# Version of the main module a Go binary was built from ("" if unknown).
go_bin_version() {
    go version -m "$1" 2>/dev/null | awk -v m="$2" '$1=="mod" && $2==m {print $3; exit}'
}

# run_timed NAME LOGFILE CMD...: runs CMD with output to LOGFILE, records the time.
run_timed() {
    local name=$1 logf=$2; shift 2
    local start rc=0 took
    start=$(date +%s)
    "$@" >"$logf" 2>&1 || rc=$?
    took=$(( $(date +%s) - start ))
    if [ "$rc" -eq 0 ]; then
        log "$name: done in ${took}s"
        summary+=("$name: installed in ${took}s")
    else
        log "FAILED: $name (exit $rc after ${took}s); last lines of $logf:"
        tail -n 25 "$logf" >&2 || true
        summary+=("$name: FAILED after ${took}s (see $logf)")
    fi
    return "$rc"
}

# --- etcd (apt) ------------------------------------------------------------------------
install_etcd() {
    if command -v etcd >/dev/null; then
        log "etcd already installed: $(command -v etcd) ($(etcd --version | head -1))"
        summary+=("etcd: already installed")
        return 0
    fi
    command -v apt-get >/dev/null || die "etcd missing and apt-get not available; install etcd >= 3.4 by hand"
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get install -y etcd-server ..."
    local start
    start=$(date +%s)
    if ! apt-get install -y --no-install-recommends etcd-server >"$LOGDIR/apt-etcd.log" 2>&1; then
        log "apt-get install failed; running apt-get update and retrying"
        apt-get update >>"$LOGDIR/apt-etcd.log" 2>&1 \
            || { tail -n 20 "$LOGDIR/apt-etcd.log" >&2; die "apt-get update failed"; }
        apt-get install -y --no-install-recommends etcd-server >>"$LOGDIR/apt-etcd.log" 2>&1 \
            || { tail -n 20 "$LOGDIR/apt-etcd.log" >&2; die "apt-get install etcd-server failed"; }
    fi
    command -v etcd >/dev/null || die "etcd-server installed but no etcd binary on PATH"
    local took=$(( $(date +%s) - start ))
    log "etcd installed in ${took}s: $(etcd --version | head -1)"
    summary+=("etcd: installed in ${took}s")
}

# --- a Go binary built from one of our tools/ modules ------------------------------------
# build_tool NAME DIR OUT PKG [LDFLAGS]: builds PKG inside module DIR to OUT, unless OUT
# was built from exactly these sources (hash of the module's files and the ldflags,
# kept in OUT.stamp).
tree_hash() { (cd "$1" && cat go.mod go.sum ./*.go 2>/dev/null | sha256sum | cut -c1-16); }

build_tool() {
    local name=$1 dir=$2 out=$3 pkg=$4 ldflags=${5:-}
    local hash stamp="$out.stamp"
    hash="$(tree_hash "$dir")-$(printf '%s' "$ldflags" | sha256sum | cut -c1-8)"
    if [ -x "$out" ] && [ -s "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
        log "$name already built from current sources: $out"
        summary+=("$name: already installed")
        return 0
    fi
    log "building $name from $dir (log: $LOGDIR/$name.log) ..."
    run_timed "$name" "$LOGDIR/$name.log" \
        bash -c 'cd "$1" && go build -ldflags "$2" -o "$3.tmp" "$4" && mv -f "$3.tmp" "$3"' _ \
        "$dir" "$ldflags" "$out" "$pkg" \
        || die "could not build $name (see $LOGDIR/$name.log)"
    echo "$hash" >"$stamp"
}

# --- helm ---------------------------------------------------------------------------------
install_helm() {
    local bin="$GOBIN_DIR/helm" have v
    if [ -x "$bin" ]; then
        have=$(go_bin_version "$bin" helm.sh/helm/v3)
        for v in $HELM_VERSIONS; do
            if [ "$have" = "$v" ]; then
                log "helm $have already installed at $bin"
                summary+=("helm $have: already installed")
                return 0
            fi
        done
        log "helm at $bin is version '${have:-unknown}'; installing ${HELM_VERSIONS%% *}"
    fi
    for v in $HELM_VERSIONS; do
        log "go install helm.sh/helm/v3/cmd/helm@$v (log: $LOGDIR/helm-$v.log) ..."
        # -X sets the version `helm version` prints (otherwise only "v3.NN").
        if run_timed "helm $v" "$LOGDIR/helm-$v.log" \
            go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
            "helm.sh/helm/v3/cmd/helm@$v"; then
            return 0
        fi
    done
    die "could not build helm with any of: $HELM_VERSIONS"
}

install_etcd

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
build_tool sluice-test-apiserver "$REPO/tools/test-apiserver" "$GOBIN_DIR/sluice-test-apiserver" . \
    "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

if [ "${INSTALL_ETCD35:-0}" = 1 ]; then
    build_tool etcd-3.5 "$REPO/tools/etcd" "$GOBIN_DIR/etcd-3.5" go.etcd.io/etcd/server/v3
fi

if [ "${SKIP_HELM:-0}" != 1 ]; then
    install_helm
fi

log "summary:"
for s in "${summary[@]}"; do log "  $s"; done
log "paths:"
log "  etcd:                  $(command -v etcd)"
log "  sluice-test-apiserver: $GOBIN_DIR/sluice-test-apiserver ($KUBE_VERSION)"
[ "${INSTALL_ETCD35:-0}" != 1 ] || log "  etcd 3.5:              $GOBIN_DIR/etcd-3.5 (use: ETCD_BIN=$GOBIN_DIR/etcd-3.5)"
[ "${SKIP_HELM:-0}" = 1 ] || log "  helm:                  $GOBIN_DIR/helm"
case ":$PATH:" in
    *":$GOBIN_DIR:"*) ;;
    *) log "note: $GOBIN_DIR is not on PATH; scripts/kube-apiserver.sh finds the API server there anyway" ;;
esac
