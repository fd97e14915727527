#!/usr/bin/env bash
# Builds the Dockerfile's runtime stage here, where no registry can be reached, and
# runs the image as Envoy Gateway runs its rate limit container.
#
#   scripts/image-test.sh            (scripts/test.sh runs it)
#   SLUICE_BIN=target/release/sluice scripts/image-test.sh
#
# The layers are made locally:
#   - RUNTIME_BASE (distroless/cc-debian12 in a release) is a root made from Debian's
#     own packages, as distroless is: the packages that own the shared libraries the
#     binary loads (`ldd`: libc6, libgcc-s1), ca-certificates (the bundle written as
#     update-ca-certificates writes it), tzdata and netbase, `/etc/passwd` with root,
#     nobody (65534) and nonroot (65532), no shell. `docker import` makes it an image.
#   - BINARY_FROM is an image holding /out as the build stage lays it out: the binary
#     built on this machine (SLUICE_BIN, default target/debug/sluice) at
#     /usr/local/bin/sluice and the /bin/ratelimit link.
# The Dockerfile's own `runtime` stage is then built from them (BuildKit: the unused
# rust build stage is never pulled).
#
# The container runs as Envoy Gateway's Deployment runs it: uid/gid 65534, read-only
# root filesystem, every capability dropped, no new privileges, command
# /bin/ratelimit with Envoy Gateway's environment (the limits over xDS from
# envoy-gateway, here the test xDS server of tools/test-xds; gRPC over TLS; both with
# the certificates mounted at /certs), host networking on loopback ports chosen at
# run time.
# Checks: the image's user and entrypoint; the probes' GET /healthcheck answers OK;
# the limits arrive over xDS; ShouldRateLimit over gRPC and TLS (grpcurl) answers
# 3 OK then OVER_LIMIT; the process runs as 65534 with no capabilities; the root
# filesystem is read-only; the image's size.
# Then as a user runs it: the Dockerfile's `docker run` example (its ports answer
# /healthz, /readyz, POST /json and gRPC; SIGHUP reads an edited policy; `docker stop`
# ends it with status 0), and deploy/kubernetes/sluice.yaml's pod (its args, user and
# security context, probes and ports; its ConfigMap updated by the kubelet's `..data`
# swap; stopped with status 0 within its terminationGracePeriodSeconds).
#
# The Docker engine (Debian's docker.io, installed when missing) is used through a
# daemon of this script's own when none answers on $SLUICE_DOCKER_HOST: started with
# --iptables=false --ip6tables=false --bridge=none (it changes no firewall rule or
# network of the machine, so other tests' namespaces are left alone), its own socket,
# data and exec roots, and stopped on exit.
# Prints PASS/FAIL per check and `N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
pass=0
fail=0
W=$(mktemp -d /tmp/sluice-image-test.XXXXXX)
DROOT=${SLUICE_DOCKER_ROOT:-/var/tmp/sluice-docker}
export DOCKER_HOST=${SLUICE_DOCKER_HOST:-unix://$DROOT/docker.sock}
CONTAINER=sluice-image-test-$$
started_dockerd=""

ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$*"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$*"; }
log() { printf '==> %s\n' "$*"; }
die() { bad "$*"; echo "$pass passed, $fail failed"; exit 1; }
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

