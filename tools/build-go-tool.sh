#!/usr/bin/env bash
# Builds one pinned Go program from its module (`go install pkg@version` checks every dependency
# against the module's own go.sum and the Go checksum database) into a cache outside the clone, keyed
# by the version, so a fresh clone on the same machine reuses it:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/<name>/<version>/<name>
# Nothing is done when the binary is cached. Prints the binary's path on its last line.
#   build-go-tool.sh NAME PACKAGE VERSION      e.g. build-go-tool.sh cosign github.com/sigstore/cosign/v2/cmd/cosign v2.6.5
# GO_TOOL_LDFLAGS adds linker flags, for a program that learns its version only from one (-X main.version=...).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 NAME PACKAGE VERSION" >&2; exit 2; }
NAME=$1 PACKAGE=$2 VERSION=$3
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/$NAME/$VERSION"
if [ ! -x "$DIR/$NAME" ]; then
  echo "[$NAME] building $PACKAGE@$VERSION from its Go module (cached afterwards)" >&2
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "-s -w ${GO_TOOL_LDFLAGS:-}" "$PACKAGE@$VERSION"
  mv "$tmp/$(basename "$PACKAGE")" "$DIR/$NAME"
fi
echo "$DIR/$NAME"
