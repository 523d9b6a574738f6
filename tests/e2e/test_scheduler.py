"""End to end: Neuron-aware scheduling on the real single-node cluster (make cluster-up), with the real
kube-scheduler (`neuron-scheduler`, the cluster's own build), API server and kubelet, the chart's
extender and the device plugin's NeuronNode report, over a simulated trn1.32xlarge.

The node loses one device in each torus row (1, 5, 9, 13: twelve free, no free row of four): an
8-device and a 4-device pod naming `neuron-scheduler` stay Pending with the reason in their
FailedScheduling event while 1-device pods run; once the devices recover (a simulated reboot), the
8-device pod runs on an aligned group of eight. Last, four Node objects of a simulated trn2u
UltraServer (no kubelet behind them) join the cluster, and a 4-pod group is bound one pod to each
while a second waits with the reason. The tests run in file order and share one release.

Runs with `-m e2e` (make cluster-test) against $KUBECONFIG, which defaults to the test cluster's. It
needs the images `make images` builds (the extender's among them) and the second scheduler's image
(tests/cluster/kube-scheduler-image.sh).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_access import (
    NODE,
    REPO,
    SIM_ROOT,
    WORKLOAD_PYTHON,
    eventually,
    helm,
    kubectl,
    node,
    pod_phase,
    read,
    sim,
    workload_pod,
)
from simcluster.fleet import ULTRASERVER_NODES, ULTRASERVER_TYPE, GroupSpec, NodeSpec, PodSpec, UltraServerSeat
from simcluster.nodes import SimNode, whole_node

from neuron_device_plugin.node_report import FIELD_MANAGER
from neuron_model.instance_types import get_instance_type

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-helm-chart"
NAMESPACE = "neuron-e2e-scheduling"
WORKLOADS = "neuron-e2e-scheduling-workloads"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
# any project image serves: it has Python, which prints what the container was given
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/device-plugin:{VERSION}"
SCHEDULER = "neuron-scheduler"
EXTENDER = f"{RELEASE}-scheduler-extender"
KUBE_SCHEDULER = f"{RELEASE}-kube-scheduler"
ONE_PER_ROW = (1, 5, 9, 13)
RESOURCE = "aws.amazon.com"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


# --- helpers ---------------------------------------------------------------------------------


def install(*args: str) -> None:
    helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}",
        "--set", "scheduler.enabled=true",
        # every object <release>-<component> in NAMESPACE (EXTENDER, KUBE_SCHEDULER, the plugin), which these
        # tests name
        "--set", "objectNames=release",
        *args, "--wait", "--timeout", "300s",
    )  # fmt: skip


def allocatable() -> tuple[str | None, str | None]:
    a = node()["status"].get("allocatable", {})
    return a.get(f"{RESOURCE}/neuron"), a.get(f"{RESOURCE}/neuroncore")


def report() -> dict[str, Any]:
    return read("neuronnodes", NODE)


def pod_manifest(name: str, devices: int, scheduler: str = SCHEDULER) -> str:
    limits = {"limits": {f"{RESOURCE}/neuron": devices}}
    return workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, limits, schedulerName=scheduler)


def create_pod(name: str, devices: int) -> None:
    kubectl("apply", "-f", "-", stdin=pod_manifest(name, devices))


def shown(name: str) -> dict[str, list[str]]:
    """What a running workload printed: its /dev/neuronN and NEURON_RT_VISIBLE_CORES."""
    seen: dict[str, list[str]] = {}

    def logged() -> bool:
        seen.clear()
        for line in kubectl("logs", "-n", WORKLOADS, name).splitlines():
            key, _, value = line.partition("=")
            seen.setdefault(key, []).append(value)
        return "cores" in seen

    eventually(logged, f"pod {name} printed its devices")
    return seen


def devices_of(name: str) -> list[int]:
    return sorted(int(d.removeprefix("/dev/neuron")) for d in shown(name)["device"])


def pod(name: str) -> dict[str, Any]:
    return read("pod", name, namespace=WORKLOADS)


def unschedulable_reason(name: str) -> str:
    """The PodScheduled=False message (kube-scheduler's FitError, the same text as the event)."""
    for condition in pod(name)["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


def failed_scheduling_events(name: str) -> list[str]:
    events = kubectl("get", "events", "-n", WORKLOADS, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e["message"] for e in json.loads(events)["items"] if e["reason"] == "FailedScheduling"]


def runs(name: str, devices: int, what: str) -> None:
    """Wait for the pod to run, creating it again (once per failure) when the kubelet failed its
    admission: `simulated_reboot` restarts the device plugin under pending pods, and when its
    ListAndWatch ends the kubelet closes the plugin's connection, failing an Allocate still on the
    wire (UnexpectedAdmissionError), which a real reboot, with no pod bound before the plugin is
    back, cannot meet. Any other failure fails the test."""

    def running() -> bool:
        status = pod(name)["status"]
        if status.get("phase") == "Failed" and status.get("reason") == "UnexpectedAdmissionError":
            print(
                f"{name}: admission failed during the plugin's restart ({status.get('message', '')}); creating it again"
            )
            delete_pods(name)
            create_pod(name, devices)
            return False
        assert status.get("phase") != "Failed", status
        return status.get("phase") == "Running"

    eventually(running, what, timeout=400)


def delete_pods(*names: str) -> None:
    kubectl("delete", "pod", "-n", WORKLOADS, *names, "--ignore-not-found", "--wait=true", "--timeout=60s")


def extender_pods() -> list[dict[str, Any]]:
    pods = read("pods", namespace=NAMESPACE, selector="app.kubernetes.io/component=scheduler-extender")
    return [p for p in pods["items"] if p["metadata"].get("deletionTimestamp") is None]


def extender_tls(client_cert: bool) -> ssl.SSLContext:
    """A client context trusting the release's CA, with its certificate (kube-scheduler's) or none."""
    import base64
    import tempfile

    secret = read("secret", f"{EXTENDER}-tls", namespace=NAMESPACE)["data"]
    with tempfile.TemporaryDirectory(prefix="extender-tls-") as scratch:  # a key on disk only while it loads
        directory = Path(scratch)
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (directory / key).write_bytes(base64.b64decode(secret[key]))
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
        context.check_hostname = False  # dialled by pod IP; the CA is what is checked
        if client_cert:
            context.load_cert_chain(str(directory / "tls.crt"), str(directory / "tls.key"))
    return context


def get(pod_ip: str, path: str) -> tuple[int, str]:
    return call(pod_ip, path)


def call(pod_ip: str, path: str, body: bytes | None = None, client_cert: bool = False) -> tuple[int, str]:
    """GET (or POST `body`) on an extender replica over HTTPS, as anyone in the cluster could."""
    request = urllib.request.Request(f"https://{pod_ip}:9843{path}", data=body, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10, context=extender_tls(client_cert)) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def leader_pod() -> dict[str, Any]:
    (leader,) = [p for p in extender_pods() if get(p["status"]["podIP"], "/readyz")[1].startswith("leader")]
    return leader


def restart_daemonset_pods(component: str) -> None:
    name = f"{RELEASE}-{component}"
    selector = f"app.kubernetes.io/component={component}"
    before = kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "name").split()
    kubectl("delete", "-n", NAMESPACE, *before, "--wait=true", "--timeout=60s")
    kubectl("rollout", "status", "-n", NAMESPACE, f"daemonset/{name}", "--timeout=180s")


def simulated_reboot() -> None:
    """A reboot as the node agents see it (as test_e2e does): a new boot id, an empty kernel log, every agent restarted."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    for component in ("problem-detector", "device-plugin", "node-metrics"):
        restart_daemonset_pods(component)


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def release() -> Iterator[None]:
    """The chart with scheduling on, a clean simulated node, the workloads' namespace; all removed afterwards."""
    sim("inject", "--root", SIM_ROOT, "reboot")
    kubectl("create", "namespace", WORKLOADS, check=False)
    install()
    eventually(lambda: allocatable() == ("16", "32"), "allocatable 16 neuron / 32 neuroncore", timeout=180)
    yield
    kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    sim("inject", "--root", SIM_ROOT, "reboot")


# --- the tests, in order ----------------------------------------------------------------------


def test_the_node_reports_and_both_extender_replicas_are_ready() -> None:
    eventually(lambda: report()["status"]["devices"] == "16/16", "the NeuronNode report: 16 of 16 devices free")
    printed = kubectl("get", "neuronnodes")
    assert NODE in printed
    pods = extender_pods()
    assert len(pods) == 2
    answers = [get(p["status"]["podIP"], "/readyz") for p in pods]
    assert all(status == 200 for status, _ in answers), answers
    roles = sorted(text.split(";")[0].split(",")[0] for _, text in answers)
    assert roles == ["leader", "standby"], answers
    status, metrics = get(pods[0]["status"]["podIP"], "/metrics")
    assert status == 200
    assert re.search(r"^neuron_scheduler_extender_reports 1\.0$", metrics, re.MULTILINE), metrics[-2000:]


def free_devices_in(reason: str, size: int) -> set[int] | None:
    """The free devices a refusal names: `no connected set of 8 free devices (free: 0,2,3,...)`."""
    match = re.search(rf"no connected set of {size} free devices \(free: ([0-9,]+)\)", reason)
    return {int(d) for d in match[1].split(",")} if match else None


def test_one_device_lost_in_each_row_keeps_8_and_4_device_pods_pending_with_the_reason() -> None:
    for device in ONE_PER_ROW:
        sim("inject", "--root", SIM_ROOT, "fault", "--kind", "NC_UNCORRECTABLE_ERROR", "--device", str(device))
    eventually(lambda: allocatable() == ("12", "24"), "devices 1, 5, 9, 13 Unhealthy", timeout=180)
    eventually(
        lambda: report()["status"]["unhealthyDevices"] == list(ONE_PER_ROW), "the report names the unhealthy devices"
    )
    create_pod("one-a", 1)
    create_pod("one-b", 1)
    eventually(lambda: pod_phase("one-a", WORKLOADS) == "Running", "one-a running", timeout=180)
    eventually(lambda: pod_phase("one-b", WORKLOADS) == "Running", "one-b running", timeout=180)
    for name in ("one-a", "one-b"):
        (device,) = devices_of(name)
        assert device not in ONE_PER_ROW
        assert pod(name)["spec"]["schedulerName"] == SCHEDULER
    held = {*devices_of("one-a"), *devices_of("one-b")}
    assert len(held) == 2
    # by count (12 healthy, 2 held) the default scheduler would bind both; neuron-scheduler keeps them Pending
    create_pod("eight", 8)
    create_pod("four", 4)
    expected_free = set(range(16)) - set(ONE_PER_ROW) - held
    for name, size in (("eight", 8), ("four", 4)):
        eventually(
            lambda name=name, size=size: free_devices_in(unschedulable_reason(name), size) == expected_free,
            f"{name} unschedulable, naming the free devices {sorted(expected_free)}",
            timeout=120,
        )
        reason = unschedulable_reason(name)
        assert "the node cannot hold it even with every healthy device free" in reason, reason
        eventually(
            lambda name=name, size=size: any(
                f"no connected set of {size} free devices" in m for m in failed_scheduling_events(name)
            ),
            f"a FailedScheduling event for {name} with the reason",
        )
        assert pod_phase(name, WORKLOADS) == "Pending"
        assert not pod(name)["spec"].get("nodeName")


def test_a_bind_without_the_releases_certificate_is_refused_and_an_oversized_body_gets_413() -> None:
    """What issue 24 did from inside the cluster: POST /bind for a pending pod. Without a client
    certificate of the release's CA the extender answers 403 and the pod stays unbound; with it, a
    body over the limit gets 413 and both replicas stay up."""
    binding = json.dumps(
        {"PodName": "four", "PodNamespace": WORKLOADS, "PodUID": pod("four")["metadata"]["uid"], "Node": NODE}
    ).encode()
    for replica in extender_pods():
        status, text = call(replica["status"]["podIP"], "/bind", binding)
        assert status == 403, text
        assert "client certificate" in text
    assert pod_phase("four", WORKLOADS) == "Pending"
    assert not pod("four")["spec"].get("nodeName")
    leader_ip = leader_pod()["status"]["podIP"]
    status, text = call(leader_ip, "/filter", b"[" + b"0," * (3 * 1024**2) + b"0]", client_cert=True)
    assert status == 413, text
    for replica in extender_pods():
        assert get(replica["status"]["podIP"], "/healthz")[0] == 200
    _, metrics = get(leader_ip, "/metrics")
    assert 'neuron_scheduler_extender_refused_requests_total{reason="too_large",verb="filter"} 1.0' in metrics


# What an attacker's pod runs: POST /bind for a pending pod to the extender's Service by its DNS name,
# trusting any certificate, and print what came back (the HTTP status, or how the connection failed).
ATTACK = """
import json, socket, ssl, sys, urllib.error, urllib.request
url, body = sys.argv[1], sys.argv[2].encode()
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
try:
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5, context=context) as r:
        print("status", r.status)
except urllib.error.HTTPError as e:
    print("status", e.code)
except (TimeoutError, socket.timeout):
    print("timed out")
except urllib.error.URLError as e:
    print("timed out" if isinstance(e.reason, (TimeoutError, socket.timeout)) else f"failed {e.reason}")
"""


def attack_from(namespace: str, body: str) -> str:
    """Run a pod in `namespace` that POSTs `body` to the extender's /bind by its Service name; what it printed."""
    url = f"https://{EXTENDER}.{NAMESPACE}.svc:9843/bind"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "attacker", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "command": [WORKLOAD_PYTHON, "-c", ATTACK, url, body],
            }],
        },
    }  # fmt: skip
    kubectl("delete", "pod", "-n", namespace, "attacker", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    eventually(lambda: pod_phase("attacker", namespace) == "Succeeded", f"the attacker pod in {namespace} done", 90)
    printed = kubectl("logs", "-n", namespace, "attacker").strip()
    kubectl("delete", "pod", "-n", namespace, "attacker", "--wait=false")
    return printed


def test_the_extenders_network_policy_holds_on_a_cluster_that_enforces_it() -> None:
    """Issue 24 item 7 with the test cluster's real NetworkPolicy enforcer (kube-network-policies) and
    DNS (CoreDNS): a pod of another namespace that POSTs /bind for a pending pod to the extender's
    Service never gets a connection; a pod the policy admits (the `monitoring` namespace, there for
    /metrics on the same port) connects, by the same name, and meets the next wall (no client
    certificate: 403). The pod stays unbound either way."""
    binding = json.dumps(
        {"PodName": "four", "PodNamespace": WORKLOADS, "PodUID": pod("four")["metadata"]["uid"], "Node": NODE}
    )
    # dropped or rejected, as the enforcer does it (kube-router rejects: "Connection refused"); never an HTTP answer
    assert attack_from(WORKLOADS, binding) in ("timed out", "failed [Errno 111] Connection refused")
    kubectl("create", "namespace", "monitoring", check=False)
    try:
        # an enforcer admits a new pod once it has seen it (kube-router: its IP in the admitted set), not at once
        eventually(lambda: attack_from("monitoring", binding) == "status 403", "the admitted pod reaching /bind", 90)
    finally:
        kubectl("delete", "namespace", "monitoring", "--wait=true", "--timeout=120s", check=False)
    assert pod_phase("four", WORKLOADS) == "Pending"
    assert not pod("four")["spec"].get("nodeName")


def test_restarting_both_extenders_loses_nothing() -> None:
    """New processes know from the API server alone what is held and what is broken: the same refusal, to the device."""
    held = {*devices_of("one-a"), *devices_of("one-b")}
    before = {p["metadata"]["name"] for p in extender_pods()}
    kubectl("delete", "pod", "-n", NAMESPACE, *before, "--wait=true", "--timeout=60s")
    kubectl("rollout", "status", "-n", NAMESPACE, f"deployment/{EXTENDER}", "--timeout=180s")
    assert not before & {p["metadata"]["name"] for p in extender_pods()}
    create_pod("eight-again", 8)
    expected_free = set(range(16)) - set(ONE_PER_ROW) - held
    eventually(
        lambda: free_devices_in(unschedulable_reason("eight-again"), 8) == expected_free,
        f"eight-again unschedulable, naming the free devices {sorted(expected_free)}",
        timeout=120,
    )
    delete_pods("eight-again")


def test_after_the_devices_recover_the_8_device_pod_runs_on_an_aligned_group() -> None:
    simulated_reboot()
    # neuron allocatable counts healthy devices; neuroncore's also lacks the cores of devices the
    # 1-device pods hold whole, so only the former says "every device healthy"
    eventually(lambda: allocatable()[0] == "16", "every device healthy again", timeout=180)
    eventually(lambda: report()["status"]["unhealthyDevices"] == [], "the report shows no unhealthy device")
    # kube-scheduler retries the pending pods on the node's change (at the latest after 5 minutes)
    runs("eight", 8, "the 8-device pod running")
    devices = devices_of("eight")
    assert devices in (list(range(8)), list(range(8, 16))), devices
    cores = [int(c) for c in shown("eight")["cores"][0].split(",")]
    assert cores == [c for d in devices for c in (2 * d, 2 * d + 1)]
    runs("four", 4, "the 4-device pod running")
    four = devices_of("four")
    assert four in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]), four
    held = {*devices, *four, *devices_of("one-a"), *devices_of("one-b")}
    assert len(held) == 14, "no device is given twice"


