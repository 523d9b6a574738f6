"""On the real single-node cluster (make cluster-up): what Dynamic Resource Allocation needs of the
cluster itself. The runtime is the pinned containerd 2.x and applies CDI; the API server serves
resource.k8s.io/v1; the scheduler allocates a ResourceClaim from a ResourceSlice and the kubelet
hands the claim to its DRA manager.

Runs only with `-m cluster` (make cluster-test / make test), after cluster-up and `make images`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_access import (
    CTR,
    NODE,
    REPO,
    SHOW_DEVICES,
    SIM_ROOT,
    WORKLOAD_PYTHON,
    eventually,
    host_device_plugin,
    kubectl,
    node,
    pod_phase,
    read,
)

from neuron_device_plugin.cdi import cdi_kind
from neuron_driver import layout

pytestmark = pytest.mark.cluster

PAUSE = "registry.k8s.io/pause:3.10"
CHART_VERSION = yaml.safe_load((REPO / "charts/neuron-helm-chart/Chart.yaml").read_text())["appVersion"]
WORKLOAD_IMAGE = f"localhost/neuron-helm-chart/device-plugin:{CHART_VERSION}"
CDI_SPEC_DIR = Path(layout.CDI_SPEC_DIR)  # one of the runtime's cdi_spec_dirs (up.sh)
# Not the Neuron driver's name: this suite publishes a slice of its own and must not meet a real driver's.
TEST_DRIVER = "runtime-test.neuron-helm-chart.example"
RESOURCE = "aws.amazon.com"  # the plugin's default --resource-prefix


def containerd_pin() -> str:
    go_mod = (REPO / "tests/cluster/containerd/go.mod").read_text()
    match = re.search(r"^require github\.com/containerd/containerd/v2 v(\S+)$", go_mod, re.MULTILINE)
    assert match, "no containerd pin in tests/cluster/containerd/go.mod"
    return match.group(1)


def test_the_node_runs_the_pinned_containerd() -> None:
    assert node()["status"]["nodeInfo"]["containerRuntimeVersion"] == f"containerd://{containerd_pin()}"


def test_the_api_server_serves_resource_k8s_io_v1() -> None:
    group = json.loads(kubectl("get", "--raw", "/apis/resource.k8s.io"))
    assert group["preferredVersion"]["version"] == "v1"
    listed = set(kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name").split())
    assert {
        "deviceclasses.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io",
        "resourceslices.resource.k8s.io",
    } <= listed


# --- the scheduler allocates a claim; the kubelet takes it to its DRA manager ----------------------


def dra_objects() -> list[dict[str, Any]]:
    """A DeviceClass for TEST_DRIVER, a slice of two devices on the node, a claim for the one with
    index 1, and a pod using the claim."""
    devices = [{"name": f"testdevice{i}", "attributes": {"index": {"int": i}}} for i in (0, 1)]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": TEST_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{TEST_DRIVER}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "runtime-test-slice"},
            "spec": {
                "driver": TEST_DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "runtime-test-claim", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "one",
                            "exactly": {
                                "deviceClassName": TEST_DRIVER,
                                "selectors": [
                                    {"cel": {"expression": f'device.attributes["{TEST_DRIVER}"].index == 1'}}
                                ],
                            },
                        }
                    ]
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "runtime-test-claimant", "namespace": "default"},
            "spec": {
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "device", "resourceClaimName": "runtime-test-claim"}],
                "containers": [
                    {
                        "name": "main",
                        "image": PAUSE,
                        "imagePullPolicy": "Never",
                        "resources": {"claims": [{"name": "device"}]},
                    }
                ],
            },
        },
    ]


@pytest.fixture
def claimant() -> Iterator[None]:
    objects = dra_objects()
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    try:
        yield
    finally:
        # No driver ever prepared the claim, so the pod has nothing to wait for on the node.
        kubectl("delete", "pod", "runtime-test-claimant", "--force", "--grace-period=0", "--ignore-not-found")
        for obj in reversed(objects[:-1]):
            namespace = ["-n", obj["metadata"]["namespace"]] if "namespace" in obj["metadata"] else []
            kind = obj["kind"].lower() + ".resource.k8s.io"
            kubectl("delete", kind, obj["metadata"]["name"], *namespace, "--ignore-not-found", "--wait=false")


def test_the_scheduler_allocates_a_claim_and_the_kubelet_asks_its_driver(claimant: None) -> None:
    def claim() -> dict[str, Any]:
        return read("resourceclaim", "runtime-test-claim")

    eventually(lambda: claim()["status"]["allocation"], "claim allocated", 120)
    status = claim()["status"]
    [result] = status["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (TEST_DRIVER, NODE, "testdevice1")
    assert [r["name"] for r in status["reservedFor"]] == ["runtime-test-claimant"]
    assert kubectl("get", "pod", "runtime-test-claimant", "-o", "jsonpath={.spec.nodeName}") == NODE

    # No plugin is registered for TEST_DRIVER: the kubelet's DRA manager says so, which it does only
    # once it took the claim from the pod to prepare it.
    def kubelet_asked_the_driver() -> bool:
        events = kubectl("get", "events", "--field-selector", "involvedObject.name=runtime-test-claimant", "-o", "json")
        return any(
            e["reason"] == "FailedPrepareDynamicResources" and TEST_DRIVER in e["message"]
            for e in json.loads(events)["items"]
        )

    eventually(kubelet_asked_the_driver, "the kubelet's FailedPrepareDynamicResources event naming the driver", 120)


# --- CDI: the device plugin's CDI path, applied by the runtime ----------------------------------------


def neuron_cdi_specs() -> list[Path]:
    return [p for p in CDI_SPEC_DIR.glob("*.json") if json.loads(p.read_text()).get("kind") == cdi_kind(RESOURCE)]


@pytest.fixture
def cdi_plugin() -> Iterator[dict[str, Any]]:
    """The device plugin answering Allocate with CDI device names only (no DeviceSpec); yields the
    spec it wrote in the runtime's CDI directory, and removes it afterwards (the plugin leaves it)."""
    assert not neuron_cdi_specs(), f"a CDI spec for {cdi_kind(RESOURCE)} is already in {CDI_SPEC_DIR}"
    try:
        with host_device_plugin(
            "device-plugin-cdi-test", 19843, "--cdi", "--cdi-spec-dir", str(CDI_SPEC_DIR), leftover_pods=("cdi",)
        ):
            [spec_path] = neuron_cdi_specs()
            yield json.loads(spec_path.read_text())  # type: ignore[no-any-return]
    finally:
        for spec_path in neuron_cdi_specs():
            spec_path.unlink()


