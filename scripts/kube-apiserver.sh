#!/usr/bin/env bash
# shellcheck disable=SC2015  # `a && b || c` is used where b cannot fail
# A real (CRD-only) Kubernetes API server for tests: etcd + apiextensions-apiserver,
# bound to 127.0.0.1 on free ports, client-certificate auth (O=system:masters).
#
#   scripts/kube-apiserver.sh start DIR    start (or report already running), print DIR/env
#   scripts/kube-apiserver.sh stop DIR     stop both processes (no error if not running)
#   scripts/kube-apiserver.sh status DIR   exit 0 if the API server answers /healthz
#
# After `start`, DIR holds:
#   env           sourceable: KUBECONFIG, KUBECTL, KUBE_APISERVER_URL, ports, PIDs, ...
#   kubeconfig    absolute cert paths; for kubectl and kube-rs (KUBECONFIG=DIR/kubeconfig)
#   kubectl       symlink to a kubectl within one minor version of the server
#   pki/          ca.{crt,key}, server.{crt,key}, client.{crt,key}
#   etcd-data/    etcd's data; etcd.log, etcd.pid
#   apiserver.log, apiserver.pid, fake.kubeconfig
#
# Environment overrides:
#   APIEXT_BIN                 API server binary (default: $(go env GOPATH)/bin/sluice-test-apiserver)
#   ETCD_BIN                   etcd binary (default: etcd on PATH; e.g. $(go env GOPATH)/bin/etcd-3.5)
#   SLUICE_KUBE_APISERVER_PORT, SLUICE_ETCD_CLIENT_PORT, SLUICE_ETCD_PEER_PORT
#                              fixed ports (default: free ones in 20000-29999)
#   KUBE_START_TIMEOUT         seconds to wait for /healthz (default 60)
#   KUBECTL_MINOR              kubectl minor version to prefer (default 33)
#   SLUICE_KUBECTL             use this kubectl binary instead
#   KUBE_APISERVER_EXTRA_ARGS  extra flags for the API server, split on spaces
#                              (e.g. "--feature-gates=WatchList=true")
set -euo pipefail

log() { printf '[kube-apiserver] %s\n' "$*" >&2; }
die() { printf '[kube-apiserver] ERROR: %s\n' "$*" >&2; exit 1; }

usage() { die "usage: $0 start|stop|status DIR"; }
[ $# -eq 2 ] || usage
cmd=$1
case "$cmd" in
    start) mkdir -p "$2" ;;
    stop|status)
        if [ ! -d "$2" ]; then log "$2 does not exist: nothing to $cmd"; [ "$cmd" = stop ]; exit; fi ;;
    *) usage ;;
esac
DIR=$(cd "$2" && pwd -P)

START_TIMEOUT=${KUBE_START_TIMEOUT:-60}
KUBECTL_MINOR=${KUBECTL_MINOR:-33}

# --- helpers -------------------------------------------------------------------------

# pid_alive PIDFILE: true if the pid in the file runs a process whose command line
# mentions DIR (so a recycled PID is never mistaken for ours).
pid_alive() {
    local f=$1 pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/"
}

# started PID: true while a child this run started has not exited. Right after the fork
# its command line is still this script's, so pid_alive would call it dead.
started() {
    kill -0 "$1" 2>/dev/null
}

stop_pidfile() {
    local f=$1 name=$2 pid
    if ! pid_alive "$f"; then
        rm -f "$f"
        return 0
    fi
    pid=$(cat "$f")
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) did not exit after 10s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$f"
}

