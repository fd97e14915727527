#!/usr/bin/env python3
"""Redis CPU per request of envoyproxy/ratelimit's traffic, without envoyproxy/ratelimit.

Per request it sends what the reference sends for a fixed window: one pipeline of
INCRBY key 1 and EXPIRE key ttl per descriptor, in one round trip, and waits for the
replies; CONNS connections each keep one request in flight. The Redis server's CPU
(INFO cpu, user + system) over the run, divided by the requests, is the figure to
hold `scripts/lua-cost.sh` against (BENCHMARKS.md, "Redis CPU per decision").

    scripts/reference-redis-cost.py PORT [REQUESTS] [DESCRIPTORS] [CONNS] [hot]

The first descriptor's key is one of 100,000 (one key with `hot`), the others one
of 100, as in the layered scenario. Uses a scratch Redis: it writes keys.
"""
import random
import selectors
import socket
import sys


def command(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def request(descriptors, hot):
    pipeline = b""
    for i in range(descriptors):
        k = 0 if hot else random.randrange(100000 if i == 0 else 100)
        key = b"reference_d%d_k%d" % (i, k)
        pipeline += command(b"INCRBY", key, 1) + command(b"EXPIRE", key, 60)
    return pipeline


def redis_cpu(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(command(b"INFO", b"cpu"))
    data = s.recv(65536)
    # A bulk reply: "$LEN\r\n", LEN bytes, "\r\n".
    head = data.index(b"\r\n")
    while len(data) < head + 2 + int(data[1:head]) + 2:
        data += s.recv(65536)
    s.close()
    fields = dict(l.split(":", 1) for l in data.decode().split("\r\n") if ":" in l)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


def main():
    port = int(sys.argv[1])
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 40000
    descriptors = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    conns = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    hot = len(sys.argv) > 5 and sys.argv[5] == "hot"
    replies = 2 * descriptors
    sel = selectors.DefaultSelector()
    pending, sent, done = {}, 0, 0
    before = redis_cpu(port)
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        pending[s] = b""
        s.sendall(request(descriptors, hot))
        sent += 1
    while done < total:
        for key, _ in sel.select():
            s = key.fileobj
            pending[s] += s.recv(65536)
            # Every reply is one integer line (":N\r\n").
            while pending[s].count(b"\r\n") >= replies:
                cut = 0
                for _ in range(replies):
                    cut = pending[s].index(b"\r\n", cut) + 2
                pending[s] = pending[s][cut:]
                done += 1
                if sent < total:
                    s.sendall(request(descriptors, hot))
                    sent += 1
    after = redis_cpu(port)
    print(f"{(after - before) * 1e6 / total:.2f} µs of Redis CPU per request "
          f"({descriptors} descriptor(s), {conns} connections, {total} requests"
          f"{', one hot key' if hot else ''})")


if __name__ == "__main__":
    main()