def test_the_device_plugins_cdi_devices_reach_the_container(cdi_plugin: dict[str, Any]) -> None:
    spec = cdi_plugin
    assert len(spec["devices"]) == 16
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cdi", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [WORKLOAD_PYTHON, "-c", SHOW_DEVICES],
                    "resources": {"limits": {"aws.amazon.com/neuron": 2}},
                }
            ],
        },
    }
    kubectl("delete", "pod", "cdi", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    eventually(lambda: pod_phase("cdi") == "Running", "the CDI pod running", 180)
    eventually(lambda: "cores=" in kubectl("logs", "cdi"), "the pod's device listing")
    seen = [line.removeprefix("device=") for line in kubectl("logs", "cdi").splitlines() if line.startswith("device=")]

    # The container sees two Neuron device nodes, which only CDI could have given it: the plugin
    # sent no DeviceSpec. They are the simulated node's character devices (major and minor as on the host).
    assert len(seen) == 2
    cid = kubectl("get", "pod", "cdi", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
    info = subprocess.run(
        [*CTR, "containers", "info", cid.removeprefix("containerd://")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    oci = json.loads(info.stdout)["Spec"]
    devices = {d["path"]: d for d in oci["linux"]["devices"]}
    assert sorted(devices) == seen
    host_paths = {n["path"]: n["hostPath"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
    for path, device in devices.items():
        assert host_paths[path].startswith(f"{SIM_ROOT}/")
        rdev = os.stat(host_paths[path]).st_rdev
        assert (device["type"], device["major"], device["minor"]) == ("c", os.major(rdev), os.minor(rdev))
    # and the device cgroup lets the container open them
    allowed = {(r.get("major"), r.get("minor")) for r in oci["linux"]["resources"]["devices"] if r["allow"]}
    assert {(d["major"], d["minor"]) for d in devices.values()} <= allowed
    kubectl("delete", "pod", "cdi", "--wait=true")
