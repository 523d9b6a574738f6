#!/usr/bin/env bash
# The nodes of a multi-node test cluster (`NODES=<n> make cluster-up`, n from 2 to 4). Node 1 is up.sh's
# own, beside the control plane in this network namespace; node i (2..n) has network and mount namespaces
# of its own (tests/cluster/isolated.sh's, under $CLUSTER_DIR/nodes/<name>), in which up.sh runs again
# with CONTROL_DIR set: its own containerd, runc, kubelet, kube-proxy, kube-router's policy controller,
# pod bridge, host paths (/var/lib/kubelet, /var/lib/neuron-sim, ...) and kubelet cgroup root.
#
# Addresses (every one of them inside this machine's namespaces):
#   node 1   pods 10.88.0.0/24 on the bridge at 10.88.0.1 (the API server's advertised address, node IP)
#   node i   pods 10.88.<i>.0/24 on its bridge at 10.88.<i>.1; veth neuron-n<i> (10.89.<i>.1, here) to
#            uplink0 (10.89.<i>.2, its node IP); here a route to its pods via 10.89.<i>.2, there a route
#            to 10.88.0.0/16, 10.89.0.0/16 and the Service range via 10.89.<i>.1, and no other way out
#            (isolated.sh's dead-end default route). No masquerade anywhere: pods see each other's
#            addresses (NetworkPolicy judges them), and here the raw table drops whatever a pod sends
#            to an address outside these ranges, so that nothing is routed off this machine.
#
#   nodes.sh list                 each node: name, index, node IP, instance type, state directory
#   nodes.sh exec NODE CMD...     run CMD on NODE (a name from list, or its index), in its namespaces,
#                                 with CLUSTER_DIR, KUBECONFIG and SIM_ROOT set to that node's; e.g.
#                                 nodes.sh exec neuron-sim-node-2 neuron-sim inject hw-error --device 0 ...
#   nodes.sh restart-kubelet NODE stop NODE's kubelet and start it again (up.sh in its namespaces)
#   nodes.sh reboot NODE          a simulated reboot the cluster sees (not node 1, which shares the host's
#                                 /proc): a new boot ID for the simulated node, shown to NODE's kubelet, restarted,
#                                 as its status.nodeInfo.bootID (what the remediation controller compares)
# Used by up.sh and down.sh (images.sh imports into every node's containerd):
#   nodes.sh plan                 check NODES, NODE_TYPES, ULTRASERVER; print the layout (nodes.env), with
#                                 DRIVER_VERSION (none: the simulator's tree before 2.28) for every node
#   nodes.sh type I               node I's instance type
#   nodes.sh sim I                write node I's simulated Neuron node at $SIM_ROOT unless it is there
#   nodes.sh guard                the raw table's rules above (node 1's namespace)
#   nodes.sh up                   nodes 2..n, each Ready, with the last images build imported
#   nodes.sh down                 down.sh in nodes 2..n, their namespaces, the routes and rules above
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/../.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
NODE_NAME="${NODE_NAME:-neuron-sim-node}"
SIM_ROOT="${SIM_ROOT:-/var/lib/neuron-sim/node}"
ENV_FILE="$CLUSTER_DIR/nodes.env"
GUARD=neuron-test-nodes  # the comment on this script's iptables rules, by which down removes them
log() { printf '[nodes] %s\n' "$*"; }
die() { printf '[nodes] error: %s\n' "$*" >&2; exit 1; }
usage() { echo "usage: $0 list | exec NODE CMD... | restart-kubelet NODE | reboot NODE | plan | type I | sim I | guard | up | down" >&2; exit 2; }

layout() {  # NODES, NODE_TYPES, ULTRASERVER_ID of the running cluster
  [ -f "$ENV_FILE" ] || die "no multi-node cluster runs at $CLUSTER_DIR (NODES=<n> make cluster-up)"
  # shellcheck source=/dev/null
  . "$ENV_FILE"
  IFS=, read -r -a TYPES <<<"$NODE_TYPES"
}
name_of() { if [ "$1" = 1 ]; then echo "$NODE_NAME"; else echo "$NODE_NAME-$1"; fi; }
# named after the cluster's directory too: isolated.sh makes neuron-<this name> the node's kubelet cgroup
# root, which must differ between two multi-node clusters on this machine
dir_of() { echo "$CLUSTER_DIR/nodes/$(basename "$CLUSTER_DIR")-$(name_of "$1")"; }
index_of() {  # a node's name or index
  local i
  for i in $(seq 1 "$NODES"); do
    if [ "$1" = "$i" ] || [ "$1" = "$(name_of "$i")" ]; then echo "$i"; return; fi
  done
  die "no node $1 (nodes.sh list)"
}
node_ip() { if [ "$1" = 1 ]; then echo 10.88.0.1; else echo "10.89.$1.2"; fi; }
in_node() {  # index, CMD...: in node I's namespaces, with that node's environment
  local i=$1; shift
  if [ "$i" = 1 ]; then
    (cd "$caller_dir" && env CLUSTER_DIR="$CLUSTER_DIR" KUBECONFIG="$CLUSTER_DIR/admin.kubeconfig" \
      SIM_ROOT="$SIM_ROOT" NODE_NAME="$NODE_NAME" PATH="$REPO/.venv/bin:$PATH" "$@")
  else
    (cd "$caller_dir" && "$REPO/tests/cluster/isolated.sh" exec "$(dir_of "$i")" \
      env SIM_ROOT="$SIM_ROOT" NODE_NAME="$(name_of "$i")" PATH="$REPO/.venv/bin:$PATH" "$@")
  fi
}