port_in_use() {
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

# await_free PORT...: a port given in the environment (a restart at the same address)
# may still be held by the instance just stopped: wait up to 15 s for each to be free,
# and name what holds one that stays taken.
await_free() {
    local p deadline=$(( $(date +%s) + 15 ))
    for p in "$@"; do
        while port_in_use "$p" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
        if port_in_use "$p"; then
            log "port $p is still taken: $(ss -Hltnp "sport = :$p" 2>/dev/null | head -1)"
        fi
    done
}

# pick_port VAR: sets VAR to a random port in 20000-29999 (below Linux's ephemeral
# range, so outgoing connections do not take it) that nothing listens on and that no
# earlier call in this run has handed out. A value already in VAR (from the
# environment) is kept.
handed_out=" "
pick_port() {
    local var=$1 p
    if [ -n "${!var:-}" ]; then handed_out+="${!var} "; return 0; fi
    for _ in $(seq 1 200); do
        p=$(( 20000 + RANDOM % 10000 ))
        port_in_use "$p" && continue
        [[ "$handed_out" == *" $p "* ]] && continue
        handed_out+="$p "
        printf -v "$var" '%s' "$p"
        return 0
    done
    die "found no free port in 20000-29999 after 200 tries"
}

healthz() {
    curl -fsS --max-time 3 \
        --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/client.crt" --key "$DIR/pki/client.key" \
        "https://127.0.0.1:$1/healthz" >/dev/null 2>&1
}

# find_apiext: the API server built by scripts/install-kube.sh (sluice-test-apiserver).
# The stock apiextensions-apiserver also starts, but serves no /apis, so kubectl and
# helm cannot use it: it is taken only when named in APIEXT_BIN.
find_apiext() {
    if [ -n "${APIEXT_BIN:-}" ]; then echo "$APIEXT_BIN"; return; fi
    local gobin=""
    if command -v go >/dev/null; then
        gobin=$(go env GOBIN); [ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
    fi
    for d in $gobin "$HOME/go/bin"; do
        if [ -x "$d/sluice-test-apiserver" ]; then echo "$d/sluice-test-apiserver"; return; fi
    done
    command -v sluice-test-apiserver 2>/dev/null || true
}

# find_kubectl: versioned binary within one minor of the server (1.33 for v0.33), else
# 1.32/1.34, else a plain kubectl (with a warning).
find_kubectl() {
    local real dir m
    if [ -n "${SLUICE_KUBECTL:-}" ]; then readlink -f "$SLUICE_KUBECTL"; return; fi
    real=$(readlink -f "$(command -v kubectl 2>/dev/null || echo /nonexistent)" 2>/dev/null || true)
    dir=$(dirname "${real:-/nonexistent}")
    for m in "$KUBECTL_MINOR" $((KUBECTL_MINOR - 1)) $((KUBECTL_MINOR + 1)); do
        for d in "$dir" /usr/lib/google-cloud-sdk/bin /usr/local/bin /usr/bin; do
            if [ -x "$d/kubectl.1.$m" ]; then echo "$d/kubectl.1.$m"; return; fi
        done
    done
    if [ -n "$real" ] && [ -x "$real" ]; then
        log "WARNING: no kubectl.1.$KUBECTL_MINOR found; using $real (version skew possible)"
        echo "$real"; return
    fi
    echo ""
}

make_certs() {
    local pki=$DIR/pki
    if [ -s "$pki/ca.crt" ] && [ -s "$pki/server.crt" ] && [ -s "$pki/client.crt" ]; then
        log "reusing certificates in $pki"
        return 0
    fi
    command -v openssl >/dev/null || die "openssl not found"
    mkdir -p "$pki"
    log "making certificates in $pki"
    (
        set -e
        cd "$pki"
        exec 2>openssl.log
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
            -keyout ca.key -out ca.crt -subj "/CN=sluice-test-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign"
        openssl req -newkey rsa:2048 -nodes -sha256 -keyout server.key -out server.csr \
            -subj "/CN=localhost"
        printf '%s\n' "basicConstraints=CA:FALSE" \
            "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=serverAuth" \
            "subjectAltName=IP:127.0.0.1,DNS:localhost" >server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 3650 -sha256 -extfile server.ext -out server.crt
        openssl req -newkey rsa:2048 -nodes -sha256 -keyout client.key -out client.csr \
            -subj "/O=system:masters/CN=sluice-test-admin"
        printf '%s\n' "basicConstraints=CA:FALSE" \
            "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=clientAuth" >client.ext
        openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 3650 -sha256 -extfile client.ext -out client.crt
        rm -f server.csr client.csr
    ) || { cat "$pki/openssl.log" >&2 || true; die "openssl failed"; }
    chmod 600 "$pki"/*.key
}

show_log_tail() {
    log "---- last lines of $1 ----"
    tail -n "${2:-40}" "$1" >&2 2>/dev/null || true
    log "---- end of $1 ----"
}

# listening_pid PORT: pid of the process listening on 127.0.0.1:PORT ("" if none).
listening_pid() {
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

# start_etcd BIN CLIENT_PORT PEER_PORT: 0 = healthy, 2 = a port was taken (retry),
# 1 = other failure (log shown).
start_etcd() {
    local bin=$1 port=$2 peer=$3 pid deadline
    if port_in_use "$port" || port_in_use "$peer"; then return 2; fi
    mkdir -p "$DIR/etcd-data"
    log "starting etcd ($bin) on 127.0.0.1:$port (peer $peer), data in $DIR/etcd-data"
    setsid "$bin" \
        --name sluice-test \
        --data-dir "$DIR/etcd-data" \
        --listen-client-urls "http://127.0.0.1:$port" \
        --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "sluice-test=http://127.0.0.1:$peer" \
        --initial-cluster-state new \
        --logger zap --log-outputs stderr \
        --quota-backend-bytes 1073741824 \
        </dev/null >"$DIR/etcd.log" 2>&1 &
    pid=$!
    echo "$pid" >"$DIR/etcd.pid"
    deadline=$(( $(date +%s) + START_TIMEOUT ))
    # Healthy, and the listener is ours (not another test's etcd on the same port).
    until [ "$(listening_pid "$port")" = "$pid" ] \
        && curl -fsS --max-time 2 "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"health":"true"'; do
        if ! started "$pid"; then
            if grep -q 'address already in use' "$DIR/etcd.log"; then return 2; fi
            show_log_tail "$DIR/etcd.log"
            log "etcd exited during start-up"
            return 1
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            show_log_tail "$DIR/etcd.log"
            stop_pidfile "$DIR/etcd.pid" etcd
            log "etcd not healthy after ${START_TIMEOUT}s"
            return 1
        fi
        sleep 0.2
    done
    log "etcd healthy (pid $pid)"
}

# fake.kubeconfig points where nothing listens: the server needs some kubeconfig for
# its delegated authn/authz and its informers; it must not fall back to in-cluster
# config. (The informer's "connection refused" errors in apiserver.log are expected.)
write_fake_kubeconfig() {
    cat >"$DIR/fake.kubeconfig" <<'EOF2'
apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: http://127.1.2.3:12345
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
current-context: fake
users:
- name: fake
  user: {}
EOF2
}

# start_apiserver BIN PORT ETCD_PORT: 0 = /healthz OK, 2 = port taken (retry), 1 = failure.
start_apiserver() {
    local bin=$1 port=$2 etcd_port=$3 pid deadline
    if port_in_use "$port"; then return 2; fi
    log "starting API server ($bin) on https://127.0.0.1:$port"
    # shellcheck disable=SC2086  # KUBE_APISERVER_EXTRA_ARGS is split on purpose
    setsid "$bin" \
        --etcd-servers "http://127.0.0.1:$etcd_port" \
        --secure-port "$port" --bind-address 127.0.0.1 \
        --cert-dir "$DIR/pki" \
        --tls-cert-file "$DIR/pki/server.crt" --tls-private-key-file "$DIR/pki/server.key" \
        --client-ca-file "$DIR/pki/ca.crt" \
        --authentication-skip-lookup \
        --authentication-kubeconfig "$DIR/fake.kubeconfig" \
        --authorization-kubeconfig "$DIR/fake.kubeconfig" \
        --kubeconfig "$DIR/fake.kubeconfig" \
        --enable-priority-and-fairness=false \
        --disable-admission-plugins NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy \
        ${KUBE_APISERVER_EXTRA_ARGS:-} \
        </dev/null >"$DIR/apiserver.log" 2>&1 &
    pid=$!
    echo "$pid" >"$DIR/apiserver.pid"
    deadline=$(( $(date +%s) + START_TIMEOUT ))
    until [ "$(listening_pid "$port")" = "$pid" ] && healthz "$port"; do
        if ! started "$pid"; then
            if grep -q 'address already in use' "$DIR/apiserver.log"; then return 2; fi
            show_log_tail "$DIR/apiserver.log" 60
            log "API server exited during start-up"
            return 1
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            show_log_tail "$DIR/apiserver.log" 60
            show_log_tail "$DIR/etcd.log" 20
            log "API server: /healthz not OK after ${START_TIMEOUT}s"
            return 1
        fi
        sleep 0.3
    done
    log "API server healthy (pid $pid)"
}

# --- commands ------------------------------------------------------------------------

do_stop() {
    stop_pidfile "$DIR/apiserver.pid" apiextensions-apiserver
    stop_pidfile "$DIR/etcd.pid" etcd
    log "stopped (DIR=$DIR)"
}

do_status() (
    # a subshell: sourcing DIR/env must not leak into do_start
    [ -s "$DIR/env" ] || { log "not started (no $DIR/env)"; return 1; }
    # shellcheck disable=SC1091
    . "$DIR/env"
    if pid_alive "$DIR/apiserver.pid" && pid_alive "$DIR/etcd.pid" && healthz "$KUBE_APISERVER_PORT"; then
        log "running: $KUBE_APISERVER_URL (etcd $ETCD_ENDPOINT)"
        return 0
    fi
    log "not running"
    return 1
)

do_start() {
    if [ -s "$DIR/env" ] && do_status 2>/dev/null; then
        log "already running; nothing to do"
        cat "$DIR/env"
        return 0
    fi
    # Half-started or stale leftovers: clean them up first.
    do_stop 2>/dev/null

    local etcd_bin apiext_bin kubectl_bin
    etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
    [ -n "$etcd_bin" ] && [ -x "$etcd_bin" ] || die "etcd not found; run scripts/install-kube.sh (or set ETCD_BIN)"
    apiext_bin=$(find_apiext)
    [ -n "$apiext_bin" ] && [ -x "$apiext_bin" ] || die "sluice-test-apiserver not found; run scripts/install-kube.sh (or set APIEXT_BIN)"
    kubectl_bin=$(find_kubectl)
    [ -n "$kubectl_bin" ] || die "no kubectl found (looked for kubectl.1.$KUBECTL_MINOR beside the kubectl wrapper)"
    command -v curl >/dev/null || die "curl not found (used to poll /healthz)"
    command -v ss >/dev/null || die "ss (iproute2) not found (used to find free ports)"

    make_certs

    # Ports are picked at random, so another process may take one between our check
    # and the bind: such a start is retried with new ports (up to 3 times).
    local etcd_port peer_port api_port attempt rc
    # shellcheck disable=SC2086  # unset ones are left out on purpose
    await_free ${SLUICE_ETCD_CLIENT_PORT:-} ${SLUICE_ETCD_PEER_PORT:-} ${SLUICE_KUBE_APISERVER_PORT:-}
    for attempt in 1 2 3; do
        etcd_port=${SLUICE_ETCD_CLIENT_PORT:-} peer_port=${SLUICE_ETCD_PEER_PORT:-}
        handed_out=" "
        pick_port etcd_port
        pick_port peer_port
        rc=0
        start_etcd "$etcd_bin" "$etcd_port" "$peer_port" || rc=$?
        [ "$rc" -eq 0 ] && break
        [ "$rc" -eq 2 ] && [ "$attempt" -lt 3 ] && [ -z "${SLUICE_ETCD_CLIENT_PORT:-}${SLUICE_ETCD_PEER_PORT:-}" ] \
            || { [ "$rc" -eq 2 ] && die "etcd: port $etcd_port or $peer_port is already in use"; die "etcd did not start (see $DIR/etcd.log)"; }
        log "etcd: port taken meanwhile; retrying with other ports"
    done
    write_fake_kubeconfig
    for attempt in 1 2 3; do
        api_port=${SLUICE_KUBE_APISERVER_PORT:-}
        handed_out=" $etcd_port $peer_port "
        pick_port api_port
        rc=0
        start_apiserver "$apiext_bin" "$api_port" "$etcd_port" || rc=$?
        [ "$rc" -eq 0 ] && break
        if [ "$rc" -eq 2 ] && [ "$attempt" -lt 3 ] && [ -z "${SLUICE_KUBE_APISERVER_PORT:-}" ]; then
            log "apiserver: port taken meanwhile; retrying with another port"
            continue
        fi
        do_stop
        [ "$rc" -eq 2 ] && die "API server: port $api_port is already in use"
        die "API server did not start (see $DIR/apiserver.log)"
    done

    # --- client files ---
    cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sluice-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $DIR/pki/ca.crt
contexts:
- name: sluice-test
  context:
    cluster: sluice-test
    user: sluice-test-admin
    namespace: default
current-context: sluice-test
users:
- name: sluice-test-admin
  user:
    client-certificate: $DIR/pki/client.crt
    client-key: $DIR/pki/client.key
EOF
    chmod 600 "$DIR/kubeconfig"
    ln -sfn "$kubectl_bin" "$DIR/kubectl"

    cat >"$DIR/env" <<EOF
# Written by scripts/kube-apiserver.sh start; source it: . $DIR/env
export KUBE_TEST_DIR=$DIR
export KUBECONFIG=$DIR/kubeconfig
export KUBECTL=$DIR/kubectl
export KUBECTL_REAL=$kubectl_bin
export KUBE_APISERVER_URL=https://127.0.0.1:$api_port
export KUBE_APISERVER_PORT=$api_port
export KUBE_CA_CERT=$DIR/pki/ca.crt
export KUBE_CLIENT_CERT=$DIR/pki/client.crt
export KUBE_CLIENT_KEY=$DIR/pki/client.key
export ETCD_ENDPOINT=http://127.0.0.1:$etcd_port
export ETCD_CLIENT_PORT=$etcd_port
export ETCD_PEER_PORT=$peer_port
export APISERVER_PID=$(cat "$DIR/apiserver.pid")
export ETCD_PID=$(cat "$DIR/etcd.pid")
export APIEXT_BIN=$apiext_bin
export ETCD_BIN=$etcd_bin
EOF
    log "API server healthy at https://127.0.0.1:$api_port; kubeconfig: $DIR/kubeconfig; kubectl: $kubectl_bin"
    cat "$DIR/env"
}

case "$cmd" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    *) usage ;;
esac
