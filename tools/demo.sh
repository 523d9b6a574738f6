#!/usr/bin/env bash
# `make demo`: the chart on the real single-node cluster over a simulated Neuron node.
# Brings the cluster up (if needed), builds and imports the images, installs the chart in
# simulation mode for INSTANCE_TYPE (default trn1.32xlarge), then shows the node's Neuron capacity,
# a pod holding two cores with its device and environment, that pod's attributed metrics, and a
# hardware error becoming a NodeCondition, an Event and an unhealthy device.
# Leaves the cluster and the release up (make cluster-down stops everything).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
INSTANCE_TYPE="${INSTANCE_TYPE:-trn1.32xlarge}"
NODE=neuron-sim-node
NAMESPACE=neuron-system
RELEASE=neuron-helm-chart
BIN=$REPO/.venv/bin
export KUBECONFIG="$CLUSTER_DIR/admin.kubeconfig" PATH="$BIN:$PATH"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
jp() { kubectl get node $NODE -o jsonpath="$1"; }
trap 'kubectl delete pod demo-two-cores demo-connected-devices -n default --ignore-not-found --wait=false >/dev/null 2>&1 || true' EXIT

say "the cluster and the project's images"
tests/cluster/up.sh
tests/cluster/images.sh --import

# The cluster's own simulated node is a trn1.32xlarge; any other type gets its own simulated root.
SIM_ROOT="${SIM_ROOT:-/var/lib/neuron-sim/node}"
if [ "$INSTANCE_TYPE" != "trn1.32xlarge" ]; then
  SIM_ROOT="/var/lib/neuron-sim/demo-$INSTANCE_TYPE"
  neuron-sim create --instance-type "$INSTANCE_TYPE" --root "$SIM_ROOT" --char-devices --force >/dev/null
fi
kubectl label node $NODE "node.kubernetes.io/instance-type=$INSTANCE_TYPE" --overwrite >/dev/null

# A clean start: no release, no error left from an earlier demo (a new boot), no advertised devices.
helm uninstall $RELEASE -n $NAMESPACE --ignore-not-found --wait >/dev/null
neuron-sim inject --root "$SIM_ROOT" reboot >/dev/null
until [ "$(jp '{.status.allocatable.aws\.amazon\.com/neuron}')" = "0" ] || [ -z "$(jp '{.status.allocatable.aws\.amazon\.com/neuron}')" ]; do sleep 1; done

say "what neuron_driver discovers on the simulated node ($SIM_ROOT)"
inventory=$(neuron-inventory --root "$SIM_ROOT")
head -6 <<<"$inventory"

say "helm upgrade --install $RELEASE charts/neuron-helm-chart (simulation mode)"
helm upgrade --install $RELEASE charts/neuron-helm-chart --namespace $NAMESPACE --create-namespace \
  --set simulation.enabled=true --set "simulation.hostRoot=$SIM_ROOT" --set nodeMetrics.attributionInterval=2 \
  -f charts/neuron-helm-chart/ci/scheduler-values.yaml --wait --timeout 300s >/dev/null
# AWS's names and namespaces (objectNames: aws, the default): the plugin is neuron-device-plugin in kube-system, the
# detector in neuron-healthcheck-system, the scheduling pair in kube-system; the exporter in $NAMESPACE
kubectl get daemonsets,deployments -A -l app.kubernetes.io/instance=$RELEASE
devices=$(neuron-inventory --root "$SIM_ROOT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["device_count"])')
until [ "$(jp '{.status.allocatable.aws\.amazon\.com/neuron}')" = "$devices" ]; do sleep 1; done

say "the node's Neuron capacity ($INSTANCE_TYPE)"
kubectl get node $NODE -o custom-columns='NODE:.metadata.name,NEURON:.status.capacity.aws\.amazon\.com/neuron,NEURONCORE:.status.capacity.aws\.amazon\.com/neuroncore,NEURONHEALTH:.status.conditions[?(@.type=="NeuronHealth")].reason'

say "a pod holding two NeuronCores: its devices and environment"
kubectl delete pod demo-two-cores -n default --ignore-not-found --wait=true >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-two-cores, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: trainer
    image: localhost/neuron-helm-chart/device-plugin:$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/neuron-helm-chart/Chart.yaml)
    imagePullPolicy: Never
    # the project's images have no shell: the workload is Python from the image's own venv
    command: [/opt/neuron/bin/python3, -c, "import glob, os, time; [print(d) for d in sorted(glob.glob('/dev/neuron*'))]; [print(f'{k}={v}', flush=True) for k, v in sorted(os.environ.items()) if k.startswith('NEURON_')]; time.sleep(3600)"]
    resources: {limits: {aws.amazon.com/neuroncore: 2}}
