#!/usr/bin/env bash
# Builds the pinned Kubernetes release's binaries from the Go module in tests/cluster/k8s
# (requires k8s.io/kubernetes at the pin, with `replace` lines mapping each staging module to
# the same release's published v0.x version) into a cache outside the clone, so a fresh clone
# on the same machine reuses them:  ${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/<version>/bin
# Rebuilt only when the pin changes (first build: about ten minutes on two cores).
#   build-k8s.sh                 build what is missing
#   build-k8s.sh --regenerate    rewrite tests/cluster/k8s/go.mod for K8S_VERSION from the release's own go.mod
# K8S_MODULE_DIR names another such module (tests/simcluster/k8s-next: a newer release for the
# scheduling simulation only) and K8S_BINARIES the binaries to build from it.
set -euo pipefail
cd "${K8S_MODULE_DIR:-$(dirname "$0")/k8s}"
K8S_VERSION=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' go.mod)
[ -n "${NEW_K8S_VERSION:-}" ] && K8S_VERSION=$NEW_K8S_VERSION
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/$K8S_VERSION"
read -r -a BINARIES <<< "${K8S_BINARIES:-kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet}"

if [ "${1:-}" = "--regenerate" ]; then
  upstream=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    printf 'module neuron-helm-chart/k8s-build\n\n%s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$(grep -E '^go [0-9]' "$upstream")" "$K8S_VERSION"
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 v0.'"${K8S_VERSION#v1.}"'#p' "$upstream"
    printf ')\n'
  } > go.mod
  GOFLAGS=-mod=mod go mod tidy
  echo "tests/cluster/k8s now pins Kubernetes $K8S_VERSION"
  exit 0
fi

missing=()
for b in "${BINARIES[@]}"; do [ -x "$CACHE/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "Kubernetes $K8S_VERSION binaries cached in $CACHE/bin"; exit 0; fi
mkdir -p "$CACHE/bin"
for b in "${missing[@]}"; do
  echo "building $b $K8S_VERSION (cached afterwards)"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$(echo "${K8S_VERSION#v1.}" | cut -d. -f1)" \
      -o "$CACHE/bin/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv "$CACHE/bin/$b.tmp" "$CACHE/bin/$b"
done
echo "Kubernetes $K8S_VERSION binaries cached in $CACHE/bin"
