#!/usr/bin/env bash
# anchore's syft, pinned, built from its Go module by build-go-tool.sh into the cache outside the
# clone (measured 2026-12-01: 425 CPU-seconds to compile once its modules are downloaded, 13 minutes
# on two cores shared with other builds, 1.2 GB of memory at its peak; an 89 MB binary; nothing once
# cached), and linked as .venv/bin/syft. `make release` writes each image's SPDX SBOM with it
# (tools/release.py). Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
SYFT_VERSION=v1.57.0
# syft takes its version, which its SBOMs name as their creator, from the linker alone
SYFT=$(GO_TOOL_LDFLAGS="-X main.version=${SYFT_VERSION#v}" tools/build-go-tool.sh syft github.com/anchore/syft/cmd/syft "$SYFT_VERSION" | tail -n1)
"$SYFT" version 2>&1 | grep -q "${SYFT_VERSION#v}" || { echo "[syft] $SYFT is not $SYFT_VERSION" >&2; exit 1; }
[ -d .venv/bin ] && ln -sf "$SYFT" .venv/bin/syft
echo "$SYFT"
