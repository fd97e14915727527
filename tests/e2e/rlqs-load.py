"""Paced HTTP load for tests/e2e/rlqs.sh: for each NAME=PORT:RATE, one thread sends
GET /api requests to 127.0.0.1:PORT at RATE a second on keep-alive connections, for
SECONDS seconds, and writes one line per request: `unix_time NAME status ms`, ms
being the time from sending the request to reading the whole response (status 0:
the connection failed).

    python3 rlqs-load.py SECONDS OUT NAME=PORT:RATE ...
"""
import http.client
import sys
import threading
import time

seconds, out = float(sys.argv[1]), sys.argv[2]
targets = []
for arg in sys.argv[3:]:
    name, rest = arg.split("=")
    port, rate = rest.split(":")
    targets.append((name, int(port), float(rate)))

log = open(out, "a", buffering=1)
lock = threading.Lock()
start = time.time()


def run(name, port, rate):
    conn = None
    n = 0
    while True:
        due = start + n / rate
        if due - start >= seconds:
            return
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        n += 1
        status = 0
        sent = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/api/item")
            r = conn.getresponse()
            r.read()
            status = r.status
        except Exception:
            conn = None
        ms = (time.perf_counter() - sent) * 1000
        with lock:
            log.write(f"{time.time():.3f} {name} {status} {ms:.3f}\n")


threads = [threading.Thread(target=run, args=t) for t in targets]
for t in threads:
    t.start()
for t in threads:
    t.join()
