#!/usr/bin/env python3
"""Builds an Envoy bootstrap shaped like the xDS Envoy Gateway sends for the Gateway
`eg` (namespace default, listener `http`) and the HTTPRoute `backend`, applies the
JSON patches of EnvoyPatchPolicy files to it, and writes it for tests/e2e/envoy.sh.

    envoy-gateway-bootstrap.py OUT.yaml LISTEN ADMIN SLUICE_GRPC UPSTREAM \
        [--btp BACKENDTRAFFICPOLICY.yaml] [--patch ENVOYPATCHPOLICY.yaml]... [--certs DIR]

--btp adds what Envoy Gateway generates for a BackendTrafficPolicy's global rate limit
(its rate limit filter with domain NAMESPACE/GATEWAY/LISTENER, the mTLS cluster
`ratelimit_cluster`, and per-route rate_limits in its descriptor scheme), following
Envoy Gateway's xds translator. Cluster endpoints whose host names Sluice
(`sluice...svc...`) are then pointed at 127.0.0.1:SLUICE_GRPC; any other
cluster host is left alone, so a patch that did not apply makes Envoy fail. --certs
reads the files Envoy Gateway mounts at /certs (ca.crt, tls.crt, tls.key) from DIR.
"""
import argparse
import copy

import yaml

LISTENER = "default/eg/http"
ROUTE = "httproute/default/backend/rule/0/match/0/*"
RL_FILTER = "envoy.filters.http.ratelimit"

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("listen", type=int)
ap.add_argument("admin", type=int)
ap.add_argument("grpc", type=int)
ap.add_argument("upstream", type=int)
ap.add_argument("--btp")
ap.add_argument("--patch", action="append", default=[])
ap.add_argument("--certs", default="/certs")
a = ap.parse_args()


def endpoint(host, port):
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


h2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    "explicit_http_config": {"http2_protocol_options": {}}}}

hcm = {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "http-10080",
    "use_remote_address": True,
    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
}
listener = {
    "name": LISTENER,
    "address": {"socket_address": {"address": "127.0.0.1", "port_value": a.listen}},
    "default_filter_chain": {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]},
}
route = {"name": ROUTE, "match": {"prefix": "/"}, "route": {"cluster": "httproute/default/backend/rule/0"}}
route_config = {"name": LISTENER, "virtual_hosts": [{"name": LISTENER + "/*", "domains": ["*"], "routes": [route]}]}
clusters = [{
    "name": "httproute/default/backend/rule/0", "type": "STATIC", "connect_timeout": "1s",
    "load_assignment": {"cluster_name": "httproute/default/backend/rule/0",
                        "endpoints": [{"lb_endpoints": [endpoint("127.0.0.1", a.upstream)]}]},
}]


def rule_key(r, m):
    return f"rule-{r}-match-{m}"


if a.btp:
    btp = next(d for d in yaml.safe_load_all(open(a.btp)) if d and d.get("kind") == "BackendTrafficPolicy")
    rules = btp["spec"]["rateLimit"]["global"]["rules"]
    rate_limits = []
    for r, rule in enumerate(rules):
        actions = [{"generic_key": {"descriptor_key": ROUTE, "descriptor_value": ROUTE}}]
        headers = [h for sel in rule.get("clientSelectors", []) for h in sel.get("headers", [])]
        for m, h in enumerate(headers):
            kind = h.get("type", "Exact")
            if kind == "Distinct":
                actions.append({"request_headers": {"header_name": h["name"], "descriptor_key": rule_key(r, m)}})
            else:
                sm = {"exact": h["value"]} if kind == "Exact" else {"safe_regex": {"regex": h["value"]}}
                actions.append({"header_value_match": {
                    "descriptor_key": rule_key(r, m), "descriptor_value": rule_key(r, m),
                    "expect_match": not h.get("invert", False),
                    "headers": [{"name": h["name"], "string_match": sm}]}})
        cidrs = [sel["sourceCIDR"] for sel in rule.get("clientSelectors", []) if "sourceCIDR" in sel]
        for c in cidrs:
            actions.append({"masked_remote_address": {"v4_prefix_mask_len": int(c["value"].split("/")[1])}})
            if c.get("type", "Exact") == "Distinct":
                actions.append({"remote_address": {}})
        if not headers and not cidrs:
            actions.append({"generic_key": {"descriptor_key": rule_key(r, -1), "descriptor_value": rule_key(r, -1)}})
        rate_limits.append({"actions": actions})
    route["typed_per_filter_config"] = {RL_FILTER: {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "rate_limits": rate_limits}}
    hcm["http_filters"].insert(0, {"name": RL_FILTER, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": LISTENER,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limit_service": {"transport_api_version": "V3",
                               "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_cluster"}}}}})
    clusters.append({
        "name": "ratelimit_cluster", "type": "STRICT_DNS", "connect_timeout": "10s",
        "typed_extension_protocol_options": copy.deepcopy(h2),
        "load_assignment": {"cluster_name": "ratelimit_cluster", "endpoints": [{"lb_endpoints": [
            endpoint("envoy-ratelimit.envoy-gateway-system.svc.cluster.local", 8081)]}]},
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [{"certificate_chain": {"filename": f"{a.certs}/tls.crt"},
                                      "private_key": {"filename": f"{a.certs}/tls.key"}}],
                "validation_context": {"trusted_ca": {"filename": f"{a.certs}/ca.crt"}}}}},
    })


def pointer(path):
    if path == "":
        return []
    assert path.startswith("/"), path
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply(doc, op):
    parts = pointer(op["path"])
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    kind = op["op"]
    if isinstance(parent, list):
        i = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(i, op["value"])
        elif kind == "replace":
            parent[i] = op["value"]
        elif kind == "remove":
            del parent[i]
        else:
            raise SystemExit(f"unsupported op {kind}")
    else:
        if kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise SystemExit(f"replace of missing {op['path']}")
            parent[last] = op["value"]
        elif kind == "remove":
            if last not in parent:
                raise SystemExit(f"remove of missing {op['path']}")
            del parent[last]
        else:
            raise SystemExit(f"unsupported op {kind}")


for f in a.patch:
    for d in yaml.safe_load_all(open(f)):
        if not d or d.get("kind") != "EnvoyPatchPolicy":
            continue
        assert d["spec"]["type"] == "JSONPatch"
        for jp in d["spec"]["jsonPatches"]:
            t, name, op = jp["type"].rsplit(".", 1)[-1], jp["name"], jp["operation"]
            if t == "Cluster":
                if op["path"] == "":
                    assert op["op"] == "add"
                    clusters.append(op["value"])
                    continue
                target = next((c for c in clusters if c["name"] == name), None)
            elif t == "Listener":
                target = listener if name == listener["name"] else None
            elif t == "RouteConfiguration":
                target = route_config if name == route_config["name"] else None
            else:
                raise SystemExit(f"unsupported type {jp['type']}")
            if target is None:
                raise SystemExit(f"{f}: no {t} named {name} in an Envoy Gateway config for Gateway default/eg")
            apply(target, op)

for c in clusters:
    for e in c.get("load_assignment", {}).get("endpoints", []):
        for lb in e["lb_endpoints"]:
            sa = lb["endpoint"]["address"]["socket_address"]
            if sa["address"].startswith("sluice"):
                sa.update({"address": "127.0.0.1", "port_value": a.grpc})
                c["type"] = "STATIC"
hcm["route_config"] = route_config
boot = {
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": a.admin}}},
    "static_resources": {"listeners": [listener], "clusters": clusters},
}
yaml.safe_dump(boot, open(a.out, "w"))
