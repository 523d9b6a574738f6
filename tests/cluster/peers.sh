#!/usr/bin/env bash
# The parts of a real cluster the chart counts on that a bare control plane lacks: cluster DNS
# (CoreDNS; the chart's neuron-scheduler reaches the extender by its Service name) and a
# NetworkPolicy enforcer (sigs.k8s.io/kube-network-policies; the chart renders policies, and the
# security tests prove they hold). Each is built from its pinned Go module by tools/build-go-tool.sh
# into the cache outside the clone, packed as a one-binary image and run in the cluster from
# tests/cluster/peers/*.yaml, as a cluster installer would.
#   peers.sh build      build both (nothing when cached; `make setup` runs it)
#   peers.sh install    import the images into the running cluster's containerd, apply the
#                       manifests and wait until both run (up.sh runs it once the node is Ready)
set -euo pipefail
cd "$(dirname "$0")/../.."
COREDNS_VERSION=v1.14.7
KNP_VERSION=v0.8.0
CLUSTER_DIR="${CLUSTER_DIR:-$PWD/.run/cluster}"
log() { printf '[peers] %s\n' "$*"; }

build() {
  COREDNS=$(tools/build-go-tool.sh coredns github.com/coredns/coredns "$COREDNS_VERSION" | tail -n1)
  KNP=$(tools/build-go-tool.sh kube-network-policies sigs.k8s.io/kube-network-policies/cmd "$KNP_VERSION" | tail -n1)
}

install_peer() {  # name, binary, path in the image, manifest
  local name=$1 binary=$2 path=$3 manifest=$4
  local image="localhost/neuron-test/$name:$(basename "$(dirname "$binary")")"
  if ! "$CTR" --address "$CTR_SOCK" -n k8s.io images ls -q | grep -x "$image" >/dev/null; then
    log "importing $image"
    .venv/bin/python tests/cluster/pause_image.py "$CLUSTER_DIR/$name.tar" "$image" binary "$binary" "$path"
    "$CTR" --address "$CTR_SOCK" -n k8s.io images import "$CLUSTER_DIR/$name.tar" >/dev/null
    rm -f "$CLUSTER_DIR/$name.tar"
  fi
  sed "s|@IMAGE@|$image|" "$manifest" | "${KUBECTL[@]}" apply -f - >/dev/null
}

case "${1:-}" in
  build)
    build
    printf '%s\n%s\n' "$COREDNS" "$KNP"
    ;;
  install)
    build
    CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
    CTR="$CLUSTER_DIR/containerd/bin/ctr"
    export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
    KUBECTL=(.venv/bin/kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig")
    install_peer coredns "$COREDNS" /coredns tests/cluster/peers/coredns.yaml
    install_peer kube-network-policies "$KNP" /bin/netpol tests/cluster/peers/kube-network-policies.yaml
    "${KUBECTL[@]}" -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null \
      || { "${KUBECTL[@]}" -n kube-system logs deployment/coredns --tail=20 >&2 || true; exit 1; }
    "${KUBECTL[@]}" -n kube-system rollout status daemonset/kube-network-policies --timeout=120s >/dev/null \
      || { "${KUBECTL[@]}" -n kube-system logs daemonset/kube-network-policies --tail=20 >&2 || true; exit 1; }
    for _ in $(seq 1 150); do curl -sf http://127.0.0.1:19080/metrics >/dev/null && break; sleep 0.2; done
    curl -sf http://127.0.0.1:19080/metrics >/dev/null \
      || { echo "kube-network-policies serves no metrics on 127.0.0.1:19080" >&2; exit 1; }
    log "CoreDNS $COREDNS_VERSION (kube-dns 10.96.0.10) and kube-network-policies $KNP_VERSION run"
    ;;
  *) echo "usage: $0 build|install" >&2; exit 2 ;;
esac
