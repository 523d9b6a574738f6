"""The real kube-scheduler allocating from the driver's ResourceSlices, with the chart's
DeviceClasses: what the claims in docs/dra.md get. A private control plane, no kubelet: a
pod is bound and its claim allocated, nothing runs."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from dra_harness import Harness, eventually
from simcluster.controlplane import ControlPlane
from simcluster.dra import chart_device_classes
from simcluster.schedulers import start_scheduler

from neuron_common.kube import Api
from neuron_model import resources
from neuron_sim import node as sim

pytestmark = pytest.mark.integration  # starts external processes: make integration

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "default"
GROUP4 = "resource.aws.com/devicegroup4_id"


def ready_for_claims(cp: ControlPlane) -> None:
    """The chart's DeviceClasses in `cp`, and the namespace's default ServiceAccount, which pods need
    (no controller manager here makes it)."""
    kubectl = [str(REPO / ".venv/bin/kubectl"), f"--kubeconfig={cp.kubeconfig}"]
    subprocess.run(
        [*kubectl, "-n", NAMESPACE, "create", "serviceaccount", "default"], capture_output=True, text=True, check=False
    )
    for device_class in chart_device_classes():
        subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=json.dumps(device_class), capture_output=True, text=True, check=True
        )


@pytest.fixture(scope="module")
def scheduler(apiserver: ControlPlane) -> str:
    """kube-scheduler against the shared API server, and the chart's DeviceClasses in it."""
    start_scheduler(apiserver, "default-scheduler")
    ready_for_claims(apiserver)
    return "default-scheduler"


async def create_node(api: Api, name: str) -> None:
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    await api.create(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": resources, "allocatable": resources, "conditions": [ready]},
        },
    )


