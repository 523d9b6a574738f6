#!/usr/bin/env bash
# `make cluster-up`: a real single-node Kubernetes on this machine, for tests and the demo.
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (built from the pinned release by
# build-k8s.sh), containerd 2.x with CDI (built from its pinned module by build-containerd.sh) and
# Debian's runc, a bridge CNI, and a kubelet registered as a Neuron node
# (node.kubernetes.io/instance-type) over a simulated Neuron node with real character devices.
# Idempotent: components already running are left alone. Everything is on 127.0.0.1 or unix
# sockets; runtime state lives in $CLUSTER_DIR (default .run/cluster, untracked).
# NODES=<n> (1 to 4; NODE_TYPES, ULTRASERVER): n real nodes, this one and n-1 more in namespaces of
# their own (tests/cluster/nodes.sh, which runs this script in each of them with CONTROL_DIR set).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
K8S_VERSION=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' tests/cluster/k8s/go.mod)
BIN="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/k8s/$K8S_VERSION/bin"
NODE_NAME="${NODE_NAME:-neuron-sim-node}"
INSTANCE_TYPE="${INSTANCE_TYPE:-trn1.32xlarge}"
SIM_ROOT="${SIM_ROOT:-/var/lib/neuron-sim/node}"
POD_CIDR=10.88.0.0/16
PAUSE_IMAGE=registry.k8s.io/pause:3.10
APICHECK_IMAGE=localhost/neuron-test/apicheck:2
# The registry the kubelet pulls released images from (make release REGISTRY=127.0.0.1:5000); plain HTTP,
# loopback only. tests/cluster_access.py's REGISTRY names it too.
REGISTRY_ADDR=127.0.0.1:5000
PY="$REPO/.venv/bin/python"
# The cgroup the kubelet puts its kubepods under ("" for the root): a second cluster on this machine
# (tests/cluster/isolated.sh) gets its own, so that neither kubelet's cleanup sees the other's pods.
KUBELET_CGROUP_ROOT="${KUBELET_CGROUP_ROOT:-}"
# A node joining the cluster whose directory CONTROL_DIR is (tests/cluster/nodes.sh sets these, in the
# node's own network namespace): no control plane, registry or CoreDNS of its own; the API server on the
# first node's bridge address, which routes through the host end of the node's veth pair.
CONTROL_DIR="${CONTROL_DIR:-}"
API_HOST=127.0.0.1
NODE_IP="${NODE_IP:-}"             # the address the kubelet reports and serves on ("" : the kubelet's choice)
NODE_POD_CIDR="$POD_CIDR"          # this node's pods' subnet (host-local IPAM)
BRIDGE_ADDR=10.88.0.1/16           # the pod bridge's address, the pods' gateway
IP_MASQ=true
KUBELET_ADDRESS=127.0.0.1
PROBE_POD=apicheck
PROBE_ARGS=()
if [ -n "$CONTROL_DIR" ]; then
  API_HOST=10.88.0.1
  # no masquerade here either: a pod's packets must reach another node from the pod's own address, the
  # one NetworkPolicy peers name (masqueraded to this node's IP, kube-router on the far node refused them)
  NODE_POD_CIDR="${NODE_POD_CIDR_JOIN:?}" BRIDGE_ADDR="${BRIDGE_ADDR_JOIN:?}" KUBELET_ADDRESS=0.0.0.0 IP_MASQ=false
  PROBE_POD="apicheck-$NODE_NAME" PROBE_ARGS=("--overrides={\"apiVersion\": \"v1\", \"spec\": {\"nodeName\": \"$NODE_NAME\"}}")
fi
# Several nodes: the cluster's layout (NODES, NODE_TYPES, ULTRASERVER) is kept in nodes.env while it
# runs, so that a later up.sh (a kubelet restart's) brings back the same cluster.
if [ -z "$CONTROL_DIR" ]; then
  if [ -f "$CLUSTER_DIR/nodes.env" ]; then
    requested="${NODES:-}"
    # shellcheck source=/dev/null
    . "$CLUSTER_DIR/nodes.env"
    [ -z "$requested" ] || [ "$requested" = "$NODES" ] \
      || { printf '[cluster-up] error: the cluster runs %s nodes: make cluster-down first\n' "$NODES" >&2; exit 1; }
  fi
  NODES="${NODES:-1}"
  case $NODES in 1|2|3|4) ;; *) printf '[cluster-up] error: NODES=%s: 1 to 4\n' "$NODES" >&2; exit 1 ;; esac
  if [ "$NODES" -gt 1 ] && [ ! -f "$CLUSTER_DIR/nodes.env" ]; then
    mkdir -p "$CLUSTER_DIR"
    NODES=$NODES tests/cluster/nodes.sh plan > "$CLUSTER_DIR/nodes.env.new" || exit 1
    mv "$CLUSTER_DIR/nodes.env.new" "$CLUSTER_DIR/nodes.env"
  fi
  if [ "$NODES" -gt 1 ]; then
    # the first node's pods keep 10.88.0.0/24; nodes.sh gives node i 10.88.<i>.0/24. No masquerade: pods
    # talk to pods of other nodes by their own addresses, and to nothing outside this machine's namespaces.
    NODE_POD_CIDR=10.88.0.0/24 BRIDGE_ADDR=10.88.0.1/24 IP_MASQ=false NODE_IP=10.88.0.1
    PROBE_ARGS=("--overrides={\"apiVersion\": \"v1\", \"spec\": {\"nodeName\": \"$NODE_NAME\"}}")
    INSTANCE_TYPE=$(tests/cluster/nodes.sh type 1)
  fi
