"""End to end across nodes (issue 55): the chart on a real multi-node cluster (`NODES=3 make
cluster-up`, tests/cluster/nodes.sh), each node a kubelet with its own containerd, kube-proxy,
pod network and simulated Neuron node, in namespaces of its own.

- every node Ready, each advertising its own devices, and `kubectl get neuronnodes` listing each;
- pods reaching a pod on another node by its address and by its Service's name (kube-proxy on every
  node, CoreDNS on the first);
- neuron-scheduler placing a 4-device pod on the one node of three where a connected set of four is
  free, while the other two, by count, have twelve free devices each;
- on a simulated UltraServer (`ULTRASERVER=trn2u NODES=4 make cluster-up`): a 4-pod group placed one
  pod a node by neuron-scheduler, all four running, each with its node's sixteen devices and the
  UltraServer variables of its node.

Runs with `-m multinode` against $KUBECONFIG (the test cluster's by default) with at least three
nodes; `make e2e` on a single-node cluster leaves these out. The tests run in file order and share
one release.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import random
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_access import (
    CLUSTER_DIR,
    REPO,
    SHOW_DEVICES,
    WORKLOAD_PYTHON,
    eventually,
    helm,
    kubectl,
    read,
    workload_pod,
)
from kueue import controller as kq
from polling import until_async
from simcluster.api import Api as SimApi
from simcluster.api import ApiError as SimApiError
from simcluster.controlplane import ControlPlane, Credentials, Processes
from simcluster.fleet import GroupSpec, PodSpec
from skips import require

from neuron_driver import layout as driver_layout
from neuron_model import node_health, remediation
from neuron_model.instance_types import get_instance_type
from neuron_model.placement_labels import NETWORK_NODE_LAYER_LABELS
from neuron_model.ultraserver import Mode, server_id_label

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-multinode"
NAMESPACE = "neuron-e2e-multinode"
WORKLOADS = "neuron-e2e-multinode-workloads"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/device-plugin:{VERSION}"  # any project image: it has Python
SCHEDULER = "neuron-scheduler"
RESOURCE = "aws.amazon.com"
SIM_ROOT = "/var/lib/neuron-sim/node"  # the same path on every node, each its own (nodes.sh)
NODES_SH = REPO / "tests" / "cluster" / "nodes.sh"

pytestmark = [pytest.mark.e2e, pytest.mark.multinode, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Node:
    name: str
    index: int
    ip: str
    instance_type: str


def cluster_nodes() -> list[Node]:
    """The nodes tests/cluster/nodes.sh lists for the cluster at $CLUSTER_DIR (none: one node)."""
    result = subprocess.run(
        [str(NODES_SH), "list"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, CLUSTER_DIR=str(CLUSTER_DIR)),
    )
    if result.returncode != 0:
        return []
    return [
        Node(name, int(index), ip, instance_type)
        for name, index, ip, instance_type, _ in (line.split("\t") for line in result.stdout.splitlines())
    ]


def on_node(node: Node, *command: str) -> str:
    """A command on one node, in its namespaces (its simulated node at SIM_ROOT)."""
    result = subprocess.run(
        [str(NODES_SH), "exec", node.name, *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, CLUSTER_DIR=str(CLUSTER_DIR)),
    )
    assert result.returncode == 0, f"on {node.name}: {command}: {result.stdout}{result.stderr}"
    return result.stdout


def sim_on(node: Node, *args: str) -> None:
    on_node(node, "neuron-sim", "inject", "--root", SIM_ROOT, *args)


def ultraserver_id() -> str:
    """The UltraServer nodes.sh simulated over the cluster's four nodes ("" : none)."""
    layout = dict(line.split("=", 1) for line in (CLUSTER_DIR / "nodes.env").read_text().split())
    return layout.get("ULTRASERVER_ID", "")


def allocatable(node: Node) -> str | None:
    value = read("node", node.name)["status"].get("allocatable", {}).get(f"{RESOURCE}/neuron")
    return None if value is None else str(value)


def devices(node: Node) -> int:
    return get_instance_type(node.instance_type).devices


def pod(name: str) -> dict[str, Any]:
    return read("pod", name, namespace=WORKLOADS)


def phase(name: str) -> str:
    return str(pod(name).get("status", {}).get("phase", ""))


def logs(name: str) -> str:
    return kubectl("logs", "-n", WORKLOADS, name)


def restart_plugins(node: Node) -> None:
    """The node agents of one node started again (after a simulated reboot), as a reboot restarts them."""
    for component in ("problem-detector", "device-plugin", "node-metrics"):
        kubectl(
            "delete", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}",
            "--field-selector", f"spec.nodeName={node.name}", "--wait=true", "--timeout=60s",
        )  # fmt: skip
    for daemonset in kubectl("get", "daemonsets", "-n", NAMESPACE, "-o", "name").split():
        kubectl("rollout", "status", "-n", NAMESPACE, daemonset, "--timeout=180s")


@pytest.fixture(scope="module")
def nodes() -> list[Node]:
    listed = cluster_nodes()
    if len(listed) < 3:
        pytest.skip(
            f"needs a cluster of three nodes or more (NODES=3 make cluster-up); {CLUSTER_DIR} has {len(listed) or 1}"
        )
    return listed


@pytest.fixture(scope="module", autouse=True)
def release(nodes: list[Node]) -> Iterator[None]:
    """The chart with scheduling on, clean simulated nodes, the workloads' namespace; all removed afterwards."""
    for node in nodes:
        sim_on(node, "reboot")
    kubectl("create", "namespace", WORKLOADS, check=False)
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}",
        "--set", "scheduler.enabled=true", "--set", "objectNames=release",
        *(("--set", "ultraServer.runtimeEnvNodes=4") if ultraserver_id() else ()),
        "--wait", "--timeout", "420s",
    )  # fmt: skip
    yield
    kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    for node in nodes:
        sim_on(node, "reboot")


# --- every node, each its own -------------------------------------------------------------------


