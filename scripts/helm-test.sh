#!/usr/bin/env bash
# Tests the Helm chart (charts/sluice) and the plain manifests (deploy/kubernetes):
#   - the chart's CRD copy matches crds/ (when crds/ exists; scripts/sync-chart-crds.sh)
#   - `helm lint` and `helm template` for the default values and each examples/*.yaml
#   - every rendered object validated against the Kubernetes OpenAPI schemas bundled
#     with the kubernetes-validate package (strict: unknown fields fail), plus
#     cross-object checks (scripts/check-manifests.py)
#   - inline policies rendered into ConfigMaps load with `sluice validate`; the
#     sidecar-mode Envoy bootstrap passes `envoy --mode validate`, and the real Envoy
#     run on it takes IPv4 and IPv6; the sluice container's args pass sluice's own
#     flag parsers, and its SLUICE_* variables are ones sluice reads
#   - the bundled Redis's rendered args run by the real redis-server: it evicts
#     counters below its container's memory limit
#   - autoscaling: the HPA, the Deployment without replicas, the refusals
#   - the ServiceMonitor's tlsConfig, followed with curl, scrapes the real sluice
#     whose HTTP port asks for client certificates
#   - the notes `helm install` prints, per mode
#   - the "sluice.container" helper included from a parent chart
#   - values that must be refused are refused (schema and template checks)
#   - deploy/kubernetes/*.yaml and tests/e2e/kind/ manifests validated the same way;
#     tests/e2e/kind.sh parses and its chart values render
#   - with scripts/kube-apiserver.sh (a CRD-only API server: it serves
#     apiextensions.k8s.io and custom resources, not the core or apps groups),
#     `kubectl apply --dry-run=server` of the CRD and of RateLimitPolicy resources
# Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
start=$(date +%s)
K8S_VERSION=${K8S_VERSION:-1.33.0}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
CHART=charts/sluice
pass=0
fail=0
skip=0
work=$(mktemp -d)
apiserver_dir=""
cleanup() {
    if [ -n "$apiserver_dir" ]; then
        bash scripts/kube-apiserver.sh stop "$apiserver_dir" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$*"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$*"; }
# skipped FLAG WHAT: a check that cannot run here; a failure when the SLUICE_REQUIRE_*
# variable FLAG is set (scripts/test.sh sets them after installing what they name).
skipped() {
    local flag=$1; shift
    if [ -n "${!flag:-}" ]; then bad "$* ($flag is set)"; else skip=$((skip + 1)); printf 'SKIP %s\n' "$*"; fi
}
# check NAME CMD...: runs CMD, output to a log shown only on failure.
check() {
    local name=$1; shift
    if "$@" >"$work/out" 2>&1; then ok "$name"; else bad "$name"; sed 's/^/    /' "$work/out" | tail -n 30; fi
}
# refuse NAME CMD...: CMD must fail.
refuse() {
    local name=$1; shift
    if "$@" >"$work/out" 2>&1; then bad "$name (was accepted)"; else ok "$name"; fi
}

# --- tools -------------------------------------------------------------------------
find_helm() {
    local h
    for h in "$(command -v helm 2>/dev/null)" "$HOME/go/bin/helm" "$(go env GOPATH 2>/dev/null)/bin/helm"; do
        [ -n "$h" ] && [ -x "$h" ] && { echo "$h"; return; }
    done
}
HELM=$(find_helm)
if [ -z "$HELM" ] && command -v go >/dev/null; then
    echo "==> installing helm $HELM_VERSION (go install)"
    GOTOOLCHAIN=local go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$work/helm-install.log" 2>&1 \
        || tail -n 20 "$work/helm-install.log"
    HELM=$(find_helm)
fi
if [ -z "$HELM" ]; then
    bad "helm is not installed and could not be built (needs go)"
    echo "$pass passed, $fail failed"
    exit 1
fi
if ! python3 -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    echo "==> pip install kubernetes-validate"
    python3 -m pip install -q kubernetes-validate >"$work/pip.log" 2>&1 || tail -n 20 "$work/pip.log"
fi
SLUICE=${SLUICE_BIN:-target/debug/sluice}
[ -x "$SLUICE" ] || cargo build -q --bin sluice
ENVOY=$(command -v envoy || true)
echo "==> helm: $HELM ($("$HELM" version --short 2>/dev/null)); Kubernetes schemas: $K8S_VERSION"

# --- CRD copy ----------------------------------------------------------------------
check "chart crds/ is a copy of crds/ (scripts/sync-chart-crds.sh --check)" bash scripts/sync-chart-crds.sh --check

