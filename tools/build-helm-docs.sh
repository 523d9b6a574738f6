#!/usr/bin/env bash
# norwoodj's helm-docs, pinned, built from its Go module by build-go-tool.sh into the cache outside
# the clone (nothing once cached). `make chart-docs` renders the chart's README.md with it, from
# README.md.gotmpl and values.yaml's `# --` comments. Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM_DOCS_VERSION=v1.14.2
# helm-docs takes its version, which `--version` prints, from the linker alone
HELM_DOCS=$(GO_TOOL_LDFLAGS="-X main.version=${HELM_DOCS_VERSION#v}" \
  tools/build-go-tool.sh helm-docs github.com/norwoodj/helm-docs/cmd/helm-docs "$HELM_DOCS_VERSION" | tail -n1)
"$HELM_DOCS" --version 2>&1 | grep -q "${HELM_DOCS_VERSION#v}" || { echo "[helm-docs] $HELM_DOCS is not $HELM_DOCS_VERSION" >&2; exit 1; }
echo "$HELM_DOCS"