def test_every_node_is_ready_advertises_its_own_devices_and_has_its_neuronnode(nodes: list[Node]) -> None:
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in read("node", node.name)["status"]["conditions"]}
        assert conditions.get("Ready") == "True", (node.name, conditions)
        assert read("node", node.name)["metadata"]["labels"]["node.kubernetes.io/instance-type"] == node.instance_type
        eventually(
            lambda node=node: allocatable(node) == str(devices(node)),
            f"{node.name} advertising its {devices(node)} devices",
            timeout=180,
        )
    # the device plugin of each node reports that node: kubectl's own listing names every one
    listing = kubectl("get", "neuronnodes", "-o", "name")
    assert sorted(line.rsplit("/", 1)[-1] for line in listing.split()) == sorted(n.name for n in nodes), listing
    for node in nodes:
        eventually(
            lambda node=node: (
                read("neuronnodes", node.name)["status"].get("devices") == f"{devices(node)}/{devices(node)}"
            ),
            f"{node.name}'s NeuronNode: every device free",
        )
    # each node's containers are its own kubelet's: a pod pinned to a node runs there and sees that
    # node's devices (the simulated node of the other namespaces is not visible in this one)
    for node in nodes:
        name = f"devices-{node.index}"
        limits = {"limits": {f"{RESOURCE}/neuron": 1}}
        kubectl("apply", "-f", "-", stdin=workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, limits, nodeName=node.name))
    for node in nodes:
        name = f"devices-{node.index}"
        eventually(lambda name=name: "cores=" in logs(name), f"{name} printed its devices", timeout=180)
        assert pod(name)["spec"]["nodeName"] == node.name
        assert len([line for line in logs(name).splitlines() if line.startswith("device=/dev/neuron")]) == 1
    kubectl("delete", "pod", "-n", WORKLOADS, *(f"devices-{n.index}" for n in nodes), "--wait=true", "--timeout=60s")


# --- pods across nodes ---------------------------------------------------------------------------

SERVE = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('served by ' + os.environ['HOSTNAME']).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.HTTPServer(('', 8080), H).serve_forever()\n"
)
FETCH = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    print(url, urllib.request.urlopen(url, timeout=10).read().decode(), flush=True)\n"
)


def test_pods_reach_a_pod_on_another_node_by_its_address_and_by_its_service_name(nodes: list[Node]) -> None:
    server_node, *client_nodes = nodes[1], nodes[0], *nodes[2:]
    server = json.loads(workload_pod("echo", WORKLOADS, WORKLOAD_IMAGE, {}, script=SERVE, nodeName=server_node.name))
    server["metadata"]["labels"] = {"app": "echo"}
    kubectl("apply", "-f", "-", stdin=json.dumps(server))
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": WORKLOADS},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps(service))
    eventually(lambda: phase("echo") == "Running", "the server pod running", timeout=180)
    pod_ip = pod("echo")["status"]["podIP"]
    own_subnet = f"10.88.{0 if server_node.index == 1 else server_node.index}."
    assert pod_ip.startswith(own_subnet), f"{pod_ip}: not from {server_node.name}'s pod network"
    urls = [f"http://{pod_ip}:8080/", "http://echo/", f"http://echo.{WORKLOADS}.svc.cluster.local/"]
    for node in client_nodes:
        name = f"fetch-{node.index}"
        client = json.loads(workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, {}, script=FETCH, nodeName=node.name))
        client["spec"]["containers"][0]["command"] += urls
        kubectl("apply", "-f", "-", stdin=json.dumps(client))
    for node in client_nodes:
        name = f"fetch-{node.index}"
        eventually(lambda name=name: phase(name) in ("Succeeded", "Failed"), f"{name} done", timeout=180)
        assert phase(name) == "Succeeded", logs(name)
        lines = logs(name).splitlines()
        assert lines == [f"{url} served by echo" for url in urls], lines
    kubectl("delete", "pod", "-n", WORKLOADS, "echo", *(f"fetch-{n.index}" for n in client_nodes), "--wait=false")


# --- one node's kubelet restarts; the others keep serving ---------------------------------------------


def answers(pod_ip: str) -> str:
    """What an echo server pod answers, from this process (this namespace routes to every node's pods)."""
    try:
        with urllib.request.urlopen(f"http://{pod_ip}:8080/", timeout=2) as response:
            return str(response.read().decode())
    except OSError as e:
        return f"no answer: {e}"


def test_a_kubelet_restart_on_one_node_leaves_the_others_serving(nodes: list[Node]) -> None:
    """The kubelet of one node stopped and started again (nodes.sh restart-kubelet): every other node
    stays Ready and its pod answers throughout; that node's own pod, whose containers outlive their
    kubelet, answers too, and once the kubelet is back the node takes new pods."""
    restarted = nodes[1]
    for node in nodes:
        server = workload_pod(f"serve-{node.index}", WORKLOADS, WORKLOAD_IMAGE, {}, script=SERVE, nodeName=node.name)
        kubectl("apply", "-f", "-", stdin=server)
    names = {node.name: f"serve-{node.index}" for node in nodes}
    eventually(lambda: all(phase(n) == "Running" for n in names.values()), "a server on every node", timeout=180)
    ips = {node: pod(name)["status"]["podIP"] for node, name in names.items()}
    eventually(lambda: all(answers(ip).startswith("served by") for ip in ips.values()), "every server answering")

    failures: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for node, ip in ips.items():
                answer = answers(ip)
                if not answer.startswith(f"served by {names[node]}"):
                    failures.append(f"{node}: {answer}")
            for node in nodes:
                if node != restarted:
                    ready = {c["type"]: c["status"] for c in read("node", node.name)["status"]["conditions"]}
                    if ready.get("Ready") != "True":
                        failures.append(f"{node.name} not Ready while {restarted.name}'s kubelet restarted")
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        restart = subprocess.run(
            [str(NODES_SH), "restart-kubelet", restarted.name],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=dict(os.environ, CLUSTER_DIR=str(CLUSTER_DIR)),
        )
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert "starting kubelet" in restart.stdout, restart.stdout
    finally:
        done.set()
        watcher.join(timeout=30)
    assert failures == []
    assert pod(names[restarted.name])["status"]["containerStatuses"][0]["restartCount"] == 0
    after = workload_pod("after-restart", WORKLOADS, WORKLOAD_IMAGE, {}, script=SERVE, nodeName=restarted.name)
    kubectl("apply", "-f", "-", stdin=after)
    eventually(lambda: phase("after-restart") == "Running", f"a new pod running on {restarted.name}", timeout=180)
    kubectl("delete", "pod", "-n", WORKLOADS, "after-restart", *names.values(), "--wait=false")


# --- neuron-scheduler chooses between real nodes -------------------------------------------------


def connected(chosen: set[int], adjacency: dict[int, tuple[int, ...]]) -> bool:
    seen, todo = set(), [min(chosen)]
    while todo:
        device = todo.pop()
        if device in seen:
            continue
        seen.add(device)
        todo += [d for d in adjacency[device] if d in chosen]
    return seen == chosen


