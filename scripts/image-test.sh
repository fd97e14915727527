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
    [ -n "${DOCKER:-}" ] && "$DOCKER" rm -f "$CONTAINER" "$CONTAINER-file" >/dev/null 2>&1
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
for cmd in grpcurl curl openssl python3 ldd apt-get dpkg-deb; do
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

# --- run its default command on a mounted policy, as docs/container-image.md does ---
# (ports by environment, as host networking has no -p; the command is the image's.)
read -r F_GRPC F_HTTP F_ADMIN < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
if "$DOCKER" run -d --name "$CONTAINER-file" --network host \
    -v "$ROOT/examples/policy.yaml:/etc/sluice/policy.yaml:ro" \
    -e SLUICE_GRPC_ADDR="127.0.0.1:$F_GRPC" -e SLUICE_HTTP_ADDR="127.0.0.1:$F_HTTP" \
    -e SLUICE_ADMIN_ADDR="127.0.0.1:$F_ADMIN" sluice:image-test >"$W/run-file.log" 2>&1 &&
    wait_for "the policy file's sluice" 30 curl -fsS "http://127.0.0.1:$F_HTTP/readyz"; then
    body='{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.7"}]}]}'
    answer=$(curl -sS -d "$body" "http://127.0.0.1:$F_HTTP/json")
    if printf '%s' "$answer" | grep -q '"limitRemaining":599'; then
        ok "the image's default command serves examples/policy.yaml mounted at /etc/sluice"
    else
        bad "POST /json to the policy file's sluice: want limitRemaining 599 (the 600 a minute of policy.yaml), got '$answer'"
    fi
else
    bad "the image's default command did not serve examples/policy.yaml mounted at /etc/sluice"
    cat "$W/run-file.log"
    "$DOCKER" logs "$CONTAINER-file" 2>&1 | tail -n 20
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
