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

import json
import os
import random
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
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
from simcluster.fleet import GroupSpec, PodSpec

from neuron_model.instance_types import get_instance_type
from neuron_model.ultraserver import Mode

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
