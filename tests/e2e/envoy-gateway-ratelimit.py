#!/usr/bin/env python3
"""Writes what Envoy Gateway generates around its rate limit service, for
tests/e2e/envoy-gateway.sh, following its xds translator (internal/xds/translator/
ratelimit.go and its testdata):

- RATELIMIT_CONFIG: the RateLimitConfig it serves over xDS for listener
  default/eg/http, in the translator's YAML;
- BOOTSTRAP: an Envoy bootstrap with that listener's rate limit filter (domain
  default/eg/http, DRAFT_VERSION_03 headers, no x-envoy-ratelimited), the cluster
  `ratelimit_cluster` (STRICT_DNS, HTTP/2, TLS up to 1.3 trusting ca.crt and presenting
  tls.crt), and the route's RateLimitPerRoute with its descriptors.

    envoy-gateway-ratelimit.py RATELIMIT_CONFIG BOOTSTRAP LISTEN ADMIN GRPC UPSTREAM CERTS

The BackendTrafficPolicy it stands for has two global rules on route `backend`:
  0. x-user-id: one            3 per minute
  1. x-tenant (Distinct)       2 per minute, or the tenant's own limit taken from the
                               request's metadata (limit.fromMetadata: namespace
                               sluice.e2e, key tenant_rate_limit), which a Lua filter
                               sets from x-plan here (gold: 4 per minute)
  2. x-heavy: yes              4 per minute, each request costing 2 (cost.request:
                               {from: Number, number: 2}, Envoy's hits_addend)
The filter's timeout is 1 s (rateLimit.timeout) so that a loaded test machine does
not turn a slow answer into Envoy's failure mode.
"""
import argparse

import yaml

LISTENER = "default/eg/http"
ROUTE = "httproute/default/backend/rule/0/match/0/*"

ap = argparse.ArgumentParser()
for name in ("config", "bootstrap"):
    ap.add_argument(name)
for name in ("listen", "admin", "grpc", "upstream"):
    ap.add_argument(name, type=int)
ap.add_argument("certs")
a = ap.parse_args()


def limit(n, unit):
    return {"requests_per_unit": n, "unit": unit, "unlimited": False, "name": "", "replaces": []}


def desc(key, value, rate_limit=None, children=()):
    return {"key": key, "value": value, "rate_limit": rate_limit, "descriptors": list(children),
            "shadow_mode": False, "quota_mode": False, "detailed_metric": False,
            "value_to_metric": False, "share_threshold": False}


config = {"name": LISTENER, "domain": LISTENER, "descriptors": [desc(ROUTE, ROUTE, None, [
    desc("rule-0-match-0", "rule-0-match-0", limit(3, "DAY")),
    desc("rule-1-match-0", "", limit(2, "DAY")),
    desc("rule-2-match-0", "rule-2-match-0", limit(4, "DAY")),
])]}
yaml.safe_dump(config, open(a.config, "w"), sort_keys=False)

lua = """
function envoy_on_request(h)
  if h:headers():get("x-plan") == "gold" then
    h:streamInfo():dynamicMetadata():set("sluice.e2e", "tenant_rate_limit",
      {requests_per_unit = 4, unit = "DAY"})
  end
end
"""
hcm = {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "http-10080",
    "use_remote_address": True,
    "http_filters": [
        {"name": "envoy.filters.http.lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": lua}}},
        {"name": "envoy.filters.http.ratelimit", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": LISTENER,
            "timeout": "1s",
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "disable_x_envoy_ratelimited_header": True,
            "rate_limit_service": {"transport_api_version": "V3",
                                   "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_cluster"}}}}},
        {"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
    ],
}
route_key = {"generic_key": {"descriptor_key": ROUTE, "descriptor_value": ROUTE}}
rate_limits = [
    {"actions": [route_key, {"header_value_match": {
        "descriptor_key": "rule-0-match-0", "descriptor_value": "rule-0-match-0",
        "expect_match": True,
        "headers": [{"name": "x-user-id", "string_match": {"exact": "one"}}]}}]},
    {"actions": [route_key, {"request_headers": {"header_name": "x-tenant", "descriptor_key": "rule-1-match-0"}}],
     "limit": {"dynamic_metadata": {"metadata_key": {
         "key": "sluice.e2e", "path": [{"key": "tenant_rate_limit"}]}}}},
    {"actions": [route_key, {"header_value_match": {
        "descriptor_key": "rule-2-match-0", "descriptor_value": "rule-2-match-0",
        "expect_match": True,
        "headers": [{"name": "x-heavy", "string_match": {"exact": "yes"}}]}}],
     "hits_addend": {"number": 2}},
]
route = {
    "name": ROUTE, "match": {"prefix": "/"}, "route": {"cluster": "httproute/default/backend/rule/0"},
    "typed_per_filter_config": {"envoy.filters.http.ratelimit": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "domain": LISTENER, "rate_limits": rate_limits}},
}


def endpoint(host, port):
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


ratelimit_cluster = {
    "name": "ratelimit_cluster", "type": "STRICT_DNS", "connect_timeout": "10s",
    "dns_lookup_family": "V4_PREFERRED", "respect_dns_ttl": True, "dns_refresh_rate": "30s",
    "per_connection_buffer_limit_bytes": 32768,
    "load_assignment": {"cluster_name": "ratelimit_cluster", "endpoints": [{"lb_endpoints": [
        endpoint("localhost", a.grpc)]}]},
    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {
            "initial_connection_window_size": 1048576, "initial_stream_window_size": 65536}}}},
}
# No SNI and no name check, as Envoy Gateway's cluster has none.
ratelimit_cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "tls_params": {"tls_maximum_protocol_version": "TLSv1_3"},
            "tls_certificates": [{"certificate_chain": {"filename": f"{a.certs}/tls.crt"},
                                  "private_key": {"filename": f"{a.certs}/tls.key"}}],
            "validation_context": {"trusted_ca": {"filename": f"{a.certs}/ca.crt"}}}}}
boot = {
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": a.admin}}},
    "static_resources": {
        "listeners": [{
            "name": LISTENER,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": a.listen}},
            "default_filter_chain": {"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": dict(hcm, route_config={"name": LISTENER, "virtual_hosts": [
                    {"name": LISTENER + "/*", "domains": ["*"], "routes": [route]}]})}]},
        }],
        "clusters": [
            {"name": "httproute/default/backend/rule/0", "type": "STATIC", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": "httproute/default/backend/rule/0",
                                 "endpoints": [{"lb_endpoints": [endpoint("127.0.0.1", a.upstream)]}]}},
            ratelimit_cluster,
        ],
    },
}
yaml.safe_dump(boot, open(a.bootstrap, "w"))
