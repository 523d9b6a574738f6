#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, the controller Kueue's own image runs) from its
# Go module at the pinned version, through tools/build-go-tool.sh, into the cache outside the clone:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/kueue/<version>/kueue
# with that version's own manifests beside it, copied from the module the build used:
#   config/crd      the CRDs (bases/) and the kustomization whose patches turn on their conversion webhook
#   config/webhook  the Mutating- and ValidatingWebhookConfiguration (manifests.yaml)
# About ten minutes cold on two cores; nothing once cached. tests/test_kueue.py runs it against a
# simcluster control plane (tests/kueue/controller.py). Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
KUEUE_VERSION=v0.17.0
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/kueue/$KUEUE_VERSION"
KUEUE=$(GO_TOOL_LDFLAGS="-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  tools/build-go-tool.sh kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION" | tail -n1)
if [ ! -f "$DIR/config/.complete" ]; then
  # the module go install verified (its go.sum and the checksum database), from the module cache
  src=$(cd "$DIR" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src/config/components/crd/bases" ] || { echo "[kueue] no CRDs in the module's directory ($src)" >&2; exit 1; }
  rm -rf "$DIR/config"
  mkdir -p "$DIR/config/webhook"
  cp -r "$src/config/components/crd" "$DIR/config/crd"
  cp "$src/config/components/webhook/manifests.yaml" "$DIR/config/webhook/"
  chmod -R u+w "$DIR/config"
  touch "$DIR/config/.complete"
fi
echo "$KUEUE"
