#!/usr/bin/env bash
# Runs the promtool tests of the shipped alerts: deploy/prometheus/tests/*.test.yaml
# against the rule file inside deploy/prometheus/sluice-rules.yaml (a PrometheusRule,
# whose `spec` is a plain Prometheus rule file), and the same tests against the Helm
# chart's PrometheusRule when helm is installed. Needs promtool (Debian's
# `prometheus` package; scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The `spec` of the first PrometheusRule in a YAML stream, as a rule file.
spec_of() {
  python3 -c '
import sys, yaml
for doc in yaml.safe_load_all(sys.stdin):
    if doc and doc.get("kind") == "PrometheusRule":
        yaml.safe_dump(doc["spec"], sys.stdout, sort_keys=False)
        break
else:
    sys.exit("no PrometheusRule in the input")
'
}

run() {
  local name=$1 dir="$work/$1"
  mkdir -p "$dir"
  cp deploy/prometheus/tests/*.test.yaml "$dir/"
  cat > "$dir/rules.yaml"
  promtool check rules "$dir/rules.yaml" >/dev/null
  echo "promtool test rules ($name)"
  promtool test rules "$dir"/*.test.yaml
}

spec_of < deploy/prometheus/sluice-rules.yaml | run deploy

# The chart's PrometheusRule selects its own job: the same series, scraped by it.
if command -v helm >/dev/null; then
  helm template sluice charts/sluice --kube-version 1.30.0 --set prometheusRule.enabled=true \
    --set fullnameOverride=sluice | spec_of > "$work/chart-rules.yaml"
  mkdir -p "$work/chart"
  for t in deploy/prometheus/tests/*.test.yaml; do
    sed -e "s/series: '\(sluice_[a-z_]*\){/series: '\1{job=\"sluice\",/" \
        -e 's/exp_labels: {/exp_labels: {job: sluice, /' "$t" > "$work/chart/$(basename "$t")"
  done
  mv "$work/chart-rules.yaml" "$work/chart/rules.yaml"
  # One set of alerts: the chart's are the file's, each limited to its job, plus
  # SluiceDown, which only the chart can write (`up` is found by the job's name).
  echo "same alerts (deploy, chart)"
  spec_of < deploy/prometheus/sluice-rules.yaml | python3 -c '
import re, sys, yaml
def alerts(path):
    spec = yaml.safe_load(open(path))
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
deploy = alerts("/dev/stdin")
chart = alerts(sys.argv[1])
chart.pop("SluiceDown", None)
if set(deploy) != set(chart):
    sys.exit(f"only in deploy: {sorted(set(deploy) - set(chart))}; only in chart: {sorted(set(chart) - set(deploy))}")
for name, rule in deploy.items():
    theirs = dict(chart[name])
    theirs["expr"] = re.sub(r"\{job=\"sluice\"\}|job=\"sluice\",", "", theirs["expr"])
    if rule != theirs:
        sys.exit(f"{name} differs:\n  deploy: {rule}\n  chart:  {theirs}")
' "$work/chart/rules.yaml"
  promtool check rules "$work/chart/rules.yaml" >/dev/null
  echo "promtool test rules (chart)"
  promtool test rules "$work/chart"/*.test.yaml
else
  echo "helm not found: the chart's alerts are not tested (scripts/install-kube.sh installs it)" >&2
  exit 1
fi