def test_a_pod_written_for_awss_chart_is_placed_by_neuron_scheduler() -> None:
    """`schedulerName: my-scheduler`, AWS's chart's default, is one of neuron-scheduler's profiles."""
    kubectl("apply", "-f", "-", stdin=pod_manifest("aws-style", 1, scheduler="my-scheduler"))
    eventually(lambda: pod_phase("aws-style", WORKLOADS) == "Running", "the my-scheduler pod running", timeout=180)
    assert len(devices_of("aws-style")) == 1
    delete_pods("aws-style")


def test_the_standby_takes_over_when_the_leader_goes() -> None:
    delete_pods("eight", "four")
    leader = leader_pod()["metadata"]["name"]
    kubectl("delete", "pod", "-n", NAMESPACE, leader, "--wait=true", "--timeout=60s")
    create_pod("after-failover", 8)
    eventually(
        lambda: pod_phase("after-failover", WORKLOADS) == "Running", "a pod placed after the failover", timeout=180
    )
    assert devices_of("after-failover") in (list(range(8)), list(range(8, 16)))
    kubectl("rollout", "status", "-n", NAMESPACE, f"deployment/{EXTENDER}", "--timeout=180s")
    delete_pods("after-failover", "one-a", "one-b")


def test_helm_test_passes_with_scheduling() -> None:
    result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s")
    assert re.search(rf"TEST SUITE:\s+{RELEASE}-tests-scheduling\n.*\n.*\nPhase:\s+Succeeded", result.stdout), (
        result.stdout
    )
    assert "placed by the Neuron-aware scheduler" in result.stdout


