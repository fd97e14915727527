#!/usr/bin/env python3
"""Applies the patches of deploy/istio/envoyfilter.yaml to a bare Envoy bootstrap, as
Istio would on its gateway, so that tests/e2e/envoy.sh can run them in a real Envoy.

    envoyfilter-bootstrap.py ENVOYFILTER.yaml OUT.yaml LISTEN ADMIN SLUICE_GRPC UPSTREAM

Handles the patch kinds that file uses: HTTP_FILTER INSERT_BEFORE the router, and
VIRTUAL_HOST MERGE. The cluster named by the filter's envoy_grpc (Istio's
`outbound|PORT||HOST`) is created pointing at 127.0.0.1:SLUICE_GRPC over HTTP/2.
"""
import sys

import yaml

src, dst = sys.argv[1], sys.argv[2]
listen, admin, grpc, upstream = map(int, sys.argv[3:7])

http_filters = [{
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}]
vhost = {"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]}
rls_cluster = None
for doc in yaml.safe_load_all(open(src)):
    if not doc or doc.get("kind") != "EnvoyFilter":
        continue
    for p in doc["spec"]["configPatches"]:
        op, value = p["patch"]["operation"], p["patch"]["value"]
        if p["applyTo"] == "HTTP_FILTER":
            sub = p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            assert op == "INSERT_BEFORE" and sub == "envoy.filters.http.router", (op, sub)
            http_filters.insert(len(http_filters) - 1, value)
            rls_cluster = value["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        elif p["applyTo"] == "VIRTUAL_HOST":
            assert op == "MERGE", op
            vhost.update(value)
        else:
            raise SystemExit(f"unsupported patch {p['applyTo']}")
assert rls_cluster, "no rate limit filter patch found"


def cluster(name, port, h2=False):
    c = {
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
    }
    if h2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


boot = {
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
    "static_resources": {
        "listeners": [{
            "name": "gateway",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "gateway",
                    "use_remote_address": True,
                    "route_config": {"virtual_hosts": [vhost]},
                    "http_filters": http_filters,
                },
            }]}],
        }],
        "clusters": [cluster(rls_cluster, grpc, h2=True), cluster("backend", upstream)],
    },
}
yaml.safe_dump(boot, open(dst, "w"))
