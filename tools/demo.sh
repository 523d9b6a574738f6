#!/usr/bin/env bash
# `make demo`: the stack on the real single-node cluster over a simulated Neuron node.
# Until the chart exists, the three services run as host processes (as their DaemonSets will,
# with the same flags). Shows the node's Neuron capacity, a pod holding two cores with its
# device and environment, that pod's attributed metrics, then a hardware error becoming a
# NodeCondition, an Event and an unhealthy device. Leaves the cluster up (make cluster-down).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
DEMO_DIR="$REPO/.run/demo"
SIM_ROOT="${SIM_ROOT:-/var/lib/neuron-sim/node}"
NODE=neuron-sim-node
BIN=$REPO/.venv/bin
K=("$BIN/kubectl" --kubeconfig "$CLUSTER_DIR/admin.kubeconfig")
CTR=(ctr --address "$CLUSTER_DIR/containerd/containerd.sock" -n k8s.io)
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

mkdir -p "$DEMO_DIR"
tests/cluster/up.sh
pids=()
cleanup() {
  "${K[@]}" delete pod demo-two-cores --ignore-not-found --wait=false >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# a clean start: no error left from an earlier demo on this boot
"$BIN/neuron-sim" inject --root "$SIM_ROOT" reboot >/dev/null
rm -rf "$DEMO_DIR/npd"
until [ "$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuron}')" = "0" ] \
   || [ -z "$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuron}')" ]; do sleep 1; done

say "what neuron_sysfs discovers on the simulated node ($SIM_ROOT)"
"$BIN/neuron-inventory" --root "$SIM_ROOT" | head -6

say "starting neuron-device-plugin, neuron-node-metrics and neuron-problem-detector"
"$BIN/neuron-device-plugin" --host-root "$SIM_ROOT" --listen 127.0.0.1:9841 --kmsg-path none \
  --verdict-dir "$DEMO_DIR/npd/verdicts" >"$DEMO_DIR/device-plugin.log" 2>&1 & pids+=($!)
"$BIN/neuron-node-metrics" --host-root "$SIM_ROOT" --listen 127.0.0.1:9840 --attribution-interval 2 \
  >"$DEMO_DIR/node-metrics.log" 2>&1 & pids+=($!)
"$BIN/neuron-problem-detector" --host-root "$SIM_ROOT" --node-name $NODE --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" \
  --listen 127.0.0.1:9842 --state-file "$DEMO_DIR/npd/state.json" --verdict-dir "$DEMO_DIR/npd/verdicts" \
  >"$DEMO_DIR/problem-detector.log" 2>&1 & pids+=($!)
until [ "$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuroncore}')" = "32" ]; do sleep 1; done

say "the node's Neuron capacity ($("${K[@]}" get node $NODE -o jsonpath='{.metadata.labels.node\.kubernetes\.io/instance-type}'))"
"${K[@]}" get node $NODE -o custom-columns='NODE:.metadata.name,NEURON:.status.capacity.aws\.amazon\.com/neuron,NEURONCORE:.status.capacity.aws\.amazon\.com/neuroncore,NEURONHEALTH:.status.conditions[?(@.type=="NeuronHealth")].status'

say "a pod holding two NeuronCores"
"${K[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-two-cores, namespace: default}
spec:
  containers:
  - name: trainer
    image: registry.k8s.io/pause:3.10
    imagePullPolicy: Never
    resources: {limits: {aws.amazon.com/neuroncore: 2}}
EOF
"${K[@]}" wait --for=condition=Ready pod/demo-two-cores --timeout=120s >/dev/null
cid=$("${K[@]}" get pod demo-two-cores -o jsonpath='{.status.containerStatuses[0].containerID}'); cid=${cid#containerd://}
"${CTR[@]}" containers info "$cid" | "$BIN/python" -c '
import json, sys
spec = json.load(sys.stdin)["Spec"]
print("environment:", " ".join(e for e in spec["process"]["env"] if e.startswith("NEURON_")))
for d in spec["linux"]["devices"]:
    print("device:      %s (char %s:%s)" % (d["path"], d["major"], d["minor"]))'

say "its metrics, attributed by the exporter (PodResources, read every 2 s)"
sleep 3
"$BIN/neuron-sim" inject --root "$SIM_ROOT" counter --device 0 --core 0 --name success --by 42 >/dev/null
curl -s 127.0.0.1:9840/metrics | grep 'pod="demo-two-cores"' | grep -E 'status="success"|allocation_info' | head -4

say "a hardware error on the pod's device: NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=0"
"$BIN/neuron-sim" inject --root "$SIM_ROOT" hw-error --kind NC_UNCORRECTABLE_ERROR --device 0 --core 1 >/dev/null
until [ "$("${K[@]}" get node $NODE -o jsonpath='{.status.conditions[?(@.type=="NeuronHealth")].status}')" = "True" ]; do sleep 0.5; done
"${K[@]}" get node $NODE -o jsonpath='{range .status.conditions[?(@.type=="NeuronHealth")]}condition:   {.type}={.status} reason={.reason}{"\n"}             {.message}{"\n"}{end}'
sleep 2
"${K[@]}" get events --field-selector involvedObject.kind=Node,reason=NeuronHasError_NC_UNCORRECTABLE_ERROR \
  -o custom-columns='EVENT:.reason,COUNT:.count,MESSAGE:.message' | cut -c1-160
until [ "$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuroncore}')" = "30" ]; do sleep 1; done
echo "allocatable: aws.amazon.com/neuroncore=$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuroncore}') of 32," \
  "aws.amazon.com/neuron=$("${K[@]}" get node $NODE -o jsonpath='{.status.allocatable.aws\.amazon\.com/neuron}') of 16 (neuron0 and its cores are Unhealthy)"

say "done; the cluster stays up (make cluster-down stops it); service logs are in .run/demo/"