fi

log() { printf '[cluster-up] %s\n' "$*"; }
die() { printf '[cluster-up] error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (containerd, runc, the kubelet and device nodes)"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  [ -x "$BIN/$b" ] || { log "building Kubernetes $K8S_VERSION (cached afterwards)"; tests/cluster/build-k8s.sh; break; }
done
CONTAINERD_BIN=$(tests/cluster/build-containerd.sh)  # seconds when cached
for cmd in etcd runc openssl curl gcc; do command -v "$cmd" >/dev/null || die "$cmd missing: run make setup"; done

mkdir -p "$CLUSTER_DIR"/{pki,logs,containerd/root,containerd/state,cni/net.d,kubelet}
# etcd's data on tmpfs when the machine has one ($CLUSTER_DIR/etcd links to it; down.sh removes both):
# etcd syncs its log to disk on every write, and the cluster writes all the time (each node status,
# lease and event), on a CI disk whose writes cost system time in a make test that is CPU-bound
# (tests/scratch.py). The data goes with the cluster anyway.
if [ -z "$CONTROL_DIR" ] && [ ! -e "$CLUSTER_DIR/etcd" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    etcd_data=/dev/shm/neuron-test-etcd-$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-12)
    mkdir -p "$etcd_data"
    ln -s "$etcd_data" "$CLUSTER_DIR/etcd"
  else
    mkdir -p "$CLUSTER_DIR/etcd"
  fi
fi
PKI="$CLUSTER_DIR/pki"
running() { [ -f "$CLUSTER_DIR/$1.pid" ] && kill -0 "$(cat "$CLUSTER_DIR/$1.pid")" 2>/dev/null; }
start() {  # name, command...
  local name=$1; shift
  if running "$name"; then return; fi
  log "starting $name"
  setsid "$@" >"$CLUSTER_DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$CLUSTER_DIR/$name.pid"
}
wait_for() {  # description, seconds, command...
  local what=$1 seconds=$2; shift 2
  for _ in $(seq 1 $((seconds * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what did not come up in ${seconds}s (see $CLUSTER_DIR/logs)"
}

# --- certificates ------------------------------------------------------------------------------
cert() {  # name, subject, extensions (or "")
  local name=$1 subj=$2 ext=$3
  [ -f "$PKI/$name.crt" ] && return
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  if [ -n "$ext" ]; then printf '%s\n' "$ext" > "$PKI/$name.ext"; extarg=(-extfile "$PKI/$name.ext"); else extarg=(); fi
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 365 \
    -out "$PKI/$name.crt" "${extarg[@]}" 2>/dev/null
}
if [ -n "$CONTROL_DIR" ]; then  # the cluster's CA signs this node's certificates
  for f in ca.crt ca.key; do [ -f "$PKI/$f" ] || cp "$CONTROL_DIR/pki/$f" "$PKI/$f"; done
fi
if [ ! -f "$PKI/ca.crt" ]; then
  openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=neuron-test-ca" -days 365 -out "$PKI/ca.crt" 2>/dev/null
fi
if [ -z "$CONTROL_DIR" ]; then
cert apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.88.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
cert controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
cert scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
fi
cert admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
cert kubelet-serving "/CN=$NODE_NAME" "subjectAltName=IP:127.0.0.1,${NODE_IP:+IP:$NODE_IP,}DNS:$NODE_NAME,DNS:localhost
extendedKeyUsage=serverAuth"
[ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null; openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }

kubeconfig() {  # name, cert
  cat > "$CLUSTER_DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: neuron-test
  cluster: {server: "https://$API_HOST:6443", certificate-authority: "$PKI/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}
contexts:
- name: neuron-test
  context: {cluster: neuron-test, user: $1}
current-context: neuron-test
EOF
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kubelet kubelet
KUBECTL=("$REPO/.venv/bin/kubectl" --kubeconfig "$CLUSTER_DIR/admin.kubeconfig")

# --- the node's name resolves to this machine (kubectl logs/exec dial the node by name) -------
grep -qE "^127\.0\.0\.1[[:space:]].*\b$NODE_NAME\b" /etc/hosts || echo "127.0.0.1 $NODE_NAME  # neuron-helm-chart test cluster" >> /etc/hosts

if [ -z "$CONTROL_DIR" ]; then
# --- control plane ------------------------------------------------------------------------------
start etcd etcd --name neuron-test --data-dir "$CLUSTER_DIR/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster neuron-test=http://127.0.0.1:2380
wait_for etcd 30 curl -sf http://127.0.0.1:2379/health

start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --advertise-address=10.88.0.1 --secure-port=6443 \
  --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC \
  --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=Hostname,InternalIP \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" --allow-privileged=true \
  --enable-admission-plugins=NodeRestriction --endpoint-reconciler-type=none
wait_for kube-apiserver 90 "${KUBECTL[@]}" get --raw /readyz

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$CLUSTER_DIR/controller-manager.kubeconfig" \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --use-service-account-credentials=true --leader-elect=false --bind-address=127.0.0.1 \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --controllers='*,-nodeipam,-route,-service-lb-controller,-cloud-node-lifecycle'
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" --authorization-kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" \
  --leader-elect=false --bind-address=127.0.0.1

# The `kubernetes` Service's endpoint: the API server on the pod bridge's host address.
"${KUBECTL[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Endpoints
metadata: {name: kubernetes, namespace: default}
subsets: [{addresses: [{ip: 10.88.0.1}], ports: [{name: https, port: 6443, protocol: TCP}]}]
EOF
fi

# --- the simulated Neuron node, with real character devices ------------------------------------
# Several nodes: nodes.sh writes each one's (its instance type, an UltraServer's identity).
[ "${NODES:-1}" = 1 ] || CLUSTER_DIR="${CONTROL_DIR:-$CLUSTER_DIR}" tests/cluster/nodes.sh sim "${NODE_INDEX:-1}"
# Written again when something left it without character devices (pods would fail with "not a device
# node"), an older neuron-sim left it without the PCI class node-feature-discovery needs, it is another
# instance type, or a multi-node cluster stopped without make cluster-down left its node 1 there (its
# `.spec` marker, perhaps an UltraServer's identity): one node alone has neither.
if [ "${NODES:-1}" = 1 ] && [ -e "$SIM_ROOT.spec" ]; then
  log "a multi-node cluster's simulated node is at $SIM_ROOT ($(cat "$SIM_ROOT.spec")): replaced"
  rm -rf "$SIM_ROOT" "$SIM_ROOT.spec" "$SIM_ROOT.ultraserver"
fi
if ! "$PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if s.get("char_devices") and s.get("instance_type") == sys.argv[2] else 1)' \
    "$SIM_ROOT/.neuron-sim/state.json" "$INSTANCE_TYPE" 2>/dev/null || ! compgen -G "$SIM_ROOT/sys/bus/pci/devices/*/class" >/dev/null; then
  log "creating a simulated $INSTANCE_TYPE at $SIM_ROOT"
  "$REPO/.venv/bin/neuron-sim" create --instance-type "$INSTANCE_TYPE" --root "$SIM_ROOT" --char-devices --force
fi

# --- containerd, runc, CNI ----------------------------------------------------------------------
# containerd 2.x from the pinned Go module (build-containerd.sh): it applies CDI device requests (the
# device plugin's CDIDevices, a DRA driver's CDI IDs), which Debian's containerd 1.6 ignores. Config
# version 3: plugin IDs io.containerd.cri.v1.images / .runtime (2.4 migrates it to 4 in memory).
# CDI is always on in 2.4 (enable_cdi is gone); cdi_spec_dirs is written out so the directories a
# CDI spec must go to are stated here. The shim is named by path so that no other containerd's shim
# on $PATH (Debian's 1.6) is picked. certs.d holds per-registry hosts.toml files (a loopback registry).
CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
# containerd's per-registry host configuration (hosts.toml): the loopback registry over plain HTTP,
# read through the config_path of the CRI images plugin and of the transfer service below.
mkdir -p "$CLUSTER_DIR/containerd/certs.d/$REGISTRY_ADDR"
cat > "$CLUSTER_DIR/containerd/certs.d/$REGISTRY_ADDR/hosts.toml" <<EOF
server = "http://$REGISTRY_ADDR"

[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
EOF
cat > "$CLUSTER_DIR/containerd/config.toml" <<EOF
version = 3
root = "$CLUSTER_DIR/containerd/root"
state = "$CLUSTER_DIR/containerd/state"
[grpc]
  address = "$CTR_SOCK"
[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$CLUSTER_DIR/containerd/certs.d"
# the same hosts directory for pulls through the transfer service (ctr images pull), not only the kubelet's
[plugins.'io.containerd.transfer.v1.local']
  config_path = "$CLUSTER_DIR/containerd/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "$CONTAINERD_BIN/containerd-shim-runc-v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$CLUSTER_DIR/cni/net.d"
EOF
cat > "$CLUSTER_DIR/cni/net.d/10-neuron-test.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "neuron-test", "plugins": [
  {"type": "bridge", "bridge": "neuron0br", "isGateway": true, "ipMasq": $IP_MASQ,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "${BRIDGE_ADDR%/*}"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
# podman's default network is 10.88.0.0/16 as well: the bridge a plain `podman run` leaves behind
# takes the pod network's route, and the kubelet's probes then time out. Remove such a bridge; refuse
# to go on over anything else holding an address there.
for dev in $(ip -o -4 addr show | awk '$4 ~ /^10\.88\./ {print $2}' | sort -u); do
  [ "$dev" = neuron0br ] && continue
  case $dev in
    cni-podman*|podman*) log "removing $dev: podman's default network overlaps the pod network $POD_CIDR"; ip link delete "$dev" ;;
    *) die "$dev holds an address in the pod network $POD_CIDR: remove it first" ;;
  esac
done
# The bridge (and its address, where the API server is advertised) exists before any pod.
ip link show neuron0br >/dev/null 2>&1 || ip link add neuron0br type bridge
# (grep without -q reads to the end: with pipefail, grep -q exiting early makes the producer die of SIGPIPE and the test false)
ip addr show dev neuron0br | grep "$BRIDGE_ADDR" >/dev/null || ip addr add "$BRIDGE_ADDR" dev neuron0br
ip link set neuron0br up
# several nodes: nothing a pod sends leaves this machine's namespaces (nodes.sh)
[ -n "$CONTROL_DIR" ] || [ "$NODES" = 1 ] || tests/cluster/nodes.sh guard
if [ -z "$CONTROL_DIR" ]; then
  tests/registry.sh start "$CLUSTER_DIR/registry" "${REGISTRY_ADDR##*:}" \
    || die "the registry did not start on $REGISTRY_ADDR (is the port taken?)"
  log "registry on $REGISTRY_ADDR (storage: $CLUSTER_DIR/registry)"
fi
# The cluster's own ctr, for images.sh, down.sh and the tests: $CLUSTER_DIR/containerd/bin/ctr
ln -sfn "$CONTAINERD_BIN" "$CLUSTER_DIR/containerd/bin"
CTR="$CLUSTER_DIR/containerd/bin/ctr"
# containerd 2.x's ctr repeats every server deprecation (this host's cgroup v1) on each call
export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
start containerd "$CONTAINERD_BIN/containerd" --config "$CLUSTER_DIR/containerd/config.toml"
wait_for containerd 30 "$CTR" --address "$CTR_SOCK" version

# --- the pause image, built locally (no registry here) ------------------------------------------
if ! "$CTR" --address "$CTR_SOCK" -n k8s.io images ls -q | grep -x "$PAUSE_IMAGE" >/dev/null; then
  log "building $PAUSE_IMAGE"
  "$PY" tests/cluster/pause_image.py "$CLUSTER_DIR/pause.tar" "$PAUSE_IMAGE"
  "$CTR" --address "$CTR_SOCK" -n k8s.io images import "$CLUSTER_DIR/pause.tar" >/dev/null
fi

if ! "$CTR" --address "$CTR_SOCK" -n k8s.io images ls -q | grep -x "$APICHECK_IMAGE" >/dev/null; then
  log "building $APICHECK_IMAGE"
  "$PY" tests/cluster/pause_image.py "$CLUSTER_DIR/apicheck.tar" "$APICHECK_IMAGE" apicheck
  "$CTR" --address "$CTR_SOCK" -n k8s.io images import "$CLUSTER_DIR/apicheck.tar" >/dev/null
fi

# --- kube-proxy: the `kubernetes` Service (10.96.0.1:443) reaches the API server from pods ----
start kube-proxy "$BIN/kube-proxy" --kubeconfig="$CLUSTER_DIR/admin.kubeconfig" --hostname-override="$NODE_NAME" \
  --cluster-cidr="$POD_CIDR" --proxy-mode=iptables --conntrack-max-per-core=0 --metrics-bind-address=127.0.0.1:10249 \
  --healthz-bind-address=127.0.0.1:10256

# --- kubelet --------------------------------------------------------------------------------------
cat > "$CLUSTER_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KUBELET_ADDRESS
port: 10250
readOnlyPort: 0
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTR_SOCK
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/kubelet-serving.crt"
tlsPrivateKeyFile: "$PKI/kubelet-serving.key"
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]  # CoreDNS's kube-dns Service (tests/cluster/peers)
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
# A change to allocatable (a device plugin's update) reaches the Node with the next status sync: 10 s
# by default. The tests wait on such changes often, and 2 s makes each wait shorter, not different;
# tests that reason about the period read it from this file (cluster_access.node_status_update_period).
nodeStatusUpdateFrequency: 2s
localStorageCapacityIsolation: false
podPidsLimit: -1
EOF
if [ -n "$KUBELET_CGROUP_ROOT" ]; then  # the kubelet refuses a cgroup root that does not exist
  for hierarchy in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -f "$hierarchy/cgroup.procs" ] && mkdir -p "$hierarchy/$KUBELET_CGROUP_ROOT"
  done
  echo "cgroupRoot: /$KUBELET_CGROUP_ROOT" >> "$CLUSTER_DIR/kubelet/config.yaml"
fi
start kubelet "$BIN/kubelet" --config="$CLUSTER_DIR/kubelet/config.yaml" --kubeconfig="$CLUSTER_DIR/kubelet.kubeconfig" \
  --hostname-override="$NODE_NAME" ${NODE_IP:+--node-ip="$NODE_IP"} \
  --node-labels="node.kubernetes.io/instance-type=$INSTANCE_TYPE" --v=1
wait_for "node $NODE_NAME Ready" 120 bash -c \
  "'${KUBECTL[0]}' --kubeconfig '$CLUSTER_DIR/admin.kubeconfig' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
# --- readiness: a pod reaches the API server through the kubernetes Service -------------------
wait_for "kube-proxy's rule for the kubernetes Service" 60 bash -c "iptables -t nat -S KUBE-SERVICES | grep -q 10.96.0.1/32"
probe() {  # [name to reach the API server by]
  "${KUBECTL[@]}" delete pod "$PROBE_POD" --ignore-not-found --wait=true >/dev/null
  local args=(); [ $# -eq 0 ] || args=(-- "$@")
  "${KUBECTL[@]}" run "$PROBE_POD" --image="$APICHECK_IMAGE" --image-pull-policy=Never --restart=Never \
    ${PROBE_ARGS[@]+"${PROBE_ARGS[@]}"} "${args[@]}" >/dev/null
  for _ in $(seq 1 150); do
    case $("${KUBECTL[@]}" get pod "$PROBE_POD" -o jsonpath='{.status.phase}' 2>/dev/null) in
      Succeeded) return 0 ;;
      Failed) return 1 ;;
    esac
    sleep 0.2
  done
  return 1
}
probe_until() {  # what failed, [name to reach the API server by]
  local what=$1; shift
  for attempt in 1 2 3 4 5; do
    if probe "$@"; then log "$("${KUBECTL[@]}" logs "$PROBE_POD" | tr -d '\n' | head -c 120)"; return 0; fi
    log "in-cluster API probe failed (attempt $attempt): $("${KUBECTL[@]}" logs "$PROBE_POD" 2>&1 | tail -c 300)"
    sleep 2
  done
  die "$what"
}
wait_for "the default service account" 60 "${KUBECTL[@]}" get serviceaccount default
probe_until "no pod could reach the API server through the kubernetes Service"
# --- cluster DNS and the NetworkPolicy enforcer (tests/cluster/peers.sh) ------------------------
[ -n "$CONTROL_DIR" ] || tests/cluster/peers.sh install || die "cluster DNS did not start"
# kube-router's network policy controller alone, on the host like kube-proxy (see peers.sh for why this one)
start kube-router "$(tests/cluster/peers.sh path kube-router)" --kubeconfig="$CLUSTER_DIR/admin.kubeconfig" \
  --hostname-override="$NODE_NAME" --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
  --service-cluster-ip-range=10.96.0.0/24 --health-port=0 --metrics-port=0
wait_for "kube-router's network policy chains" 60 bash -c "iptables -S FORWARD | grep KUBE-ROUTER-FORWARD >/dev/null"
probe_until "no pod could reach the API server by its DNS name (kubernetes.default.svc)" kubernetes.default.svc
"${KUBECTL[@]}" delete pod "$PROBE_POD" --wait=false >/dev/null
log "node $NODE_NAME is Ready; kubeconfig: $CLUSTER_DIR/admin.kubeconfig"
if [ -z "$CONTROL_DIR" ] && [ "$NODES" -gt 1 ]; then tests/cluster/nodes.sh up || die "the other nodes did not come up"; fi
