#!/usr/bin/env bash
# sigstore's cosign, pinned, built from its Go module by build-go-tool.sh into the cache outside the
# clone (about five minutes cold on two cores; nothing once cached), and linked as .venv/bin/cosign.
# `make release` signs with it and the release tests verify with it. Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
COSIGN_VERSION=v2.6.5
COSIGN=$(tools/build-go-tool.sh cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION" | tail -n1)
"$COSIGN" version 2>/dev/null | grep -q "GitVersion: *$COSIGN_VERSION" \
  || "$COSIGN" version 2>&1 | grep -q "${COSIGN_VERSION#v}" \
  || { echo "[cosign] $COSIGN is not $COSIGN_VERSION" >&2; exit 1; }
[ -d .venv/bin ] && ln -sf "$COSIGN" .venv/bin/cosign
echo "$COSIGN"
