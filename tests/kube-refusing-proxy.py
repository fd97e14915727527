#!/usr/bin/env python3
"""A plain-HTTP front for the test API server (tests/kube.rs) that refuses status
writes as RBAC refuses a role without ratelimitpolicies/status: each PATCH of a
.../status is answered 403 Forbidden while the file REFUSE exists (and counted as
a line in REFUSE.count). While the file REFUSE.hold exists, each PATCH of a
.../status waits for it to go before it is passed on (and is counted as a line in
REFUSE.held as it starts to wait), as a slow network would hold it. Everything else
is passed on, streamed, over TLS with the API server's client certificate.

    kube-refusing-proxy.py API_URL KUBE_TEST_DIR REFUSE

Prints the port it listens on (127.0.0.1) as its first line."""
import http.client
import http.server
import json
import os
import ssl
import sys
import time
import urllib.parse

api, pki, refuse = urllib.parse.urlsplit(sys.argv[1]), sys.argv[2] + "/pki", sys.argv[3]
tls = ssl.create_default_context(cafile=f"{pki}/ca.crt")
tls.load_cert_chain(f"{pki}/client.crt", f"{pki}/client.key")


class Front(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forbid(self):
        name = self.path.split("?")[0].split("/")[-2]
        body = json.dumps({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": "Forbidden", "code": 403,
            "message": f'ratelimitpolicies.sluice.dev "{name}" is forbidden: cannot patch '
                       'resource "ratelimitpolicies/status" in API group "sluice.dev"',
        }).encode()
        with open(refuse + ".count", "a") as f:
            f.write(name + "\n")
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.command == "PATCH" and self.path.split("?")[0].endswith("/status") \
                and os.path.exists(refuse):
            return self.forbid()
        if self.command == "PATCH" and self.path.split("?")[0].endswith("/status") \
                and os.path.exists(refuse + ".hold"):
            with open(refuse + ".held", "a") as f:
                f.write(self.path.split("?")[0].split("/")[-2] + "\n")
            deadline = time.monotonic() + 60
            while os.path.exists(refuse + ".hold") and time.monotonic() < deadline:
                time.sleep(0.02)
        up = http.client.HTTPSConnection(api.hostname, api.port, context=tls, timeout=600)
        skip = ("host", "connection", "content-length")
        up.request(self.command, self.path, body=body,
                   headers={k: v for k, v in self.headers.items() if k.lower() not in skip})
        answer = up.getresponse()
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while chunk := answer.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            up.close()

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = any


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