def test_neuron_scheduler_places_a_four_device_pod_on_the_one_node_with_a_connected_set_free(
    nodes: list[Node],
) -> None:
    """One device lost in each torus row of every node but one (the free one chosen at random): by
    count each still has twelve free devices, and only the free node has a connected set of four.
    (Every node of the cluster takes part: one left whole would be a second place for the pod.)"""
    trn = [n for n in nodes if get_instance_type(n.instance_type).torus_shape == (4, 4)]
    if len(trn) != len(nodes):
        pytest.skip(f"needs every node of a 4x4 torus type (trn1.32xlarge, trn2.48xlarge): {nodes}")
    free = random.choice(trn)
    print(f"the node left with a connected set free: {free.name}")
    fragmented = [n for n in trn if n != free]
    one_per_row = (1, 5, 9, 13)
    for node in fragmented:
        for device in one_per_row:
            sim_on(node, "fault", "--kind", "NC_UNCORRECTABLE_ERROR", "--device", str(device))
    for node in trn:
        want = str(devices(node) - (len(one_per_row) if node in fragmented else 0))
        eventually(lambda node=node, want=want: allocatable(node) == want, f"{node.name}: {want} devices", timeout=180)
    limits = {"limits": {f"{RESOURCE}/neuron": 4}}
    kubectl("apply", "-f", "-", stdin=workload_pod("four", WORKLOADS, WORKLOAD_IMAGE, limits, schedulerName=SCHEDULER))
    try:
        eventually(lambda: phase("four") == "Running", "the 4-device pod running", timeout=240)
    except AssertionError as e:
        events = kubectl("get", "events", "-n", WORKLOADS, "--field-selector", "involvedObject.name=four")
        raise AssertionError(f"{e}\n{pod('four').get('status')}\n{events}") from None
    assert pod("four")["spec"]["nodeName"] == free.name
    eventually(lambda: "cores=" in logs("four"), "the 4-device pod printed its devices")
    held = {
        int(line.removeprefix("device=/dev/neuron")) for line in logs("four").splitlines() if line.startswith("device=")
    }
    assert len(held) == 4, held
    assert connected(held, get_instance_type(free.instance_type).adjacency()), held
    kubectl("delete", "pod", "-n", WORKLOADS, "four", "--wait=true", "--timeout=60s")
    for node in fragmented:  # healthy again for the tests after this one
        sim_on(node, "reboot")
        restart_plugins(node)
        eventually(lambda node=node: allocatable(node) == str(devices(node)), f"{node.name} whole again", timeout=180)


# --- an UltraServer group, on four real kubelets ---------------------------------------------------


def test_an_ultraserver_group_runs_one_pod_a_node_each_with_its_devices_and_ultraserver_variables(
    nodes: list[Node],
) -> None:
    """The group test_scheduler.py binds to Node objects no kubelet serves, here running: a
    LeaderWorkerSet group of four whole-node pods, placed by neuron-scheduler one a node of the
    UltraServer, each container given its node's 16 devices and the runtime's UltraServer variables
    (the device plugin's, from the identity neuron-sim create-ultraserver wrote on that node)."""
    server_id = ultraserver_id()
    if not server_id:
        pytest.skip("the cluster is no UltraServer (ULTRASERVER=trn2u NODES=4 make cluster-up)")
    group = GroupSpec(1, 4, 4)
    pods = []
    for i in range(4):
        obj = PodSpec(f"us-{i}", 16, 0, group).pod_object(SCHEDULER)
        obj["metadata"]["namespace"] = WORKLOADS
        obj["spec"]["restartPolicy"] = "Never"
        container = obj["spec"]["containers"][0]
        container.update(image=WORKLOAD_IMAGE, imagePullPolicy="Never", command=[WORKLOAD_PYTHON, "-c", SHOW_DEVICES])
        pods.append(obj)
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    names = [p["metadata"]["name"] for p in pods]
    eventually(lambda: all(phase(n) == "Running" for n in names), "the group's four pods running", timeout=300)
    by_node = {n.name: n for n in nodes}
    placed = {name: pod(name)["spec"]["nodeName"] for name in names}
    assert sorted(placed.values()) == sorted(by_node), f"one pod on each node of the UltraServer: {placed}"
    for name in names:
        eventually(lambda name=name: "cores=" in logs(name), f"{name} printed its devices")
        seen: dict[str, list[str]] = {}
        for line in logs(name).splitlines():
            key, _, value = line.partition("=")
            seen.setdefault(key, []).append(value)
        node = by_node[placed[name]]
        assert len(seen["device"]) == devices(node), seen
        assert seen["ultraserver_server_id"] == [server_id], seen
        assert seen["ultraserver_mode"] == [str(int(Mode.X4))], seen  # the runtime's mode number for 4 nodes
        assert seen["ultraserver_node_id"] == [str(node.index - 1)], seen
    kubectl("delete", "pod", "-n", WORKLOADS, *names, "--wait=true", "--timeout=60s")


# --- remediation across nodes (issue 56): drain within the breaker, resume after a restart ------------

HBM_FAULT = "HBM_UNCORRECTABLE_ERROR"  # the replace-instance rung: cordon, drain, ask for a new instance


def workflow(node: Node) -> dict[str, Any] | None:
    """The remediation controller's state on the node (its annotation), or None."""
    text = read("node", node.name)["metadata"].get("annotations", {}).get(remediation.STATE_ANNOTATION)
    return None if text is None else dict(json.loads(text))


def node_events(node: Node, reason: str, since: float = 0.0) -> list[str]:
    """The messages of the node's Events of `reason`, last seen at `since` (Unix time) or later: a Node's
    Events outlive a test (an hour), and a cluster may run the suite twice."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node.name},reason={reason}"
    listed = read("events", namespace="default", field_selector=selector)["items"]
    return [str(e.get("message", "")) for e in listed if event_time(e) >= since]


def event_time(event: dict[str, Any]) -> float:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"]["creationTimestamp"]
    return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def node_condition(node: Node, kind: str) -> tuple[str, str, str] | None:
    """The node's condition of type `kind` as (status, reason, message), or None."""
    for c in read("node", node.name)["status"].get("conditions", []):
        if c["type"] == kind:
            return str(c["status"]), str(c.get("reason", "")), str(c.get("message", ""))
    return None


def condition(node: Node, kind: str) -> str | None:
    found = node_condition(node, kind)
    return None if found is None else found[0]


def released(node: Node) -> None:
    """A node as a remediation test found it: booted again healthy, its agents restarted, and nothing of
    a workflow left (uncordoned, the controller's taint and annotations gone)."""
    sim_on(node, "reboot")
    restart_plugins(node)
    kubectl("uncordon", node.name, check=False)
    kubectl("taint", "node", node.name, f"{remediation.TAINT}-", check=False)
    kubectl("annotate", "node", node.name, f"{remediation.STATE_ANNOTATION}-", f"{remediation.REQUEST_ANNOTATION}-",
            check=False)  # fmt: skip


