#!/usr/bin/env bash
# Installs what the tests need when it is missing, then runs every test.
# Used by developers and by CI (.ci/run) alike.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

log() { printf '==> %s\n' "$*"; }

# --- Rust checks -------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --all-targets -- -D warnings
# --- Kubernetes: etcd and an API server for tests/kube.rs ----------------------------
# Installed when missing; then the Kubernetes tests must run (they skip only when the
# binaries are absent and SLUICE_REQUIRE_KUBE is unset).
if [ -f scripts/install-kube.sh ]; then
    log "scripts/install-kube.sh"
    bash scripts/install-kube.sh
    export SLUICE_REQUIRE_KUBE=1
else
    log "WARNING: scripts/install-kube.sh is missing; the Kubernetes tests may skip"
fi
log "cargo test"
cargo test --all-targets

log "done in $(( $(date +%s) - start ))s"