async def claim_and_pod(
    api: Api,
    node: str,
    device_class: str,
    count: int,
    match: str | None = None,
    selector: str | None = None,
    cores: int | None = None,
) -> tuple[str, str]:
    """A claim pinned to the test's node and a pod using it; their names. `cores`: each device's share
    asked as capacity (cores as consumable capacity)."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if cores is not None:
        exactly["capacity"] = {"requests": {"cores": str(cores)}}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [{"name": "r", "exactly": exactly}]}
    if match:
        devices["constraints"] = [{"requests": ["r"], "matchAttribute": match}]
    await api.create(
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
        {"metadata": {"name": name}, "spec": {"devices": devices}},
    )
    await api.create(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                # several nodes share the API server: this test's node only
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "r", "resourceClaimName": name}],
                "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "r"}]}}],
            },
        },
    )
    return name, name


async def allocation(api: Api, claim: str) -> list[str] | None:
    obj = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{claim}")
    result = (obj.get("status") or {}).get("allocation")
    return sorted(r["device"] for r in result["devices"]["results"]) if result else None


async def unschedulable(api: Api, pod: str) -> str:
    obj = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    for condition in (obj.get("status") or {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


def index(name: str) -> int:
    return int(name.removeprefix("neurondevice").removeprefix("neuroncore"))


async def started(start_driver, instance_type: str, devices: int, cores: int, arcs: int = 0) -> Harness:  # type: ignore[no-untyped-def]
    node = f"sched-{uuid.uuid4().hex[:8]}"
    h: Harness = await start_driver(instance_type, node=node)
    await create_node(h.api, node)
    await eventually(lambda: _published(h, devices + cores + arcs))
    return h


async def _published(h: Harness, count: int) -> bool:
    return len(await h.device_names()) == count


async def test_four_connected_devices_are_a_torus_row(start_driver, scheduler) -> None:  # type: ignore[no-untyped-def]
    h = await started(start_driver, "trn1.32xlarge", 16, 32)
    rows = []
    for _ in range(4):
        claim, _pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", 4, GROUP4)
        await eventually(lambda claim=claim: allocation(h.api, claim), timeout=60)
        devices = [index(d) for d in await allocation(h.api, claim) or []]
        assert len(devices) == 4
        assert len({d // 4 for d in devices}) == 1, f"{devices} is not one row"
        rows.append(devices[0] // 4)
    assert sorted(rows) == [0, 1, 2, 3]
    # the node is full: a fifth row stays Pending with the scheduler's reason
    claim, pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", 4, GROUP4)
    await eventually(lambda: unschedulable(h.api, pod), timeout=60)
    assert "claim" in await unschedulable(h.api, pod)
    assert await allocation(h.api, claim) is None


async def test_a_device_and_its_cores_are_never_both_allocated(start_driver, scheduler) -> None:  # type: ignore[no-untyped-def]
    h = await started(start_driver, "inf2.24xlarge", 6, 12, 6 * 4 + 1)  # 2 cores a device
    claim, _ = await claim_and_pod(h.api, h.node, "neuroncore.aws.com", 11)
    await eventually(lambda: allocation(h.api, claim), timeout=60)
    cores = [index(c) for c in await allocation(h.api, claim) or []]
    assert len(cores) == 11
    # one core is left, so no whole device is: the device claim stays Pending, one core fits
    device_claim, device_pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", 1)
    await eventually(lambda: unschedulable(h.api, device_pod), timeout=60)
    assert await allocation(h.api, device_claim) is None
    core_claim, _ = await claim_and_pod(h.api, h.node, "neuroncore.aws.com", 1)
    await eventually(lambda: allocation(h.api, core_claim), timeout=60)
    (last,) = [index(c) for c in await allocation(h.api, core_claim) or []]
    assert sorted([*cores, last]) == list(range(12))


async def test_three_cores_on_a_ring_tile_are_on_two_neighbours(start_driver, scheduler) -> None:  # type: ignore[no-untyped-def]
    h = await started(start_driver, "inf2.48xlarge", 12, 24, 12 * 10 + 1)
    claim, _ = await claim_and_pod(h.api, h.node, "neuroncore.aws.com", 3, "resource.aws.com/devicegroup2_id")
    await eventually(lambda: allocation(h.api, claim), timeout=60)
    cores = [index(c) for c in await allocation(h.api, claim) or []]
    devices = sorted({c // 2 for c in cores})
    assert len(cores) == 3
    assert len(devices) == 2
    assert devices[1] - devices[0] == 1
    assert devices[0] % 2 == 0  # one tile of the ring's size-2 groups


async def test_any_arc_of_the_ring_is_one_group_device(start_driver, scheduler) -> None:  # type: ignore[no-untyped-def]
    """An arc across the size-4 tiles (devices 2-5 of inf2.24xlarge's ring of 6) is reachable as
    one device of class neurongroup.aws.com, and never handed out with a member or its cores."""
    h = await started(start_driver, "inf2.24xlarge", 6, 12, 6 * 4 + 1)
    # devices 0 and 1 taken: only arcs of 4 within 2..5 are free, and 2-5 crosses the tiles 0-3 / 4-7
    taken, _ = await claim_and_pod(h.api, h.node, "neuron.aws.com", 2, "resource.aws.com/devicegroup2_id")
    await eventually(lambda: allocation(h.api, taken), timeout=60)
    held = [index(d) for d in await allocation(h.api, taken) or []]
    assert sorted(held) in ([0, 1], [2, 3], [4, 5])
    four = 'device.attributes["neuron.aws.com"].deviceCount == 4'
    arc, _ = await claim_and_pod(h.api, h.node, "neurongroup.aws.com", 1, selector=four)
    await eventually(lambda: allocation(h.api, arc), timeout=60)
    (name,) = await allocation(h.api, arc) or []
    size, first = resources.parse_dra_group(name) or (0, 0)
    members = set(resources.ring_arc(first, size, 6))
    assert size == 4
    assert not members & set(held), f"{name} overlaps the devices held {held}"
    # the arc consumed its members' counters: no device or core of it can go to anyone else
    rest, rest_pod = await claim_and_pod(h.api, h.node, "neuroncore.aws.com", 1)
    await eventually(lambda: unschedulable(h.api, rest_pod), timeout=60)
    assert await allocation(h.api, rest) is None


async def test_a_trainium3_switch_gives_any_count_even_to_claims_written_for_the_torus(start_driver, scheduler) -> None:  # type: ignore[no-untyped-def]
    """trn3.48xlarge: every set of devices is connected. kube-scheduler allocates 3, 5 and 8 devices
    under `matchAttribute: devicegroup4_id` (a torus claim's constraint, which on a switch every device
    satisfies) until all 16 are taken, disjoint; then a claim for one more waits."""
    h = await started(start_driver, "trn3.48xlarge", 16, 64, arcs=1)  # + the whole-node device
    taken: set[int] = set()
    for count in (3, 5, 8):
        claim, _pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", count, GROUP4)
        await eventually(lambda claim=claim: allocation(h.api, claim), timeout=60)
        devices = {index(d) for d in await allocation(h.api, claim) or []}
        assert len(devices) == count
        assert not devices & taken
        taken |= devices
    assert taken == set(range(16))
    claim, pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", 1)
    await eventually(lambda: unschedulable(h.api, pod), timeout=60)
    assert await allocation(h.api, claim) is None


# The selector docs/driver-versions.md gives a claim for work that spans nodes: no device whose
# firmware lists a failing link (the driver's multiNodeUnfit attribute).
FIT_FOR_MULTI_NODE = '!("multiNodeUnfit" in device.attributes["neuron.aws.com"])'


async def _unfit_devices(h: Harness) -> set[int]:
    return {
        index(d["name"])
        for s in await h.slices()
        for d in s["spec"].get("devices") or []
        if d["name"].startswith("neurondevice") and "multiNodeUnfit" in d.get("attributes", {})
    }


async def test_a_claim_for_multi_node_work_selects_against_a_failing_link(start_driver, scheduler, short_tmp) -> None:  # type: ignore[no-untyped-def]
    """Issue 57: a device whose firmware lists link_efa (driver 2.30.2) stays allocatable for work on its
    node, and kube-scheduler keeps it out of a claim that selects against multiNodeUnfit."""
    root = short_tmp / "trn2-link"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    sim.set_unhealthy_components(root, 6, ["link_efa"])
    node = f"sched-{uuid.uuid4().hex[:8]}"
    h: Harness = await start_driver("trn2.48xlarge", node=node, root=root)
    await create_node(h.api, node)
    await eventually(lambda: _unfit_devices(h), timeout=30)
    assert await _unfit_devices(h) == {6}
    group, _ = await claim_and_pod(h.api, h.node, "neuron.aws.com", 15, selector=FIT_FOR_MULTI_NODE)
    await eventually(lambda: allocation(h.api, group), timeout=60)
    assert sorted(index(d) for d in await allocation(h.api, group) or []) == [d for d in range(16) if d != 6]
    # every fit device is taken: one more such claim waits, while a claim for work on this node gets device 6
    waiting, waiting_pod = await claim_and_pod(h.api, h.node, "neuron.aws.com", 1, selector=FIT_FOR_MULTI_NODE)
    local, _ = await claim_and_pod(h.api, h.node, "neuron.aws.com", 1)
    await eventually(lambda: allocation(h.api, local), timeout=60)
    assert [index(d) for d in await allocation(h.api, local) or []] == [6]
    await eventually(lambda: unschedulable(h.api, waiting_pod), timeout=60)
    assert await allocation(h.api, waiting) is None


async def test_cores_as_capacity_share_a_device_by_capacity_and_each_share_gets_its_own_cores(
    start_driver, scheduler
) -> None:  # type: ignore[no-untyped-def]
    """`--cores-as-capacity` on 1.36 (DRAConsumableCapacity on): the real scheduler hands out shares of one
    device, never more cores than it has and never beside a whole-device claim, and the driver gives each
    share its own cores at prepare."""
    node = f"sched-{uuid.uuid4().hex[:8]}"
    h: Harness = await start_driver("trn2.3xlarge", "--cores-as-capacity", node=node)  # 1 device, 4 cores (LNC 2)
    await create_node(h.api, node)
    await eventually(lambda: _published(h, 1))
    (device,) = [d for s in await h.slices() for d in s["spec"].get("devices") or []]
    # the API server kept the shareable device as published (the gate is on in 1.36), so nothing to write again
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["cores"]["value"] == "4"
    assert not h.driver.publisher.shares_dropped
    assert await h.driver.publisher.sync() is False
    three, _ = await claim_and_pod(h.api, node, "neuron.aws.com", 1, cores=3)
    await eventually(lambda: allocation(h.api, three), timeout=60)
    one, _ = await claim_and_pod(h.api, node, "neuron.aws.com", 1, cores=1)
    await eventually(lambda: allocation(h.api, one), timeout=60)
    # the device's 4 cores are allocated: neither another core nor the whole device fits
    more, more_pod = await claim_and_pod(h.api, node, "neuron.aws.com", 1, cores=1)
    whole, whole_pod = await claim_and_pod(h.api, node, "neuron.aws.com", 1)
    for pod in (more_pod, whole_pod):
        await eventually(lambda pod=pod: unschedulable(h.api, pod), timeout=60)
    assert await allocation(h.api, more) is None
    assert await allocation(h.api, whole) is None
    visible = {}
    for name in (three, one):
        claim = await h.api.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "neurondevice0"
        assert result.get("shareID")
        uid = claim["metadata"]["uid"]
        answer = (await h.kubelet.prepare((uid, NAMESPACE, name))).claims[uid]
        assert answer.error == ""
        # the kubelet reports the share in PodResources, so two shares of a device stay apart there
        assert [d.share_id for d in answer.devices] == [result["shareID"]]
        spec = json.loads((h.cdi_dir / f"neuron.aws.com_claim-{uid}.json").read_text())
        (edits,) = [d["containerEdits"] for d in spec["devices"]]
        env = dict(e.split("=", 1) for e in edits["env"])
        visible[name] = [int(c) for c in env["NEURON_RT_VISIBLE_CORES"].split(",")]
    assert visible == {three: [0, 1, 2], one: [3]}