def one_device_deployment(name: str, replicas: int, affinity: dict[str, Any]) -> list[dict[str, Any]]:
    """A Deployment whose pods each hold one device, and a PodDisruptionBudget of minAvailable 1 over it."""
    labels = {"app": name}
    template = json.loads(workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, {"limits": {f"{RESOURCE}/neuron": 1}}))
    spec = template["spec"]
    spec.update(restartPolicy="Always", affinity=affinity)
    return [
        {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": WORKLOADS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}},
        },
        {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": WORKLOADS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    ]  # fmt: skip


def running_pods(app: str) -> list[dict[str, Any]]:
    listed = read("pods", namespace=WORKLOADS, selector=f"app={app}")["items"]
    return [
        p for p in listed
        if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]  # fmt: skip


def leader_of(lease: str) -> str:
    return str(read("lease", lease, namespace=NAMESPACE)["spec"].get("holderIdentity") or "")


def test_remediation_drains_one_faulty_node_at_a_time_and_resumes_a_drain_after_its_restart(
    nodes: list[Node],
) -> None:
    """The remediation controller with a 25 % breaker over the four nodes. An uncorrectable HBM fault on
    node A, which holds one replica of a 2-replica Deployment under a PDB (minAvailable 1) and a bare
    pod: A is cordoned and drained (the replica runs again on another node, the PDB never broken; the
    bare pod deleted, with an Event), AcceleratedHardwareReady is False and a new instance is asked for.
    Faults on B and C meanwhile wait, each with an Event naming the breaker. Once A boots again
    healthy its workflow ends and B's starts; B's drain waits on a PDB, the controller's leader is
    deleted mid-drain, and the new leader resumes the same workflow, which ends once the PDB allows."""
    if len(nodes) < 4:
        pytest.skip("needs four nodes: the 25 % breaker then allows one (ULTRASERVER=trn2u NODES=4 make cluster-up)")
    helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reset-then-reuse-values",
        "--set", "remediation.enabled=true", "--set", "remediation.maxPercent=25", "--set", "remediation.maxNodes=1",
        "--set", "remediation.rateLimit=10", "--set", "remediation.resync=2s",
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    since = time.time() - 1  # Events of an earlier run do not count
    lease = next(
        name.rsplit("/", 1)[-1]
        for name in kubectl("get", "leases", "-n", NAMESPACE, "-o", "name").split()
        if "remediation" in name
    )
    eventually(lambda: bool(leader_of(lease)), "a remediation controller leading", timeout=120)
    spread = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": one_device_deployment("web", 2, spread)}))  # fmt: skip
    eventually(lambda: len(running_pods("web")) == 2, "both web replicas running", timeout=180)
    by_name = {n.name: n for n in nodes}
    a = by_name[running_pods("web")[0]["spec"]["nodeName"]]
    b, c = [n for n in nodes if n != a][:2]
    kubectl("apply", "-f", "-", stdin=workload_pod("bare", WORKLOADS, WORKLOAD_IMAGE,
                                                   {"limits": {f"{RESOURCE}/neuron": 1}}, nodeName=a.name))  # fmt: skip
    prefer_b = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [b.name]}]}}]}}  # fmt: skip
    stuck = one_device_deployment("stuck", 1, prefer_b)
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": stuck}))
    eventually(lambda: phase("bare") == "Running", "the bare pod running on A", timeout=180)
    eventually(lambda: [p["spec"]["nodeName"] for p in running_pods("stuck")] == [b.name], "stuck running on B")

    web_low: list[int] = []
    done = threading.Event()

    def watch() -> None:  # the PDB: never fewer than one web replica Ready
        while not done.is_set():
            ready = len(running_pods("web"))
            if ready < 1:
                web_low.append(ready)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        sim_on(a, "fault", "--kind", HBM_FAULT, "--device", "3")
        eventually(
            lambda: (workflow(a) or {}).get("phase") in ("draining", "requested"), "A's workflow begun", timeout=180
        )
        for node in (b, c):
            sim_on(node, "fault", "--kind", HBM_FAULT, "--device", "3")
        for node in (b, c):
            eventually(
                lambda node=node: any("breaker" in m for m in node_events(node, "RemediationHeld", since)),
                f"{node.name} held by the breaker, with an Event saying so",
                timeout=180,
            )
            assert workflow(node) is None
            assert not read("node", node.name)["spec"].get("unschedulable"), f"{node.name} cordoned past the breaker"
        eventually(lambda: (workflow(a) or {}).get("phase") == "requested", "A drained and its new instance asked for",
                   timeout=240)  # fmt: skip
        node_a = read("node", a.name)
        assert node_a["spec"].get("unschedulable") is True
        assert remediation.REQUEST_ANNOTATION in node_a["metadata"]["annotations"]
        assert condition(a, node_health.ACCELERATED_HARDWARE_CONDITION) == "False"
        assert node_events(a, "ReplacementRequested", since), "no Event asking for A's new instance"
        eventually(lambda: len(running_pods("web")) == 2, "the evicted web replica running again", timeout=180)
        assert a.name not in {p["spec"]["nodeName"] for p in running_pods("web")}
        eventually(lambda: not kubectl("get", "pod", "-n", WORKLOADS, "bare", "--ignore-not-found"), "bare deleted")
        deleted = json.loads(kubectl("get", "events", "-n", WORKLOADS, "--field-selector",
                                     "involvedObject.name=bare,reason=RemediationPodDeleted", "-o", "json"))["items"]  # fmt: skip
        assert deleted, "no Event for the bare pod's deletion"
    finally:
        done.set()
        watcher.join(timeout=30)
    assert web_low == [], "the PodDisruptionBudget was broken"

    # C opted out; A boots again healthy: its workflow ends and B's, held until now, begins
    kubectl("label", "node", c.name, f"{remediation.OPT_OUT_LABEL}=true", "--overwrite")
    try:
        sim_on(a, "reboot")
        restart_plugins(a)
        eventually(lambda: workflow(a) is None, "A's workflow ended once it booted again healthy", timeout=180)
        assert not read("node", a.name)["spec"].get("unschedulable")
        eventually(lambda: (workflow(b) or {}).get("phase") == "draining", "B draining", timeout=120)
        eventually(lambda: bool(node_events(b, "RemediationDrainWaiting", since)), "B's drain waiting on stuck's PDB")
        started = workflow(b)["started"]  # type: ignore[index]
        assert workflow(c) is None, "C is opted out"
        old_leader = leader_of(lease)
        kubectl("delete", "pod", "-n", NAMESPACE, old_leader.split("_", 1)[0], "--wait=true", "--timeout=60s")
        eventually(lambda: leader_of(lease) not in ("", old_leader), "another replica leading", timeout=120)
        kubectl("delete", "pdb", "-n", WORKLOADS, "stuck")
        eventually(lambda: (workflow(b) or {}).get("phase") == "requested", "B's drain resumed and ended", timeout=180)
        assert workflow(b)["started"] == started, "the new leader began B's workflow again instead of resuming it"  # type: ignore[index]
        eventually(lambda: [p["spec"]["nodeName"] != b.name for p in running_pods("stuck")] == [True], "stuck moved")
    finally:
        kubectl("label", "node", c.name, f"{remediation.OPT_OUT_LABEL}-", check=False)
        kubectl("delete", "deployment,pdb", "-n", WORKLOADS, "web", "stuck", "--ignore-not-found", check=False)
        kubectl("delete", "pod", "-n", WORKLOADS, "bare", "--ignore-not-found", "--wait=false", check=False)
        helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reset-then-reuse-values",
            "--set", "remediation.enabled=false", "--wait", "--timeout", "300s",
        )  # fmt: skip
        for node in nodes:
            released(node)