def test_the_second_scheduler_runs_the_clusters_own_version() -> None:
    server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    deployment = read("deployment", KUBE_SCHEDULER, namespace=NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.k8s.io/kube-scheduler:{server}"
    lease = read("lease", SCHEDULER, namespace=NAMESPACE)
    assert lease["spec"]["holderIdentity"]


# --- preemption (issue 59 item 1) ------------------------------------------------------------------
BATCH_CLASS, URGENT_CLASS = "neuron-e2e-batch", "neuron-e2e-urgent"
ROWS = [list(range(r, r + 4)) for r in range(0, 16, 4)]


def test_a_high_priority_4_device_pod_evicts_exactly_the_pods_of_one_row_and_runs_there() -> None:
    """The node full of one-device pods of low priority; a 4-device pod of high priority. kube-scheduler's
    own preemption would evict the four pods started last, most of the time no torus row, and the pod
    would stay Pending; the extender's preempt verb makes the victims the four pods of one row."""
    for name, value in ((BATCH_CLASS, 100), (URGENT_CLASS, 1_000_000)):
        kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value,
        }))  # fmt: skip
    batch = [f"batch-{d:02d}" for d in range(16)]
    try:
        for name in batch:
            limits = {"limits": {f"{RESOURCE}/neuron": 1}}
            kubectl("apply", "-f", "-", stdin=workload_pod(name, WORKLOADS, WORKLOAD_IMAGE, limits,
                                                           schedulerName=SCHEDULER, priorityClassName=BATCH_CLASS))  # fmt: skip
        for name in batch:
            eventually(lambda n=name: pod_phase(n, WORKLOADS) == "Running", f"{name} running", timeout=300)  # type: ignore[misc]
        held = {name: devices_of(name) for name in batch}
        assert sorted(d for devices in held.values() for d in devices) == list(range(16)), held
        eventually(lambda: report()["status"]["freeDevices"] == [], "the report shows the node full")

        limits = {"limits": {f"{RESOURCE}/neuron": 4}}
        kubectl("apply", "-f", "-", stdin=workload_pod("urgent", WORKLOADS, WORKLOAD_IMAGE, limits,
                                                       schedulerName=SCHEDULER, priorityClassName=URGENT_CLASS))  # fmt: skip
        eventually(lambda: pod_phase("urgent", WORKLOADS) == "Running", "the 4-device pod running", timeout=300)
        row = devices_of("urgent")
        assert row in ROWS, row
        left = {p["metadata"]["name"] for p in read("pods", namespace=WORKLOADS)["items"]
                if p["metadata"]["name"].startswith("batch-") and p["metadata"].get("deletionTimestamp") is None}  # fmt: skip
        evicted = set(batch) - left
        # exactly the pods that held the row, no other
        assert evicted == {name for name, devices in held.items() if devices[0] in row}, (evicted, held, row)
        assert all(pod_phase(name, WORKLOADS) == "Running" for name in left)
        events = kubectl("get", "events", "-n", WORKLOADS, "--field-selector", "reason=Preempted", "-o", "json")
        assert {e["involvedObject"]["name"] for e in json.loads(events)["items"]} == evicted
    finally:
        delete_pods("urgent", *batch)
        kubectl("delete", "priorityclass", BATCH_CLASS, URGENT_CLASS, "--ignore-not-found", check=False)


