"""The device plugin's NeuronNode report on the real single-node cluster (make cluster-up): the
chart's CRD, RBAC and admission policy applied to the real API server, the plugin (a host process,
as in test_cluster.py) writing its node's report against the real kubelet, and the admission policy
judging tokens the real API server issues.

- the report's free devices and cores are the node's allocatable minus what running pods request,
  through each resource, and follow pods, a vanished device and the heartbeat;
- with a token bound to a pod on this node, the plugin's ServiceAccount may write this node's
  NeuronNode and no other; with a token bound to no pod (no node claim), none.

Runs only with `-m cluster` (make cluster-test / make test), after cluster-up. Leaves nothing behind:
the CRD (and so every NeuronNode), the policy, the RBAC, the namespace and the pods are deleted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml_streams
from cluster_access import (
    BIN,
    KUBECONFIG,
    NODE,
    REPO,
    SIM_ROOT,
    eventually,
    host_device_plugin,
    kubectl,
    node,
    pod_phase,
    read,
)

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-report-test"
NAMESPACE = "neuron-report-test"
PLUGIN_SA = f"{RELEASE}-neuron-helm-chart-device-plugin"
CRD = "neuronnodes.neuron.aws.com"
OTHER_NODE = "some-other-node"
PAUSE = "registry.k8s.io/pause:3.10"
PORT = 19842
RESOURCES = ("aws.amazon.com/neuron", "aws.amazon.com/neuroncore")


def chart_objects() -> list[dict[str, Any]]:
    """What the chart installs for the report, and nothing of the scheduler itself: the CRD, and the
    device plugin's ServiceAccount, ClusterRole and binding, admission policy and its binding."""
    out = subprocess.run(
        [str(BIN / "helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "scheduler.enabled=true",
         "--set", "objectNames=release"],  # PLUGIN_SA: the release-scoped name, in NAMESPACE
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml_streams.load_all(out) if d]
    component = "app.kubernetes.io/component"
    return [
        d
        for d in docs
        if d["kind"] == "CustomResourceDefinition"
        or (d["metadata"]["labels"].get(component) == "device-plugin" and d["kind"] != "DaemonSet")
    ]


@pytest.fixture(scope="module")
def report_api() -> Iterator[None]:
    objects = yaml_streams.dump_all(chart_objects())
    kubectl("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n")
    kubectl("apply", "--server-side", "-f", "-", stdin=objects)
    kubectl("wait", "--for", "condition=established", "--timeout=60s", f"crd/{CRD}")
    try:
        yield
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", stdin=objects, check=False)
        kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def neuronnode(name: str = NODE) -> dict[str, Any] | None:
    # kubectl hides managedFields unless asked; a test reads who wrote the report
    out = kubectl("get", "neuronnode", name, "-o", "json", "--ignore-not-found", "--show-managed-fields")
    return json.loads(out) if out.strip() else None


def status() -> dict[str, Any]:
    found = neuronnode()
    assert found is not None, f"no NeuronNode {NODE}"
    return found["status"]  # type: ignore[no-any-return]


def requested_on_node() -> dict[str, int]:
    """What the node's pods that are not finished ask for, per Neuron resource (limits: extended
    resources have no overcommit, requests equal limits)."""
    pods = read("pods", namespace=None, field_selector=f"spec.nodeName={NODE}")
    totals = dict.fromkeys(RESOURCES, 0)
    for pod in pods["items"]:
        if pod["status"].get("phase") in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            continue
        for c in pod["spec"]["containers"]:
            for resource in RESOURCES:
                totals[resource] += int(c.get("resources", {}).get("limits", {}).get(resource, 0))
    return totals


def report_matches_the_node() -> bool:
    """Free devices and cores are what the node's allocatable leaves once running pods' requests,
    through each resource, are taken (the kubelet lists silicon held through the other resource
    Unhealthy, so allocatable already lacks it)."""
    allocatable = node()["status"]["allocatable"]
    requested = requested_on_node()
    s = status()
    free = {RESOURCES[0]: len(s["freeDevices"]), RESOURCES[1]: len(s["freeCores"])}
    expected = {r: int(allocatable.get(r, "0")) - requested[r] for r in RESOURCES}
    return free == expected


def pod_manifest(name: str, limits: dict[str, int]) -> str:
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": PAUSE, "imagePullPolicy": "Never", "resources": {"limits": limits}}],
        },
    })  # fmt: skip


@pytest.fixture(scope="module")
def reporting_plugin(report_api: None) -> Iterator[subprocess.Popen[bytes]]:
    flags = ("--node-report", "--node-name", NODE, "--kubeconfig", str(KUBECONFIG), "--node-report-interval", "2s")
    with host_device_plugin(
        "device-plugin-report-test", PORT, *flags, leftover_pods=("report-devices", "report-cores")
    ) as proc:
        yield proc