HEARTBEAT_FAULT = "NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE"  # the validate rung: validated in place, no drain
# The node agents' remediation, for the two tests below (one rollout: the second's upgrade changes nothing
# when it follows the first): the controller, the detector's reset and validation after a reboot, short
# windows, and the detector reading the driver's counters every second.
NODE_AGENT_REMEDIATION = (
    "--set", "remediation.enabled=true", "--set", "remediation.maxPercent=25", "--set", "remediation.resync=2s",
    "--set", "remediation.rateLimit=10", "--set", "remediation.validateAfterReboot=true",
    "--set", "firmwareHeartbeat.staleAfter=8", "--set", "npd.extraArgs={--counter-interval=1s}",
    "--set", "npd.remediation.deviceReset.enabled=true", "--set", "npd.remediation.deviceReset.validationWindow=8",
    "--set-string", f"npd.remediation.deviceReset.validationCommand={WORKLOAD_PYTHON} -c pass",  # the detector image's Python
)  # fmt: skip
NODE_AGENT_REMEDIATION_OFF = (
    "--set", "remediation.enabled=false", "--set", "remediation.validateAfterReboot=false",
    "--set", "firmwareHeartbeat.staleAfter=300", "--set", "npd.extraArgs=null",
    "--set", "npd.remediation.deviceReset.enabled=false",
)  # fmt: skip


def upgrade(*values: str) -> None:
    helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reset-then-reuse-values", *values,
         "--wait", "--timeout", "300s")  # fmt: skip


def health(node: Node) -> tuple[str, str, str]:
    return node_condition(node, node_health.CONDITION) or ("", "", "")


def kernel_log(node: Node) -> str:
    return on_node(node, "cat", str(driver_layout.HostLayout(Path(SIM_ROOT)).kmsg))


def heartbeat(node: Node, device: int) -> int:
    where = driver_layout.HostLayout(Path(SIM_ROOT)).device_dir(device)
    return int(on_node(node, "cat", str(driver_layout.health_status_file(where, driver_layout.HEARTBEAT_FILE))))


def test_a_stalled_heartbeat_is_validated_in_place_then_reset_then_escalated_to_a_reboot(nodes: list[Node]) -> None:
    """A stalled firmware heartbeat on one node of today's driver (2.30.2), with the remediation
    controller on: on a device a pod holds, the detector validates it in place: no drain, no cordon, no
    reset, the pod keeps running, AcceleratedHardwareReady stays True, and the heartbeat moving again
    clears it. On an idle device the detector resets it through the simulated driver and validates it
    (the validation command in the detector's image), healthy again with nothing drained. A stall a
    reset does not end escalates: AcceleratedHardwareReady False, and the controller's reboot workflow."""
    a = nodes[1]
    layout = dict(line.split("=", 1) for line in (CLUSTER_DIR / "nodes.env").read_text().split() if "=" in line)
    if not layout.get("DRIVER_VERSION", "").startswith("2.3"):
        pytest.skip("needs a cluster of driver 2.30.2 or later (DRIVER_VERSION=2.30.2.0 NODES=4 make cluster-up)")
    sim_on(a, "heartbeat-resume", "--device", "5", "--mended")  # an earlier run's persistent stall, if any
    upgrade(*NODE_AGENT_REMEDIATION)
    since = time.time() - 1  # Events of an earlier run of this test do not count
    # the driver's side on A: every heartbeat beats but a stalled one's, and each write of a reset node is done
    driver = subprocess.Popen(
        [str(NODES_SH), "exec", a.name, "timeout", "900", "neuron-sim", "driver", "--root", SIM_ROOT,
         "--interval", "0.5", "--heartbeat-every", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, CLUSTER_DIR=str(CLUSTER_DIR)),
    )  # fmt: skip
    everything = {"limits": {f"{RESOURCE}/neuron": devices(a)}}
    try:
        kubectl(
            "apply", "-f", "-", stdin=workload_pod("holder", WORKLOADS, WORKLOAD_IMAGE, everything, nodeName=a.name)
        )
        eventually(lambda: phase("holder") == "Running", "a pod holding every device of A", timeout=180)
        uid = pod("holder")["metadata"]["uid"]
        first = heartbeat(a, 3)
        # the detector judges a heartbeat once it has seen it move: a few of its reads (1 s apart) first
        eventually(lambda: heartbeat(a, 3) >= first + 4, "the heartbeat beating", timeout=120)

        # 1. held: validated in place, nothing moved; the firmware's checks resume by themselves
        sim_on(a, "heartbeat-stall", "--device", "3")
        eventually(lambda: any("validating in place" in m for m in node_events(a, "NeuronDeviceValidating", since)),
                   "A's heartbeat stale and a validation in place said", timeout=120)  # fmt: skip
        # the firmware's checks resume by themselves within the 8 s window: the validation passes
        sim_on(a, "heartbeat-resume", "--device", "3")
        [told] = [m for m in node_events(a, "NeuronDeviceValidating", since) if "validating in place" in m]
        assert f"neuron3: {HEARTBEAT_FAULT}: validating in place" in told
        assert f"held by {WORKLOADS}/holder" in told
        assert condition(a, node_health.ACCELERATED_HARDWARE_CONDITION) == "True"
        assert workflow(a) is None, "the remediation controller acted on a fault the node agent validates in place"
        assert not read("node", a.name)["spec"].get("unschedulable"), "A cordoned for a validation in place"
        eventually(lambda: health(a)[0] == "False", "A healthy again after the heartbeat resumed", timeout=120)
        assert node_events(a, "NeuronDeviceValidated", since)
        assert (phase("holder"), pod("holder")["metadata"]["uid"]) == ("Running", uid), "the holder was moved"
        assert "nd3: initiating device reset" not in kernel_log(a), "a held device was reset"
        assert workflow(a) is None

        # 2. idle: reset through the simulated driver, then validated with the command, healthy again
        kubectl("delete", "pod", "-n", WORKLOADS, "holder", "--wait=true", "--timeout=60s")
        sim_on(a, "heartbeat-stall", "--device", "4")
        eventually(lambda: "nd4: reset request" in kernel_log(a), "neuron4 reset by the detector", timeout=180)
        eventually(lambda: any("neuron4" in m for m in node_events(a, "NeuronDeviceValidated", since)),
                   "neuron4 validated after its reset", timeout=120)  # fmt: skip
        eventually(lambda: health(a)[0] == "False", "A healthy again after the reset", timeout=60)
        assert workflow(a) is None
        assert not read("node", a.name)["spec"].get("unschedulable")

        # 3. a stall a reset does not end: escalated to the reboot rung, where the controller takes over
        sim_on(a, "heartbeat-stall", "--device", "5", "--persistent")
        eventually(lambda: any("neuron5" in m for m in node_events(a, "NeuronDeviceResetEscalated", since)),
                   "neuron5's reset escalated", timeout=180)  # fmt: skip
        eventually(lambda: condition(a, node_health.ACCELERATED_HARDWARE_CONDITION) == "False",
                   "AcceleratedHardwareReady False once escalated", timeout=60)  # fmt: skip
        eventually(lambda: (workflow(a) or {}).get("rung") == "reboot", "the controller's reboot workflow on A",
                   timeout=120)  # fmt: skip
        assert read("node", a.name)["spec"].get("unschedulable") is True
    finally:
        driver.terminate()
        subprocess.run(["pkill", "-f", f"neuron-sim driver --root {SIM_ROOT}"], check=False)
        driver.wait(30)
        kubectl("delete", "pod", "-n", WORKLOADS, "holder", "--ignore-not-found", "--wait=false", check=False)
        # the values stay for the next test, which turns them off
        sim_on(a, "heartbeat-resume", "--device", "5", "--mended")  # a persistent stall outlives a reboot
        released(a)


