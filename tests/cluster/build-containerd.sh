#!/usr/bin/env bash
# Builds the test cluster's container runtime, containerd 2.x (its daemon, the runc shim and ctr), from
# the Go module pinned in tests/cluster/containerd/go.mod into a cache outside the clone, keyed by
# version, so a fresh clone on the same machine reuses it:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/containerd/<version>/bin
# containerd 2.x because Debian's 1.6 does not apply CDI device requests, which Dynamic Resource
# Allocation and the device plugin's CDIDevices rely on. runc stays Debian's (separate project).
# Rebuilt only when the pin changes; seconds once cached. Prints the bin directory on its last line.
#
# Build settings follow containerd's Makefile: urfave_cli_no_docs everywhere, the shim static and
# without gRPC (no_grpc). No cgo: the daemon then leaves out the btrfs snapshotter (cgo only), and
# no_devmapper/no_zfs leave out two more snapshotters the cluster never uses (overlayfs is the default).
set -euo pipefail
cd "$(dirname "$0")/containerd"
CONTAINERD_VERSION=$(sed -n 's#^require github.com/containerd/containerd/v2 \(v[0-9.]*\)$#\1#p' go.mod)
[ -n "$CONTAINERD_VERSION" ] || { echo "[containerd] cannot read the pin in tests/cluster/containerd/go.mod" >&2; exit 1; }
BIN="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/containerd/$CONTAINERD_VERSION/bin"
PKG=github.com/containerd/containerd/v2
LDFLAGS="-s -w -X $PKG/version.Version=$CONTAINERD_VERSION -X $PKG/version.Revision=go-module"

build() {  # binary, build tags
  [ -x "$BIN/$1" ] && return
  echo "[containerd] building $1 $CONTAINERD_VERSION (cached afterwards)" >&2
  mkdir -p "$BIN"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -tags "$2" -trimpath -ldflags "$LDFLAGS" -o "$BIN/$1.tmp" "$PKG/cmd/$1"
  mv "$BIN/$1.tmp" "$BIN/$1"
}
build containerd "urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
build containerd-shim-runc-v2 "urfave_cli_no_docs no_grpc"
build ctr "urfave_cli_no_docs"
echo "[containerd] containerd $CONTAINERD_VERSION cached in $BIN" >&2
echo "$BIN"
