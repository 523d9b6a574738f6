#!/usr/bin/env bash
# Builds the pinned Kubernetes release's node and control-plane binaries from its Go modules
# into a cache outside the clone, so a fresh clone on the same machine reuses them:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/<version>/bin
# Rebuilt only when the pin (K8S_VERSION below) changes. `replace` lines map every staging
# module of k8s.io/kubernetes to the same release's published version (v0.<minor>.<patch>).
set -euo pipefail
cd "$(dirname "$0")"
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet)

missing=()
for b in "${BINARIES[@]}"; do [ -x "$CACHE/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "kubernetes $K8S_VERSION binaries cached in $CACHE/bin"; exit 0; fi

work="$CACHE/module"
mkdir -p "$work" "$CACHE/bin"
# The module is generated, not committed: its replace block comes from the release's own go.mod.
upstream_mod=$(cd "$work" && { [ -f go.mod ] || go mod init neuron-helm-chart/k8s-build >/dev/null 2>&1; } \
  && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module neuron-helm-chart/k8s-build"
  echo
  grep -E '^go [0-9]' "$upstream_mod"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$upstream_mod"
  echo ")"
} > "$work/go.mod"
printf 'package tools\n\nimport (\n' > "$work/tools.go"
for b in "${BINARIES[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b" >> "$work/tools.go"; done
printf ')\n' >> "$work/tools.go"
sed -i '1i //go:build tools\n' "$work/tools.go"
(cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
for b in "${missing[@]}"; do
  echo "building $b $K8S_VERSION (first time: minutes)"
  (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#v1.} " \
      -o "$CACHE/bin/$b.tmp" "k8s.io/kubernetes/cmd/$b")
  mv "$CACHE/bin/$b.tmp" "$CACHE/bin/$b"
done
echo "kubernetes $K8S_VERSION binaries cached in $CACHE/bin"
