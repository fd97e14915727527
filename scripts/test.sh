#!/usr/bin/env bash
# Installs what the tests need when it is missing, then runs every test.
# Used by developers and by CI (.ci/run) alike.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

log() { printf '==> %s\n' "$*"; }

# --- Test dependencies ----------------------------------------------------------
# tests/redis.rs starts real redis-server processes (and skips loudly without one).
if ! command -v redis-server >/dev/null; then
  log "installing redis-server"
  apt-get update && apt-get install -y redis-server
fi

# --- Rust checks -------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --all-targets -- -D warnings
log "cargo test"
cargo test --all-targets

log "done in $(( $(date +%s) - start ))s"