EOF
kubectl wait --for=condition=Ready pod/demo-two-cores -n default --timeout=120s >/dev/null
sleep 1
kubectl logs demo-two-cores -n default

say "its metrics, attributed by the exporter (PodResources, read every 2 s)"
exporter=$(kubectl get pods -n $NAMESPACE -l app.kubernetes.io/component=node-metrics -o jsonpath='{.items[0].status.podIP}')
device=$(kubectl logs demo-two-cores -n default | sed -n 's#.*/dev/neuron\([0-9]*\)$#\1#p' | head -1)
neuron-sim inject --root "$SIM_ROOT" counter --device "$device" --core 0 --name success --by 42 >/dev/null
# (whole responses in variables: with pipefail, `curl | grep -q` fails when grep stops reading early)
metrics() { curl -s "$exporter:9840/metrics" || true; }
until [[ "$(metrics)" == *'pod="demo-two-cores"'* ]]; do sleep 1; done
attributed=$(metrics | grep 'pod="demo-two-cores"' | grep -E 'status="success"|allocation_info' || true)
head -4 <<<"$attributed"

# a connected group the two-core pod above leaves free: a torus row on trn, an arc of the ring on inf
want=$(( devices >= 8 ? 4 : devices / 2 ))
say "a pod placed by neuron-scheduler: the node's NeuronNode report, then a pod of $want connected device(s)"
if [ "$want" -ge 1 ]; then
until kubectl get neuronnode $NODE >/dev/null 2>&1; do sleep 1; done
kubectl get neuronnodes
kubectl delete pod demo-connected-devices -n default --ignore-not-found --wait=true >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-connected-devices, namespace: default}
spec:
  schedulerName: neuron-scheduler
  terminationGracePeriodSeconds: 1
  containers:
  - name: trainer
    image: localhost/neuron-helm-chart/device-plugin:$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/neuron-helm-chart/Chart.yaml)
    imagePullPolicy: Never
    command: [/opt/neuron/bin/python3, -c, "import glob, time; [print(d) for d in sorted(glob.glob('/dev/neuron*'))]; time.sleep(3600)"]
    resources: {limits: {aws.amazon.com/neuron: $want}}
EOF
kubectl wait --for=condition=Ready pod/demo-connected-devices -n default --timeout=180s >/dev/null
kubectl get pod demo-connected-devices -n default \
  -o custom-columns='POD:.metadata.name,SCHEDULER:.spec.schedulerName,NODE:.spec.nodeName,PHASE:.status.phase'
sleep 1
echo "its devices: $(kubectl logs demo-connected-devices -n default | tr '\n' ' ')"
kubectl delete pod demo-connected-devices -n default --wait=true >/dev/null
else
  echo "(skipped: a $INSTANCE_TYPE has $devices device, and the pod above holds it)"
fi

say "a hardware error on the pod's device: NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=$device"
neuron-sim inject --root "$SIM_ROOT" hw-error --kind NC_UNCORRECTABLE_ERROR --device "$device" --core 1 >/dev/null
until [ "$(jp '{.status.conditions[?(@.type=="NeuronHealth")].status}')" = "True" ]; do sleep 0.5; done
jp '{range .status.conditions[?(@.type=="NeuronHealth")]}condition:   {.type}={.status} reason={.reason}{"\n"}             {.message}{"\n"}{end}'
until [ -n "$(kubectl get events -n default --field-selector "involvedObject.kind=Node,reason=NeuronHasError_NC_UNCORRECTABLE_ERROR" -o name)" ]; do sleep 0.5; done
kubectl get events -n default --field-selector involvedObject.kind=Node,reason=NeuronHasError_NC_UNCORRECTABLE_ERROR \
  -o custom-columns='EVENT:.reason,COUNT:.count,MESSAGE:.message' | grep -E "^EVENT|neuron$device " | cut -c1-160
cores=$(jp '{.status.capacity.aws\.amazon\.com/neuroncore}')
per_device=$((cores / devices))
until [ "$(jp '{.status.allocatable.aws\.amazon\.com/neuroncore}')" = "$((cores - per_device))" ]; do sleep 1; done
echo "allocatable: aws.amazon.com/neuroncore=$(jp '{.status.allocatable.aws\.amazon\.com/neuroncore}') of $cores," \
  "aws.amazon.com/neuron=$(jp '{.status.allocatable.aws\.amazon\.com/neuron}') of $devices (neuron$device and its cores are Unhealthy)"

say "done: the release stays installed (helm test $RELEASE -n $NAMESPACE); make cluster-down stops everything"
