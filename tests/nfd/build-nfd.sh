#!/usr/bin/env bash
# Builds node-feature-discovery's nfd-master and nfd-worker from the pinned Go module
# (tests/nfd/tools/go.mod: sigs.k8s.io/node-feature-discovery and its nested api/nfd module, which
# the release's own go.mod replaces with ./api/nfd, so `go install ...@version` is refused) into a
# cache outside the clone:  ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/nfd/<version>-cwd-root/bin
# (about six minutes cold on two cores; seconds once cached).
#
# The directory NFD takes for the host's root is fixed at link time (hostpath.pathPrefix: "/" in
# local builds, "/host-" in NFD's images). These binaries link "./": the worker reads sys/ (and
# proc/, etc/, ...) under its working directory, so a worker started in a simulated node's root
# (neuron-sim) reads that node's PCI functions as the host's, with no mount and no privilege. That
# is also why the cache key names the prefix. Never run these binaries on a real node.
# Prints the bin directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/tools"
NFD_VERSION=$(sed -n 's#^require sigs.k8s.io/node-feature-discovery \(v[0-9.]*\)$#\1#p' go.mod)
[ -n "$NFD_VERSION" ] || { echo "[nfd] cannot read the node-feature-discovery pin in tests/nfd/tools/go.mod" >&2; exit 1; }
BIN="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/nfd/$NFD_VERSION-cwd-root/bin"

for b in nfd-master nfd-worker; do
  [ -x "$BIN/$b" ] && continue
  echo "[nfd] building $b $NFD_VERSION (cached afterwards)" >&2
  mkdir -p "$BIN"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -tags osusergo,netgo -trimpath -ldflags "-s -w \
      -X sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath.pathPrefix=./ \
      -X sigs.k8s.io/node-feature-discovery/pkg/version.version=$NFD_VERSION" \
      -o "$BIN/$b.tmp" "sigs.k8s.io/node-feature-discovery/cmd/$b"
  mv "$BIN/$b.tmp" "$BIN/$b"
done
echo "[nfd] node-feature-discovery $NFD_VERSION cached in $BIN" >&2
echo "$BIN"
