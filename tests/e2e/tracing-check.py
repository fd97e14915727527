#!/usr/bin/env python3
"""Checks, through Jaeger's query API, the trace of an over-limit call (tracing.sh).

    tracing-check.py QUERY_URL LABEL USER SLUICE_LOG METRICS_URL [REDIS_PORT]

Finds the trace whose Envoy span served `/t/LABEL` and holds Sluice's decision span
over the limit, waiting up to 30 s for it to arrive. With REDIS_PORT, also the span of
the decision's store call to the Redis at localhost:REDIS_PORT. Prints `ok: ...` per
check passed and a reason per check failed; exits 1 on any failure.
"""
import json
import re
import sys
import time
import urllib.request

QUERY, LABEL, USER, LOG, METRICS = sys.argv[1:6]
REDIS_PORT = int(sys.argv[6]) if len(sys.argv) > 6 else None
# Redis 7 runs the decide function by FCALL; an older Redis, the script by EVALSHA.
STORE_COMMAND = sys.argv[7] if len(sys.argv) > 7 else "FCALL"
STORE_CALL = f"{STORE_COMMAND} decide"
SLUICE_SERVICE = "sluice-e2e"
ENVOY_SERVICE = "e2e-envoy"
DECISION = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
failed = False


def ok(msg):
    print(f"ok: {msg}")


def bad(msg):
    global failed
    failed = True
    print(msg)


