#!/usr/bin/env python3
"""Rewrites one of deploy/envoy/'s bootstraps for a test on loopback: the admin and
the one listener on the given ports, the `sluice` and `backend` clusters at
127.0.0.1 on theirs.

    loopback-bootstrap.py SRC DST LISTEN ADMIN SLUICE_GRPC BACKEND
"""
import sys

import yaml

src, dst = sys.argv[1], sys.argv[2]
listen, admin, grpc, up = map(int, sys.argv[3:7])
c = yaml.safe_load(open(src))
c["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin}
(l,) = c["static_resources"]["listeners"]
l["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen}
ports = {"sluice": grpc, "backend": up}
for cl in c["static_resources"]["clusters"]:
    cl["type"] = "STATIC"
    for e in cl["load_assignment"]["endpoints"]:
        for lb in e["lb_endpoints"]:
            lb["endpoint"]["address"]["socket_address"] = {
                "address": "127.0.0.1",
                "port_value": ports[cl["name"]],
            }
yaml.safe_dump(c, open(dst, "w"))