# --- UltraServer groups: four more nodes, Node objects without a kubelet -----------------------
#
# The cluster has one real node, and a group spans nodes. These four are Node objects of a simulated
# trn2u UltraServer, as simcluster makes them (the identity neuron_sim writes and neuron_driver reads,
# AWS's labels, the NeuronNode report the device plugin would publish), registered in this cluster so
# the chart's neuron-scheduler and extender place onto them as onto any node. STAND-IN, plainly: no
# kubelet runs there, so a pod bound to one never runs; what is checked is where the scheduler binds.
# The test keeps their node leases renewed (the controller manager would mark them NotReady), and a
# taint of its own keeps the chart's DaemonSets off them.

US_SERVER = "00c0ffee0badf00d"
US_TAINT = {"key": "neuron-e2e/no-kubelet", "value": "true", "effect": "NoSchedule"}


def ultraserver_specs() -> list[NodeSpec]:
    lnc = get_instance_type(ULTRASERVER_TYPE).family.default_lnc
    return [
        NodeSpec(f"neuron-e2e-us-{i}", ULTRASERVER_TYPE, lnc, UltraServerSeat(US_SERVER, i))
        for i in range(ULTRASERVER_NODES)
    ]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _lease(name: str) -> str:
    return json.dumps({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                 "renewTime": _now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    })  # fmt: skip


