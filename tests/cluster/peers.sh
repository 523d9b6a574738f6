#!/usr/bin/env bash
# The parts of a real cluster the chart counts on that a bare control plane lacks: cluster DNS
# (CoreDNS; the chart's neuron-scheduler reaches the extender by its Service name) and a
# NetworkPolicy enforcer (the chart renders policies, and the security tests prove they hold). Each
# is built from its pinned Go module by tools/build-go-tool.sh into the cache outside the clone.
# CoreDNS runs in the cluster from tests/cluster/peers/coredns.yaml, packed as a one-binary image, as
# kubeadm installs it. The enforcer is kube-router's network policy controller alone
# (--run-firewall; no routing, no service proxy), a host process like this cluster's kube-proxy, as
# its user guide's "running as agent" shows: it programs iptables and ipsets through their tools,
# which the host has and a one-binary image would not.
# Why not sigs.k8s.io/kube-network-policies (v0.8.0, which the issue named): it queues packets with
# nftables' `queue` expression, which this machine's kernel is built without (CONFIG_NFT_QUEUE is
# not set in /proc/config.gz), so it cannot program a single rule here ("netlink receive: no such
# file or directory"). kube-router v2.1.0 is the only version the Go module proxy serves; security
# flaws are reported against it. It runs only on this loopback test cluster, never in the product.
#   peers.sh build          build both (nothing when cached; `make setup` runs it)
#   peers.sh path NAME      the cached binary of coredns or kube-router (built if missing)
#   peers.sh install        import CoreDNS's image into the running cluster's containerd, apply its
#                           manifest and wait until it serves (up.sh runs it once the node is Ready)
set -euo pipefail
cd "$(dirname "$0")/../.."
COREDNS_VERSION=v1.14.7
KUBE_ROUTER_VERSION=v2.1.0
CLUSTER_DIR="${CLUSTER_DIR:-$PWD/.run/cluster}"
log() { printf '[peers] %s\n' "$*"; }

build() {
  COREDNS=$(tools/build-go-tool.sh coredns github.com/coredns/coredns "$COREDNS_VERSION" | tail -n1)
  KUBE_ROUTER=$(tools/build-go-tool.sh kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
    "$KUBE_ROUTER_VERSION" | tail -n1)
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
    printf '%s\n%s\n' "$COREDNS" "$KUBE_ROUTER"
    ;;
  path)
    build >/dev/null
    case "${2:-}" in
      coredns) echo "$COREDNS" ;;
      kube-router) echo "$KUBE_ROUTER" ;;
      *) echo "usage: $0 path coredns|kube-router" >&2; exit 2 ;;
    esac
    ;;
  install)
    build
    CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
    CTR="$CLUSTER_DIR/containerd/bin/ctr"
    export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
    KUBECTL=(.venv/bin/kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig")
    install_peer coredns "$COREDNS" /coredns tests/cluster/peers/coredns.yaml
    "${KUBECTL[@]}" -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null \
      || { "${KUBECTL[@]}" -n kube-system logs deployment/coredns --tail=20 >&2 || true; exit 1; }
    log "CoreDNS $COREDNS_VERSION serves the kube-dns Service (10.96.0.10)"
    ;;
  *) echo "usage: $0 build|path NAME|install" >&2; exit 2 ;;
esac