def get(url, accept=None):
    req = urllib.request.Request(url, headers={"accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def tags(span):
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def service(trace, span):
    return trace["processes"][span["processID"]]["serviceName"]


def store_calls(trace, decision):
    """Sluice's spans that are children of the decision span `decision`."""
    return [
        s
        for s in trace["spans"]
        if service(trace, s) == SLUICE_SERVICE
        and any(
            r["refType"] == "CHILD_OF" and r["spanID"] == decision["spanID"]
            for r in s.get("references", [])
        )
    ]


def find():
    """The trace of the 429 of /t/LABEL, once Jaeger has both services' spans and
    the parent of Sluice's (Envoy exports its spans in batches, so a trace fills in
    over a few seconds)."""
    url = f"{QUERY}/api/traces?service={ENVOY_SERVICE}&limit=100&lookback=1h"
    for trace in json.loads(get(url)).get("data") or []:
        envoy = [s for s in trace["spans"] if service(trace, s) == ENVOY_SERVICE]
        if not any(f"/t/{LABEL}" in json.dumps(tags(s)) for s in envoy):
            continue
        for s in trace["spans"]:
            if (
                service(trace, s) == SLUICE_SERVICE
                and s["operationName"] == DECISION
                and tags(s).get("ratelimit.outcome") == "over_limit"
            ):
                ids = {x["spanID"] for x in trace["spans"]}
                refs = [r["spanID"] for r in s.get("references", []) if r["refType"] == "CHILD_OF"]
                if refs and refs[0] in ids and (REDIS_PORT is None or store_calls(trace, s)):
                    return trace, s
                last[0] = (trace, s)
    return None, None


last = [(None, None)]
deadline = time.time() + 30
trace, span = find()
while trace is None and time.time() < deadline:
    time.sleep(0.5)
    trace, span = find()
if trace is None:
    # The trace without the parent of Sluice's span: the check below says so.
    trace, span = last[0]
if trace is None:
    print(f"no trace in Jaeger with Envoy's /t/{LABEL} span and Sluice's over-limit decision span")
    sys.exit(1)
trace_id = trace["traceID"]
ok(f"trace {trace_id} holds Envoy's spans and Sluice's decision span")

by_id = {s["spanID"]: s for s in trace["spans"]}
parents = [r for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
parent = by_id.get(parents[0]["spanID"]) if parents else None
if parent is not None and service(trace, parent) == ENVOY_SERVICE:
    ok(f"Sluice's span is the child of Envoy's span {parent['operationName']!r}")
else:
    bad(f"Sluice's span's parent is not an Envoy span: references {span.get('references')}")

want = {
    "ratelimit.domain": "trace-e2e",
    "ratelimit.outcome": "over_limit",
    "ratelimit.rule": "user_id",
    "ratelimit.algorithm": "fixed_window",
    "ratelimit.limit": 2,
    "ratelimit.remaining": 0,
    "ratelimit.hits": 1,
    "ratelimit.descriptors": 2,
    "span.kind": "server",
}
got = tags(span)
wrong = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
if wrong:
    bad(f"attributes (want, got): {wrong}")
else:
    ok("attributes " + ", ".join(f"{k}={v}" for k, v in want.items() if k.startswith("ratelimit.")))

events = [
    {f["key"]: f["value"] for f in log["fields"]}
    for log in span.get("logs", [])
    if any(f["key"] == "event" and f["value"] == "ratelimit.descriptor" for f in log["fields"])
]
if len(events) == 2 and {e.get("ratelimit.descriptor.outcome") for e in events} == {"ok", "over_limit"}:
    ok("one ratelimit.descriptor event per descriptor, with its own outcome")
else:
    bad(f"ratelimit.descriptor events: {events}")

if REDIS_PORT is not None:
    calls = store_calls(trace, span)
    want = {
        "db.system.name": "redis",
        "db.operation.name": STORE_COMMAND,
        "db.stored_procedure.name": "decide",
        "server.address": "localhost",
        "server.port": REDIS_PORT,
        "ratelimit.store.keys": 2,
        "span.kind": "client",
    }
    if len(calls) != 1:
        bad(f"want one store call under the decision span, got {[c['operationName'] for c in calls]}")
    else:
        call = calls[0]
        got = tags(call)
        wrong = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        if call["operationName"] != STORE_CALL:
            bad(f"the store call's span is named {call['operationName']!r}, want {STORE_CALL!r}")
        elif wrong:
            bad(f"store call attributes (want, got): {wrong}")
        else:
            ok(f"the decision span's child {STORE_CALL!r}: " + ", ".join(f"{k}={v}" for k, v in want.items()))
        start, end = call["startTime"], call["startTime"] + call["duration"]
        if span["startTime"] <= start and end <= span["startTime"] + span["duration"]:
            ok(f"the store call ({call['duration']} us) lies within the decision ({span['duration']} us)")
        else:
            bad(f"the store call [{start}, {end}] is not within the decision span "
                f"[{span['startTime']}, {span['startTime'] + span['duration']}]")

text = json.dumps(trace)
if USER in text:
    bad(f"the user id {USER!r} appears in the trace")
else:
    ok(f"the user id sent to Envoy appears nowhere in the trace ({len(trace['spans'])} spans)")
sluice_text = json.dumps([s for s in trace["spans"] if service(trace, s) == SLUICE_SERVICE])
if "127.0.0.1" in sluice_text:
    bad("Sluice's spans carry the client address 127.0.0.1")
else:
    ok("Sluice's spans carry no client address")

short = trace_id.lstrip("0")
logged = [line for line in open(LOG, errors="replace") if "trace_id=" in line]
if any(re.search(r"trace_id=0*" + short + r"\b", line) for line in logged):
    ok("the call's log line carries its trace id")
else:
    bad(f"no log line with trace_id={trace_id} ({len(logged)} lines with a trace id)")

# Exemplars: the OpenMetrics exposition's decision histogram names sampled traces.
try:
    om = get(METRICS, "application/openmetrics-text; version=1.0.0")
except OSError as e:
    om = ""
    bad(f"GET {METRICS} (OpenMetrics): {e}")
# A strict OpenMetrics parser (prometheus_client's, which tracing.sh installs) reads
# the whole exposition.
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(om))
    ok(f"the OpenMetrics exposition parses ({len(families)} families)")
except ImportError:
    bad("prometheus_client is not installed: cannot check the OpenMetrics exposition")
except Exception as e:  # the parser raises ValueError and others on bad input
    bad(f"the OpenMetrics exposition does not parse: {e}")
ids = re.findall(r'^sluice_decision_seconds_bucket\{[^}]*\} \d+ # \{trace_id="([0-9a-f]{32})"\}', om, re.M)
if not om.rstrip().endswith("# EOF"):
    bad("the OpenMetrics exposition does not end with # EOF")
elif not ids:
    bad("no exemplar on sluice_decision_seconds in the OpenMetrics exposition")
else:
    found = []
    for i in ids:
        try:
            data = json.loads(get(f"{QUERY}/api/traces/{i}")).get("data") or []
        except OSError:
            data = []
        if data:
            found.append(i)
    if found:
        ok(f"the decision histogram's exemplar links to trace {found[0]}, which Jaeger holds")
    else:
        bad(f"exemplars {ids} name no trace Jaeger holds")
sys.exit(1 if failed else 0)
