#!/usr/bin/env bash
# Builds the Karpenter node-repair test peer (tests/karpenter/peer: Karpenter's own node repair
# controller with a test cloud provider carrying AWS's repair policies) from its module, at the
# sigs.k8s.io/karpenter version its go.mod pins, into a cache outside the clone:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/karpenter/<version>/<source key>/karpenter-repair-peer
# keyed by the version and the peer's own source, so an edit to it rebuilds (a few minutes cold on
# two cores; nothing once cached), with the NodePool and NodeClaim CRDs of that version in crds/. Karpenter v1.15 needs Go >= 1.26.9, newer than this machine's,
# so this build, and only this build, takes the approved Go 1.27.3 toolchain from the Go module proxy.
# Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/peer"
export GOTOOLCHAIN=go1.27.3
VERSION=$(sed -n 's#^\s*sigs.k8s.io/karpenter \(v[0-9.]*\)$#\1#p; s#^require sigs.k8s.io/karpenter \(v[0-9.]*\)$#\1#p' go.mod | head -1)
[ -n "$VERSION" ] || { echo "[karpenter] cannot read the sigs.k8s.io/karpenter pin in tests/karpenter/peer/go.mod" >&2; exit 1; }
KEY=$(cat go.mod go.sum main.go | sha256sum | cut -c1-12)
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/karpenter/$VERSION/$KEY"
if [ ! -x "$DIR/karpenter-repair-peer" ]; then
  echo "[karpenter] building the node repair peer on sigs.k8s.io/karpenter $VERSION (cached afterwards)" >&2
  mkdir -p "$DIR"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$DIR/karpenter-repair-peer.tmp" .
  mv "$DIR/karpenter-repair-peer.tmp" "$DIR/karpenter-repair-peer"
fi
if [ ! -f "$DIR/crds/.complete" ]; then
  src=$(GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)/pkg/apis/crds
  mkdir -p "$DIR/crds"
  cp "$src/karpenter.sh_nodepools.yaml" "$src/karpenter.sh_nodeclaims.yaml" "$DIR/crds/"
  touch "$DIR/crds/.complete"
fi
echo "$DIR/karpenter-repair-peer"
