#!/usr/bin/env bash
# The image of the chart's second scheduler (`neuron-scheduler`, scheduler.enabled=true) on the test
# cluster, which cannot pull from registry.k8s.io: the cluster's own kube-scheduler binary (built by
# build-k8s.sh from the pinned Kubernetes module, static) at /usr/local/bin/kube-scheduler, where the
# upstream image has it, tagged exactly as the chart's default expects:
# registry.k8s.io/kube-scheduler:<the cluster's version>. Imported into the cluster's containerd;
# skipped when it is there already. Meant to be called from images.sh (or by hand, as root):
#   tests/cluster/kube-scheduler-image.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER_DIR="${CLUSTER_DIR:-$PWD/.run/cluster}"
K8S_VERSION=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' tests/cluster/k8s/go.mod)
BINARY="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/$K8S_VERSION/bin/kube-scheduler"
IMAGE="registry.k8s.io/kube-scheduler:$K8S_VERSION"
CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
CTR="$CLUSTER_DIR/containerd/bin/ctr"  # the cluster's own (up.sh links it)
# containerd 2.x's ctr repeats every server deprecation (this host's cgroup v1) on each call
export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
log() { printf '[kube-scheduler-image] %s\n' "$*"; }

[ -x "$BINARY" ] || tests/cluster/build-k8s.sh
[ -S "$CTR_SOCK" ] || { echo "no containerd at $CTR_SOCK: run make cluster-up first" >&2; exit 1; }
if "$CTR" --address "$CTR_SOCK" -n k8s.io images ls -q | grep -x "$IMAGE" >/dev/null; then
  log "$IMAGE already in the cluster's containerd"
  exit 0
fi
archive="$CLUSTER_DIR/kube-scheduler.tar"
.venv/bin/python tests/cluster/pause_image.py "$archive" "$IMAGE" binary "$BINARY" /usr/local/bin/kube-scheduler
"$CTR" --address "$CTR_SOCK" -n k8s.io images import "$archive" >/dev/null
rm -f "$archive"
log "$IMAGE (the cluster's own build) imported into the cluster's containerd"
