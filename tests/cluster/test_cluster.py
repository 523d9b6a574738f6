"""On the real single-node cluster (make cluster-up): the node, a pod, the API from a pod, and
the device plugin against the real kubelet (as a host process; the chart deploys it later).

Runs only with `-m cluster` (make cluster-test / make test), after cluster-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_access import (
    APICHECK_IMAGE,
    CTR,
    KUBECONFIG,
    NODE,
    REGISTRY,
    REPO,
    SIM_ROOT,
    eventually,
    host_device_plugin,
    kubectl,
    node,
    pod_phase,
    read,
    restart_kubelet,
    unschedulable,
)

PAUSE = "registry.k8s.io/pause:3.10"

pytestmark = pytest.mark.cluster


def pod_manifest(name: str, resources: dict[str, int] | None = None) -> str:
    limits = json.dumps({"limits": resources}) if resources else "{}"
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  restartPolicy: Never
  containers: [{{name: main, image: {PAUSE}, imagePullPolicy: Never, resources: {limits}}}]
"""


def container_spec(pod: str) -> dict:  # type: ignore[type-arg]
    cid = kubectl("get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].containerID}").removeprefix(
        "containerd://"
    )
    out = subprocess.run(
        [*CTR, "containers", "info", cid],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)["Spec"]  # type: ignore[no-any-return]