plan() {
  local nodes=${NODES:?} types=${NODE_TYPES:-} us=${ULTRASERVER:-} id="" n
  case $nodes in 2|3|4) ;; *) die "NODES=$nodes: 2 to 4 for this script" ;; esac
  if [ -n "$us" ]; then
    [ "$nodes" = 4 ] || die "ULTRASERVER=$us needs NODES=4 (one UltraServer of four nodes)"
    [ -z "$types" ] || die "ULTRASERVER and NODE_TYPES together: the UltraServer sets every node's type"
    types=$(printf "$us.48xlarge,%.0s" $(seq 1 4)); types=${types%,}
    id=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  elif [ -z "$types" ]; then
    types=$(printf "${INSTANCE_TYPE:-trn1.32xlarge},%.0s" $(seq 1 "$nodes")); types=${types%,}
  fi
  n=$(tr ',' '\n' <<<"$types" | grep -c .)
  [ "$n" = "$nodes" ] || die "NODE_TYPES names $n instance types for NODES=$nodes"
  printf 'NODES=%s\nNODE_TYPES=%s\nULTRASERVER_ID=%s\nDRIVER_VERSION=%s\n' "$nodes" "$types" "$id" "${DRIVER_VERSION:-}"
}

sim() {  # index: node I's simulated Neuron node at $SIM_ROOT, in the namespaces this runs in
  local i=$1 type spec marker
  type=${TYPES[$((i - 1))]}
  spec="$type ${ULTRASERVER_ID:--} $i ${DRIVER_VERSION:--}"
  marker="$SIM_ROOT.spec"
  [ "$(cat "$marker" 2>/dev/null)" != "$spec" ] || [ ! -f "$SIM_ROOT/.neuron-sim/state.json" ] || return 0
  log "node $i: a simulated $type${ULTRASERVER_ID:+ (UltraServer $ULTRASERVER_ID, node id $((i - 1)))} at $SIM_ROOT"
  rm -rf "$SIM_ROOT" "$SIM_ROOT.ultraserver"
  if [ -n "${ULTRASERVER_ID:-}" ]; then
    # the identity `neuron-sim create-ultraserver` writes, one node of the four on each of them
    "$REPO/.venv/bin/python" -c 'import sys
from pathlib import Path
from neuron_sim import node
node.create_ultraserver(Path(sys.argv[1]), sys.argv[2], 4, sys.argv[3], node_ids=[int(sys.argv[4])], char_devices=True,
                       driver_version=sys.argv[5] or None)' \
      "$SIM_ROOT.ultraserver" "$type" "$ULTRASERVER_ID" "$((i - 1))" "${DRIVER_VERSION:-}"
    mv "$SIM_ROOT.ultraserver/node-$((i - 1))" "$SIM_ROOT"
    rm -rf "$SIM_ROOT.ultraserver"
  else
    "$REPO/.venv/bin/neuron-sim" create --instance-type "$type" --root "$SIM_ROOT" --char-devices --force \
      ${DRIVER_VERSION:+--driver-version "$DRIVER_VERSION"} >/dev/null
  fi
  echo "$spec" > "$marker"
}

guard() {  # idempotent: -C first
  local rule
  while read -r rule; do
    # shellcheck disable=SC2086
    iptables -t raw -C PREROUTING $rule -m comment --comment "$GUARD" 2>/dev/null \
      || iptables -t raw -A PREROUTING $rule -m comment --comment "$GUARD"
  done <<'EOF'
-s 10.88.0.0/15 -d 10.96.0.0/24 -j ACCEPT
-s 10.88.0.0/15 ! -d 10.88.0.0/15 -j DROP
EOF
}

up_sh() {  # index: up.sh in node I's namespaces, joining this cluster as node I (2..n)
  local i=$1
  in_node "$i" env CONTROL_DIR="$CLUSTER_DIR" NODES="$NODES" NODE_INDEX="$i" INSTANCE_TYPE="${TYPES[$((i - 1))]}" \
    NODE_IP="10.89.$i.2" NODE_POD_CIDR_JOIN="10.88.$i.0/24" BRIDGE_ADDR_JOIN="10.88.$i.1/24" "$REPO/tests/cluster/up.sh"
}