def _remove_ultraserver_nodes(names: list[str]) -> None:
    """Pods bound there cannot end on their own (no kubelet confirms it): deleted at once, then the rest."""
    pods = read("pods", namespace=WORKLOADS)["items"]
    stuck = [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("us-")]
    if stuck:
        kubectl("delete", "pod", "-n", WORKLOADS, *stuck, "--grace-period=0", "--force", "--ignore-not-found",
                check=False)  # fmt: skip
    kubectl("delete", "node", *names, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    kubectl("delete", "lease", "-n", "kube-node-lease", *names, "--ignore-not-found", check=False)
    kubectl("delete", "neuronnodes", *names, "--ignore-not-found", check=False)


@pytest.fixture
def ultraserver_nodes() -> Iterator[list[NodeSpec]]:
    specs = ultraserver_specs()
    names = [s.name for s in specs]
    _remove_ultraserver_nodes(names)  # a run stopped half-way left them
    nodes = []
    for spec in specs:
        obj = spec.node_object()
        obj["spec"] = {"taints": [US_TAINT]}
        for condition in obj["status"]["conditions"]:
            condition["lastHeartbeatTime"] = condition["lastTransitionTime"] = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        nodes.append(obj)
    stop = threading.Event()

    def renew_leases() -> None:
        while not stop.wait(10):
            for name in names:
                kubectl("apply", "-f", "-", stdin=_lease(name), check=False)

    heartbeats = threading.Thread(target=renew_leases, daemon=True)
    try:
        kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        for spec in specs:
            kubectl("apply", "-f", "-", stdin=_lease(spec.name))
            sim_node = SimNode(spec, spec.topology, whole_node(spec.topology))
            kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                    stdin=json.dumps(sim_node.report(_now())))  # fmt: skip
        heartbeats.start()
        yield specs
    finally:
        stop.set()
        _remove_ultraserver_nodes(names)


