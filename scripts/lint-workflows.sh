#!/usr/bin/env bash
# Checks the GitHub workflows (.github/workflows/*.yml), which cannot run here, with
# actionlint: the workflow syntax, expressions, action inputs, job needs, and the
# `run:` scripts through shellcheck. Installs what is missing: actionlint from the Go
# module proxy (ACTIONLINT_VERSION), shellcheck from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/.."

ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
have=$(go version -m "$gobin/actionlint" 2>/dev/null | awk '$1 == "mod" {print $3; exit}' || true)
if [ "$have" != "$ACTIONLINT_VERSION" ]; then
    echo "[lint-workflows] go install actionlint@$ACTIONLINT_VERSION" >&2
    GOBIN="$gobin" go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
fi
if ! command -v shellcheck >/dev/null; then
    echo "[lint-workflows] apt-get install shellcheck" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends shellcheck >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends shellcheck >/dev/null; }
fi
"$gobin/actionlint" -shellcheck "$(command -v shellcheck)" .github/workflows/*.yml
echo "actionlint: $(ls .github/workflows/*.yml | wc -l) workflow(s) clean"
