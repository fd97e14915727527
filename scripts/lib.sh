# Shared by the bench and profiling scripts (sourced, not run): processes started in
# the background are killed on exit, temporary directories removed, and ports waited
# for. Everything listens on 127.0.0.1.

pids=()     # background processes to stop on exit
scratch=()  # directories to remove on exit
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for p in "${scratch[@]}"; do rm -rf "$p"; done
}
trap cleanup EXIT

# wait_port PORT [PID]: until something listens on 127.0.0.1:PORT (10 s at most);
# fails sooner if PID exits first.
wait_port() {
  local port=$1 pid=${2:-}
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  echo "$(basename "$0"): nothing listens on 127.0.0.1:$port" >&2
  return 1
}

# start_redis PORT [LOG [FLAGS...]]: a redis-server without persistence on
# 127.0.0.1:PORT, stopped on exit; its pid in $started_pid. `hz 100` (REDIS_HZ), as
# docs/redis.md recommends: at Redis's default 10 its expire cycle can block it for 25 ms,
# past sluice's 15 ms store timeout, when many counters expire (uniform keys). FLAGS
# go to redis-server after these (a later --dir wins).
start_redis() {
  local port=$1 log=${2:-/dev/null}
  shift $(($# < 2 ? $# : 2))
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
    --hz "${REDIS_HZ:-100}" --dir "${TMPDIR:-/tmp}" --loglevel warning "$@" >"$log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  wait_port "$port" "$started_pid"
}

# tls_certs DIR: a CA of its own (DIR/ca.crt) and a certificate for 127.0.0.1 signed
# by it (DIR/server.crt, DIR/server.key); fails if openssl cannot make them.
tls_certs() {
  local d=$1
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$d/ca.key" -out "$d/ca.crt" -days 1 -subj "/CN=test CA" \
    -addext basicConstraints=critical,CA:TRUE 2>/dev/null &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$d/server.key" -out "$d/server.csr" -subj /CN=127.0.0.1 2>/dev/null &&
    echo "subjectAltName=IP:127.0.0.1" >"$d/ext.cnf" &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
      -CAcreateserial -out "$d/server.crt" -days 1 -extfile "$d/ext.cnf" 2>/dev/null
}

# start_redis_tls PORT DIR [LOG]: start_redis serving TLS only, with tls_certs DIR.
start_redis_tls() {
  local port=$1 d=$2 log=${3:-/dev/null}
  redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" --save '' --appendonly no \
    --hz "${REDIS_HZ:-100}" --dir "${TMPDIR:-/tmp}" --loglevel warning \
    --tls-cert-file "$d/server.crt" --tls-key-file "$d/server.key" \
    --tls-ca-cert-file "$d/ca.crt" --tls-auth-clients no >"$log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  wait_port "$port" "$started_pid"
}

# ticks PID...: CPU ticks (user + system, CLK_TCK per second) the processes used so far.
ticks() {
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
