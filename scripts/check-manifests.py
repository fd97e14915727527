#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (used by scripts/helm-test.sh).

    check-manifests.py [--k8s-version 1.33.0] [--extract-policies DIR]
                       [--extract-envoy FILE] MANIFEST.yaml...

1. Every document parses as YAML and has apiVersion, kind and metadata.name.
2. Built-in kinds are validated against the Kubernetes OpenAPI schemas bundled with
   the `kubernetes-validate` package, strictly (unknown fields are errors).
3. Prometheus Operator and cert-manager kinds (no bundled schema) get a structural
   check; other custom kinds (RateLimitPolicy, CustomResourceDefinition handled by the API
   server test) are listed as not checked here.
4. Cross-object checks: volume and Service names are DNS labels; a Service selects the pods of a Deployment and its
   targetPorts name container ports; probes have one handler and name container ports; a
   pod running --kube has a token of a ServiceAccount bound to read RateLimitPolicies; the pod's
   ServiceAccount, ConfigMaps, Secrets and (Cluster)Role bindings exist in the render
   (a Secret also as a Certificate's secretName) or are declared external; the sluice container's --config paths are mounted;
   a HorizontalPodAutoscaler's target is rendered without replicas, and its containers
   request the resources whose utilization it reads.
5. --extract-policies writes every policy file of ConfigMaps named *-policies to DIR
   (for `sluice validate`); --extract-envoy writes a ConfigMap's envoy.yaml to FILE
   (for `envoy --mode validate`).
Exit status 1 on any error, each printed as `FILE: kind/name: message`.
"""
import argparse
import os
import sys

import re

import yaml

try:
    import kubernetes_validate as kv
except ImportError:  # pragma: no cover - reported below
    kv = None

PROM_KINDS = {"ServiceMonitor", "PrometheusRule"}
CERT_KINDS = {"Certificate"}
errors = []
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def err(src, doc, msg):
    name = f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}" if isinstance(doc, dict) else "?"
    errors.append(f"{src}: {name}: {msg}")


def check_prom(src, d):
    spec = d.get("spec")
    if not isinstance(spec, dict):
        return err(src, d, "spec missing")
    if d["kind"] == "ServiceMonitor":
        if not isinstance(spec.get("selector"), dict):
            err(src, d, "spec.selector missing")
        eps = spec.get("endpoints")
        if not isinstance(eps, list) or not eps:
            err(src, d, "spec.endpoints missing")
        for ep in eps or []:
            if not (ep.get("port") or ep.get("targetPort")):
                err(src, d, "endpoint without port")
    else:
        groups = spec.get("groups")
        if not isinstance(groups, list) or not groups:
            return err(src, d, "spec.groups missing")
        for g in groups:
            if not g.get("name"):
                err(src, d, "rule group without name")
            for r in g.get("rules", []):
                if not (("alert" in r) ^ ("record" in r)):
                    err(src, d, f"rule needs exactly one of alert/record: {r}")
                if not isinstance(r.get("expr"), str) or not r["expr"].strip():
                    err(src, d, f"rule without expr: {r}")
                if r.get("expr", "").count("(") != r.get("expr", "").count(")"):
                    err(src, d, f"unbalanced parentheses in expr: {r['expr']}")
                extra = set(r) - {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}
                if extra:
                    err(src, d, f"unknown rule fields {sorted(extra)}")


def check_certificate(src, d):
    spec = d.get("spec")
    if not isinstance(spec, dict):
        return err(src, d, "spec missing")
    if not spec.get("secretName"):
        err(src, d, "spec.secretName missing")
    if not (spec.get("issuerRef") or {}).get("name"):
        err(src, d, "spec.issuerRef.name missing")
    names = spec.get("dnsNames")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        err(src, d, f"spec.dnsNames must list names: {names!r}")
    extra = set(spec) - {"secretName", "issuerRef", "dnsNames", "duration", "renewBefore",
                         "privateKey", "usages", "commonName", "ipAddresses", "uris",
                         "secretTemplate", "subject", "isCA", "keystores"}
    if extra:
        err(src, d, f"unknown spec fields {sorted(extra)}")


def pod_spec(d):
    if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return ((d.get("spec") or {}).get("template") or {}).get("spec") or {}, (
            ((d.get("spec") or {}).get("template") or {}).get("metadata") or {}
        ).get("labels") or {}
    if d["kind"] == "Pod":
        return d.get("spec") or {}, (d.get("metadata") or {}).get("labels") or {}
    return None, None


def kube_access(src, w, spec, by_kind):
    """A pod running `sluice serve --kube` gets a token, of a ServiceAccount bound to a
    role that lists and watches RateLimitPolicy resources."""
    sa = spec.get("serviceAccountName") or "default"
    mount = spec.get("automountServiceAccountToken")
    if mount is None:
        mount = (by_kind.get("ServiceAccount", {}).get(sa) or {}).get("automountServiceAccountToken", True)
    if not mount:
        err(src, w, f"runs --kube without a service account token (automountServiceAccountToken: false for {sa})")

    def grants(role):
        for r in (role or {}).get("rules") or []:
            if ("sluice.dev" in r.get("apiGroups", []) and "ratelimitpolicies" in r.get("resources", [])
                    and {"list", "watch"} <= set(r.get("verbs", []))):
                return True
        return False

    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for b in by_kind.get(kind, {}).values():
            ref = b.get("roleRef") or {}
            if any(s.get("kind") == "ServiceAccount" and s.get("name") == sa for s in b.get("subjects") or []) \
                    and grants(by_kind.get(ref.get("kind"), {}).get(ref.get("name"))):
                return
    err(src, w, f"runs --kube as ServiceAccount {sa}, which no rendered binding lets list and watch ratelimitpolicies")


def cross_checks(src, docs, external_configmaps, external_secrets=frozenset()):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    workloads = [d for d in docs if pod_spec(d)[0] is not None]
    for w in workloads:
        spec, labels = pod_spec(w)
        sel = ((w.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if w["kind"] != "Pod" and any(labels.get(k) != v for k, v in sel.items()):
            err(src, w, f"selector {sel} does not match pod labels {labels}")
        sa = spec.get("serviceAccountName")
        if sa and sa != "default" and sa not in by_kind.get("ServiceAccount", {}):
            err(src, w, f"serviceAccountName {sa} is not in the render")
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        for v in vols:
            # The API server's rule (the OpenAPI schema has no pattern for it).
            if not DNS_LABEL.match(v) or len(v) > 63:
                err(src, w, f"volume name {v!r} is not a DNS label of at most 63 characters")
        for v in vols.values():
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in by_kind.get("ConfigMap", {}) and cm not in external_configmaps:
                err(src, w, f"volume {v['name']} uses ConfigMap {cm}, which is neither rendered nor declared external")
            secret = (v.get("secret") or {}).get("secretName")
            made = {((c.get("spec") or {}).get("secretName")) for c in by_kind.get("Certificate", {}).values()}
            if secret and secret not in by_kind.get("Secret", {}) and secret not in made and secret not in external_secrets:
                err(src, w, f"volume {v['name']} uses Secret {secret}, which is neither rendered, a Certificate's, nor declared external")
        for c in spec.get("containers") or []:
            ports = {p.get("name") for p in c.get("ports") or [] if p.get("name")}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                pr = c.get(probe) or {}
                handlers = [h for h in ("httpGet", "tcpSocket", "grpc", "exec") if pr.get(h)]
                if len(handlers) > 1:
                    # The API server's own rule: "may not specify more than 1 handler type".
                    err(src, w, f"{c['name']}.{probe} has {len(handlers)} handlers ({', '.join(handlers)}); the API server takes one")
                for h in ("httpGet", "tcpSocket", "grpc"):
                    port = (pr.get(h) or {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        err(src, w, f"{c['name']}.{probe} names port {port!r}, not a container port")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
            for m in mounts.values():
                if m["name"] not in vols:
                    err(src, w, f"{c['name']} mounts volume {m['name']}, not in the pod")
            args = c.get("args") or []
            if "--kube" in args:
                kube_access(src, w, spec, by_kind)
            for a in args:
                if isinstance(a, str) and a.startswith("--config="):
                    path = a.split("=", 1)[1]
                    if not any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mounts):
                        err(src, w, f"{c['name']}: {a} is not under any volumeMount")
        for svc in by_kind.get("Service", {}).values():
            ssel = (svc.get("spec") or {}).get("selector") or {}
            if not ssel or any(labels.get(k) != v for k, v in ssel.items()):
                continue
            all_ports = {p.get("name") for c in spec.get("containers") or [] for p in c.get("ports") or []}
            for p in (svc.get("spec") or {}).get("ports") or []:
                tp = p.get("targetPort")
                if isinstance(tp, str) and tp not in all_ports:
                    err(src, svc, f"targetPort {tp!r} is not a port of the pods of {w['metadata']['name']}")
    for svc in by_kind.get("Service", {}).values():
        # The API server's rule: a Service's name is a DNS-1035 label.
        name = svc["metadata"]["name"]
        if len(name) > 63 or not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", name):
            err(src, svc, f"Service name of {len(name)} characters is not a DNS-1035 label of at most 63")
    pod_labels = [pod_spec(w)[1] for w in workloads]
    for svc in by_kind.get("Service", {}).values():
        ssel = (svc.get("spec") or {}).get("selector") or {}
        if ssel and not any(all(l.get(k) == v for k, v in ssel.items()) for l in pod_labels):
            err(src, svc, f"selector {ssel} selects no rendered pod")
    for hpa in by_kind.get("HorizontalPodAutoscaler", {}).values():
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        target = by_kind.get(ref.get("kind"), {}).get(ref.get("name"))
        if target is None:
            err(src, hpa, f"scaleTargetRef {ref} is not in the render")
            continue
        if "replicas" in (target.get("spec") or {}):
            err(src, hpa, f"{ref['kind']} {ref['name']} sets replicas: each apply resets the count the autoscaler chose")
        # The controller's rule: a resource's utilization needs that request on every container.
        for m in (hpa.get("spec") or {}).get("metrics") or []:
            res = (m.get("resource") or {}).get("name") if m.get("type") == "Resource" else None
            if res and (m["resource"].get("target") or {}).get("type") == "Utilization":
                for c in pod_spec(target)[0].get("containers") or []:
                    if res not in ((c.get("resources") or {}).get("requests") or {}):
                        err(src, hpa, f"{res} utilization, but container {c['name']} requests no {res}")
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for b in by_kind.get(kind, {}).values():
            ref = b.get("roleRef") or {}
            if ref.get("name") not in by_kind.get(ref.get("kind"), {}):
                err(src, b, f"roleRef {ref} is not in the render")
            for s in b.get("subjects") or []:
                if s.get("kind") == "ServiceAccount" and s.get("name") not in by_kind.get("ServiceAccount", {}) and s.get("name") != "default":
                    err(src, b, f"subject ServiceAccount {s.get('name')} is not in the render")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-version", default="1.33.0")
    ap.add_argument("--extract-policies")
    ap.add_argument("--extract-envoy")
    ap.add_argument("--external-configmap", action="append", default=[])
    ap.add_argument("--external-secret", action="append", default=[])
    ap.add_argument("--allow-kind", action="append", default=[], help="custom kinds that are expected (not checked here)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    if kv is None:
        print("check-manifests: the kubernetes-validate package is missing (pip install kubernetes-validate)", file=sys.stderr)
        return 2
    counts = {}
    for src in a.files:
        try:
            with open(src) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            errors.append(f"{src}: YAML does not parse: {e}")
            continue
        good = []
        for d in docs:
            if not isinstance(d, dict) or not d.get("apiVersion") or not d.get("kind") or not (d.get("metadata") or {}).get("name"):
                err(src, d if isinstance(d, dict) else {}, "not an object with apiVersion, kind and metadata.name")
                continue
            good.append(d)
            kind = d["kind"]
            if kind in PROM_KINDS:
                check_prom(src, d)
                counts[kind + " (structural)"] = counts.get(kind + " (structural)", 0) + 1
                continue
            if kind in CERT_KINDS:
                check_certificate(src, d)
                counts[kind + " (structural)"] = counts.get(kind + " (structural)", 0) + 1
                continue
            try:
                kv.validate(d, a.k8s_version, strict=True)
                counts[kind] = counts.get(kind, 0) + 1
            except kv.SchemaNotFoundError:
                if kind in a.allow_kind:
                    counts[kind + " (not checked here)"] = counts.get(kind + " (not checked here)", 0) + 1
                else:
                    err(src, d, f"no schema for {d['apiVersion']} {kind} in Kubernetes {a.k8s_version}")
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in getattr(e, "path", []) or [])
                err(src, d, f"{path}: {getattr(e, 'message', e)}")
        cross_checks(src, good, set(a.external_configmap), set(a.external_secret))
        for d in good:
            if d["kind"] != "ConfigMap":
                continue
            data = d.get("data") or {}
            if a.extract_policies and d["metadata"]["name"].endswith("-policies"):
                os.makedirs(a.extract_policies, exist_ok=True)
                for name, text in data.items():
                    with open(os.path.join(a.extract_policies, name), "w") as f:
                        f.write(text)
            if a.extract_envoy and "envoy.yaml" in data:
                with open(a.extract_envoy, "w") as f:
                    f.write(data["envoy.yaml"])
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if errors:
        for e in errors:
            print("  " + e, file=sys.stderr)
        print(f"check-manifests: {len(errors)} error(s); checked {summary}", file=sys.stderr)
        return 1
    print(f"check-manifests: OK ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
