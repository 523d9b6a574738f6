#!/usr/bin/env bash
# Builds sigstore's cosign, pinned, from its Go module (`go install` of a tagged version checks every
# dependency against cosign's own go.sum and the Go checksum database) into a cache outside the clone:
# ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/cosign/<version>/cosign (about five minutes cold on two
# cores; nothing once cached), and links it as .venv/bin/cosign. `make release` signs with it and the
# release tests verify with it. Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
COSIGN_VERSION=v2.6.5
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/cosign/$COSIGN_VERSION"
if [ ! -x "$DIR/cosign" ]; then
  echo "[cosign] building cosign $COSIGN_VERSION from its Go module (cached afterwards)" >&2
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
    "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION"
  mv "$tmp/cosign" "$DIR/cosign"
fi
"$DIR/cosign" version 2>/dev/null | grep -q "GitVersion: *$COSIGN_VERSION" \
  || "$DIR/cosign" version 2>&1 | grep -q "${COSIGN_VERSION#v}" \
  || { echo "[cosign] $DIR/cosign is not $COSIGN_VERSION" >&2; exit 1; }
[ -d .venv/bin ] && ln -sf "$DIR/cosign" .venv/bin/cosign
echo "$DIR/cosign"
