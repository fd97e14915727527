#!/usr/bin/env python3
"""A backend for tests behind Envoy: `ok` to every GET on 127.0.0.1:PORT.

    upstream.py PORT [LOG]

With LOG, each request's arrival time, path and `x-tenant` header are appended to it,
one line each. A request's `x-cost` header comes back as the response's `x-tokens`: what
the response cost, as an LLM backend reports the tokens it used. `x-hold: SECONDS` holds
the response that long (a long stream).
"""
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = open(sys.argv[2], "a", buffering=1) if len(sys.argv) > 2 else None
LOCK = threading.Lock()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the body waits
    # for Envoy's delayed ACK (40 ms), which would swamp a latency measured through it.
    disable_nagle_algorithm = True

    def do_GET(self):
        if LOG is not None:
            with LOCK:
                LOG.write(f"{time.time():.6f} {self.path} {self.headers.get('x-tenant', '-')}\n")
        hold = self.headers.get("x-hold")
        if hold is not None:
            time.sleep(min(float(hold), 30.0))
        body = b"ok\n"
        self.send_response(200)
        cost = self.headers.get("x-cost")
        if cost is not None:
            self.send_header("x-tokens", cost)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