def test_node_is_ready_with_the_instance_type_label() -> None:
    n = node()
    ready = {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert n["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "trn1.32xlarge"


def test_a_pod_runs_and_logs_are_readable() -> None:
    kubectl("delete", "pod", "smoke", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", "-", stdin=pod_manifest("smoke"))
    eventually(lambda: pod_phase("smoke") == "Running", "pod running")
    kubectl("logs", "smoke")  # needs the API server to reach the kubelet by the node's name
    kubectl("delete", "pod", "smoke", "--wait=false")


def test_a_pod_reaches_the_api_server_by_its_dns_name() -> None:
    """Through the kubernetes Service, by the name cluster DNS (CoreDNS, tests/cluster/peers.sh) answers for it."""
    kubectl("delete", "pod", "apicheck-test", "--ignore-not-found", "--wait=true")
    kubectl(
        "run",
        "apicheck-test",
        f"--image={APICHECK_IMAGE}",
        "--image-pull-policy=Never",
        "--restart=Never",
        "--",
        "kubernetes.default.svc",
    )
    eventually(lambda: pod_phase("apicheck-test") == "Succeeded", "apicheck")
    logged = kubectl("logs", "apicheck-test")
    assert "reached the API server at kubernetes.default.svc:443" in logged, logged
    assert '"major": "1"' in logged
    kubectl("delete", "pod", "apicheck-test", "--wait=false")


@pytest.fixture(scope="module")
def device_plugin() -> Iterator[subprocess.Popen[bytes]]:
    with host_device_plugin(
        "device-plugin-test", 19841, leftover_pods=("cores", "too-many", "devices4", "after-restart", "exporter")
    ) as proc:
        yield proc


def test_real_kubelet_allocatable(device_plugin: subprocess.Popen[bytes]) -> None:
    allocatable = node()["status"]["allocatable"]
    assert (allocatable["aws.amazon.com/neuron"], allocatable["aws.amazon.com/neuroncore"]) == ("16", "32")


def test_pod_with_two_cores_gets_its_device_and_env(device_plugin: subprocess.Popen[bytes]) -> None:
    kubectl("apply", "-f", "-", stdin=pod_manifest("cores", {"aws.amazon.com/neuroncore": 2}))
    eventually(lambda: pod_phase("cores") == "Running", "cores pod", 120)
    spec = container_spec("cores")
    env = dict(e.split("=", 1) for e in spec["process"]["env"])
    cores = [int(c) for c in env["NEURON_RT_VISIBLE_CORES"].split(",")]
    assert len(cores) == 2
    assert cores[1] == cores[0] + 1
    [device] = spec["linux"]["devices"]
    assert device["path"] == f"/dev/neuron{cores[0] // 2}"
    assert (device["type"], device["major"], device["minor"]) == ("c", 241, cores[0] // 2)
    # the device whose cores are held is not offered whole: allocatable neuron drops to 15
    eventually(lambda: node()["status"]["allocatable"]["aws.amazon.com/neuron"] == "15", "cross-resource holding", 60)
    kubectl("delete", "pod", "cores", "--wait=true")
    eventually(lambda: node()["status"]["allocatable"]["aws.amazon.com/neuron"] == "16", "released", 60)


def test_a_pod_asking_for_more_than_is_free_stays_pending(device_plugin: subprocess.Popen[bytes]) -> None:
    kubectl("apply", "-f", "-", stdin=pod_manifest("too-many", {"aws.amazon.com/neuron": 17}))
    # the scheduler's verdict on it first: only after it is Pending a proof that nothing placed it
    refused = eventually(lambda: unschedulable("too-many"), "the scheduler to refuse too-many", 60)
    assert "Insufficient aws.amazon.com/neuron" in refused, refused
    assert pod_phase("too-many") == "Pending"
    kubectl("delete", "pod", "too-many", "--wait=false")


def test_four_devices_are_a_torus_row(device_plugin: subprocess.Popen[bytes]) -> None:
    kubectl("apply", "-f", "-", stdin=pod_manifest("devices4", {"aws.amazon.com/neuron": 4}))
    eventually(lambda: pod_phase("devices4") == "Running", "pod", 120)
    devices = sorted(d["minor"] for d in container_spec("devices4")["linux"]["devices"])
    assert devices in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15])
    kubectl("delete", "pod", "devices4", "--wait=true")


def test_kubelet_restart_reregisters(device_plugin: subprocess.Popen[bytes]) -> None:
    restart_kubelet()
    # Proof of re-registration: a new pod is admitted with cores after the restart.
    kubectl("delete", "pod", "after-restart", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", "-", stdin=pod_manifest("after-restart", {"aws.amazon.com/neuroncore": 1}))
    eventually(
        lambda: pod_phase("after-restart") == "Running",
        "pod after restart",
        180,
    )
    eventually(lambda: node()["status"]["allocatable"].get("aws.amazon.com/neuroncore") == "32", "allocatable back", 60)
    assert device_plugin.poll() is None  # the plugin rode it out
    kubectl("delete", "pod", "after-restart", "--wait=true")


def test_a_vanished_device_leaves_allocatable(device_plugin: subprocess.Popen[bytes]) -> None:
    from neuron_sim import node as sim

    # start from nothing held: every pod of the earlier tests is gone
    eventually(lambda: node()["status"]["allocatable"]["aws.amazon.com/neuron"] == "16", "all devices free", 90)
    sim.vanish(SIM_ROOT, 15)
    try:
        eventually(lambda: node()["status"]["allocatable"]["aws.amazon.com/neuron"] == "15", "device 15 unhealthy", 60)
        assert node()["status"]["capacity"]["aws.amazon.com/neuron"] == "16"
    finally:
        sim.restore(SIM_ROOT, 15)
    eventually(lambda: node()["status"]["allocatable"]["aws.amazon.com/neuron"] == "16", "device 15 back", 90)


def test_project_images_are_in_containerd() -> None:
    listed = subprocess.run(
        [*CTR, "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for svc in ("device-plugin", "node-metrics", "node-problem-detector"):
        assert any(ref.startswith(f"localhost/neuron-helm-chart/{svc}:") for ref in listed), svc


def test_the_kubelet_pulls_from_the_clusters_registry_over_plain_http() -> None:
    """up.sh's registry and containerd's hosts.toml for it: an image pushed there (a tag no other run used)
    runs as a pod that must pull it."""
    version = next(
        line.split('"')[1]
        for line in (REPO / "services/node-metrics/pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    ref = f"{REGISTRY}/neuron-test/registry-check:{int(time.time())}"
    # A label of its own gives it an image ID no imported image has: the kubelet keeps a record of each
    # image ID it pulled, and then refuses a local image of that ID under pull policy Never.
    subprocess.run(
        ["podman", "build", "-q", "--network", "none", "-t", ref, "-f", "-", str(REPO / "tests")],
        input=f"FROM localhost/neuron-helm-chart/node-metrics:{version}\nLABEL neuron-test.registry-check={ref}\n",
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    subprocess.run(
        ["podman", "push", "-q", "--tls-verify=false", ref, f"docker://{ref}"],
        capture_output=True,
        text=True,
        check=True,
    )
    subprocess.run(["podman", "rmi", "-f", ref], capture_output=True, text=True, check=False)
    kubectl("delete", "pod", "registry-check", "--ignore-not-found", "--wait=true")
    kubectl("run", "registry-check", f"--image={ref}", "--image-pull-policy=Always", "--restart=Never", "--", "--help")
    try:
        eventually(lambda: pod_phase("registry-check") == "Succeeded", "a pod of the pushed image ran", 120)
        events = kubectl("get", "events", "--field-selector", "involvedObject.name=registry-check,reason=Pulled")
        assert "Successfully pulled image" in events, events
    finally:
        kubectl("delete", "pod", "registry-check", "--ignore-not-found", "--wait=false")


def test_the_exporter_image_runs_as_a_pod_over_the_simulated_node() -> None:
    version = next(
        line.split('"')[1]
        for line in (REPO / "services/node-metrics/pyproject.toml").read_text().splitlines()
        if line.startswith("version")
    )
    manifest = f"""
apiVersion: v1
kind: Pod
metadata: {{name: exporter, namespace: default}}
spec:
  hostNetwork: true
  containers:
  - name: exporter
    image: localhost/neuron-helm-chart/node-metrics:{version}
    imagePullPolicy: Never
    args: [--host-root, {SIM_ROOT}, --listen, "127.0.0.1:19850", --pod-resources-socket, /var/lib/kubelet/pod-resources/kubelet.sock]
    # the image runs as nobody; the kubelet's PodResources socket admits root alone, as the chart knows
    securityContext: {{runAsUser: 0, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
    volumeMounts:
    - {{name: sim, mountPath: {SIM_ROOT}, readOnly: true}}
    - {{name: pod-resources, mountPath: /var/lib/kubelet/pod-resources, readOnly: true}}
  volumes:
  - {{name: sim, hostPath: {{path: {SIM_ROOT}}}}}
  - {{name: pod-resources, hostPath: {{path: /var/lib/kubelet/pod-resources}}}}
"""
    import urllib.request

    kubectl("delete", "pod", "exporter", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", "-", stdin=manifest)
    try:
        eventually(lambda: pod_phase("exporter") == "Running", "exporter", 120)

        def scrape() -> str:
            with urllib.request.urlopen("http://127.0.0.1:19850/metrics", timeout=5) as r:
                return str(r.read().decode())

        eventually(lambda: "neuron_exporter_podresources_up 1" in scrape(), "exporter attribution up", 60)
        text = scrape()
        assert 'neuron_device_info{device="15"' in text
        assert 'instance_type="trn1.32xlarge"' in text
    finally:
        kubectl("delete", "pod", "exporter", "--wait=false", check=False)


def test_problem_detector_against_the_real_api_server(tmp_path: Path) -> None:
    """The detector's strategic merge patch on a real API server: NeuronHealth set, the
    kubelet's own conditions intact, an Event on the Node; then cleared by a new boot."""
    from neuron_sim import node as sim

    state = tmp_path / "npd"
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_problem_detector", "--host-root", str(SIM_ROOT), "--node-name", NODE,
         "--kubeconfig", str(KUBECONFIG), "--listen", "127.0.0.1:0", "--state-file", str(state / "state.json"),
         "--verdict-dir", str(state / "verdicts"), "--lookback", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def neuron_health() -> tuple[str, str] | None:
        for c in node()["status"]["conditions"]:
            if c["type"] == "NeuronHealth":
                return c["status"], c["reason"]
        return None

    try:
        eventually(lambda: neuron_health() == ("False", "NeuronHasNoError"), "healthy condition", 60)
        sim.inject_hw_error(SIM_ROOT, "HBM_UNCORRECTABLE_ERROR", 6, 1)
        eventually(lambda: neuron_health() == ("True", "NeuronHasError_HBM_UNCORRECTABLE_ERROR"), "condition", 30)
        types = {c["type"] for c in node()["status"]["conditions"]}
        assert {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"} <= types  # the kubelet's survived
        events = read("events", namespace="default")["items"]
        [event] = [
            e for e in events if e["reason"] == "NeuronHasError_HBM_UNCORRECTABLE_ERROR" and "neuron6" in e["message"]
        ]
        assert event["involvedObject"]["kind"] == "Node"
        assert event["involvedObject"]["name"] == NODE
    finally:
        proc.terminate()
        proc.wait(20)
    # a new boot: the restarted detector clears the stale True
    sim.reboot(SIM_ROOT)
    proc = subprocess.Popen(proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: neuron_health() == ("False", "NeuronHasNoError"), "cleared after reboot", 60)
    finally:
        proc.terminate()
        proc.wait(20)