up_node() {  # index
  local i=$1 name dir began=$SECONDS
  name=$(name_of "$i") dir=$(dir_of "$i")
  mkdir -p "$dir"
  if ! ip link show "neuron-n$i" >/dev/null 2>&1; then
    [ ! -f "$dir/ns/net" ] || "$REPO/tests/cluster/isolated.sh" down "$dir" >/dev/null 2>&1 || true
    UPLINK="neuron-n$i 10.89.$i 10.88.0.0/16 10.89.0.0/16 10.96.0.0/24" "$REPO/tests/cluster/isolated.sh" ns "$dir"
  fi
  ip addr show dev "neuron-n$i" | grep "10.89.$i.1/24" >/dev/null || ip addr add "10.89.$i.1/24" dev "neuron-n$i"
  ip link set "neuron-n$i" up
  ip route replace "10.88.$i.0/24" via "10.89.$i.2" dev "neuron-n$i"
  # the API server dials a kubelet by its node's name (logs, exec, port-forward)
  grep -qE "^10\.89\.$i\.2[[:space:]].*\b$name\b" /etc/hosts \
    || echo "10.89.$i.2 $name  # neuron-helm-chart test cluster" >> /etc/hosts
  up_sh "$i" 2>&1 | sed "s/^/[$name] /" || die "node $name did not come up (its logs: $dir/logs)"
  # the last build's images; a build under way (make test's, beside up.sh) imports into every node itself
  if [ -f build/images.tsv ] && flock -n build/.images.lock true; then
    in_node "$i" "$REPO/tests/cluster/images.sh" --import-only 2>&1 | sed "s/^/[$name] /" \
      || die "the images did not import into $name"
  fi
  log "node $name up in $((SECONDS - began)) s"
}

down_node() {  # index
  local i=$1 dir
  dir=$(dir_of "$i")
  [ -d "$dir/ns" ] || return 0
  "$REPO/tests/cluster/isolated.sh" down "$dir" 2>&1 | sed "s/^/[$(name_of "$i")] /"
  # the namespace took its end of the pair, and the pair, with it; this end lingers if something held it
  ip link delete "neuron-n$i" 2>/dev/null || true
}

[ $# -ge 1 ] || usage
action=$1; shift
case $action in
  plan) plan ;;
  type) layout; echo "${TYPES[$(( ${1:?} - 1 ))]}" ;;
  sim) layout; sim "${1:?}" ;;
  guard) guard ;;
  up)
    layout
    [ "$(id -u)" -eq 0 ] || die "needs root"
    guard
    for i in $(seq 2 "$NODES"); do up_node "$i"; done
    ;;
  list)
    layout
    for i in $(seq 1 "$NODES"); do
      printf '%s\t%s\t%s\t%s\t%s\n' "$(name_of "$i")" "$i" "$(node_ip "$i")" "${TYPES[$((i - 1))]}" \
        "$([ "$i" = 1 ] && echo "$CLUSTER_DIR" || dir_of "$i")"
    done
    ;;
  exec)
    layout
    [ $# -ge 2 ] || usage
    i=$(index_of "$1"); shift
    in_node "$i" "$@"
    ;;
  restart-kubelet)
    layout
    i=$(index_of "${1:?}")
    if [ "$i" = 1 ]; then pidfile=$CLUSTER_DIR/kubelet.pid; else pidfile=$(dir_of "$i")/kubelet.pid; fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if [ "$i" = 1 ]; then
      "$REPO/tests/cluster/up.sh"
    else
      up_sh "$i"
    fi
    ;;
  reboot)
    layout
    i=$(index_of "${1:?}")
    [ "$i" != 1 ] || die "node 1 shares the host's /proc: its kubelet's boot ID cannot change (reboot another node)"
    in_node "$i" neuron-sim inject --root "$SIM_ROOT" reboot >/dev/null
    # the kubelet reads its boot ID (cAdvisor's machine info) from /proc/sys/kernel/random/boot_id, once, at
    # start: in this node's mount namespace that file is the simulated node's (a new inode each reboot, so
    # mounted again), and the kubelet starts again to read it
    in_node "$i" sh -c 'umount /proc/sys/kernel/random/boot_id 2>/dev/null || true
      mount --bind "$SIM_ROOT/proc/sys/kernel/random/boot_id" /proc/sys/kernel/random/boot_id'
    "$0" restart-kubelet "$1"
    in_node "$i" cat /proc/sys/kernel/random/boot_id
    ;;
  down)
    [ -f "$ENV_FILE" ] || exit 0
    layout
    for i in $(seq 2 "$NODES"); do down_node "$i"; done
    for table in raw; do
      iptables -t "$table" -S PREROUTING 2>/dev/null | grep -- "--comment $GUARD" | sed 's/^-A/-D/' \
        | while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done
    done
    # node 1's simulated node was written for this layout: the next single-node cluster writes its own
    rm -rf "$SIM_ROOT" "$SIM_ROOT.spec"
    rm -f "$ENV_FILE"
    ;;
  *) usage ;;
esac
