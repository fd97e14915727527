#!/usr/bin/env bash
# End to end on a real Kubernetes cluster (kind): the image built from the Dockerfile
# and loaded into kind, the Helm chart installed (with the CRD), a RateLimitPolicy
# applied with kubectl, Envoy (deploy/envoy/envoy.yaml) and an echo server deployed,
# and traffic through Envoy checked.
#
#   tests/e2e/kind.sh                 create cluster "sluice-e2e", test, delete it
#   KEEP_CLUSTER=1 tests/e2e/kind.sh  leave the cluster running afterwards
#
# Needs a container engine (docker), kind, kubectl and helm. Not part of
# scripts/test.sh; it was not run where it was written (no container engine there).
# Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${KIND_CLUSTER:-sluice-e2e}
IMAGE=${SLUICE_IMAGE:-sluice:e2e}
NS=sluice
pass=0
fail=0
pf_pid=""
created=0
W=$(mktemp -d)

ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$*"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$*"; }
log() { printf '==> %s\n' "$*"; }
finish() {
    [ -n "$pf_pid" ] && kill "$pf_pid" 2>/dev/null
    if [ "$fail" -ne 0 ]; then
        log "sluice logs:"; kubectl -n "$NS" logs deploy/sluice --tail=30 2>/dev/null | sed 's/^/    /'
        log "envoy logs:"; kubectl logs deploy/envoy --tail=20 2>/dev/null | sed 's/^/    /'
    fi
    if [ "$created" = 1 ] && [ -z "${KEEP_CLUSTER:-}" ]; then
        log "kind delete cluster --name $CLUSTER"
        kind delete cluster --name "$CLUSTER" >/dev/null 2>&1
    fi
    rm -rf "$W"
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
trap 'finish; exit $?' EXIT
die() { bad "$*"; exit 1; }

for tool in docker kind kubectl helm curl; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
docker info >/dev/null 2>&1 || die "no container engine answers (docker info failed)"

# --- cluster and image ------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER"
else
    log "kind create cluster --name $CLUSTER"
    kind create cluster --name "$CLUSTER" --wait 120s || die "kind create cluster failed"
    created=1
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null || die "no context kind-$CLUSTER"
log "docker build -t $IMAGE ."
docker build -t "$IMAGE" . || die "docker build failed"
ok "image $IMAGE built from the Dockerfile"
kind load docker-image "$IMAGE" --name "$CLUSTER" || die "kind load docker-image failed"
ok "image loaded into kind"

# --- sluice via the chart, policy via kubectl ---------------------------------------
if [ ! -e charts/sluice/crds/ratelimitpolicies.yaml ]; then
    die "charts/sluice/crds/ratelimitpolicies.yaml is missing: run scripts/sync-chart-crds.sh"
fi
log "helm install sluice charts/sluice"
helm upgrade --install sluice charts/sluice --namespace "$NS" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set replicaCount=2 --set redis.bundled.enabled=true --set logFormat=text \
    --wait --timeout 180s || die "helm install failed"
ok "chart installed; sluice pods ready (readiness /readyz)"
kubectl get crd ratelimitpolicies.sluice.dev >/dev/null 2>&1 && ok "CRD ratelimitpolicies.sluice.dev installed from the chart" ||
    bad "CRD ratelimitpolicies.sluice.dev missing"

kubectl apply -f tests/e2e/kind/policy.yaml || die "kubectl apply of the RateLimitPolicy failed"
if kubectl wait --for=condition=Accepted rlp/kind-e2e --timeout=30s >/dev/null 2>&1; then
    ok "RateLimitPolicy kind-e2e is Accepted (status condition set by sluice)"
else
    bad "RateLimitPolicy kind-e2e not Accepted within 30 s: $(kubectl get rlp kind-e2e -o jsonpath='{.status}' 2>&1)"
fi
# A bad spec is refused by the API server (the CRD's schema).
if kubectl apply --dry-run=server -f tests/e2e/bad-policy.yaml >/dev/null 2>&1; then
    bad "the API server accepted a RateLimitPolicy with requestsPerUnit: many"
else
    ok "the API server refuses a RateLimitPolicy with a bad spec"
fi

# --- echo server and Envoy ---------------------------------------------------------------
sed -e 's/{address: sluice, port_value: 8081}/{address: sluice-headless.sluice.svc.cluster.local, port_value: 8081}/' \
    -e 's/{address: backend, port_value: 8080}/{address: echo.default.svc.cluster.local, port_value: 8080}/' \
    -e 's/address: 127.0.0.1, port_value: 9901/address: 0.0.0.0, port_value: 9901/' \
    deploy/envoy/envoy.yaml >"$W/envoy.yaml"
grep -q sluice-headless "$W/envoy.yaml" && grep -q echo.default "$W/envoy.yaml" || die "could not adapt deploy/envoy/envoy.yaml"
kubectl create configmap envoy --from-file=envoy.yaml="$W/envoy.yaml" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -f tests/e2e/kind/echo.yaml -f tests/e2e/kind/envoy.yaml >/dev/null || die "could not deploy echo and envoy"
kubectl rollout status deploy/echo --timeout=120s >/dev/null && kubectl rollout status deploy/envoy --timeout=120s >/dev/null ||
    die "echo or envoy did not become ready"
ok "echo server and Envoy running"

PORT=$((20000 + RANDOM % 10000))
kubectl port-forward svc/envoy "$PORT:10000" >"$W/pf.log" 2>&1 &
pf_pid=$!
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.2; done

req() { curl -sS --max-time 10 -o /dev/null -D "$W/$1.h" -w '%{http_code}' "${@:2}" 2>/dev/null || echo 000; }
hdr() { grep -i "^$2:" "$W/$1.h" | head -n 1 | cut -d: -f2- | tr -d ' \r'; }

code=$(req allowed "http://127.0.0.1:$PORT/")
[ "$code" = 200 ] && [ -n "$(hdr allowed x-ratelimit-remaining)" ] &&
    ok "through Envoy: 200 with x-ratelimit-remaining $(hdr allowed x-ratelimit-remaining)" ||
    bad "through Envoy: want 200 with x-ratelimit-remaining, got $code"
codes=""
for i in 1 2 3 4; do codes+="$(req t$i -H 'x-tenant: kind-e2e' "http://127.0.0.1:$PORT/") "; done
if [ "$codes" = "200 200 200 429 " ] && [ -n "$(hdr t4 retry-after)" ] && [ "$(hdr t4 x-ratelimit-remaining)" = 0 ]; then
    ok "kubectl-applied policy enforced through Envoy (shared counters in Redis): $codes, retry-after $(hdr t4 retry-after)"
else
    bad "kubectl-applied policy: want '200 200 200 429' with retry-after, got '$codes'"
fi
code=$(req other -H 'x-tenant: someone-else' "http://127.0.0.1:$PORT/")
[ "$code" = 200 ] && ok "another tenant still passes" || bad "another tenant got $code"

# Deleting the policy lifts the limit within a few seconds.
kubectl delete -f tests/e2e/kind/policy.yaml >/dev/null
lifted=""
for _ in $(seq 1 20); do
    [ "$(req after -H 'x-tenant: kind-e2e' "http://127.0.0.1:$PORT/")" = 200 ] && { lifted=1; break; }
    sleep 0.25
done
[ -n "$lifted" ] && ok "deleting the RateLimitPolicy lifts the limit" || bad "limit still enforced 5 s after deleting the policy"