# --- (a) the plugin's report against the real kubelet and API server ---------------------------


def test_the_plugin_creates_its_nodes_report_matching_allocatable(reporting_plugin: subprocess.Popen[bytes]) -> None:
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    eventually(lambda: neuronnode() is not None, f"NeuronNode {NODE} created", 60)
    eventually(report_matches_the_node, "free devices and cores = allocatable - requested", 60)
    s = status()
    assert (s["instanceType"], s["devices"], s["cores"], s["health"]) == ("trn1.32xlarge", "16/16", "32/32", "Healthy")
    assert s["topology"]["kind"] == "torus2d"
    assert s["topology"]["torusShape"] == [4, 4]
    assert (s["coresPerDevice"], s["unhealthyDevices"], s["pods"]) == (2, [], [])
    # the heartbeat moves on without a change (--node-report-interval 2s)
    first = s["heartbeatTime"]
    assert dt.datetime.strptime(first, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC) >= started - dt.timedelta(seconds=5)
    eventually(lambda: status()["heartbeatTime"] > first, "a newer heartbeat", 30)
    # written by the plugin's field manager, and by no one else
    managers = {m["manager"] for m in neuronnode()["metadata"]["managedFields"]}  # type: ignore[index]
    assert managers == {"neuron-device-plugin"}
    printed = kubectl("get", "neuronnodes", NODE)
    header = ["NAME", "INSTANCE", "DEVICES", "CORES", "HEALTH", "ULTRASERVER", "HEARTBEAT"]
    assert printed.split()[:7] == header, printed  # ULTRASERVER empty: a trn1 is in no UltraServer
    assert "trn1.32xlarge" in printed
    assert "16/16" in printed


def test_the_report_follows_a_pod_taking_devices_and_one_taking_cores(
    reporting_plugin: subprocess.Popen[bytes],
) -> None:
    kubectl("apply", "-f", "-", stdin=pod_manifest("report-devices", {"aws.amazon.com/neuron": 4}))
    eventually(lambda: pod_phase("report-devices") == "Running", "device pod running", 120)
    eventually(lambda: status()["pods"] == ["default/report-devices"], "the pod listed in the report", 60)
    eventually(report_matches_the_node, "12 devices and 24 cores free", 60)
    s = status()
    assert (s["devices"], s["cores"]) == ("12/16", "24/32")
    held = sorted(set(range(16)) - set(s["freeDevices"]))
    assert held in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]), "an aligned torus row"

    kubectl("apply", "-f", "-", stdin=pod_manifest("report-cores", {"aws.amazon.com/neuroncore": 2}))
    eventually(lambda: pod_phase("report-cores") == "Running", "core pod running", 120)
    eventually(lambda: "default/report-cores" in status()["pods"], "the core pod listed", 60)
    eventually(report_matches_the_node, "a device fewer and two cores fewer", 60)
    assert (status()["devices"], status()["cores"]) == ("11/16", "22/32")

    kubectl("delete", "pod", "report-devices", "report-cores", "--wait=true")
    eventually(lambda: status()["pods"] == [], "no pod listed", 60)
    eventually(lambda: (status()["devices"], status()["cores"]) == ("16/16", "32/32"), "everything free again", 60)
    # the node's allocatable follows the plugin's lists with the kubelet's status cadence
    eventually(report_matches_the_node, "the report and allocatable agree again", 60)


def test_a_vanished_device_is_unhealthy_in_the_report(reporting_plugin: subprocess.Popen[bytes]) -> None:
    from neuron_sim import node as sim

    sim.vanish(SIM_ROOT, 15)
    try:
        eventually(lambda: status()["unhealthyDevices"] == [15], "neuron15 unhealthy in the report", 60)
        assert (status()["health"], status()["devices"], status()["cores"]) == ("15/16 healthy", "15/16", "30/32")
        eventually(report_matches_the_node, "the report and allocatable agree", 60)
    finally:
        sim.restore(SIM_ROOT, 15)
    eventually(lambda: status()["health"] == "Healthy", "neuron15 back", 90)


# --- (b) the admission policy: a plugin writes only its own node's report -------------------------


def token_kubeconfig(token: str, path: Path) -> Path:
    """The test cluster's API server and CA, with `token` as the only credential."""
    admin = json.loads(kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json"))
    path.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "plugin", "user": {"token": token}}],
        "contexts": [{"name": "plugin", "context": {"cluster": "test", "user": "plugin"}}],
        "current-context": "plugin",
    }))  # fmt: skip
    return path


