#!/usr/bin/env bash
# A second test cluster on this machine, beside make cluster-up's, in network and mount namespaces of
# its own: up.sh and down.sh as they are, run inside them. `make test` runs chart-testing's installs
# on it (tests marked `ct`) while the rest of the e2e suite runs on the first cluster: they cannot
# share one kubelet (two releases' device plugins on one resource, cluster-scoped objects, ct's
# checks of a healthy node while other tests inject faults).
#   isolated.sh up DIR          create the namespaces, start the cluster (state in DIR), import the
#                               images of the last build (images.sh --import-only)
#   isolated.sh exec DIR CMD... run CMD in its namespaces, with CLUSTER_DIR and KUBECONFIG set to it
#   isolated.sh down DIR        down.sh inside, then remove the namespaces and what they held
#   isolated.sh ns DIR          only create the namespaces (tests/cluster/nodes.sh: a node of a cluster).
#                               With UPLINK="IFNAME A.B.C ROUTE...": also a veth pair to the namespace
#                               this runs in, its end there named IFNAME (address A.B.C.1, the caller
#                               configures it), the other end inside (A.B.C.2/24), each ROUTE via A.B.C.1
#
# What keeps the two apart:
# - the network namespace: its own loopback (API server on 127.0.0.1:6443, kubelet, registry), pod
#   bridge and iptables (kube-proxy, kube-router and the bridge plugin program rules of the same names),
#   and no way out: its default route goes to a veth pair with both ends inside, whose address is the node's;
# - the mount namespace: each host path below, which up.sh, down.sh, the kubelet, containerd or the
#   chart write by a fixed name, is a directory of its own under DIR/host (the simulated node at
#   /var/lib/neuron-sim is its own too, so a fault injected on one node is not seen on the other);
# - the kubelet's cgroup root (up.sh's KUBELET_CGROUP_ROOT): its pods' cgroups are apart from the first's.
# Processes share the host's PID namespace: down.sh stops them by pid file, as for the first cluster.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/../.."
usage() { echo "usage: $0 up DIR | exec DIR CMD... | down DIR | ns DIR" >&2; exit 2; }
log() { printf '[isolated] %s\n' "$*"; }
die() { printf '[isolated] error: %s\n' "$*" >&2; exit 1; }
[ $# -ge 2 ] || usage
action=$1 DIR=$(realpath -m "$2")
shift 2
[ "$(id -u)" -eq 0 ] || die "needs root (namespaces, mounts, and all that up.sh needs)"
NS="$DIR/ns"
PRIVATE=(/var/lib/kubelet /var/lib/neuron-sim /var/lib/neuron-problem-detector /var/lib/cni /etc/cdi /run/cdi
  /run/netns /run/containerd /var/log/pods /var/log/containers)
export CLUSTER_DIR="$DIR" KUBELET_CGROUP_ROOT="neuron-$(basename "$DIR")"

exists() { [ -f "$NS/net" ] && nsenter --mount="$NS/mnt" --net="$NS/net" true 2>/dev/null; }
in_ns() {  # [--wd DIR] CMD...: nsenter would start it in / of the mount namespace
  local wd=$PWD
  if [ "$1" = --wd ]; then wd=$2; shift 2; fi
  nsenter --mount="$NS/mnt" --net="$NS/net" --wd="$wd" -- env KUBECONFIG="$DIR/admin.kubeconfig" "$@"
}

create() {
  mkdir -p "$NS" "$DIR/host"
  # unshare keeps a namespace by bind-mounting it on a file; the file's mount must not propagate
  mountpoint -q "$NS" || mount --bind "$NS" "$NS"
  mount --make-private "$NS"
  touch "$NS/mnt" "$NS/net"
  local path
  for path in "${PRIVATE[@]}"; do mkdir -p "$path" "$DIR/host$path"; done
  # a copy: up.sh adds the node's name; down.sh removes it again from this copy only
  cp /etc/hosts "$DIR/host/hosts"
  # No way out, so no name server either: the host's is unreachable from here, and a lookup would wait
  # for its timeout (cosign's for its TUF root took about 10 s a call); on loopback it is refused at once.
  # CoreDNS forwards nothing (tests/cluster/peers/coredns.yaml), so cluster names still resolve.
  echo "nameserver 127.0.0.1" > "$DIR/host/resolv.conf"
  unshare --mount="$NS/mnt" --net="$NS/net" --propagation private \
    bash -euc 'dir=$1 parent=$2 uplink=$3; shift 3
      for path in "$@"; do mount --bind "$dir/host$path" "$path"; done
      mount --bind "$dir/host/hosts" /etc/hosts
      [ ! -e /etc/resolv.conf ] || mount --bind "$dir/host/resolv.conf" /etc/resolv.conf
      ip link set lo up
      # a default route: the kubelet takes the node address from its interface, and kube-router needs one
      ip link add host0 type veth peer name host0-peer
      ip link set host0-peer up
      ip addr add 10.89.0.1/24 dev host0
      ip link set host0 up
      ip route add default dev host0
      if [ -n "$uplink" ]; then
        set -- $uplink
        ip link add uplink0 type veth peer name "$1" netns "$parent"
        ip addr add "$2.2/24" dev uplink0
        ip link set uplink0 up
        gateway=$2.1; shift 2
        for route in "$@"; do ip route add "$route" via "$gateway" dev uplink0; done
        sysctl -qw net.ipv4.ip_forward=1
      fi' _ "$DIR" "$$" "${UPLINK:-}" "${PRIVATE[@]}"
}

case $action in
  up)
    [ $# -eq 0 ] || usage
    exists || { log "creating its network and mount namespaces ($NS)"; create; }
    in_ns tests/cluster/up.sh
    in_ns tests/cluster/images.sh --import-only
    ;;
  ns)
    [ $# -eq 0 ] || usage
    exists || create
    ;;
  exec)
    [ $# -ge 1 ] || usage
    exists || die "no cluster at $DIR: start it with $0 up $DIR"
    in_ns --wd "$caller_dir" "$@"
    ;;
  down)
    [ $# -eq 0 ] || usage
    status=0
    if exists; then in_ns tests/cluster/down.sh || status=$?; fi
    # the namespaces end with their last process and their last mount: the pod network, its
    # iptables rules and every mount made inside go with them
    for file in "$NS/mnt" "$NS/net"; do mountpoint -q "$file" && umount "$file"; done
    mountpoint -q "$NS" && umount "$NS"
    rm -rf "$DIR/host" "$NS"
    exit $status
    ;;
  *) usage ;;
esac
