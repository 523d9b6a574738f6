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

stop_pid() {  # name, pid: its process group, TERM then KILL after ten seconds
  local name=$1 pid=$2
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping $name (pid $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  log "$name ignored SIGTERM for 10 s: SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}
stop_named() {  # name: a process cluster-up started, by its pid file
  local pidfile="$CLUSTER_DIR/$1.pid"
  [ -f "$pidfile" ] || return 0
  stop_pid "$1" "$(cat "$pidfile")"
  rm -f "$pidfile"
}
# The pods' cgroups (cgroupfs driver: kubepods under each v1 controller, or the v2 root; under
# up.sh's KUBELET_CGROUP_ROOT there when it set one)
KUBELET_CGROUP_ROOT="${KUBELET_CGROUP_ROOT:-}"
POD_CGROUPS="${KUBELET_CGROUP_ROOT:+$KUBELET_CGROUP_ROOT/}kubepods"
pod_cgroups() {
  local base
  for base in /sys/fs/cgroup/*/$POD_CGROUPS /sys/fs/cgroup/$POD_CGROUPS; do
    [ -d "$base" ] && find "$base" -name cgroup.procs 2>/dev/null
  done
}
pod_processes() { pod_cgroups | xargs -r cat 2>/dev/null | sort -un; }

# 0. The other nodes of a multi-node cluster (tests/cluster/nodes.sh), each in its own namespaces
[ ! -f "$CLUSTER_DIR/nodes.env" ] || CLUSTER_DIR="$CLUSTER_DIR" tests/cluster/nodes.sh down || status_nodes=1
# 1. The kubelet first: stopped, it can no longer start a container we are about to kill
#    (it restarted one in the window between the two once, and that one outlived the runtime).
stop_named kubelet
# 2. Every container of the cluster's runtime, in every namespace, while the runtime still runs.
if [ -S "$CTR_SOCK" ] && [ -x "$CTR" ]; then
  killed=0
  for ns in $("$CTR" --address "$CTR_SOCK" namespaces ls -q 2>/dev/null); do
    for task in $("$CTR" --address "$CTR_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
      "$CTR" --address "$CTR_SOCK" -n "$ns" tasks kill -a -s SIGKILL "$task" >/dev/null 2>&1 && killed=$((killed + 1))
    done
  done
  for _ in $(seq 1 50); do  # until the runtime reports them all stopped (ten seconds at most)
    left=0
    for ns in $("$CTR" --address "$CTR_SOCK" namespaces ls -q 2>/dev/null); do
      left=$((left + $("$CTR" --address "$CTR_SOCK" -n "$ns" tasks ls 2>/dev/null | awk 'NR > 1 && $3 != "STOPPED"' | wc -l)))
    done
    [ "$left" -eq 0 ] && break
    sleep 0.2
  done
  if [ "${left:-0}" -gt 0 ]; then log "stopped $killed container(s), $left still reported running"; else log "stopped $killed container(s)"; fi
fi
# 3. Whatever is left in the pods' cgroups (a container's children, a task the runtime lost).
for round in 1 2 3 4 5; do
  pids=$(pod_processes)
  [ -n "$pids" ] || break
  for pid in $pids; do
    log "killing pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone)), left in a pod cgroup"
    kill -KILL "$pid" 2>/dev/null || true
  done
  sleep 0.2
done
# 4. The rest of the cluster, the runtime among the last.
for name in kube-router kube-proxy kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
  stop_named "$name"
done
if tests/registry.sh status "$CLUSTER_DIR/registry" >/dev/null; then  # its storage stays, as the images' cache
  log "stopping the registry"
  tests/registry.sh stop "$CLUSTER_DIR/registry"
fi
pkill -f "containerd-shim-runc-v2 .*$CLUSTER_DIR" 2>/dev/null || true
status=${status_nodes:-0}
leftover=$(pod_processes)
if [ -n "$leftover" ]; then
  log "still in the pods' cgroups after everything stopped: $(echo $leftover)"
  status=1
fi
# the empty cgroups the kubelet made (the pod cgroups, or the whole cgroup root up.sh gave it); it makes them again
own_cgroups=${KUBELET_CGROUP_ROOT:-kubepods}
for base in /sys/fs/cgroup/*/$own_cgroups /sys/fs/cgroup/$own_cgroups; do
  [ -d "$base" ] && find "$base" -depth -type d -exec rmdir {} + 2>/dev/null
done
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
# kube-router's network policy chains and ipsets (tests/cluster/peers.sh): its own --cleanup-config
# crashes in v2.1.0 (in the service proxy's part, which never ran), and a stale chain would judge a
# later cluster's pods by this one's policies. The jumps to them went with the KUBE- rules above.
for chain in $(iptables -S 2>/dev/null | awk '/^-N KUBE-(ROUTER|NWPLCY|POD-FW)-/ {print $2}'); do
  iptables -F "$chain" 2>/dev/null || true
done
for chain in $(iptables -S 2>/dev/null | awk '/^-N KUBE-(ROUTER|NWPLCY|POD-FW)-/ {print $2}'); do
  iptables -X "$chain" 2>/dev/null || true
done
for set in $(ipset list -n 2>/dev/null | grep '^KUBE-'); do ipset destroy "$set" 2>/dev/null || true; done
# written in place, not renamed over: a second cluster's /etc/hosts is a file mounted over the host's
hosts=$(grep -v "# neuron-helm-chart test cluster$" /etc/hosts || true)
printf '%s\n' "$hosts" > /etc/hosts
# the kubelet's records of the images it pulled (image_manager) go with the cluster they were pulled
# in: a record naming an image ID makes the kubelet refuse an imported image of that ID (pull policy Never)
# etcd's data: where $CLUSTER_DIR/etcd links to (tmpfs, up.sh), then the link
[ ! -L "$CLUSTER_DIR/etcd" ] || rm -rf "$(readlink "$CLUSTER_DIR/etcd")"
rm -rf "$CLUSTER_DIR/containerd/state" "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/kubelet" /var/lib/kubelet/pods /var/lib/kubelet/image_manager
if [ "${PURGE:-0}" = 1 ]; then rm -rf "$CLUSTER_DIR"; fi
log "stopped"
exit $status