def report_of(name: str) -> dict[str, Any]:
    from neuron_model.instance_types import INSTANCE_TYPES
    from neuron_model.report import NodeReport

    it = INSTANCE_TYPES["trn1.32xlarge"]
    return NodeReport(
        name, it.name, it.topology, it.devices, it.torus_shape, it.adjacency(), 2, 1,
        frozenset(range(32)), frozenset(), frozenset(), dt.datetime.now(dt.UTC),
    ).to_object()  # fmt: skip


def write_as(kubeconfig: Path, name: str) -> str:
    """The plugin's own writer (a forced server-side apply) with these credentials: "" or the refusal."""
    from neuron_common.kube import Api
    from neuron_device_plugin.node_report import ReportWriteError, ServerSideApply

    async def write() -> str:
        api = Api.from_kubeconfig(str(kubeconfig), 10.0)
        try:
            await ServerSideApply(api)(report_of(name))
        except ReportWriteError as exc:
            return str(exc)
        finally:
            await api.close()
        return ""

    return asyncio.run(write())


@pytest.fixture(scope="module")
def plugin_pod(report_api: None) -> Iterator[str]:
    """A pod of the plugin's ServiceAccount on this node, for tokens bound to it."""
    name = "report-token-holder"
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": PLUGIN_SA,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": PAUSE, "imagePullPolicy": "Never"}],
        },
    }))  # fmt: skip
    try:
        eventually(lambda: pod_phase(name, NAMESPACE) == "Running", "token holder running", 120)
        yield name
    finally:
        kubectl("delete", "pod", "-n", NAMESPACE, name, "--ignore-not-found", "--wait=false", check=False)


def policy_refuses_other_nodes(kubeconfig: Path) -> bool:
    """The policy takes a moment to reach the admission plugin: a write it let through is undone."""
    refusal = write_as(kubeconfig, OTHER_NODE)
    if not refusal:
        kubectl("delete", "neuronnode", OTHER_NODE, "--ignore-not-found")
    return "HTTP 403" in refusal


def test_a_pod_bound_token_writes_its_own_nodes_report_and_no_other(plugin_pod: str, tmp_path: Path) -> None:
    token = kubectl(
        "create", "token", PLUGIN_SA, "-n", NAMESPACE, "--bound-object-kind", "Pod", "--bound-object-name", plugin_pod,
        "--duration", "10m",
    ).strip()  # fmt: skip
    kubeconfig = token_kubeconfig(token, tmp_path / "plugin.kubeconfig")
    whoami = json.loads(kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"))
    user = whoami["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{PLUGIN_SA}"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [NODE], "the token names the pod's node"
    try:
        eventually(lambda: policy_refuses_other_nodes(kubeconfig), "the policy refusing another node's report", 60)
        refusal = write_as(kubeconfig, OTHER_NODE)
        assert f"may write only NeuronNode {NODE}, not {OTHER_NODE}" in refusal, refusal
        assert neuronnode(OTHER_NODE) is None
        assert write_as(kubeconfig, NODE) == "", "its own node's report is allowed"
        assert neuronnode(NODE) is not None
        # the policy concerns the plugin's ServiceAccount alone: an administrator may still write any
        kubectl(
            "apply", "--server-side", "--field-manager", "admin", "-f", "-", stdin=json.dumps(report_of(OTHER_NODE))
        )
        assert neuronnode(OTHER_NODE) is not None
    finally:
        kubectl("delete", "neuronnode", OTHER_NODE, "--ignore-not-found", check=False)


def test_a_token_that_names_no_node_writes_no_report(plugin_pod: str, tmp_path: Path) -> None:
    token = kubectl("create", "token", PLUGIN_SA, "-n", NAMESPACE, "--duration", "10m").strip()
    kubeconfig = token_kubeconfig(token, tmp_path / "unbound.kubeconfig")
    whoami = json.loads(kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"))
    assert "authentication.kubernetes.io/node-name" not in whoami["status"]["userInfo"].get("extra", {})
    eventually(lambda: "HTTP 403" in write_as(kubeconfig, NODE), "an unbound token refused", 60)
    assert "only with a token bound to its pod, which names its node" in write_as(kubeconfig, NODE)


def test_the_plugins_service_account_may_not_delete_reports(plugin_pod: str, tmp_path: Path) -> None:
    token = kubectl(
        "create", "token", PLUGIN_SA, "-n", NAMESPACE, "--bound-object-kind", "Pod", "--bound-object-name", plugin_pod,
        "--duration", "10m",
    ).strip()  # fmt: skip
    kubeconfig = token_kubeconfig(token, tmp_path / "plugin.kubeconfig")
    assert write_as(kubeconfig, NODE) == "", "its own node's report is allowed"
    result = subprocess.run(
        [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "delete", "neuronnode", NODE],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower()
    assert neuronnode(NODE) is not None