REBOOT_FAULT = "HBM_REPAIRABLE_UNCORRECTABLE_ERROR"  # the reboot rung: cordon, drain, ask for a reboot


def boot_of(node: Node) -> str:
    return str(read("node", node.name)["status"]["nodeInfo"]["bootID"])


def reboot(node: Node) -> None:
    """A simulated reboot the cluster sees: the kubelet, restarted, reports the new boot ID (nodes.sh)."""
    result = subprocess.run(
        [str(NODES_SH), "reboot", node.name], capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, CLUSTER_DIR=str(CLUSTER_DIR)),
    )  # fmt: skip
    assert result.returncode == 0, f"reboot {node.name}: {result.stdout}{result.stderr}"


def validated(node: Node) -> tuple[str, str, str] | None:
    return node_condition(node, remediation.VALIDATED_CONDITION)


def test_a_rebooted_node_takes_work_again_only_once_validated_and_a_failed_validation_asks_for_a_new_instance(
    nodes: list[Node],
) -> None:
    """`remediation.validateAfterReboot` on real kubelets: a reboot-rung fault on node A, drained and its
    reboot asked for; A reboots (its kubelet reports a new boot ID), stays cordoned while the detector
    validates it, and takes work again once its verdict on the new boot passes. Node B the same, but the
    reboot leaves a defect (the firmware lists `hbm`): its validation fails and the workflow escalates to
    a new instance, with AcceleratedHardwareReady False."""
    a, b = nodes[1], nodes[2]  # node 1 shares the host's /proc: its boot ID cannot change
    upgrade(*NODE_AGENT_REMEDIATION)
    since = time.time() - 1
    try:
        for node, defect in ((a, False), (b, True)):
            sim_on(node, "fault", "--kind", REBOOT_FAULT, "--device", "2")
            eventually(lambda node=node: (workflow(node) or {}).get("phase") == "requested",
                       f"{node.name} drained and its reboot asked for", timeout=180)  # fmt: skip
            assert workflow(node)["rung"] == "reboot"  # type: ignore[index]
            before = boot_of(node)
            reboot(node)
            if defect:  # a defect the reboot left: the firmware lists it on the new boot
                sim_on(node, "unhealthy-components", "--device", "6", "--components", "hbm")
            restart_plugins(node)  # a reboot restarts the node agents: the detector validates once, at start
            assert boot_of(node) != before, "the kubelet reports the same boot after the reboot"
            eventually(lambda node=node: (workflow(node) or {}).get("phase") != "requested",
                       f"{node.name}'s new boot seen by the controller", timeout=120)  # fmt: skip
            boot = boot_of(node)
            eventually(lambda node=node, boot=boot: (validated(node) or ("", "", ""))[2].startswith(f"boot {boot}: "),
                       f"{node.name}'s verdict on its new boot", timeout=120)  # fmt: skip
            status, reason, message = validated(node)  # type: ignore[misc]
            if not defect:
                assert (status, reason) == ("True", remediation.VALIDATION_PASSED_REASON), message
                eventually(lambda node=node: workflow(node) is None, f"{node.name}'s workflow ended", timeout=120)
                assert not read("node", node.name)["spec"].get("unschedulable"), f"{node.name} still cordoned"
                assert node_events(node, "RemediationValidating", since)
            else:
                assert (status, reason) == ("False", remediation.VALIDATION_FAILED_REASON), message
                eventually(lambda node=node: bool((workflow(node) or {}).get("escalated")),
                           f"{node.name} escalated to a new instance", timeout=120)  # fmt: skip
                state = workflow(node) or {}
                assert (state.get("rung"), state.get("boot_id")) == ("replace", boot_of(node))
                assert read("node", node.name)["spec"].get("unschedulable") is True
                assert condition(node, node_health.ACCELERATED_HARDWARE_CONDITION) == "False"
                assert node_events(node, "ReplacementRequested", since)
    finally:
        upgrade(*NODE_AGENT_REMEDIATION_OFF)
        sim_on(b, "unhealthy-components", "--device", "6", "--components", "")  # the defect mended, as a new host
        for node in (a, b):
            released(node)


def cluster_control_plane(work: Path) -> ControlPlane:
    """The multi-node cluster's API server in the shape tests/kueue/controller.py takes: its admin
    kubeconfig's server and credentials (inline data written out to files)."""
    kubeconfig = CLUSTER_DIR / "admin.kubeconfig"
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    work.mkdir(parents=True, exist_ok=True)

    def material(section: dict[str, Any], key: str) -> Path:
        if f"{key}-data" in section:
            path = work / key
            path.write_bytes(base64.b64decode(section[f"{key}-data"]))
            return path
        return (kubeconfig.parent / section[key]).resolve()

    credentials = Credentials(
        material(cluster, "certificate-authority"), material(user, "client-certificate"), material(user, "client-key")
    )
    return ControlPlane(work, str(cluster["server"]), credentials, kubeconfig, Processes(work / "logs"))


def kueue_workload(job: str) -> dict[str, Any] | None:
    listed = read("workloads.kueue.x-k8s.io", namespace=WORKLOADS)["items"]
    return next(
        (w for w in listed if any(o.get("name") == job for o in w["metadata"].get("ownerReferences", []))), None
    )


