#!/usr/bin/env bash
# `make cluster-down`: stops everything cluster-up started and removes what it mounted and made.
# Idempotent. Keeps the certificates and the simulated node unless PURGE=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
CLUSTER_DIR="${CLUSTER_DIR:-$PWD/.run/cluster}"
NODE_NAME="${NODE_NAME:-neuron-sim-node}"
log() { printf '[cluster-down] %s\n' "$*"; }
[ -d "$CLUSTER_DIR" ] || { log "nothing to stop"; exit 0; }
CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
CTR="$CLUSTER_DIR/containerd/bin/ctr"  # the cluster's own (up.sh links it)

if [ -S "$CTR_SOCK" ] && [ -x "$CTR" ]; then  # stop every pod's containers before the runtime goes
  for ns in k8s.io; do
    for task in $("$CTR" --address "$CTR_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
      "$CTR" --address "$CTR_SOCK" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1
    done
  done
  sleep 1
fi
for name in kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
  pidfile="$CLUSTER_DIR/$name.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
done
if tests/registry.sh status "$CLUSTER_DIR/registry" >/dev/null; then  # its storage stays, as the images' cache
  log "stopping the registry"
  tests/registry.sh stop "$CLUSTER_DIR/registry"
fi
pkill -f "containerd-shim-runc-v2 .*$CLUSTER_DIR" 2>/dev/null || true
# what the runtime and kubelet mounted under the cluster directory and /var/lib/kubelet
for mnt in $(awk -v d="$CLUSTER_DIR" -v k=/var/lib/kubelet '$2 ~ "^"d || $2 ~ "^"k {print $2}' /proc/mounts | sort -r); do
  umount -l "$mnt" 2>/dev/null || true
done
for netns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns delete "$netns" 2>/dev/null || true; done
ip link delete neuron0br 2>/dev/null || true
# kube-proxy's and the bridge plugin's iptables rules
for table in nat filter; do
  iptables-save -t "$table" 2>/dev/null | grep -E 'KUBE-|CNI-' >/dev/null && iptables -t "$table" -S 2>/dev/null \
    | awk '/^-A (PREROUTING|OUTPUT|POSTROUTING|FORWARD|INPUT) .*(KUBE-|CNI-)/ {sub(/^-A/, "-D"); print}' \
    | while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done
done
sed -i "/# neuron-helm-chart test cluster$/d" /etc/hosts
# the kubelet's records of the images it pulled (image_manager) go with the cluster they were pulled
# in: a record naming an image ID makes the kubelet refuse an imported image of that ID (pull policy Never)
rm -rf "$CLUSTER_DIR/containerd/state" "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/kubelet" /var/lib/kubelet/pods /var/lib/kubelet/image_manager
if [ "${PURGE:-0}" = 1 ]; then rm -rf "$CLUSTER_DIR"; fi
log "stopped"
