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
log "cargo test"
cargo test --all-targets

# --- Deployment: Helm chart and manifests, then Envoy end to end --------------------
# (each script installs what it needs when missing; see their headers)
log "scripts/helm-test.sh"
bash scripts/helm-test.sh
log "tests/e2e/envoy.sh"
bash tests/e2e/envoy.sh

log "done in $(( $(date +%s) - start ))s"