def kueue_condition(job: str, kind: str) -> dict[str, Any] | None:
    workload = kueue_workload(job) or {}
    return next((c for c in workload.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def job_pods(job: str) -> list[dict[str, Any]]:
    return list(read("pods", namespace=WORKLOADS, selector=f"batch.kubernetes.io/job-name={job}")["items"])


def test_a_kueue_admitted_gang_runs_whole_on_the_simulated_ultraserver_and_the_next_waits_for_quota(
    nodes: list[Node], tmp_path: Path
) -> None:
    """Kueue v0.17.0's own manager (tests/kueue/controller.py, as in tests/test_kueue.py) against the
    real cluster, with the recipe of docs/scheduling.md#kueue over the four nodes, labelled with EKS's
    network node layers as EKS would: a Job of four whole-node pods requiring one UltraServer is
    admitted and its pods run on real kubelets, one a node, all four on the simulated UltraServer with
    its sixteen devices each; a second such Job is held for quota with no pod, and admitted and run
    once the first is deleted."""
    if not ultraserver_id():
        pytest.skip("needs the cluster as one UltraServer (ULTRASERVER=trn2u NODES=4 make cluster-up)")
    require(kq.missing(), "make setup", f"Kueue {kq.kueue_version()}'s manager (tests/kueue/build.sh)")
    layers = dict(zip(NETWORK_NODE_LAYER_LABELS, ("nn-1", "nn-2", "nn-3"), strict=True))
    for node in nodes:
        kubectl("label", "node", node.name, "--overwrite", *(f"{k}={v}" for k, v in layers.items()))
    cp = cluster_control_plane(tmp_path / "kueue")
    it = get_instance_type(nodes[0].instance_type)
    devices, cores = it.devices, it.devices * it.logical_cores_per_device(it.family.default_lnc)
    server = server_id_label(4)

    def gang(name: str) -> dict[str, Any]:
        return kq.job(name, "neuron", 4, {f"{RESOURCE}/neuron": devices}, required=server, namespace=WORKLOADS)

    async def install() -> None:
        async with SimApi(cp) as api:
            await kq.start_kueue(api, cp)
            await api.create(kq.kueue_path("topologies"), kq.topology())
            await api.create(kq.kueue_path("resourceflavors"), kq.resource_flavor("trn2u", nodes[0].instance_type))
            quota = kq.device_quota(len(nodes), devices, cores)
            await api.create(kq.kueue_path("clusterqueues"), kq.cluster_queue("neuron", "trn2u", quota))
            await api.create(
                kq.kueue_path("localqueues", namespace=WORKLOADS), kq.local_queue("neuron", "neuron", WORKLOADS)
            )

    async def uninstall() -> None:
        async with SimApi(cp) as api:
            for hooks in kq.webhook_configurations(0, ""):  # fail-closed hooks of a stopped manager refuse Jobs
                plural = "mutating" if hooks["kind"].startswith("Mutating") else "validating"
                with contextlib.suppress(SimApiError):
                    await api.request(
                        "DELETE",
                        f"/apis/admissionregistration.k8s.io/v1/{plural}webhookconfigurations/{hooks['metadata']['name']}",
                    )
            for crd in kq.crds(0, ""):
                with contextlib.suppress(SimApiError):
                    await api.request(
                        "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
                    )

            async def gone() -> bool:  # a CRD still terminating refuses the next run's objects
                for crd in kq.crds(0, ""):
                    try:
                        await api.request(
                            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
                        )
                    except SimApiError as exc:
                        if exc.status != 404:
                            raise
                    else:
                        return False
                return True

            await until_async(gone, "Kueue's CRDs deleted", 120.0, 1.0)

    try:
        asyncio.run(install())
        kubectl("apply", "-f", "-", stdin=json.dumps(gang("gang-a")))
        eventually(lambda: (kueue_condition("gang-a", "Admitted") or {}).get("status") == "True", "gang-a admitted",
                   timeout=120)  # fmt: skip
        eventually(lambda: [p["status"].get("phase") for p in job_pods("gang-a")] == ["Running"] * 4,
                   "gang-a's four pods running", timeout=240)  # fmt: skip
        placed = {p["spec"]["nodeName"] for p in job_pods("gang-a")}
        assert placed == {n.name for n in nodes}, f"one pod a node of the UltraServer, got {placed}"
        servers = {read("node", n)["metadata"]["labels"].get(server) for n in placed}
        assert len(servers) == 1 and None not in servers, servers  # noqa: PT018
        kubectl("apply", "-f", "-", stdin=json.dumps(gang("gang-b")))
        eventually(lambda: kueue_workload("gang-b") is not None, "gang-b's Workload", timeout=60)
        eventually(lambda: "quota" in (kueue_condition("gang-b", "QuotaReserved") or {}).get("message", ""),
                   "gang-b held for quota, saying so", timeout=60)  # fmt: skip
        assert read("job", "gang-b", namespace=WORKLOADS)["spec"].get("suspend") is True
        assert job_pods("gang-b") == []
        kubectl("delete", "job", "-n", WORKLOADS, "gang-a", "--cascade=foreground", "--wait=true", "--timeout=120s")
        eventually(lambda: [p["status"].get("phase") for p in job_pods("gang-b")] == ["Running"] * 4,
                   "gang-b admitted and running once gang-a left", timeout=240)  # fmt: skip
    finally:
        kubectl("delete", "jobs", "-n", WORKLOADS, "gang-a", "gang-b", "--ignore-not-found", "--cascade=foreground",
                "--wait=true", "--timeout=120s", check=False)  # fmt: skip
        asyncio.run(uninstall())
        cp.processes.stop_all()
        for node in nodes:
            kubectl("label", "node", node.name, *(f"{k}-" for k in layers), check=False)


# --- a helm upgrade rolls the node agents across the nodes -----------------------------------------

ROLLED = {"devicePlugin": "device-plugin", "nodeMetrics": "node-metrics", "npd": "problem-detector"}


def agents_missing(nodes: list[Node]) -> dict[str, list[str]]:
    """For each rolled DaemonSet's component, the nodes with no Ready pod of it just now."""
    listed = read("pods", namespace=NAMESPACE)["items"]
    missing: dict[str, list[str]] = {}
    for component in ROLLED.values():
        ready = {
            p["spec"].get("nodeName")
            for p in listed
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
            and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
        }
        missing[component] = sorted(n.name for n in nodes if n.name not in ready)
    return missing


def daemonset_of(component: str) -> dict[str, Any]:
    listed = json.loads(
        kubectl("get", "daemonsets", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}", "-o", "json")
    )["items"]
    assert len(listed) == 1, [d["metadata"]["name"] for d in listed]
    return dict(listed[0])


def test_a_helm_upgrade_rolls_the_node_agents_one_node_at_a_time_and_no_running_pod_loses_its_devices(
    nodes: list[Node],
) -> None:
    """A changed pod template for the device plugin, the exporter and the detector (`podAnnotations`,
    as a config change is): each DaemonSet rolls across every node with never more nodes at once
    without a Ready pod of it than its `maxUnavailable`, and a pod holding two devices throughout
    keeps running, keeps them, and the new device plugin counts them as taken."""
    holder_node = nodes[-1]
    limits = {"limits": {f"{RESOURCE}/neuron": 2}}
    kubectl(
        "apply", "-f", "-", stdin=workload_pod("holder", WORKLOADS, WORKLOAD_IMAGE, limits, nodeName=holder_node.name)
    )
    eventually(lambda: "cores=" in logs("holder"), "the holder printed its devices", timeout=180)
    held = sorted(line for line in logs("holder").splitlines() if line.startswith("device="))
    assert len(held) == 2, held
    total = devices(holder_node)
    taken = f"{total - 2}/{total}"
    eventually(lambda: read("neuronnodes", holder_node.name)["status"].get("devices") == taken, f"{taken} free")
    limit = {
        component: int(daemonset_of(component)["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"])
        for component in ROLLED.values()
    }
    before = {c: daemonset_of(c)["metadata"]["generation"] for c in ROLLED.values()}
    assert agents_missing(nodes) == {c: [] for c in ROLLED.values()}

    worst: dict[str, list[str]] = {c: [] for c in ROLLED.values()}
    dips: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for component, missing in agents_missing(nodes).items():
                if len(missing) > len(worst[component]):
                    worst[component] = missing
            short = [n.name for n in nodes if allocatable(n) != str(devices(n))]
            if len(short) > limit["device-plugin"]:
                dips.append(f"nodes short of devices at once: {short}")
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stamp = str(time.time_ns())
        helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reset-then-reuse-values",
            *(arg for value in ROLLED for arg in ("--set-string", f"{value}.podAnnotations.e2e-rollout={stamp}")),
            "--wait", "--timeout", "600s",
        )  # fmt: skip
        for component in ROLLED.values():
            name = daemonset_of(component)["metadata"]["name"]
            kubectl("rollout", "status", "-n", NAMESPACE, f"daemonset/{name}", "--timeout=300s")
    finally:
        done.set()
        watcher.join(timeout=30)
    for component in ROLLED.values():
        daemonset = daemonset_of(component)
        assert daemonset["metadata"]["generation"] > before[component], f"{component} did not roll"
        assert daemonset["status"].get("updatedNumberScheduled") == len(nodes), daemonset["status"]
        # something was watched: each DaemonSet's pods were replaced, one node at a time at most
        assert 1 <= len(worst[component]) <= limit[component], (component, worst[component])
    assert dips == []
    status = pod("holder")["status"]
    assert status["phase"] == "Running", status
    assert status["containerStatuses"][0]["restartCount"] == 0, status
    still = kubectl("exec", "-n", WORKLOADS, "holder", "--", WORKLOAD_PYTHON, "-c",
                    "import glob; print('\\n'.join('device=' + d for d in sorted(glob.glob('/dev/neuron*'))))")  # fmt: skip
    assert sorted(still.split()) == held
    eventually(
        lambda: read("neuronnodes", holder_node.name)["status"].get("devices") == taken,
        f"the new device plugin on {holder_node.name} counting the holder's two devices as taken",
    )
    kubectl("delete", "pod", "-n", WORKLOADS, "holder", "--wait=true", "--timeout=60s")


# --- one pod spec, the device plugin on one node and DRA on another --------------------------------

ALLOCATOR = "neuron.aws.com/allocator"


def test_the_same_pod_spec_runs_through_the_device_plugin_on_one_node_and_through_dra_on_another(
    nodes: list[Node],
) -> None:
    """A mixed cluster (docs/dra.md): devicePlugin.nodeSelector and draDriver.nodeSelector on one label
    with two values. The same `aws.amazon.com/neuron: 4` pod, pinned once to each node: through the
    device plugin its four devices are a connected set; through DRA (the DeviceClass's
    extendedResourceName) the scheduler makes the claim itself, and that claim has no constraint, so
    whether its four are connected is reported, not asserted. Runs last: it changes the release."""
    plugin_node, dra_node = nodes[0], nodes[1]
    for node in (plugin_node, dra_node):
        assert get_instance_type(node.instance_type).torus_shape == (4, 4), node
    kubectl("label", "node", plugin_node.name, f"{ALLOCATOR}=device-plugin", "--overwrite")
    kubectl("label", "node", dra_node.name, f"{ALLOCATOR}=dra", "--overwrite")
    try:
        helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reset-then-reuse-values",
            "--set-string", f"devicePlugin.nodeSelector.{ALLOCATOR.replace('.', chr(92) + '.')}=device-plugin",
            "--set", "draDriver.enabled=true",
            "--set-string", f"draDriver.nodeSelector.{ALLOCATOR.replace('.', chr(92) + '.')}=dra",
            "--wait", "--timeout", "600s",
        )  # fmt: skip
        eventually(
            lambda: bool(
                json.loads(
                    kubectl("get", "resourceslices", "--field-selector", f"spec.nodeName={dra_node.name}", "-o", "json")
                )["items"]
            ),
            f"the DRA driver's ResourceSlices of {dra_node.name}",
            timeout=180,
        )
        limits = {"limits": {f"{RESOURCE}/neuron": 4}}
        for node, name in ((plugin_node, "through-plugin"), (dra_node, "through-dra")):
            selector = {"kubernetes.io/hostname": node.name}
            kubectl(
                "apply", "-f", "-", stdin=workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, limits, nodeSelector=selector)
            )
        held: dict[str, set[int]] = {}
        for node, name in ((plugin_node, "through-plugin"), (dra_node, "through-dra")):
            eventually(lambda name=name: "cores=" in logs(name), f"{name} printed its devices", timeout=240)
            assert pod(name)["spec"]["nodeName"] == node.name
            held[name] = {
                int(line.removeprefix("device=/dev/neuron")) for line in logs(name).splitlines()
                if line.startswith("device=")
            }  # fmt: skip
            assert len(held[name]) == 4, (name, held[name])
        assert not pod("through-plugin")["status"].get("extendedResourceClaimStatus")
        assert pod("through-dra")["status"].get("extendedResourceClaimStatus"), "DRA made no claim for the pod"
        adjacency = get_instance_type(plugin_node.instance_type).adjacency()
        assert connected(held["through-plugin"], adjacency), held
        print(
            f"DRA's four devices for an extended-resource pod: {sorted(held['through-dra'])}, "
            f"connected={connected(held['through-dra'], adjacency)} (the generated claim has no constraint)"
        )
        kubectl("delete", "pod", "-n", WORKLOADS, "through-plugin", "through-dra", "--wait=true", "--timeout=60s")
    finally:
        for node in (plugin_node, dra_node):
            kubectl("label", "node", node.name, f"{ALLOCATOR}-", check=False)