cleanup() {
    [ -n "${DOCKER:-}" ] && "$DOCKER" rm -f "$CONTAINER" "$CONTAINER-file" "$CONTAINER-pod" >/dev/null 2>&1
    if [ -n "${xds_pid:-}" ]; then
        kill "$xds_pid" 2>/dev/null
        wait "$xds_pid" 2>/dev/null
    fi
    if [ -n "$started_dockerd" ]; then
        kill "$started_dockerd" 2>/dev/null
        wait "$started_dockerd" 2>/dev/null
    fi
    if [ "$fail" -ne 0 ] || [ -n "${KEEP_E2E_DIR:-}" ]; then echo "(logs kept in $W)"; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the engine --------------------------------------------------------------------
if ! command -v dockerd >/dev/null || [ ! -x /usr/bin/docker ]; then
    log "apt-get install docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends docker.io >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends docker.io >/dev/null; } ||
        die "could not install docker.io"
fi
# docker.io's own client: its BuildKit is built in (a newer CLI elsewhere on PATH
# wants the buildx plugin for it).
DOCKER=/usr/bin/docker
if ! "$DOCKER" version >/dev/null 2>&1; then
    mkdir -p "$DROOT"
    log "dockerd on $DOCKER_HOST (no iptables, no bridge; log: $DROOT/dockerd.log)"
    dockerd --host "$DOCKER_HOST" --data-root "$DROOT/data" --exec-root "$DROOT/exec" \
        --pidfile "$DROOT/dockerd.pid" --iptables=false --ip6tables=false --ip-masq=false \
        --bridge=none --containerd-namespace sluice-test \
        --containerd-plugins-namespace sluice-test-plugins >"$DROOT/dockerd.log" 2>&1 &
    started_dockerd=$!
    wait_for dockerd 60 "$DOCKER" version || { tail -n 20 "$DROOT/dockerd.log"; die "dockerd did not start"; }
fi

# --- tools and the binary ----------------------------------------------------------
PATH="$(go env GOPATH 2>/dev/null)/bin:$PATH"
for cmd in grpcurl curl openssl python3 ldd apt-get dpkg-deb nsenter; do
    command -v "$cmd" >/dev/null || die "$cmd is not installed (grpcurl: scripts/install-tools.sh)"
done
SLUICE=${SLUICE_BIN:-$ROOT/target/debug/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then
    log "cargo build --bin sluice"
    cargo build -q --bin sluice || die "cargo build --bin sluice failed"
fi
[ -x "$SLUICE" ] || die "no sluice binary at $SLUICE"

# --- RUNTIME_BASE: a root from Debian's packages -----------------------------------
# The packages owning every library the binary loads (and the loader itself).
libs=$(ldd "$SLUICE" | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u)
pkgs=$(for l in $libs; do dpkg -S "$(readlink -f "$l")" 2>/dev/null || dpkg -S "$l"; done |
    cut -d: -f1 | sort -u | tr '\n' ' ')
[ -n "$pkgs" ] || die "could not tell which packages hold $SLUICE's libraries"
pkgs="$pkgs ca-certificates tzdata netbase"
mkdir -p "$W/debs" "$W/rootfs"
log "runtime base from Debian's packages: $pkgs"
(cd "$W/debs" && apt-get download $pkgs >"$W/apt.log" 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get download $pkgs >"$W/apt.log" 2>&1; }) ||
    die "apt-get download $pkgs failed (see $W/apt.log)"
for deb in "$W"/debs/*.deb; do dpkg-deb -x "$deb" "$W/rootfs" || die "could not unpack $deb"; done
R=$W/rootfs
# What the packages' scripts would do, and what distroless adds: the CA bundle, the
# users, /tmp; documentation dropped (copyright notices kept).
mkdir -p "$R/etc/ssl/certs" "$R/tmp" "$R/home/nonroot"
find "$R/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z | xargs -0 cat >"$R/etc/ssl/certs/ca-certificates.crt"
[ -s "$R/etc/ssl/certs/ca-certificates.crt" ] || die "no CA certificates in the ca-certificates package"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$R/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$R/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$R/etc/nsswitch.conf"
chmod 1777 "$R/tmp"
chown 65532:65532 "$R/home/nonroot"
rm -rf "${R:?}/usr/share/doc"/*/changelog* "${R:?}/usr/share/man" "${R:?}/usr/share/lintian" "${R:?}/usr/share/locale"
rm -rf "${R:?}/usr/sbin" "${R:?}/usr/bin" "${R:?}/sbin" "${R:?}/bin" # no shell, no tools
mkdir -p "$R/bin"
tar -C "$R" -c . | "$DOCKER" import - sluice-runtime-base:local >/dev/null ||
    die "docker import of the runtime base failed"

# --- BINARY_FROM: /out as the build stage lays it out ------------------------------
mkdir -p "$W/bin/out/usr/local/bin" "$W/bin/out/bin"
cp "$SLUICE" "$W/bin/out/usr/local/bin/sluice"
ln -s /usr/local/bin/sluice "$W/bin/out/bin/ratelimit"
tar -C "$W/bin" -c out | "$DOCKER" import - sluice-binary:local >/dev/null ||
    die "docker import of the binary failed"

# --- the Dockerfile's runtime stage ------------------------------------------------
log "docker build --target runtime (RUNTIME_BASE and BINARY_FROM local)"
if DOCKER_BUILDKIT=1 "$DOCKER" build -q --target runtime \
    --build-arg RUNTIME_BASE=sluice-runtime-base:local --build-arg BINARY_FROM=sluice-binary:local \
    -t sluice:image-test "$ROOT" >"$W/build.log" 2>&1; then
    ok "the Dockerfile's runtime stage builds from local layers"
else
    cat "$W/build.log"
    die "docker build of the runtime stage failed"
fi
cfg=$("$DOCKER" image inspect sluice:image-test --format '{{.Config.User}} {{json .Config.Entrypoint}}')
if [ "$cfg" = '65534:65534 ["/usr/local/bin/sluice"]' ]; then
    ok "the image runs as 65534:65534, entrypoint /usr/local/bin/sluice"
else
    bad "image config: want '65534:65534 [\"/usr/local/bin/sluice\"]', got '$cfg'"
fi
size=$("$DOCKER" image inspect sluice:image-test --format '{{.Size}}')
base=$("$DOCKER" image inspect sluice-runtime-base:local --format '{{.Size}}')
log "image size: $((size / 1000000)) MB ($((base / 1000000)) MB of it the runtime base; binary $(($(stat -c %s "$SLUICE") / 1000000)) MB)"

# --- certificates, as Envoy Gateway's certgen makes them ---------------------------
mkdir -p "$W/certs" "$W/xds"
(
    cd "$W/certs" || exit 1
    leaf() {
        openssl genrsa -traditional -out "$1.key" 2048
        openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
        printf 'subjectAltName=%s\n' "$3" >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
    }
    openssl genrsa -traditional -out ca.key 2048
    openssl req -x509 -new -key ca.key -subj "/CN=envoy-gateway" -days 2 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=keyEncipherment,digitalSignature,keyCertSign" -out ca.crt
    leaf envoy-gateway envoy-gateway "DNS:envoy-gateway"
    leaf tls '*' "DNS:*.envoy-gateway-system,DNS:envoy-ratelimit.envoy-gateway-system"
    chmod 0644 tls.key # the Secret's files are readable by the pod's uid
) >"$W/certs.log" 2>&1 || die "could not make certificates (see $W/certs.log)"
# Envoy Gateway's xDS server: the test xDS server (go-control-plane's snapshot cache
# over ADS and mutual TLS) with one RateLimitConfig.
cat >"$W/xds/image-test.yaml" <<'YAML'
name: image-test
domain: image-test
descriptors:
  - key: tenant
    rate_limit:
      requests_per_unit: 3
      unit: HOUR
YAML
XDS=$(bash scripts/install-test-xds.sh) || die "could not build tools/test-xds"

read -r P_GRPC P_HTTP P_XDS P_CTL < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
"$XDS" -listen "127.0.0.1:$P_XDS" -control "127.0.0.1:$P_CTL" \
    -cert "$W/certs/envoy-gateway.crt" -key "$W/certs/envoy-gateway.key" -ca "$W/certs/ca.crt" \
    "$W/xds/image-test.yaml" >"$W/xds.log" 2>&1 &
xds_pid=$!
wait_for "xDS server" 10 grep -q listening "$W/xds.log" || die "the xDS server did not start"

# --- run it as Envoy Gateway's Deployment does -------------------------------------
# Its environment verbatim (internal/infrastructure/kubernetes/ratelimit/resource.go)
# but for the ports; its Secret at /certs; envoy-gateway resolves to this host.
"$DOCKER" run -d --name "$CONTAINER" --network host --add-host envoy-gateway:127.0.0.1 \
    --user 65534:65534 --read-only --cap-drop ALL --security-opt no-new-privileges \
    -v "$W/certs:/certs:ro" \
    -e RUNTIME_ROOT=/data -e RUNTIME_SUBDIRECTORY=ratelimit -e RUNTIME_IGNOREDOTFILES=true \
    -e RUNTIME_WATCH_ROOT=false -e LOG_LEVEL=info -e USE_STATSD=false \
    -e CONFIG_TYPE=GRPC_XDS_SOTW -e CONFIG_GRPC_XDS_SERVER_URL="envoy-gateway:$P_XDS" \
    -e CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit \
    -e GRPC_SERVER_USE_TLS=true -e GRPC_SERVER_TLS_CERT=/certs/tls.crt \
    -e GRPC_SERVER_TLS_KEY=/certs/tls.key -e GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt \
    -e CONFIG_GRPC_XDS_SERVER_USE_TLS=true -e CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt \
    -e CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key -e CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt \
    -e FORCE_START_WITHOUT_INITIAL_CONFIG=true \
    -e HOST=127.0.0.1 -e PORT="$P_HTTP" -e GRPC_HOST=127.0.0.1 -e GRPC_PORT="$P_GRPC" \
    --entrypoint /bin/ratelimit sluice:image-test >"$W/run.log" 2>&1 ||
    { cat "$W/run.log"; die "docker run failed"; }
logs() { "$DOCKER" logs "$CONTAINER" 2>&1 | tail -n 20; }

if wait_for /healthcheck 30 curl -fsS "http://127.0.0.1:$P_HTTP/healthcheck" &&
    [ "$(curl -sS "http://127.0.0.1:$P_HTTP/healthcheck")" = OK ]; then
    ok "GET /healthcheck (Envoy Gateway's startup, readiness and liveness probe) answers OK"
else
    logs
    die "the container did not become healthy"
fi
if wait_for "the xDS version" 20 sh -c "'$DOCKER' logs '$CONTAINER' 2>&1 | grep -q 'xDS version accepted'"; then
    ok "the limits came over xDS with mutual TLS (the certificates at /certs, envoy-gateway's name)"
else
    logs
    die "no xDS version accepted"
fi

rl() {
    grpcurl -cacert "$W/certs/ca.crt" -servername envoy-ratelimit.envoy-gateway-system \
        -d '{"domain":"image-test","descriptors":[{"entries":[{"key":"tenant","value":"a"}]}]}' \
        "127.0.0.1:$P_GRPC" envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit 2>&1 |
        python3 -c 'import json,sys; print(json.load(sys.stdin).get("overallCode","?"))' 2>/dev/null || echo error
}
codes="$(rl) $(rl) $(rl) $(rl)"
if [ "$codes" = "OK OK OK OVER_LIMIT" ]; then
    ok "ShouldRateLimit over gRPC and TLS (/certs), 3 an hour: $codes"
else
    bad "ShouldRateLimit: want 'OK OK OK OVER_LIMIT', got '$codes'"
    logs
fi

pid=$("$DOCKER" inspect "$CONTAINER" --format '{{.State.Pid}}')
ids=$(awk '/^Uid:|^Gid:/ {print $2}' "/proc/$pid/status" 2>/dev/null | tr '\n' ' ')
caps=$(awk '/^CapEff:|^CapPrm:|^CapBnd:/ {print $2}' "/proc/$pid/status" 2>/dev/null | sort -u | tr '\n' ' ')
comm=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
if [ "$ids" = "65534 65534 " ] && [ "$caps" = "0000000000000000 " ] && [ "$comm" = "/bin/ratelimit " ]; then
    ok "the process is '/bin/ratelimit' as uid/gid 65534 with no capability (effective, permitted, bounding)"
else
    bad "process: want '/bin/ratelimit' as 65534 65534 with no capability, got '$comm' as '$ids' caps '$caps'"
fi
ro=$("$DOCKER" inspect "$CONTAINER" --format '{{.HostConfig.ReadonlyRootfs}}')
if [ "$ro" = true ] && grep -q ' / [^ ]* ro[, ]' "/proc/$pid/mounts" 2>/dev/null &&
    [ "$("$DOCKER" inspect "$CONTAINER" --format '{{.State.Running}}')" = true ]; then
    ok "the root filesystem is mounted read-only and sluice keeps running on it"
else
    bad "read-only root: want ReadonlyRootfs=true and / mounted ro with sluice running, got '$ro'"
    grep ' / ' "/proc/$pid/mounts"
fi
if "$DOCKER" logs "$CONTAINER" 2>&1 | grep -qi "panic\|read-only file system"; then
    bad "the container's log has a panic or a write to the read-only root"
    logs
else
    ok "no panic and no write to the read-only root in the container's log"
fi

# --- the Dockerfile's `docker run` example ------------------------------------------
# Its command as the Dockerfile's header and docs/container-image.md give it, in a
# network namespace of its own (`--network none` for `-p`, which needs a bridge this
# daemon does not make): its default ports reached from inside that namespace. The
# policy is a copy of examples/policy.yaml, edited in place as a bind mount needs.
# POD_PID names the namespace `in_pod` runs in.
in_pod() { nsenter -t "$POD_PID" -n "$@"; }
# ask PORT IP: POST /json for one client address of domain api; its limitRemaining.
ask() {
    in_pod curl -sS -d "{\"domain\":\"api\",\"descriptors\":[{\"entries\":[{\"key\":\"remote_address\",\"value\":\"$2\"}]}]}" \
        "http://127.0.0.1:$1/json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["statuses"][0]["limitRemaining"])' 2>/dev/null
}
# remaining PORT WANT: a new client address has WANT left after its first request.
n_asked=0
remaining() {
    n_asked=$((n_asked + 1))
    [ "$(ask "$1" "203.0.113.$n_asked")" = "$2" ]
}
# stopped NAME TIMEOUT: `docker stop -t TIMEOUT` (SIGTERM, SIGKILL after TIMEOUT);
# ok when the container exited of itself with status 0 before that.
stopped() {
    local t0 code secs
    t0=$(date +%s%N)
    "$DOCKER" stop -t "$2" "$1" >/dev/null 2>&1
    secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    code=$("$DOCKER" inspect "$1" --format '{{.State.ExitCode}} {{.State.OOMKilled}}')
    log "$1: docker stop -t $2 took ${secs} ms, exit status ${code% *}"
    [ "$code" = "0 false" ]
}

mkdir -p "$W/file"
cp examples/policy.yaml "$W/file/policy.yaml"
chmod 0644 "$W/file/policy.yaml"
if "$DOCKER" run -d --name "$CONTAINER-file" --network none \
    -v "$W/file/policy.yaml:/etc/sluice/policy.yaml:ro" -e SLUICE_RELOAD_INTERVAL=1h \
    sluice:image-test >"$W/run-file.log" 2>&1 &&
    POD_PID=$("$DOCKER" inspect "$CONTAINER-file" --format '{{.State.Pid}}') &&
    wait_for "the example's /readyz" 30 in_pod curl -fsS http://127.0.0.1:8080/readyz; then
    if [ "$(in_pod curl -sS http://127.0.0.1:8080/healthz)" = ok ] && remaining 8080 599; then
        ok "docker run as the Dockerfile says: /healthz, /readyz and POST /json on 8080 serve examples/policy.yaml (600 a minute)"
    else
        bad "the Dockerfile's example: /healthz or the 600 a minute of examples/policy.yaml not served on 8080"
    fi
    answer=$(in_pod grpcurl -plaintext -d '{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.1"}]}]}' \
        127.0.0.1:8081 envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit 2>&1)
    if printf '%s' "$answer" | grep -q '"overallCode": "OK"'; then
        ok "docker run as the Dockerfile says: ShouldRateLimit on 8081 answers OK"
    else
        bad "ShouldRateLimit on the example's 8081: want overallCode OK, got '$answer'"
    fi
    # An edit, written in place (a file replaced is not seen through its bind mount),
    # that SIGHUP has read at once: the poll is an hour apart here.
    sed 's/requestsPerUnit: 600$/requestsPerUnit: 7/' "$W/file/policy.yaml" >"$W/file/edited"
    cat "$W/file/edited" >"$W/file/policy.yaml"
    "$DOCKER" kill -s HUP "$CONTAINER-file" >/dev/null
    if wait_for "the edit after SIGHUP" 10 remaining 8080 6 &&
        [ "$("$DOCKER" inspect "$CONTAINER-file" --format '{{.State.Running}}')" = true ]; then
        ok "docker kill -s HUP: the edited policy (7 a minute) is read at once and sluice keeps running"
    else
        bad "docker kill -s HUP: the edited policy (7 a minute) was not served"
        "$DOCKER" logs "$CONTAINER-file" 2>&1 | tail -n 20
    fi
    if stopped "$CONTAINER-file" 10; then
        ok "docker stop: SIGTERM drains and sluice exits with status 0 within docker's 10 s"
    else
        bad "docker stop: want exit status 0 before docker's 10 s ran out"
        "$DOCKER" logs "$CONTAINER-file" 2>&1 | tail -n 20
    fi
else
    bad "docker run as the Dockerfile says did not answer /readyz on 8080"
    cat "$W/run-file.log"
    "$DOCKER" logs "$CONTAINER-file" 2>&1 | tail -n 20
fi

# --- deploy/kubernetes/sluice.yaml's pod ----------------------------------------------
# The Deployment's container as the kubelet runs it: its args, its user and group,
# read-only root, capabilities dropped, no privilege escalation; the ConfigMap mounted
# where it says, laid out as the kubelet's atomic writer lays it out (a dated
# directory, `..data` linking to it, each key a link through `..data`), and updated
# as the kubelet updates it (a new dated directory, `..data` swapped by a rename).
# Its probes and ports are taken from the manifest.
M=$W/manifest
mkdir -p "$M"
python3 - deploy/kubernetes/sluice.yaml "$M" <<'PY' || die "could not read deploy/kubernetes/sluice.yaml"
import os, shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
out = sys.argv[2]
dep = next(d for d in docs if d["kind"] == "Deployment")
pod = dep["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "sluice")
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
psc, csc = pod.get("securityContext") or {}, c.get("securityContext") or {}
sc = {**psc, **csc}
mount = c["volumeMounts"][0]
vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == vol["configMap"]["name"])
for k, v in cm["data"].items():
    open(os.path.join(out, k), "w").write(v)
open(os.path.join(out, "args"), "w").write("".join(a + "\n" for a in c["args"]))
probe = lambda p: (c[p]["httpGet"]["path"], ports.get(c[p]["httpGet"]["port"], c[p]["httpGet"]["port"]))
env = {
    "M_USER": f'{sc.get("runAsUser", "")}:{sc.get("runAsGroup", "")}',
    "M_RO": str(sc.get("readOnlyRootFilesystem")).lower(),
    "M_DROP": " ".join(sc.get("capabilities", {}).get("drop", [])),
    "M_NOPRIV": str(sc.get("allowPrivilegeEscalation") is False).lower(),
    "M_MOUNT": mount["mountPath"],
    "M_GRACE": pod.get("terminationGracePeriodSeconds", 30),
    "M_READY_PATH": probe("readinessProbe")[0], "M_READY_PORT": probe("readinessProbe")[1],
    "M_LIVE_PATH": probe("livenessProbe")[0], "M_LIVE_PORT": probe("livenessProbe")[1],
    "M_GRPC": ports["grpc"], "M_HTTP": ports["http"],
    "M_ENV": " ".join(f'-e {e["name"]}={e["value"]}' for e in c.get("env") or []),
}
open(os.path.join(out, "env"), "w").write("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in env.items()))
PY
# shellcheck disable=SC1091
. "$M/env"
mapfile -t m_args <"$M/args"
# The kubelet's layout: ..<time>/KEY, ..data -> ..<time>, KEY -> ..data/KEY.
CM=$W/configmap
mkdir -p "$CM/..2026_12_07_12_00_00.000000001"
for f in "$M"/*.yaml; do
    cp "$f" "$CM/..2026_12_07_12_00_00.000000001/"
    ln -s "..data/$(basename "$f")" "$CM/$(basename "$f")"
done
chmod -R a+rX "$CM"
ln -s ..2026_12_07_12_00_00.000000001 "$CM/..data"
[ "$M_RO $M_NOPRIV $M_DROP" = "true true ALL" ] ||
    bad "deploy/kubernetes/sluice.yaml: want readOnlyRootFilesystem, no privilege escalation and every capability dropped, got '$M_RO $M_NOPRIV $M_DROP'"
img_user=$("$DOCKER" image inspect sluice:image-test --format '{{.Config.User}}')
if [ "$M_USER" = "$img_user" ]; then
    ok "deploy/kubernetes/sluice.yaml runs the image as its own user ($img_user)"
else
    bad "deploy/kubernetes/sluice.yaml runs as $M_USER, the image's USER is $img_user"
fi
# shellcheck disable=SC2086  # M_ENV is -e NAME=VALUE words
if "$DOCKER" run -d --name "$CONTAINER-pod" --network none --user "$M_USER" --read-only \
    --cap-drop "$M_DROP" --security-opt no-new-privileges $M_ENV \
    -v "$CM:$M_MOUNT:ro" sluice:image-test "${m_args[@]}" >"$W/run-pod.log" 2>&1 &&
    POD_PID=$("$DOCKER" inspect "$CONTAINER-pod" --format '{{.State.Pid}}') &&
    wait_for "the manifest's readiness probe" 30 in_pod curl -fsS "http://127.0.0.1:$M_READY_PORT$M_READY_PATH"; then
    if in_pod curl -fsS "http://127.0.0.1:$M_LIVE_PORT$M_LIVE_PATH" >/dev/null &&
        in_pod grpcurl -plaintext "127.0.0.1:$M_GRPC" list >/dev/null && remaining "$M_HTTP" 599; then
        ok "the manifest's pod: probes $M_READY_PATH, $M_LIVE_PATH answer, gRPC on $M_GRPC, the ConfigMap's 600 a minute on $M_HTTP"
    else
        bad "the manifest's pod: a probe, the gRPC port $M_GRPC or the ConfigMap's 600 a minute on $M_HTTP did not answer"
    fi
    ids=$(awk '/^Uid:|^Gid:/ {print $2}' "/proc/$POD_PID/status" | tr '\n' ':')
    [ "$ids" = "${M_USER}:" ] || bad "the manifest's pod runs as '$ids', want $M_USER"
    # The kubelet's update: a new dated directory, `..data` swapped by a rename.
    new=..2026_12_07_12_01_00.000000002
    mkdir "$CM/$new"
    for f in "$CM"/..data/*.yaml; do
        sed 's/requests_per_unit: 600}/requests_per_unit: 7}/' "$f" >"$CM/$new/$(basename "$f")"
    done
    chmod -R a+rX "$CM/$new"
    ln -s "$new" "$CM/..data_tmp" && mv -T "$CM/..data_tmp" "$CM/..data"
    rm -rf "$CM/..2026_12_07_12_00_00.000000001"
    if wait_for "the swapped ConfigMap" 10 remaining "$M_HTTP" 6; then
        ok "the manifest's pod: a ConfigMap update (the kubelet's ..data swap) is served without a restart"
    else
        bad "the manifest's pod: the ConfigMap update (7 a minute) was not served after the ..data swap"
        "$DOCKER" logs "$CONTAINER-pod" 2>&1 | tail -n 20
    fi
    # The kubelet's stop: SIGTERM, SIGKILL after terminationGracePeriodSeconds.
    if stopped "$CONTAINER-pod" "$M_GRACE"; then
        ok "the manifest's pod stops with status 0 within terminationGracePeriodSeconds ($M_GRACE)"
    else
        bad "the manifest's pod: want exit status 0 within terminationGracePeriodSeconds ($M_GRACE)"
    fi
    if "$DOCKER" logs "$CONTAINER-pod" 2>&1 | python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' 2>/dev/null; then
        ok "the manifest's pod logs JSON lines only (--log-format=json)"
    else
        bad "the manifest's pod: a log line is not JSON"
        "$DOCKER" logs "$CONTAINER-pod" 2>&1 | tail -n 5
    fi
else
    bad "deploy/kubernetes/sluice.yaml's pod did not answer its readiness probe"
    cat "$W/run-pod.log"
    "$DOCKER" logs "$CONTAINER-pod" 2>&1 | tail -n 20
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