def group_pods(prefix: str, index: int) -> list[dict[str, Any]]:
    """A LeaderWorkerSet group of four pods of a whole trn2u node each (16 devices), sharing the
    UltraServer's 4-node server id as LeaderWorkerSet's exclusive topology; as its webhook labels them."""
    group = GroupSpec(index, ULTRASERVER_NODES, ULTRASERVER_NODES)
    pods = []
    for i in range(group.size):
        pod = PodSpec(f"{prefix}-{i}", 16, 0, group).pod_object(SCHEDULER)
        pod["metadata"]["namespace"] = WORKLOADS
        pod["spec"]["tolerations"] = [{"key": US_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
        pods.append(pod)
    return pods


def bound_nodes(names: list[str]) -> dict[str, str]:
    return {n: pod(n)["spec"].get("nodeName", "") for n in names}


def test_a_four_pod_group_lands_whole_on_one_ultraserver_or_waits_whole_with_the_reason(
    ultraserver_nodes: list[NodeSpec],
) -> None:
    """Issue 26 on the real cluster: neuron-scheduler binds a 4-pod group to the four nodes of one
    UltraServer, one pod a node; a second such group finds no UltraServer with room and waits with
    none of its pods bound, saying why."""
    names = {s.name for s in ultraserver_nodes}
    assert all(s.reading is not None and s.domain(ULTRASERVER_NODES) == US_SERVER for s in ultraserver_nodes)
    first = group_pods("us-a", 1)
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": first}))
    first_names = [p["metadata"]["name"] for p in first]
    eventually(lambda: all(bound_nodes(first_names).values()), "the first group bound", timeout=120)
    assert sorted(bound_nodes(first_names).values()) == sorted(names), "one pod on each node of the UltraServer"

    second = group_pods("us-b", 2)
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": second}))
    second_names = [p["metadata"]["name"] for p in second]
    reason = "must share one UltraServer group of 4 nodes"
    eventually(
        lambda: all(reason in unschedulable_reason(n) for n in second_names),
        "the second group waiting with the extender's reason",
        timeout=120,
    )
    assert "waiting, with none of its pods placed" in unschedulable_reason(second_names[0])
    assert set(bound_nodes(second_names).values()) == {""}, "no pod of a group that does not fit is bound"
    assert sorted(bound_nodes(first_names).values()) == sorted(names)