# --- chart: lint, render, validate -------------------------------------------------
# sluice_takes_args RENDER: the args of every sluice container in RENDER's Deployments
# pass the real binary's flag parsers (each value checked as `sluice serve` checks it
# at start; the trailing --help then prints instead of serving). $(SLUICE_POD_IP) is
# given a pod IP, as the kubelet would. Each SLUICE_* variable of the container is
# one `sluice serve` reads (its --help lists them), or one its args or other
# variables name as $(NAME).
sluice_takes_args() {
    local f found=""
    rm -rf "$work/argv" && mkdir -p "$work/argv"
    [ -s "$work/sluice-env" ] || "$SLUICE" serve --help | grep -o 'env: SLUICE_[A-Z_]*' | cut -c6- >"$work/sluice-env"
    python3 -c '
import sys, yaml
n = 0
known = set(open(sys.argv[3]).read().split())
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "Deployment":
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "sluice":
                n += 1
                with open(f"{sys.argv[2]}/{n}", "w") as f:
                    f.writelines(a.replace("$(SLUICE_POD_IP)", "10.1.2.3") + "\n" for a in c["args"])
                env = c.get("env") or []
                named = " ".join(c["args"] + [e.get("value", "") for e in env])
                for e in env:
                    k = e["name"]
                    if k.startswith("SLUICE_") and k not in known and "$(%s)" % k not in named:
                        sys.exit("%s: sluice serve reads no %s" % (d["metadata"]["name"], k))
' "$1" "$work/argv" "$work/sluice-env" || return 1
    for f in "$work/argv"/*; do
        [ -e "$f" ] || continue
        found=1
        mapfile -t args <"$f"
        if ! "$SLUICE" "${args[@]}" --help >"$work/argv.out" 2>&1; then
            echo "sluice refuses its args: ${args[*]}"; head -n 3 "$work/argv.out"; return 1
        fi
    done
    [ -n "$found" ] || { echo "no sluice container in a Deployment of $1"; return 1; }
}
render_and_check() { # NAME VALUES...
    local name=$1; shift
    local out="$work/render-$name.yaml" args=()
    for v in "$@"; do args+=(-f "$v"); done
    check "helm lint ($name)" "$HELM" lint --strict "$CHART" "${args[@]}" --kube-version "$K8S_VERSION"
    if ! "$HELM" template "rel-$name" "$CHART" "${args[@]}" --namespace sluice --include-crds \
            --kube-version "$K8S_VERSION" --api-versions monitoring.coreos.com/v1 >"$out" 2>"$work/err"; then
        bad "helm template ($name)"; sed 's/^/    /' "$work/err"; return
    fi
    ok "helm template ($name)"
    rm -rf "$work/policies-$name" "$work/envoy-$name.yaml"
    check "rendered objects valid against Kubernetes $K8S_VERSION schemas + cross-checks ($name)" \
        python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" \
        --extract-policies "$work/policies-$name" --extract-envoy "$work/envoy-$name.yaml" \
        --external-configmap edge-policies --external-secret envoy-rate-limit "$out"
    if [ -d "$work/policies-$name" ]; then
        check "inline policies load with sluice validate ($name)" "$SLUICE" validate "$work/policies-$name"
    fi
    if grep -q '^kind: Deployment' "$out" && grep -q -- '- serve$' "$out"; then
        check "sluice takes the rendered args ($name)" sluice_takes_args "$out"
    fi
    if [ -s "$work/envoy-$name.yaml" ]; then
        if [ -n "$ENVOY" ]; then
            check "sidecar Envoy bootstrap passes envoy --mode validate ($name)" \
                "$ENVOY" --mode validate -c "$work/envoy-$name.yaml" --log-level warn
        else
            skipped SLUICE_REQUIRE_TOOLS "envoy not installed: sidecar bootstrap not validated ($name)"
        fi
    fi
}
# Notes shows no template errors either.
render_and_check default
for f in "$CHART"/examples/*.yaml; do
    render_and_check "$(basename "$f" .yaml)" "$f"
done

# Specific renders.
t() { "$HELM" template r "$CHART" --kube-version "$K8S_VERSION" "$@"; }
check "default: Deployment probes /healthz and /readyz on the http port, grace above --shutdown-grace, --response-headers=auto" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]
assert c[\"livenessProbe\"][\"httpGet\"] == {\"path\": \"/healthz\", \"port\": \"http\"}, c[\"livenessProbe\"]
assert c[\"readinessProbe\"][\"httpGet\"] == {\"path\": \"/readyz\", \"port\": \"http\"}, c[\"readinessProbe\"]
assert \"--shutdown-grace=20s\" in c[\"args\"] and p[\"terminationGracePeriodSeconds\"] == 30
assert \"--grpc-addr=[::]:8081\" in c[\"args\"] and \"--kube\" in c[\"args\"]
assert \"--response-headers=auto\" in c[\"args\"], c[\"args\"]
assert c[\"securityContext\"][\"readOnlyRootFilesystem\"] and p[\"securityContext\"][\"runAsNonRoot\"]
'"
check "default: the pod runs as the image's user and group (the Dockerfile's USER)" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
s = d[\"spec\"][\"template\"][\"spec\"][\"securityContext\"]
user = [l.split()[1] for l in open(\"Dockerfile\") if l.startswith(\"USER \")][-1]
pod = \"%s:%s\" % (s[\"runAsUser\"], s[\"runAsGroup\"])
assert pod == user == \"%s:%s\" % (s[\"fsGroup\"], s[\"fsGroup\"]), (s, user)
'"
check "kube.namespace: a Role and RoleBinding in that namespace, no ClusterRole" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set kube.namespace=shop | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
kinds = {x[\"kind\"] for x in ds}
assert \"ClusterRole\" not in kinds and \"Role\" in kinds and \"RoleBinding\" in kinds, kinds
r = [x for x in ds if x[\"kind\"] == \"Role\"][0]
assert r[\"metadata\"][\"namespace\"] == \"shop\"
assert {\"apiGroups\": [\"sluice.dev\"], \"resources\": [\"ratelimitpolicies\"], \"verbs\": [\"list\", \"watch\"]} in r[\"rules\"], r[\"rules\"]
assert {\"apiGroups\": [\"sluice.dev\"], \"resources\": [\"ratelimitpolicies/status\"], \"verbs\": [\"patch\"]} in r[\"rules\"], r[\"rules\"]
assert len(r[\"rules\"]) == 2, r[\"rules\"]
'"
check "hashKeys with hashSecret: --hash-keys, SLUICE_HASH_SECRET from the Secret" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set hashKeys=true --set hashSecret.existingSecret=sluice-hash | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
c = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0]
assert \"--hash-keys\" in c[\"args\"], c[\"args\"]
env = {e[\"name\"]: e for e in c[\"env\"]}
assert env[\"SLUICE_HASH_SECRET\"][\"valueFrom\"] == {\"secretKeyRef\": {\"name\": \"sluice-hash\", \"key\": \"secret\"}}, env
'"
check "rlqs: --rlqs-assignment-ttl and --rlqs-abandon-after, defaults and set" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
t | grep -q -- '- --rlqs-assignment-ttl=15s' && t | grep -q -- '- --rlqs-abandon-after=60s' &&
t --set-string rlqs.assignmentTtl=1m30s --set-string rlqs.abandonAfter=5m | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
a = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0][\"args\"]
assert \"--rlqs-assignment-ttl=1m30s\" in a and \"--rlqs-abandon-after=5m\" in a, a
'"
check "durations as the flags take them: storeTimeout=2.5ms, reloadInterval=1d, rlqs.abandonAfter=1.5m" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set-string storeTimeout=2.5ms \
        --set-string reloadInterval=1d --set-string rlqs.abandonAfter=1.5m | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
a = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0][\"args\"]
for f in (\"--store-timeout=2.5ms\", \"--reload-interval=1d\", \"--rlqs-abandon-after=1.5m\"):
    assert f in a, (f, a)
'"
# A ConfigMap's name may be as long as a DNS label, or a DNS subdomain; the pod's
# volume for it must still be a DNS label of at most 63 characters.
long_configmap_names() {
    local long
    long=$(printf 'p%.0s' $(seq 63))
    t --set "existingPolicyConfigMaps[0]=$long" --set "existingPolicyConfigMaps[1]=edge.policies" >"$work/long-cm.yaml" || return 1
    python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" --external-configmap "$long" \
        --external-configmap edge.policies "$work/long-cm.yaml" || return 1
    grep -qF -- "- --config=/etc/sluice/extra/$long" "$work/long-cm.yaml" &&
        grep -qF -- '- --config=/etc/sluice/extra/edge.policies' "$work/long-cm.yaml" &&
        sluice_takes_args "$work/long-cm.yaml"
}
check "existingPolicyConfigMaps of 63 characters, or with dots: valid volume names, each mounted and passed" long_configmap_names
# Helm takes release names of up to 53 characters: the Services named after the
# release (the headless one, the bundled Redis's) must stay within 63, and what
# names them (--redis, the Certificate, the notes) must follow.
long_release() {
    local r
    r=$(printf 'r%.0s' $(seq 53))
    "$HELM" template "$r" "$CHART" --kube-version "$K8S_VERSION" --namespace sluice --set redis.bundled.enabled=true \
        --set tls.grpc.enabled=true --set tls.grpc.certManager.enabled=true --set tls.grpc.certManager.issuerRef.name=ca \
        >"$work/long-release.yaml" || return 1
    python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" "$work/long-release.yaml" || return 1
    python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
svcs = {x["metadata"]["name"] for x in ds if x["kind"] == "Service"}
headless = [s for s in svcs if s.endswith("-headless")]
redis = [s for s in svcs if s.endswith("-redis")]
assert len(headless) == 1 and len(redis) == 1, svcs
a = [x for x in ds if x["kind"] == "Deployment" and "ratelimit" in x["metadata"]["labels"].values()][0]
a = a["spec"]["template"]["spec"]["containers"][0]["args"]
assert "--redis=redis://%s:6379" % redis[0] in a, (redis, a)
cert = [x for x in ds if x["kind"] == "Certificate"][0]["spec"]["dnsNames"]
assert "%s.sluice.svc.cluster.local" % headless[0] in cert, (headless, cert)
' "$work/long-release.yaml" || return 1
    NOTES_RELEASE=$r notes --namespace sluice >"$work/long-release-notes.txt" || return 1
    grep -qF "$(grep -o -m 1 "${r:0:20}[a-z-]*-headless" "$work/long-release.yaml" | head -n 1).sluice.svc:8081" "$work/long-release-notes.txt"
}
# notes ARGS...: NOTES.txt as `helm install` prints it (helm template renders no
# notes: a copy of the chart renders the file into a ConfigMap of its own).
notes() {
    local c="$work/notes-chart"
    if [ ! -d "$c" ]; then
        cp -r "$CHART" "$c" && cp "$c/templates/NOTES.txt" "$c/notes.txt"
        printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata: {name: notes}' 'data:' '  notes: |' \
            '    {{- tpl (.Files.Get "notes.txt") . | nindent 4 }}' >"$c/templates/zz-notes.yaml"
    fi
    "$HELM" template "${NOTES_RELEASE:-r}" "$c" --kube-version "$K8S_VERSION" --show-only templates/zz-notes.yaml "$@" |
        python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["notes"])'
}
notes_helpers() {
    local n
    n=$(notes --set mode=helpers --set kube.enabled=false --set-string 'policies.a\.yaml=domain: a') || return 1
    echo "$n"
    # No Service or pods of the release's own to port-forward to, or to count.
    ! grep -q -e 'svc/' -e 'replicas keep counters' <<<"$n" && grep -q 'sluice.container' <<<"$n"
}
check "NOTES in mode helpers: no Service to port-forward to, no replica count; says to include sluice.container" notes_helpers
notes_https() {
    local n
    n=$(notes --set tls.http.enabled=true --set tls.http.existingSecret=s) || return 1
    echo "$n"
    grep -qF 'curl -sk https://localhost:8080/debug/policies' <<<"$n" || return 1
    n=$(notes) && grep -qF 'curl -s localhost:8080/debug/policies' <<<"$n"
}
check "NOTES: curl over https:// when the HTTP port serves TLS, plain otherwise" notes_https
check "a release name of 53 characters: Services within 63, --redis, the Certificate and the notes name them" long_release
refuse "hashKeys without hashSecret.existingSecret is refused at render" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set hashKeys=true"
# In mode helpers the pods, their Service and so their scrape job are the including
# chart's: alerts on this release's job would never fire, and SluiceDown always would.
check "prometheusRule is refused in mode helpers, saying why" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'; \
        ! t --set mode=helpers --set prometheusRule.enabled=true >/dev/null 2>'$work/helpers.err' \
        && grep -q 'prometheusRule.*mode: helpers' '$work/helpers.err'"
check "redis.bundled: sluice gets --redis pointing at the bundled Service" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set redis.bundled.enabled=true | grep -q -- '--redis=redis://r-sluice-redis:6379'"
# The bundled Redis's container has a memory limit: Redis must evict counters before
# reaching it (the kubelet would OOM-kill it, every counter lost), and never the keys
# without a TTL (the shared penalty board: bans, the block list).
bundled_redis_args() { # VALUES...: the rendered bundled Redis's args, one a line
    t --set redis.bundled.enabled=true "$@" | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x["kind"] == "Deployment" and x["metadata"]["name"] == "r-sluice-redis"][0]
print("\n".join(d["spec"]["template"]["spec"]["containers"][0]["args"]))'
}
bundled_redis_evicts() {
    local port pid limit=$((40 * 1024 * 1024)) used rss evicted policy max board args
    mapfile -t args < <(bundled_redis_args --set redis.bundled.resources.limits.memory=40Mi) || return 1
    printf '%s\n' "${args[@]}" | grep -qx -- --maxmemory || { echo "no --maxmemory in ${args[*]}"; return 1; }
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$work/redis-evict"
    redis-server "${args[@]}" --port "$port" --bind 127.0.0.1 --dir "$work/redis-evict" >"$work/redis-evict/log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" zadd 'sluice:{sluice-board}:list' 1 k >/dev/null
    # 55 MB of counters with TTLs, as sluice writes them, past the 40 MiB limit.
    python3 -c '
import sys
v = "x" * 100
out = sys.stdout.buffer
for i in range(200000):
    k = "sluice:{%d}:api:remote_address:10.0.%d.%d:fw" % (i, i // 256 % 256, i % 256)
    out.write(b"*4\r\n$6\r\nPSETEX\r\n$%d\r\n%s\r\n$7\r\n3600000\r\n$%d\r\n%s\r\n" % (len(k), k.encode(), len(v), v.encode()))
' | redis-cli -p "$port" --pipe >"$work/redis-evict/pipe" 2>&1
    used=$(redis-cli -p "$port" info memory | tr -d '\r' | sed -n 's/^used_memory://p')
    rss=$(redis-cli -p "$port" info memory | tr -d '\r' | sed -n 's/^used_memory_rss://p')
    max=$(redis-cli -p "$port" config get maxmemory | tail -n 1)
    policy=$(redis-cli -p "$port" config get maxmemory-policy | tail -n 1)
    evicted=$(redis-cli -p "$port" info stats | tr -d '\r' | sed -n 's/^evicted_keys://p')
    board=$(redis-cli -p "$port" exists 'sluice:{sluice-board}:list')
    kill "$pid"; wait "$pid" 2>/dev/null
    echo "maxmemory $max ($policy), used_memory $used, resident $rss of a $limit limit, evicted $evicted; board kept: $board; $(tail -n 1 "$work/redis-evict/pipe")"
    # Redis checks maxmemory before each write: it may pass it by a few bytes.
    [ "$max" -gt 0 ] && [ "$used" -le $((max + max / 100)) ] && [ "$rss" -lt "$limit" ] && [ "$evicted" -gt 0 ] &&
        [ "$board" = 1 ] && [ "$policy" = volatile-ttl ] && grep -q 'errors: 0' "$work/redis-evict/pipe"
}
check "redis.bundled: the real redis-server given the rendered args evicts counters below the container's memory limit, keeps keys without TTL" bundled_redis_evicts
check "redis.bundled.maxmemory sets --maxmemory in bytes; 3/4 of the limit (256Mi), at least 16Mi below it (40Mi), by default; none without a limit" bash -c "
    $(declare -f t bundled_redis_args); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
    bundled_redis_args | grep -qx 201326592 && bundled_redis_args --set-string redis.bundled.maxmemory=100Mi | grep -qx 104857600 &&
    bundled_redis_args --set redis.bundled.resources.limits.memory=1G | grep -qx 750000000 &&
    bundled_redis_args --set redis.bundled.resources.limits.memory=40Mi | grep -qx 25165824 &&
    ! bundled_redis_args --set redis.bundled.resources.limits=null | grep -qx -- --maxmemory"
check "redis.bundled.maxmemory at or past the memory limit is refused, saying why; without it, a limit in another form or under 32Mi" bash -c "
    $(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
    set -e
    if t --set redis.bundled.enabled=true --set-string redis.bundled.maxmemory=256Mi >/dev/null 2>'$work/maxmemory.err'; then exit 1; fi
    grep -q 'redis.bundled.maxmemory (256Mi) must be below the container.s memory limit (256Mi)' '$work/maxmemory.err'
    if t --set redis.bundled.enabled=true --set redis.bundled.resources.limits.memory=0.5Gi >/dev/null 2>'$work/maxmemory.err'; then exit 1; fi
    grep -q 'or set redis.bundled.maxmemory' '$work/maxmemory.err'
    if t --set redis.bundled.enabled=true --set redis.bundled.resources.limits.memory=24Mi >/dev/null 2>'$work/maxmemory.err'; then exit 1; fi
    grep -q 'limits.memory (24Mi) leaves Redis no room for counters' '$work/maxmemory.err'
    t --set redis.bundled.enabled=true --set redis.bundled.resources.limits.memory=0.5Gi --set-string redis.bundled.maxmemory=300Mi >/dev/null"
# A private registry, or nodes that take only some pods: the bundled Redis's pod
# must be placeable where the release's is.
check "redis.bundled: the Redis pod takes imagePullSecrets and its own nodeSelector, tolerations and affinity" bash -c "
    $(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
    t --set redis.bundled.enabled=true --set 'imagePullSecrets[0].name=regcred' --set nodeSelector.pool=sluice \
        --set-json 'redis.bundled.nodeSelector={\"kubernetes.io/os\":\"linux\"}' \
        --set-json 'redis.bundled.tolerations=[{\"key\":\"dedicated\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]' \
        --set-json 'redis.bundled.affinity={\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":[{\"matchExpressions\":[{\"key\":\"disk\",\"operator\":\"In\",\"values\":[\"ssd\"]}]}]}}}' \
        >'$work/redis-placed.yaml' &&
    python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' --external-secret regcred '$work/redis-placed.yaml' &&
    python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x and x[\"kind\"] == \"Deployment\"]
p = {d[\"metadata\"][\"name\"]: d[\"spec\"][\"template\"][\"spec\"] for d in ds}
r = p[\"r-sluice-redis\"]
assert r.get(\"imagePullSecrets\") == [{\"name\": \"regcred\"}], r
assert r.get(\"nodeSelector\") == {\"kubernetes.io/os\": \"linux\"}, r
assert r.get(\"tolerations\") == [{\"key\": \"dedicated\", \"operator\": \"Exists\", \"effect\": \"NoSchedule\"}], r
assert r[\"affinity\"][\"nodeAffinity\"], r
assert p[\"r-sluice\"][\"nodeSelector\"] == {\"pool\": \"sluice\"} and \"tolerations\" not in p[\"r-sluice\"], p[\"r-sluice\"]
' '$work/redis-placed.yaml'"
check "redis.sentinel: --redis-sentinel and --redis-sentinel-master, or the masters from a Secret" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t \
        --set 'redis.sentinel.urls={redis://s-0.s:26379,redis://s-1.s:26379}' --set 'redis.sentinel.masters={a,b}' | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
a = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0][\"args\"]
assert \"--redis-sentinel=redis://s-0.s:26379,redis://s-1.s:26379\" in a, a
assert \"--redis-sentinel-master=a,b\" in a, a
assert not [x for x in a if x.startswith(\"--redis=\")], a
' && HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t \
        --set 'redis.sentinel.urls={redis://s-0.s:26379}' --set redis.sentinel.existingSecret=masters | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
c = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0]
env = {e[\"name\"]: e for e in c[\"env\"]}
assert env[\"SLUICE_REDIS_SENTINEL_MASTER\"][\"valueFrom\"] == {\"secretKeyRef\": {\"name\": \"masters\", \"key\": \"sentinel-masters\"}}, env
assert not [x for x in c[\"args\"] if x.startswith(\"--redis-sentinel-master\")], c[\"args\"]
'"
# Passwords of a Redis Cluster's nodes or of the sentinels are in their URLs: the
# Secret must feed whichever list the store is given.
redis_secret_env() { # VALUES...: prints the sluice container's SLUICE_REDIS* env (NAME=secret/key or NAME=value) and --redis* args
    t "$@" >"$work/redis-secret.yaml" || return 1
    sluice_takes_args "$work/redis-secret.yaml" || return 1
    python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x and x["kind"] == "Deployment"][0]
c = d["spec"]["template"]["spec"]["containers"][0]
for e in c["env"]:
    if e["name"].startswith("SLUICE_REDIS"):
        r = (e.get("valueFrom") or {}).get("secretKeyRef")
        print(e["name"] + "=" + (r["name"] + "/" + r["key"] if r else e["value"]))
for a in c["args"]:
    if a.startswith("--redis"):
        print(a)
' "$work/redis-secret.yaml"
}
redis_secret_modes() {
    local out
    out=$(redis_secret_env --set redis.existingSecret=redis) && echo "$out" &&
        [ "$out" = "SLUICE_REDIS=redis/redis-urls" ] || return 1
    out=$(redis_secret_env --set redis.existingSecret=redis --set redis.existingSecretFor=clusterUrls \
        --set redis.existingSecretKey=cluster) && echo "$out" &&
        [ "$out" = "SLUICE_REDIS_CLUSTER=redis/cluster" ] || return 1
    out=$(redis_secret_env --set redis.existingSecret=redis --set redis.existingSecretFor=sentinel.urls \
        --set redis.existingSecretKey=sentinels --set 'redis.sentinel.masters={a,b}') && echo "$out" &&
        [ "$out" = "$(printf '%s\n' SLUICE_REDIS_SENTINEL=redis/sentinels --redis-sentinel-master=a,b)" ] || return 1
    out=$(redis_secret_env --set redis.existingSecret=redis --set redis.existingSecretFor=sentinel.urls \
        --set redis.existingSecretKey=sentinels --set redis.sentinel.existingSecret=redis) && echo "$out" &&
        [ "$out" = "$(printf '%s\n' SLUICE_REDIS_SENTINEL=redis/sentinels SLUICE_REDIS_SENTINEL_MASTER=redis/sentinel-masters)" ] || return 1
    # A store from the Secret is a store: the replicas count each other through it.
    t --set redis.existingSecret=redis --set redis.existingSecretFor=clusterUrls | grep -q -- '- --local-share-service='
}
check "redis.existingSecret feeds SLUICE_REDIS, or SLUICE_REDIS_CLUSTER or SLUICE_REDIS_SENTINEL as existingSecretFor says" redis_secret_modes
refuse "template refuses redis.existingSecretFor: sentinel.urls without masters" \
    t --set redis.existingSecret=redis --set redis.existingSecretFor=sentinel.urls
refuse "template refuses redis.existingSecretFor: clusterUrls with redis.clusterUrls too" \
    t --set redis.existingSecret=redis --set redis.existingSecretFor=clusterUrls --set 'redis.clusterUrls={redis://c:6379}'
refuse "template refuses redis.existingSecretFor: sentinel.urls with redis.sentinel.urls too" \
    t --set redis.existingSecret=redis --set redis.existingSecretFor=sentinel.urls --set 'redis.sentinel.urls={redis://s:26379}' \
    --set 'redis.sentinel.masters={a}'
refuse "template refuses redis.existingSecretFor: clusterUrls without redis.existingSecret" \
    t --set redis.existingSecretFor=clusterUrls
refuse "template refuses redis.sentinel.masters with redis.existingSecretFor: clusterUrls" \
    t --set redis.existingSecret=redis --set redis.existingSecretFor=clusterUrls --set 'redis.sentinel.masters={a}'
refuse "schema refuses redis.existingSecretFor: cluster" t --set redis.existingSecret=redis --set redis.existingSecretFor=cluster
check "localShare: with Redis, --local-share-service names the release's Service; a Role reads its endpointslices; token mounted" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --namespace shop \
        --set redis.bundled.enabled=true --set kube.enabled=false --set-string 'policies.a\.yaml=domain: a' | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
named = lambda kind, name: [x for x in ds if x[\"kind\"] == kind and x[\"metadata\"][\"name\"] == name]
assert named(\"Service\", \"r-sluice\"), \"the Service counted is the chart s own\"
p = named(\"Deployment\", \"r-sluice\")[0][\"spec\"][\"template\"][\"spec\"]
a = p[\"containers\"][0][\"args\"]
assert \"--local-share-service=shop/r-sluice\" in a, a
assert p[\"automountServiceAccountToken\"] is True
role = named(\"Role\", \"r-sluice-endpointslices\")[0]
assert role[\"rules\"] == [{\"apiGroups\": [\"discovery.k8s.io\"], \"resources\": [\"endpointslices\"], \"verbs\": [\"list\", \"watch\"]}], role
b = named(\"RoleBinding\", \"r-sluice-endpointslices\")[0]
assert b[\"roleRef\"] == {\"apiGroup\": \"rbac.authorization.k8s.io\", \"kind\": \"Role\", \"name\": \"r-sluice-endpointslices\"}, b
assert b[\"subjects\"] == [{\"kind\": \"ServiceAccount\", \"name\": p[\"serviceAccountName\"], \"namespace\": \"shop\"}], b
assert not [x for x in ds if x[\"kind\"] == \"ClusterRole\"]
'"
check "localShare: with Redis, each replica advertises its pod IP and HTTP port; not without Redis or with TLS on the HTTP port" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
t --set redis.bundled.enabled=true | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
c = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0]
assert \"--local-share-advertise=\$(SLUICE_POD_IP):8080\" in c[\"args\"], c[\"args\"]
env = {e[\"name\"]: e for e in c[\"env\"]}
assert env[\"SLUICE_POD_IP\"][\"valueFrom\"] == {\"fieldRef\": {\"fieldPath\": \"status.podIP\"}}, env
'
for values in '' '--set redis.bundled.enabled=true --set tls.http.enabled=true --set tls.http.existingSecret=s'; do
    t \$values | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
c = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0]
assert not [a for a in c[\"args\"] if a.startswith(\"--local-share-advertise\")], c[\"args\"]
assert \"SLUICE_POD_IP\" not in [e[\"name\"] for e in c[\"env\"]]
'
done"
check "localShare: no --local-share-service, Role or token without a Redis store, or with localShare.fromService=false" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
for values in '' '--set redis.bundled.enabled=true --set localShare.fromService=false'; do
    t \$values --set kube.enabled=false --set-string 'policies.a\.yaml=domain: a' | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
p = [x for x in ds if x[\"kind\"] == \"Deployment\" and x[\"metadata\"][\"name\"] == \"r-sluice\"][0][\"spec\"][\"template\"][\"spec\"]
assert not [a for a in p[\"containers\"][0][\"args\"] if a.startswith(\"--local-share-service\")]
assert p[\"automountServiceAccountToken\"] is False
assert not [x for x in ds if x[\"kind\"] in (\"Role\", \"RoleBinding\")]
'
done
t -f $CHART/examples/redis-bundled.yaml | grep -q -- '- --local-share-service=default/r-sluice'
if t -f $CHART/examples/sidecar.yaml | grep -q -- '--local-share-service'; then exit 1; fi
t -f $CHART/examples/sidecar.yaml --set localShare.fromService=true --set rbac.create=true | grep -q -- '- --local-share-service=default/r-sluice'"
# An autoscaler owns the replica count: a Deployment that sets replicas has it reset
# by each `helm upgrade`.
autoscaling() {
    local mode
    for mode in "" "-f $CHART/examples/sidecar.yaml"; do
        # shellcheck disable=SC2086
        t $mode --set autoscaling.enabled=true --set autoscaling.minReplicas=3 --set autoscaling.maxReplicas=9 \
            --set autoscaling.targetCPUUtilizationPercentage=60 >"$work/hpa.yaml" || return 1
        python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" "$work/hpa.yaml" || return 1
        python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
d = [x for x in ds if x["kind"] == "Deployment"][0]
assert "replicas" not in d["spec"], d["spec"]
h = [x for x in ds if x["kind"] == "HorizontalPodAutoscaler"]
assert len(h) == 1 and h[0]["apiVersion"] == "autoscaling/v2", h
s = h[0]["spec"]
assert s["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "r-sluice"}, s
assert s["minReplicas"] == 3 and s["maxReplicas"] == 9, s
assert s["metrics"] == [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}], s
assert [x for x in ds if x["kind"] == "PodDisruptionBudget"]
' "$work/hpa.yaml" || return 1
    done
    t --set autoscaling.enabled=true --set autoscaling.targetCPUUtilizationPercentage=null \
        --set autoscaling.targetMemoryUtilizationPercentage=80 | grep -q 'name: memory' || return 1
    t | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
assert [x for x in ds if x["kind"] == "Deployment"][0]["spec"]["replicas"] == 2
assert not [x for x in ds if x["kind"] == "HorizontalPodAutoscaler"]
'
}
check "autoscaling: an autoscaling/v2 HPA on the Deployment, which then sets no replicas; the PDB stays; none by default" autoscaling
refuse "template refuses autoscaling.minReplicas above maxReplicas" \
    t --set autoscaling.enabled=true --set autoscaling.minReplicas=5 --set autoscaling.maxReplicas=3
refuse "template refuses autoscaling with no target utilization" \
    t --set autoscaling.enabled=true --set autoscaling.targetCPUUtilizationPercentage=null
refuse "template refuses autoscaling on CPU when the sluice container requests no CPU" \
    t --set autoscaling.enabled=true --set resources.requests.cpu=null
refuse "template refuses autoscaling on CPU when the sidecar Envoy requests no CPU" \
    t -f "$CHART/examples/sidecar.yaml" --set autoscaling.enabled=true --set sidecar.envoy.resources.requests.cpu=null
refuse "template refuses autoscaling in mode helpers (no Deployment of its own)" \
    t --set mode=helpers --set autoscaling.enabled=true
refuse "schema refuses autoscaling.minReplicas 0" t --set autoscaling.enabled=true --set autoscaling.minReplicas=0
notes_autoscaling() {
    local n
    n=$(notes --set replicaCount=1 --set autoscaling.enabled=true --set autoscaling.minReplicas=1 --set autoscaling.maxReplicas=4) || return 1
    echo "$n"
    grep -q 'up to 4 x N' <<<"$n" || return 1
    n=$(notes --set replicaCount=1) && ! grep -q 'replicas keep counters' <<<"$n"
}
check "NOTES: with autoscaling and in-memory counters, the per-pod warning counts up to maxReplicas" notes_autoscaling
check "failureMode: local is passed as --failure-mode=local" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set failureMode=local | grep -q -- '- --failure-mode=local'"
check "sidecar: sluice gRPC on loopback, Service exposes Envoy" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t -f $CHART/examples/sidecar.yaml | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
d = [x for x in ds if x[\"kind\"] == \"Deployment\"][0]
cs = {c[\"name\"]: c for c in d[\"spec\"][\"template\"][\"spec\"][\"containers\"]}
assert set(cs) == {\"sluice\", \"envoy\"}, cs.keys()
assert \"--grpc-addr=127.0.0.1:8081\" in cs[\"sluice\"][\"args\"]
s = [x for x in ds if x[\"kind\"] == \"Service\"][0]
assert any(p[\"targetPort\"] == \"envoy\" for p in s[\"spec\"][\"ports\"])
'"
# preStopSleepSeconds keeps the pod serving while its endpoints are removed; in
# sidecar mode the pod serves through Envoy, which exits at once on SIGTERM.
check "sidecar: preStopSleepSeconds holds Envoy's SIGTERM too" bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
t -f $CHART/examples/sidecar.yaml --set preStopSleepSeconds=5 | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
cs = {c[\"name\"]: c for c in d[\"spec\"][\"template\"][\"spec\"][\"containers\"]}
for n in (\"sluice\", \"envoy\"):
    assert cs[n].get(\"lifecycle\") == {\"preStop\": {\"sleep\": {\"seconds\": 5}}}, (n, cs[n].get(\"lifecycle\"))
'
! t -f $CHART/examples/sidecar.yaml | grep -q preStop"
check "sidecar: Envoy's failure_mode_deny follows failureMode unless set" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
deny() { t -f $CHART/examples/sidecar.yaml \"\$@\" | grep -o 'failure_mode_deny: [a-z]*'; }
set -e
[ \"\$(deny)\" = 'failure_mode_deny: false' ]
[ \"\$(deny --set failureMode=closed)\" = 'failure_mode_deny: true' ]
[ \"\$(deny --set failureMode=closed --set sidecar.envoy.failureModeDeny=false)\" = 'failure_mode_deny: false' ]
[ \"\$(deny --set sidecar.envoy.failureModeDeny=true)\" = 'failure_mode_deny: true' ]"

# An IPv6-only or IPv6-first cluster sends the Service's traffic to the pod's IPv6
# address: the sidecar Envoy's listener must take both families, as sluice's ports do.
sidecar_envoy_families() {
    local ports listen admin pid code4="" code6 deadline
    ports=$(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
    read -r listen admin <<<"$ports"
    t -f "$CHART/examples/sidecar.yaml" --set sidecar.envoy.listenerPort="$listen" \
        --set sidecar.envoy.adminPort="$admin" --set sidecar.envoy.upstream.host=127.0.0.1 \
        --show-only templates/envoy-sidecar-config.yaml |
        python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["envoy.yaml"])' >"$work/sidecar-envoy.yaml" || return 1
    "$ENVOY" -c "$work/sidecar-envoy.yaml" --use-dynamic-base-id --log-level warn >"$work/sidecar-envoy.log" 2>&1 &
    pid=$!
    deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ] && kill -0 "$pid" 2>/dev/null; do
        code4=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$listen/" || true)
        [ "$code4" != 000 ] && break
        sleep 0.2
    done
    code6=$(curl -s -o /dev/null -w '%{http_code}' "http://[::1]:$listen/" || true)
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "IPv4: $code4, IPv6: $code6"
    [ "$code4" != 000 ] && [ -n "$code4" ] && [ "$code6" != 000 ] && [ -n "$code6" ]
}
if [ -n "$ENVOY" ]; then
    check "sidecar: the real Envoy's listener takes IPv4 and IPv6 connections" sidecar_envoy_families
else
    skipped SLUICE_REQUIRE_TOOLS "envoy not installed: sidecar listener families not checked"
fi
check "tls.grpc from Envoy Gateway's Secret: cert, key and client CA flags on the mounted Secret" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t -f $CHART/examples/envoy-gateway-mtls.yaml | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
d = [x for x in ds if x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]
for f in (\"cert=/etc/sluice/tls/grpc/tls.crt\", \"key=/etc/sluice/tls/grpc/tls.key\", \"client-ca=/etc/sluice/tls/grpc/ca.crt\"):
    assert \"--grpc-tls-\" + f in c[\"args\"], c[\"args\"]
assert not any(a.startswith(\"--http-tls\") for a in c[\"args\"])
assert {\"name\": \"sluice-tls-grpc\", \"mountPath\": \"/etc/sluice/tls/grpc\", \"readOnly\": True} in c[\"volumeMounts\"]
assert {\"name\": \"sluice-tls-grpc\", \"secret\": {\"secretName\": \"envoy-rate-limit\"}} in p[\"volumes\"]
assert c[\"readinessProbe\"][\"httpGet\"] == {\"path\": \"/readyz\", \"port\": \"http\"}
assert not [x for x in ds if x[\"kind\"] == \"Certificate\"]
'"
check "extraVolumes and extraVolumeMounts: a Secret for Redis TLS in the pod and the sluice container, beside the chart's own" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
cat >'$work/extra-volumes.yaml' <<'YAML'
redis:
  urls: [\"rediss://redis.data:6380?tls_ca=/etc/sluice/redis-tls/ca.crt\"]
extraVolumes: [{name: redis-tls, secret: {secretName: redis-tls}}]
extraVolumeMounts: [{name: redis-tls, mountPath: /etc/sluice/redis-tls, readOnly: true}]
YAML
t -f '$work/extra-volumes.yaml' >'$work/extra-volumes-render.yaml'
python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' --external-secret redis-tls '$work/extra-volumes-render.yaml'
python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x and x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]
assert c[\"volumeMounts\"] == [{\"name\": \"redis-tls\", \"mountPath\": \"/etc/sluice/redis-tls\", \"readOnly\": True}], c[\"volumeMounts\"]
assert p[\"volumes\"] == [{\"name\": \"redis-tls\", \"secret\": {\"secretName\": \"redis-tls\"}}], p[\"volumes\"]
assert \"--redis=rediss://redis.data:6380?tls_ca=/etc/sluice/redis-tls/ca.crt\" in c[\"args\"], c[\"args\"]
' '$work/extra-volumes-render.yaml'
t -f $CHART/examples/sidecar.yaml --set-json 'extraVolumes=[{\"name\":\"x\",\"emptyDir\":{}}]' \
    --set-json 'extraVolumeMounts=[{\"name\":\"x\",\"mountPath\":\"/x\"}]' | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; cs = {c[\"name\"]: c for c in p[\"containers\"]}
assert {\"name\": \"x\", \"mountPath\": \"/x\"} in cs[\"sluice\"][\"volumeMounts\"], cs[\"sluice\"]
assert [v[\"name\"] for v in p[\"volumes\"]].count(\"x\") == 1 and \"envoy-config\" in [v[\"name\"] for v in p[\"volumes\"]], p[\"volumes\"]
'"
check "metrics.compat: --prometheus-addr, a metrics-compat container and Service port; none by default" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
t --set metrics.compat.enabled=true --set metrics.compat.port=19001 --api-versions monitoring.coreos.com/v1 --set serviceMonitor.enabled=true | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
d = [x for x in ds if x[\"kind\"] == \"Deployment\"][0]
c = d[\"spec\"][\"template\"][\"spec\"][\"containers\"][0]
assert \"--prometheus-addr=[::]:19001\" in c[\"args\"], c[\"args\"]
assert {\"name\": \"metrics-compat\", \"containerPort\": 19001, \"protocol\": \"TCP\"} in c[\"ports\"], c[\"ports\"]
s = [x for x in ds if x[\"kind\"] == \"Service\" and x[\"metadata\"][\"name\"] == \"r-sluice\"][0]
assert {\"name\": \"metrics-compat\", \"port\": 19001, \"targetPort\": \"metrics-compat\", \"protocol\": \"TCP\"} in s[\"spec\"][\"ports\"], s
sm = [x for x in ds if x[\"kind\"] == \"ServiceMonitor\"][0]
assert [e[\"port\"] for e in sm[\"spec\"][\"endpoints\"]] == [\"http\"], sm
'
t -f $CHART/examples/sidecar.yaml --set metrics.compat.enabled=true | grep -q 'name: metrics-compat'
! t | grep -q -e '--prometheus-addr' -e 'metrics-compat'"
check "xds from Envoy Gateway: --xds-server, node id envoy-ratelimit, TLS files from the mounted Secret; no --kube" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t -f $CHART/examples/envoy-gateway-xds.yaml | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
d = [x for x in ds if x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]; a = c[\"args\"]
for f in (\"--xds-server=https://envoy-gateway.envoy-gateway-system.svc.cluster.local:18001\", \"--xds-node-id=envoy-ratelimit\",
          \"--xds-tls-ca=/etc/sluice/tls/xds/ca.crt\", \"--xds-tls-cert=/etc/sluice/tls/xds/tls.crt\", \"--xds-tls-key=/etc/sluice/tls/xds/tls.key\",
          \"--response-headers=auto\"):
    assert f in a, (f, a)
assert \"--kube\" not in a and not [x for x in a if x.startswith((\"--config\", \"--xds-tls-server-name\"))], a
assert {\"name\": \"sluice-tls-xds\", \"mountPath\": \"/etc/sluice/tls/xds\", \"readOnly\": True} in c[\"volumeMounts\"]
assert {\"name\": \"sluice-tls-xds\", \"secret\": {\"secretName\": \"envoy-rate-limit\"}} in p[\"volumes\"]
assert p[\"automountServiceAccountToken\"] is False
'"
check "xds over plain HTTP alone: --xds-server and --xds-node-id, no TLS flags or volume; xds.tls.serverName passed" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
set -e
t --set kube.enabled=false --set xds.server=http://eg.eg:18000 --set xds.nodeId=n1 | python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(sys.stdin) if x and x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]; a = c[\"args\"]
assert \"--xds-server=http://eg.eg:18000\" in a and \"--xds-node-id=n1\" in a, a
assert not [x for x in a if x.startswith(\"--xds-tls\")], a
assert \"volumeMounts\" not in c and \"volumes\" not in p, (c, p)
'
t --set kube.enabled=false --set xds.server=https://eg.eg:18001 --set xds.tls.existingSecret=s --set xds.tls.serverName=eg | grep -q -- '- --xds-tls-server-name=eg'
! t | grep -q -- '--xds-'"
check "tls with cert-manager: a Certificate per port, HTTPS probes, ServiceMonitor over HTTPS" \
    bash -c "$(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t -f $CHART/examples/tls-cert-manager.yaml --namespace sluice --api-versions monitoring.coreos.com/v1 | python3 -c '
import sys, yaml
ds = [x for x in yaml.safe_load_all(sys.stdin) if x]
certs = {x[\"metadata\"][\"name\"]: x[\"spec\"] for x in ds if x[\"kind\"] == \"Certificate\"}
assert set(certs) == {\"r-sluice-grpc\", \"r-sluice-http\"}, certs.keys()
assert certs[\"r-sluice-grpc\"][\"secretName\"] == \"r-sluice-grpc-tls\"
assert \"r-sluice.sluice.svc\" in certs[\"r-sluice-grpc\"][\"dnsNames\"], certs[\"r-sluice-grpc\"][\"dnsNames\"]
assert certs[\"r-sluice-http\"][\"issuerRef\"][\"name\"] == \"sluice-ca\"
d = [x for x in ds if x[\"kind\"] == \"Deployment\"][0]
p = d[\"spec\"][\"template\"][\"spec\"]; c = p[\"containers\"][0]
assert \"--grpc-tls-client-ca=/etc/sluice/tls/grpc/ca.crt\" in c[\"args\"]
assert \"--http-tls-cert=/etc/sluice/tls/http/tls.crt\" in c[\"args\"]
assert not any(a.startswith(\"--http-tls-client-ca\") for a in c[\"args\"])
vols = {v[\"name\"]: v for v in p[\"volumes\"]}
assert vols[\"sluice-tls-http\"][\"secret\"][\"secretName\"] == \"r-sluice-http-tls\"
for probe in (\"livenessProbe\", \"readinessProbe\"):
    assert c[probe][\"httpGet\"][\"scheme\"] == \"HTTPS\", c[probe]
sm = [x for x in ds if x[\"kind\"] == \"ServiceMonitor\"][0][\"spec\"][\"endpoints\"][0]
assert sm[\"scheme\"] == \"https\" and sm[\"tlsConfig\"][\"ca\"][\"secret\"] == {\"name\": \"r-sluice-http-tls\", \"key\": \"ca.crt\"}
'"

# The notes point STRICT_DNS clusters at <headless>.<ns>.svc: a client that verifies
# the server's name against that must find it (and its pods' names) in the certificate.
cert_names_notes() {
    local name
    t -f "$CHART/examples/tls-cert-manager.yaml" --namespace sluice >"$work/cert-names.yaml" || return 1
    name=$(notes -f "$CHART/examples/tls-cert-manager.yaml" --namespace sluice | grep -o '[a-z0-9.-]*-headless[a-z0-9.-]*' | head -n 1)
    [ -n "$name" ] || { echo "no headless name in the notes"; return 1; }
    python3 -c '
import sys, yaml
name = sys.argv[2]
ds = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
for c in [x for x in ds if x["kind"] == "Certificate"]:
    dns = c["spec"]["dnsNames"]
    for want in (name, name.split(".")[0], ".".join(name.split(".")[:2]), name + ".cluster.local",
                 "*." + name, "*." + name + ".cluster.local"):
        assert want in dns, (c["metadata"]["name"], want, dns)
' "$work/cert-names.yaml" "$name"
}
check "cert-manager default dnsNames cover the headless name the notes give (<headless>.<ns>.svc), short forms and pods'" cert_names_notes

# With tls.http.clientCA Prometheus must present a client certificate the port takes:
# a server certificate without the client auth usage is refused. The ServiceMonitor's
# tlsConfig is followed with curl against the real sluice, each Secret it names made
# of files: srv (the port's: server auth only) and prom (a client certificate).
servicemonitor_client_cert() {
    local d="$work/sm-tls" port pid code=000 sm name ca cert keyfile
    mkdir -p "$d/srv" "$d/prom"
    key() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1" -out "$2" -subj "/CN=$3" 2>/dev/null; }
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/ca.key" -out "$d/srv/ca.crt" -subj /CN=ca \
        -days 2 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign 2>/dev/null || return 1
    key "$d/srv/tls.key" "$d/srv.csr" sluice && openssl x509 -req -in "$d/srv.csr" -CA "$d/srv/ca.crt" -CAkey "$d/ca.key" \
        -CAcreateserial -out "$d/srv/tls.crt" -days 2 \
        -extfile <(printf 'subjectAltName=DNS:r-sluice.sluice.svc\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n') 2>/dev/null || return 1
    key "$d/prom/tls.key" "$d/prom.csr" prometheus && openssl x509 -req -in "$d/prom.csr" -CA "$d/srv/ca.crt" -CAkey "$d/ca.key" \
        -CAcreateserial -out "$d/prom/tls.crt" -days 2 \
        -extfile <(printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n') 2>/dev/null || return 1
    t --namespace sluice --api-versions monitoring.coreos.com/v1 --set serviceMonitor.enabled=true --set tls.http.enabled=true \
        --set tls.http.existingSecret=srv --set tls.http.clientCA=true --set serviceMonitor.clientCertSecret=prom \
        --set-json 'livenessProbe={"grpc":{"port":8081}}' --set-json 'readinessProbe={"grpc":{"port":8081}}' >"$d/render.yaml" || return 1
    python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" --external-secret srv "$d/render.yaml" || return 1
    # The ServiceMonitor's tlsConfig as curl arguments: SECRET/KEY paths and the server name.
    sm=$(python3 -c '
import sys, yaml
sm = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x and x["kind"] == "ServiceMonitor"][0]
c = sm["spec"]["endpoints"][0]["tlsConfig"]
f = lambda s: "%s/%s" % (s["name"], s["key"])
print(c["serverName"], f(c["ca"]["secret"]), f(c["cert"]["secret"]), f(c["keySecret"]))
' "$d/render.yaml") || return 1
    read -r name ca cert keyfile <<<"$sm"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    printf 'domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n' >"$d/p.yaml"
    "$SLUICE" serve --grpc-addr 127.0.0.1:0 --http-addr "127.0.0.1:$port" --admin-addr off --config "$d/p.yaml" \
        --http-tls-cert "$d/srv/tls.crt" --http-tls-key "$d/srv/tls.key" --http-tls-client-ca "$d/srv/ca.crt" >"$d/log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --resolve "$name:$port:127.0.0.1" --cacert "$d/$ca" \
            --cert "$d/$cert" --key "$d/$keyfile" "https://$name:$port/metrics" || true)
        [ "$code" = 200 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "scrape of https://$name with ca $ca, cert $cert, key $keyfile: $code"
    [ "$code" = 200 ]
}
check "serviceMonitor.clientCertSecret: the real sluice with tls.http.clientCA takes the client certificate the ServiceMonitor presents" servicemonitor_client_cert

# --- the helper template from a parent chart ----------------------------------------
parent="$work/parent"
mkdir -p "$parent/templates" "$parent/charts"
cp -r "$CHART" "$parent/charts/sluice"
cat >"$parent/Chart.yaml" <<'YAML'
apiVersion: v2
name: shop
version: 1.0.0
YAML
cat >"$parent/values.yaml" <<'YAML'
sluice:
  mode: helpers
  kube: {enabled: false}
  extraVolumes: [{name: certs, emptyDir: {}}]
  extraVolumeMounts: [{name: certs, mountPath: /certs, readOnly: true}]
  policies:
    shop.yaml: |
      domain: shop
      descriptors:
        - key: remote_address
          rate_limit: {unit: second, requests_per_unit: 10}
YAML
cat >"$parent/templates/deployment.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-gateway
spec:
  selector:
    matchLabels: {app: gateway}
  template:
    metadata:
      labels: {app: gateway}
    spec:
      serviceAccountName: {{ include "sluice.serviceAccountNameFor" (dict "root" . "values" .Values.sluice) }}
      automountServiceAccountToken: {{ .Values.sluice.kube.enabled }}
      containers:
        - name: envoy
          image: envoyproxy/envoy:v1.33-latest
          ports: [{name: http, containerPort: 10000}]
        {{- include "sluice.container" (dict "root" . "values" .Values.sluice) | nindent 8 }}
      volumes:
        {{- include "sluice.volumes" (dict "root" . "values" .Values.sluice) | nindent 8 }}
YAML
if "$HELM" template shop "$parent" --kube-version "$K8S_VERSION" >"$work/parent.yaml" 2>"$work/err"; then
    ok "parent chart renders with include \"sluice.container\" (mode: helpers)"
    check "parent chart objects valid; sluice sidecar mounts the subchart's policies ConfigMap and extraVolumes" bash -c "
        python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' '$work/parent.yaml' &&
        grep -q 'mountPath: /certs' '$work/parent.yaml' && grep -q 'emptyDir: {}' '$work/parent.yaml'"
    check "parent chart: no sluice Deployment or Service of its own; sidecar gRPC on loopback" bash -c "
        ! grep -q 'name: shop-sluice\$' <(grep -A2 -E '^kind: (Deployment|Service)\$' '$work/parent.yaml') &&
        grep -q -- '--grpc-addr=127.0.0.1:8081' '$work/parent.yaml'"
    # kube.enabled is the default: the sidecar then watches RateLimitPolicies, as the
    # subchart's ServiceAccount, which its RBAC binds.
    check "parent chart with kube.enabled: the pod runs as the subchart's ServiceAccount, with its token" bash -c "
        '$HELM' template shop '$parent' --kube-version '$K8S_VERSION' --set sluice.kube.enabled=true >'$work/parent-kube.yaml' &&
        python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' '$work/parent-kube.yaml'"
    # The pod mounts the Secret of tls.http's Certificate: the chart must render it.
    check "parent chart with tls.http from cert-manager: the Certificate the pod's Secret comes from, for the dnsNames given" bash -c "
        '$HELM' template shop '$parent' --kube-version '$K8S_VERSION' --set sluice.tls.http.enabled=true \
            --set sluice.tls.http.certManager.enabled=true --set sluice.tls.http.certManager.issuerRef.name=ca \
            --set 'sluice.tls.http.certManager.dnsNames={shop-gateway.default.svc}' >'$work/parent-tls.yaml' &&
        python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' '$work/parent-tls.yaml' &&
        grep -q -- '- shop-gateway.default.svc' '$work/parent-tls.yaml'"
    check "parent chart with tls.http from cert-manager and no dnsNames is refused, saying why" bash -c "
        ! '$HELM' template shop '$parent' --kube-version '$K8S_VERSION' --set sluice.tls.http.enabled=true \
            --set sluice.tls.http.certManager.enabled=true --set sluice.tls.http.certManager.issuerRef.name=ca \
            >/dev/null 2>'$work/parent-tls.err' && grep -q 'tls.http.certManager.dnsNames' '$work/parent-tls.err'"
else
    bad "parent chart renders with include \"sluice.container\""; sed 's/^/    /' "$work/err"
fi

# --- values that must be refused ----------------------------------------------------
refuse "schema refuses replicaCount: two" t --set replicaCount=two
refuse "schema refuses an unknown top-level key" t --set replicas=3
refuse "schema refuses failureMode: maybe" t --set failureMode=maybe
refuse "schema refuses sidecar.envoy.failureModeDeny: maybe" t --set sidecar.envoy.failureModeDeny=maybe
refuse "schema refuses a policies file not named *.yaml" t --set-string 'policies.api\.txt=domain: a'
refuse "schema refuses a malformed storeTimeout" t --set-string storeTimeout=15
refuse "schema refuses a storeTimeout in an unknown unit" t --set-string storeTimeout=1w
refuse "schema refuses a storeTimeout of a bare dot" t --set-string storeTimeout=.ms
refuse "schema refuses a storeTimeout of 0s (--store-timeout must be longer than zero)" t --set-string storeTimeout=0s
refuse "schema refuses a malformed reloadInterval" t --set-string reloadInterval=2.5
refuse "schema refuses an rlqs.assignmentTtl of less than a whole second" t --set-string rlqs.assignmentTtl=500ms
refuse "schema refuses an rlqs.assignmentTtl of 0s" t --set-string rlqs.assignmentTtl=0s
refuse "schema refuses a malformed rlqs.abandonAfter" t --set-string rlqs.abandonAfter=60
refuse "schema refuses a reloadInterval of 0s (--reload-interval must be longer than zero)" t --set-string reloadInterval=0s
refuse "schema refuses a reloadInterval of 0.0ms0s" t --set-string reloadInterval=0.0ms0s
refuse "schema refuses an rlqs.assignmentTtl of 0d" t --set-string rlqs.assignmentTtl=0d
refuse "schema refuses an rlqs.assignmentTtl under Envoy's 5 s between reports" t --set-string rlqs.assignmentTtl=4s
check "rlqs.assignmentTtl: 1d and reloadInterval: 0.5s render in the flags' syntax" bash -c "
    $(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
    out=\$(t --set-string rlqs.assignmentTtl=1d --set-string reloadInterval=0.5s) &&
    grep -q -- '- --rlqs-assignment-ttl=1d' <<<\"\$out\" && grep -q -- '- --reload-interval=0.5s' <<<\"\$out\""
refuse "template refuses ports.grpc equal to ports.http" t --set ports.grpc=8080
refuse "template refuses ports.admin equal to ports.http" t --set ports.admin=8080
refuse "template refuses ports.grpc equal to ports.admin" t --set ports.grpc=8082
refuse "template refuses sluice's http port on the sidecar Envoy's listener port" \
    t -f "$CHART/examples/sidecar.yaml" --set ports.http=10000
check "ports.admin may reuse a port while the admin API is off" t --set admin.enabled=false --set ports.admin=8080
# An IPv6 admin.address joined to the port without brackets (`:::8082`) is no
# address sluice takes: the pod would crash-loop.
admin_ipv6() {
    local a want
    for a in :: ::1 '[::1]' 0.0.0.0; do
        want=$a
        case $a in *:*) want="[${a#[}"; want="${want%]}]" ;; esac
        t --set "admin.address=$a" >"$work/admin.yaml" || return 1
        grep -qF -- "- --admin-addr=$want:8082" "$work/admin.yaml" ||
            { echo "admin.address=$a: $(grep -- --admin-addr "$work/admin.yaml")"; return 1; }
        sluice_takes_args "$work/admin.yaml" || return 1
    done
}
check "admin.address ::, ::1, [::1] or 0.0.0.0: an --admin-addr sluice takes" admin_ipv6
check "a port collision is named in the message" bash -c "
    $(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION' t --set ports.grpc=8080 2>&1 >/dev/null |
        grep -q 'ports.grpc and ports.http are both port 8080'"
refuse "template refuses redis.urls together with redis.bundled" \
    t --set 'redis.urls[0]=redis://a:6379' --set redis.bundled.enabled=true
refuse "template refuses redis.sentinel.urls together with redis.urls" \
    t --set 'redis.urls[0]=redis://a:6379' --set 'redis.sentinel.urls[0]=redis://s:26379' --set 'redis.sentinel.masters[0]=m'
refuse "schema refuses a redis.bundled.maxmemory in Redis's own units (1gb)" t --set redis.bundled.enabled=true --set-string redis.bundled.maxmemory=1gb
refuse "template refuses redis.sentinel.urls without masters" t --set 'redis.sentinel.urls[0]=redis://s:26379'
refuse "template refuses redis.sentinel.masters without sentinels" t --set 'redis.sentinel.masters[0]=m'
refuse "schema refuses a sentinel URL that is not redis:// or rediss://" \
    t --set 'redis.sentinel.urls[0]=s:26379' --set 'redis.sentinel.masters[0]=m'
refuse "template refuses no policy source (kube off, no policies)" t --set kube.enabled=false
refuse "template refuses an https:// xds.server without xds.tls.existingSecret" \
    t --set kube.enabled=false --set xds.server=https://eg.eg:18001
refuse "template refuses xds.tls.existingSecret with an http:// xds.server" \
    t --set xds.server=http://eg.eg:18000 --set xds.tls.existingSecret=s
refuse "template refuses xds.tls.existingSecret without xds.server" t --set xds.tls.existingSecret=s
refuse "schema refuses an xds.server without a port" t --set kube.enabled=false --set xds.server=http://eg.eg
refuse "schema refuses an xds.server with a path" t --set kube.enabled=false --set xds.server=http://eg.eg:18000/x
refuse "schema refuses an empty xds.nodeId" t --set xds.server=http://eg.eg:18000 --set-string xds.nodeId=
refuse "schema refuses an unknown xds field" t --set xds.node=n
refuse "schema refuses an extraVolumes entry without a name" t --set-json 'extraVolumes=[{"emptyDir":{}}]'
refuse "schema refuses an extraVolumeMounts entry without a mountPath" t --set-json 'extraVolumeMounts=[{"name":"x"}]'
refuse "schema refuses extraVolumes that is not a list" t --set-json 'extraVolumes={"name":"x"}'
refuse "template refuses metrics.compat.port on the http port" t --set metrics.compat.enabled=true --set metrics.compat.port=8080
refuse "template refuses metrics.compat.port on the sidecar Envoy's admin port" \
    t -f "$CHART/examples/sidecar.yaml" --set metrics.compat.enabled=true --set metrics.compat.port=9901
refuse "schema refuses metrics.compat.port 0" t --set metrics.compat.enabled=true --set metrics.compat.port=0
refuse "schema refuses an unknown metrics field" t --set metrics.port=9090
refuse "template refuses shutdownGraceSeconds >= terminationGracePeriodSeconds" t --set shutdownGraceSeconds=30
# The kubelet's grace period runs from the preStop hook: the sleep, then sluice's 2 s
# --drain-delay and --shutdown-grace must all fit in it, or in-flight calls are killed.
refuse "template refuses preStopSleepSeconds + drain delay + shutdownGraceSeconds past the grace period (15 + 2 + 20 > 30)" \
    t --set preStopSleepSeconds=15
refuse "template refuses shutdownGraceSeconds 28 of 30 (the 2 s drain delay comes first)" t --set shutdownGraceSeconds=28
# The chart takes Kubernetes from 1.25; the preStop sleep action is served from 1.30.
check "preStopSleepSeconds on Kubernetes 1.29 is refused, saying why; without it 1.25 renders valid manifests" bash -c "
    ! '$HELM' template r '$CHART' --kube-version 1.29.0 --set preStopSleepSeconds=5 >/dev/null 2>'$work/prestop.err' &&
    grep -q 'preStopSleepSeconds needs Kubernetes 1.30' '$work/prestop.err' &&
    '$HELM' template r '$CHART' --kube-version 1.25.0 >'$work/k125.yaml' &&
    python3 scripts/check-manifests.py --k8s-version 1.25.0 '$work/k125.yaml'"
check "preStopSleepSeconds 7 + 2 + shutdownGraceSeconds 20 fits 30; the message names the three" bash -c "
    $(declare -f t); HELM='$HELM' CHART='$CHART' K8S_VERSION='$K8S_VERSION'
    t --set preStopSleepSeconds=7 | grep -q -A2 'preStop:' &&
    t --set preStopSleepSeconds=15 2>&1 >/dev/null | grep -q 'preStopSleepSeconds (15) + 2 s of --drain-delay + shutdownGraceSeconds (20)'"
refuse "template refuses tls.grpc.enabled without a Secret or a Certificate" t --set tls.grpc.enabled=true
refuse "template refuses tls.grpc with both existingSecret and certManager" \
    t --set tls.grpc.enabled=true --set tls.grpc.existingSecret=s --set tls.grpc.certManager.enabled=true \
    --set tls.grpc.certManager.issuerRef.name=ca
refuse "template refuses a cert-manager Certificate without an issuer" \
    t --set tls.http.enabled=true --set tls.http.certManager.enabled=true
refuse "template refuses tls.http.clientCA with httpGet probes (the kubelet has no client certificate)" \
    t --set tls.http.enabled=true --set tls.http.existingSecret=s --set tls.http.clientCA=true
# The remedy the message and values.yaml give: probes with another handler. Helm
# merges them into the default httpGet; a probe with two handlers is refused by the
# API server.
grpc_probes() {
    cat >"$work/grpc-probes.yaml" <<'YAML'
livenessProbe: {grpc: {port: 8081}}
readinessProbe: {grpc: {port: 8081}, periodSeconds: 5}
YAML
    local extra
    for extra in '' '--set tls.http.enabled=true --set tls.http.existingSecret=s --set tls.http.clientCA=true'; do
        # shellcheck disable=SC2086
        t -f "$work/grpc-probes.yaml" $extra >"$work/grpc-probes-render.yaml" || return 1
        python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" --external-secret s "$work/grpc-probes-render.yaml" || return 1
        python3 -c '
import sys, yaml
d = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x and x["kind"] == "Deployment"][0]
c = d["spec"]["template"]["spec"]["containers"][0]
assert c["livenessProbe"] == {"grpc": {"port": 8081}, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3}, c["livenessProbe"]
assert c["readinessProbe"] == {"grpc": {"port": 8081}, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 2}, c["readinessProbe"]
' "$work/grpc-probes-render.yaml" || return 1
    done
}
check "probes given as grpc replace the default httpGet (one handler each), with tls.http.clientCA too" grpc_probes
refuse "template refuses tls.grpc in sidecar mode (Envoy calls over loopback)" \
    t -f "$CHART/examples/sidecar.yaml" --set tls.grpc.enabled=true --set tls.grpc.existingSecret=s
refuse "schema refuses an unknown tls field" t --set tls.grpc.secret=s
refuse "template refuses serviceMonitor.clientCertSecret without tls.http.clientCA" \
    t --set serviceMonitor.clientCertSecret=prom --set tls.http.enabled=true --set tls.http.existingSecret=s

# --- plain manifests --------------------------------------------------------------
if [ -d deploy/kubernetes ]; then
    for f in deploy/kubernetes/*.yaml; do
        check "$f: valid against Kubernetes $K8S_VERSION schemas + cross-checks" \
            python3 scripts/check-manifests.py --k8s-version "$K8S_VERSION" --allow-kind RateLimitPolicy \
            --extract-policies "$work/plain-policies" "$f"
        if grep -q -- '- serve$' "$f"; then
            check "$f: sluice takes its args" sluice_takes_args "$f"
        fi
    done
    if [ -d "$work/plain-policies" ]; then
        check "deploy/kubernetes policies ConfigMap loads with sluice validate" "$SLUICE" validate "$work/plain-policies"
    fi
fi

# --- tests/e2e/kind.sh (not run here: it needs a container engine) ------------------
check "tests/e2e/kind.sh parses (bash -n)" bash -n tests/e2e/kind.sh
check "tests/e2e/kind.sh's helm values render and validate" bash -c "
    '$HELM' template sluice '$CHART' --namespace sluice --kube-version '$K8S_VERSION' --include-crds \
        --set image.repository=sluice --set image.tag=e2e --set image.pullPolicy=Never \
        --set replicaCount=2 --set redis.bundled.enabled=true --set logFormat=text >'$work/kind-chart.yaml' &&
    grep -q 'name: sluice-headless' '$work/kind-chart.yaml' &&
    python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' '$work/kind-chart.yaml'"
check "tests/e2e/kind/ manifests valid; its policy loads with sluice validate" bash -c "
    python3 scripts/check-manifests.py --k8s-version '$K8S_VERSION' --external-configmap envoy \
        tests/e2e/kind/echo.yaml tests/e2e/kind/envoy.yaml && '$SLUICE' validate tests/e2e/kind/policy.yaml"

# --- a real (CRD-only) API server ----------------------------------------------------
crd=$CHART/crds/ratelimitpolicies.yaml
apiserver_dir="$work/apiserver"
if bash scripts/kube-apiserver.sh start "$apiserver_dir" >"$work/apiserver-start.log" 2>&1; then
    # shellcheck disable=SC1091
    . "$apiserver_dir/env"
    check "kubectl apply --dry-run=server: the chart's CRD" "$KUBECTL" apply --dry-run=server -f "$crd"
    "$KUBECTL" apply -f "$crd" >/dev/null 2>&1
    "$KUBECTL" wait --for condition=established --timeout=30s crd/ratelimitpolicies.sluice.dev >/dev/null 2>&1
    "$KUBECTL" create namespace shop --dry-run=client -o yaml >/dev/null 2>&1
    # The API server has no namespaces API: custom resources are dry-run in a
    # namespace it does not check. Core and apps kinds are not served there.
    python3 - examples/policy.yaml deploy/kubernetes/*.yaml deploy/envoy-gateway/sluice-policy.yaml tests/e2e/kind/policy.yaml >"$work/rlp.yaml" <<'PY'
import sys, yaml
out = []
for f in sys.argv[1:]:
    for d in yaml.safe_load_all(open(f)):
        if isinstance(d, dict) and d.get("kind") == "RateLimitPolicy":
            out.append(d)
print(yaml.safe_dump_all(out))
PY
    check "kubectl apply --dry-run=server: RateLimitPolicy resources of examples/ and deploy/" \
        "$KUBECTL" apply --dry-run=server -f "$work/rlp.yaml"
    refuse "API server refuses a RateLimitPolicy with a bad spec" \
        "$KUBECTL" apply --dry-run=server -f tests/e2e/bad-policy.yaml
    # Refused for the bad field, not for a missing file or a dead server.
    grep -q requestsPerUnit "$work/out" ||
        bad "the bad spec was refused for another reason: $(tail -n 1 "$work/out")"
else
    skipped SLUICE_REQUIRE_KUBE "API server dry-run: scripts/kube-apiserver.sh could not start it ($(tail -n 1 "$work/apiserver-start.log"))"
    apiserver_dir=""
fi

echo "==> helm-test done in $(( $(date +%s) - start ))s ($skip skipped)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
