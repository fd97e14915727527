#!/usr/bin/env python3
"""Soak: Sluice on Redis at a fixed rate for a long run, Redis restarted on a timer.

    python3 scripts/soak.py                       # 30 minutes, 1,000 requests/s
    python3 scripts/soak.py --minutes 3 --restart-every 1 --warmup 1   # a short check

Every request carries a key no earlier request carried (`sluice-bench --sequential
--first-key`), so the key churn equals the rate. Every `--restart-every` minutes,
halfway through a minute, Redis is stopped and started again on the same port (its
counters gone, as after a crash without persistence): Sluice answers by its failure
mode (open) until it reconnects. Each minute the script samples Sluice's resident
memory and open files and the load's p99 and counts; at the end it prints the table
and the slope of memory and open files after the warm-up minutes (least squares).

Exits 1 when a call went unanswered or failed (a gRPC error), or when memory or open
files keep growing after the warm-up (slopes over `--max-rss-slope` KiB a minute or
`--max-fd-slope` files a minute; checked from 5 measured minutes on).

Needs redis-server and the two binaries (`cargo build --profile dist --workspace --bins`
builds both, as shipped: target/dist/sluice and target/dist/sluice-bench).
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

POLICY = """domain: soak
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
"""


ROW = ("{minute:>6} {mark:>7} {requests:>9} {answered:>9} {errors:>6} {unanswered:>10} "
       "{failure_mode:>12} {p99_ms:>8.2f} {rss_mib:>8.1f} {fds:>5}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"soak: nothing listens on port {port} after {limit}s")


class Redis:
    def __init__(self, port, workdir):
        self.port, self.workdir, self.proc = port, workdir, None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self):
        self.stop()
        self.start()


def start_sluice(binary, policy, redis_port):
    proc = subprocess.Popen(
        [binary, "serve", "--config", policy,
         "--redis", f"redis://127.0.0.1:{redis_port}",
         "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--admin-addr", "off", "--failure-mode", "open"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"sluice listening.*grpc=(\S+).*http=(\S+)", line)
        if m:
            # Keep reading its log so a full pipe never blocks it.
            threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
            return proc, m.group(1), m.group(2)
    proc.kill()
    sys.exit("soak: sluice did not start")


def proc_sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def failure_answers(http):
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("sluice_requests_total{") and 'outcome="failed_' in l)


def slope(ys):
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--rate", type=int, default=1000, help="requests (and new keys) a second")
    ap.add_argument("--restart-every", type=int, default=5, help="minutes between Redis restarts")
    ap.add_argument("--warmup", type=int, default=3, help="minutes left out of the slopes")
    ap.add_argument("--sluice", default="target/dist/sluice")
    ap.add_argument("--bench", default="target/dist/sluice-bench")
    ap.add_argument("--max-rss-slope", type=float, default=512.0, help="KiB a minute")
    ap.add_argument("--max-fd-slope", type=float, default=0.5, help="files a minute")
    args = ap.parse_args()
    for b in (args.sluice, args.bench):
        if not os.access(b, os.X_OK):
            sys.exit(f"soak: {b} is not built (cargo build --profile dist --workspace --bins)")

    work = tempfile.mkdtemp(prefix="sluice-soak-")
    policy = os.path.join(work, "policy.yaml")
    with open(policy, "w") as f:
        f.write(POLICY)
    redis = Redis(free_port(), work)
    redis.start()
    sluice, grpc, http = start_sluice(args.sluice, policy, redis.port)
    rows, failed = [], False
    per_minute = args.rate * 60
    print("minute restart  requests  answered errors unanswered failure_mode   p99_ms  rss_MiB   fds")
    try:
        for minute in range(args.minutes):
            restart = minute > 0 and minute % args.restart_every == 0
            timer = threading.Timer(30, redis.restart) if restart else None
            if timer:
                timer.start()
            before = failure_answers(http)
            out = subprocess.run(
                [args.bench, "load", "--addr", grpc, "--domain", "soak", "--key", "client",
                 "--scenario", "uniform", "--sequential", "--keys", str(per_minute),
                 "--first-key", str(minute * per_minute), "--rate", str(args.rate),
                 "--connections", "2", "--concurrency", "256",
                 # Exactly a minute's requests, each answer recorded however late;
                 # the duration only bounds a run whose answers never come.
                 "--requests", str(per_minute), "--duration", "120s", "--warmup", "1ms",
                 "--json"],
                capture_output=True, text=True, timeout=180)
            if timer:
                timer.join()
            if out.returncode != 0 or not out.stdout.strip():
                sys.exit(f"soak: sluice-bench failed: {out.stderr.strip()[-500:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rss, fds = proc_sample(sluice.pid)
            answered = r["ok"] + r["over_limit"]
            unanswered = max(per_minute - answered - r["errors"], 0)
            row = {
                "minute": minute + 1, "restart": restart, "requests": r["requests"],
                "answered": answered, "errors": r["errors"], "unanswered": unanswered,
                "failure_mode": int(failure_answers(http) - before),
                "p99_ms": r["p99_us"] / 1000, "rss_mib": rss / 1024, "fds": fds,
            }
            rows.append(row)
            print(ROW.format(mark="redis" if restart else "", **row), flush=True)
            failed |= row["errors"] > 0 or row["unanswered"] > 0
    finally:
        sluice.send_signal(signal.SIGTERM)
        try:
            sluice.wait(timeout=20)
        except subprocess.TimeoutExpired:
            sluice.kill()
        redis.stop()

    measured = rows[args.warmup:]
    rss_slope = slope([r["rss_mib"] * 1024 for r in measured])
    fd_slope = slope([r["fds"] for r in measured])
    calls = sum(r["requests"] for r in rows)
    print(f"\n{calls} calls; errors {sum(r['errors'] for r in rows)}, unanswered "
          f"{sum(r['unanswered'] for r in rows)}, answered by the failure mode "
          f"{sum(r['failure_mode'] for r in rows)}")
    print(f"after {args.warmup} warm-up minute(s): RSS slope {rss_slope:+.1f} KiB/min, "
          f"open files slope {fd_slope:+.2f}/min, p99 max "
          f"{max((r['p99_ms'] for r in measured), default=0):.2f} ms")
    if len(measured) >= 5 and (rss_slope > args.max_rss_slope or fd_slope > args.max_fd_slope):
        print("soak: memory or open files keep growing", file=sys.stderr)
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
