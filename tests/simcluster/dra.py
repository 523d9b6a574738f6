"""The fleet on DRA: each simulated node publishes the ResourceSlices the real DRA driver builds for
its instance type (`neuron_dra_driver.slices.build` on a simulated node's scanned inventory), the
chart's DeviceClasses as `helm template` renders them, and what the scheduler allocated read back
from each pod's claim as device and core indices, judged by the node model's rules.

No kubelet or driver runs: the slices are what the driver would publish on an idle healthy node,
written once, and a pod's devices are what its claim's allocation says (the driver's prepare
hands out exactly those)."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml_streams
from neuron_dra_driver import slices

from neuron_driver.inventory import NodeInventory, scan
from neuron_model import resources
from neuron_model.allocator import Topology, choose_cores, choose_devices
from neuron_model.instance_types import get_instance_type
from neuron_model.placement import FreeState
from neuron_sim import node as sim
from simcluster.fleet import NAMESPACE, NodeSpec, PodSpec

REPO = Path(__file__).resolve().parents[2]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def _chart(*args: str) -> list[dict[str, Any]]:
    """`helm template` of the chart with the DRA driver on and `args`, its documents."""
    helm = REPO / ".venv" / "bin" / "helm"
    out = subprocess.run(
        [str(helm), "template", "x", str(REPO / "charts/neuron-helm-chart"),
         "--set", "devicePlugin.enabled=false,draDriver.enabled=true", *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml_streams.load_all(out) if d]


def chart_device_classes(cores_as_capacity: bool = False) -> list[dict[str, Any]]:
    """The DeviceClasses exactly as the chart renders them with the DRA driver on (the device plugin's
    resource names mapped, cores and ring arcs published; with `cores_as_capacity`, as it renders them
    for cores as a capacity of each device: the device class alone)."""
    shares = ["--set", "draDriver.publishCores=true,draDriver.coresAsCapacity=true"] if cores_as_capacity else []
    return _chart(
        "--set", "draDriver.publishCores=true", *shares, "--show-only", "templates/dra-driver/deviceclasses.yaml"
    )  # fmt: skip


OURS = "ours"
OURS_DEVICES = "ours, devices only"  # the driver with --no-publish-cores (the chart's default from 1.37)
OURS_SHARES = "ours, cores as capacity"  # the driver with --cores-as-capacity (the chart's default on 1.36)


def keeps_cores(version: str) -> bool:
    """Whether the API server of `version` keeps what cores need (shared counters, consumable capacity:
    on by default from 1.36)."""
    major, minor = (int(x) for x in version.removeprefix("v").split(".")[:2])
    return (major, minor) >= (1, 36)


def chart_default_layout(version: str) -> str:
    """Which of our layouts the chart's defaults publish on a cluster of `version`: its DaemonSet's
    flags as `helm template --kube-version` renders them, then what the API server keeps (before 1.36
    it drops shared counters and consumable capacity, and the driver falls back to whole devices,
    `neuron_dra_driver.publisher`, tested in services/dra-driver/tests/test_versions.py)."""
    docs = _chart("--kube-version", version.removeprefix("v"), "--show-only", "templates/dra-driver/daemonset.yaml")
    (daemonset,) = docs
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--no-publish-cores" in args or not keeps_cores(version):
        return OURS_DEVICES
    return OURS_SHARES if "--cores-as-capacity" in args else OURS


@cache
def _inventory(instance_type: str, lnc: int) -> NodeInventory:
    """The scanned inventory of a simulated node of that shape. The node's files go once scanned
    (slices.build reads none): left behind, each run of the simulation left five trees of up to
    12,000 files in the temporary directory, and removing a few hundred of them took minutes."""
    with tempfile.TemporaryDirectory(prefix=f"simcluster-{instance_type}-{lnc}-") as root:
        sim.create(Path(root), instance_type, lnc=lnc)
        return scan(root, env={})


def node_slices(spec: NodeSpec, publish_cores: bool = True, cores_as_capacity: bool = False) -> list[dict[str, Any]]:
    """The ResourceSlices the driver publishes for this node, idle and healthy (`publish_cores` False: as
    it publishes where the API server drops shared counters; `cores_as_capacity`: --cores-as-capacity)."""
    inventory = _inventory(spec.instance_type, spec.lnc)
    model = slices.NodeDevices(spec.name, inventory, publish_cores=publish_cores, cores_as_capacity=cores_as_capacity)
    return slices.build(model, 1)


def capacity_claim_object(pod: PodSpec) -> dict[str, Any]:
    """The pod's claim on cores as capacity (docs/dra.md, "Cores as capacity"): whole devices as
    `PodSpec.claim_object` writes them (no capacity asked takes all of a device); k cores as the first
    that fits of k cores of one device, or k/m of each of m devices of one group of 4 (m dividing k)."""
    claim = pod.claim_object()
    if pod.devices:
        return claim
    subrequests, constraints = [], []
    for m in (1, 2, 3, 4):
        if pod.cores % m:
            continue
        name = f"m{m}"
        subrequests.append(
            {
                "name": name,
                "deviceClassName": slices.DRIVER,
                "allocationMode": "ExactCount",
                "count": m,
                "capacity": {"requests": {slices.CORES_CAPACITY: str(pod.cores // m)}},
            }
        )
        if m > 1:
            constraints.append({"requests": [f"neuron/{name}"], "matchAttribute": slices.group_attribute(4)})
    claim["spec"]["devices"] = {
        "requests": [{"name": "neuron", "firstAvailable": subrequests}],
        "constraints": constraints,
    }
    return claim


def shares(claim: dict[str, Any]) -> list[tuple[int, int]]:
    """The (device index, cores) of each share of a device a claim's allocation holds (a result that
    consumes part of a device's `cores` capacity: which cores is the driver's choice at prepare)."""
    found = []
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        consumed = (result.get("consumedCapacity") or {}).get(slices.CORES_CAPACITY)
        parsed = resources.parse_dra_name(result["device"])
        if consumed is not None and parsed is not None and parsed[0] is resources.Kind.DEVICE:
            found.append((parsed[1], int(consumed)))
    return found


def allocated(claim: dict[str, Any], ring: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The device indices and global core indices a claim's allocation holds (a ring arc: its devices);
    shares of a device (`shares`) are left to the caller, who knows which cores are free."""
    devices: set[int] = set()
    cores: set[int] = set()
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if (result.get("consumedCapacity") or {}).get(slices.CORES_CAPACITY) is not None:
            continue
        name = result["device"]
        arc = resources.parse_dra_group(name)
        if arc is not None:
            devices.update(resources.ring_arc(arc[1], arc[0], ring))
            continue
        parsed = resources.parse_dra_name(name)
        if parsed is None:
            raise ValueError(f"claim {claim['metadata']['name']}: device {name!r} is not the driver's")
        kind, index = parsed
        (devices if kind is resources.Kind.DEVICE else cores).add(index)
    return tuple(sorted(devices)), tuple(sorted(cores))


def valid_set(topo: Topology, free: FreeState, devices: tuple[int, ...], cores: tuple[int, ...]) -> bool:
    """Whether a claim's allocation is a set the device plugin's allocator calls valid on the node's
    free silicon (`free`, before the allocation): the devices one of the topology's connected groups
    of that size; the cores on connected devices, and on no more devices than the allocator's own
    choice from the free cores needs (the rules of `neuron_model.allocator`)."""
    if devices and not choose_devices(topo, devices, devices, len(devices)).valid:
        return False
    if cores:
        if not choose_cores(topo, cores, cores, len(cores)).valid:
            return False
        best = choose_cores(topo, free.cores, (), len(cores))
        per = topo.cores_per_device
        if best.valid and len({c // per for c in cores}) > len({c // per for c in best.ids}):
            return False
    return True


# -- AWS's layout (issue 58 item 1: the anchor the bench measures our slices against) -------------------
#
# What AWS's own Neuron DRA driver would publish for the node, and claims as AWS's published
# ResourceClaimTemplates write them. Which parts come from AWS's sources and which are inferred
# (docs/benchmarks.md, "DRA slices against AWS's layout", says the same):
# - from AWS (aws-neuron-sdk `deploy/eks/dra.rst`, `containers/neuron-dra.rst`, its attributes reference, and
#   the specs in tests/e2e/aws-dra-specs): driver and DeviceClass `neuron.aws.com`; whole devices only,
#   `neurondevice<N>`, no cores, no shared counters; the pool is the node; the attributes `deviceId` (int),
#   `instanceType`, `neuronDriverVersion` (strings), `draDriverVersion` (a version), `resourceType`
#   `neuron_device`; on a trn torus that is not an UltraServer node `topology_x`, `topology_y`,
#   `topology4_id`, `topology8_id` (ints); `resource.aws.com/devicegroup<k>_id` strings, opaque hashes, of
#   sizes 1, 4, 8, 16 on trn; the claims: `allocationMode: ExactCount`, `count`, a CEL selector on
#   `instanceType`, `matchAttribute: resource.aws.com/devicegroup4_id` (1x4-connected-devices) and
#   `devicegroup8_id` (the "l-trn2" template) constraints, no constraint for all 16 (the "xl-trn2" template);
# - from an AWS operator's code (the default DeviceClass its Neuron DeviceConfig makes): the class's one
#   selector `device.driver == "neuron.aws.com"`;
# - inferred: AWS's driver is documented for Trainium only, so on inf2 its layout is taken as the same
#   whole devices with the ring's groups under the same attribute names (our tiling, `slices.group_ids`:
#   the sizes the ring's allocator accepts, 2 among them), and a claim for 2 devices is written like the
#   1x4 one with `devicegroup2_id`; the hash values (16 hex digits per group), the driver versions'
#   values, one slice a node; the instance-type selector names the fleet's types (`in [...]`, one CEL
#   test per device as the templates' `==`) so that both layouts place the same pods on the same nodes;
#   no `neuron_node` device on trn2u nodes (without counters it could not be kept apart from the node's
#   devices, and no pod of the stream asks for one); no `networkNodeLayer*` or `capacityBlockId` (the
#   simulated Nodes carry no EC2 topology or capacity-block labels, which those come from).
AWS = "AWS's"
AWS_DRIVER_VERSION = "2.24.7.0"  # the kernel driver version AWS's template example selects (a value only)
AWS_DRA_DRIVER_VERSION = "1.0.1"  # a version of AWS's DRA driver image (a value only)


def aws_device_classes() -> list[dict[str, Any]]:
    """AWS's one DeviceClass."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": slices.DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{slices.DRIVER}"'}}]},
        }
    ]


def _group_hash(node: str, size: int, group: int) -> str:
    return hashlib.sha256(f"{node}/{size}/{group}".encode()).hexdigest()[:16]


def aws_node_slices(spec: NodeSpec) -> list[dict[str, Any]]:
    """The ResourceSlice AWS's driver would publish for this node, idle and healthy: whole devices only."""
    inventory = _inventory(spec.instance_type, spec.lnc)
    groups = slices.group_ids(spec.topology)
    devices = []
    for d in sorted(device.index for device in inventory.devices):
        attributes: dict[str, Any] = {
            "deviceId": {"int": d},
            "instanceType": {"string": spec.instance_type},
            "neuronDriverVersion": {"string": AWS_DRIVER_VERSION},
            "draDriverVersion": {"version": AWS_DRA_DRIVER_VERSION},
            "resourceType": {"string": slices.DEVICE_KIND},
        }
        attributes.update(slices.torus_position(inventory, d))
        for size, ids in sorted(groups.items()):
            if d in ids:
                attributes[slices.group_attribute(size)] = {"string": _group_hash(spec.name, size, ids[d])}
        devices.append({"name": slices.device_name(d), "attributes": attributes})
    return [
        {
            "apiVersion": slices.API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slices.slice_name(spec.name, 0)},
            "spec": {
                "driver": slices.DRIVER,
                "nodeName": spec.name,
                "pool": {"name": spec.name, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    ]


def aws_claim_object(pod: PodSpec, instance_types: Iterable[str]) -> dict[str, Any]:
    """A device pod's claim as AWS's published templates write one (a core pod has none: AWS's layout
    has no cores)."""
    if not pod.devices:
        raise ValueError(f"{pod.name} asks for cores, which AWS's layout does not publish")
    names = sorted(set(instance_types))
    types = ", ".join(f"'{t}'" for t in names)
    whole = max(get_instance_type(t).devices for t in names)  # all of a trn node: "xl-trn2" has no constraint
    request = {
        "name": "neurons",
        "exactly": {
            "deviceClassName": slices.DRIVER,
            "allocationMode": "ExactCount",
            "count": pod.devices,
            "selectors": [{"cel": {"expression": f"device.attributes['{slices.DRIVER}'].instanceType in [{types}]"}}],
        },
    }
    devices: dict[str, Any] = {"requests": [request]}
    if 1 < pod.devices < whole:
        devices["constraints"] = [{"requests": ["neurons"], "matchAttribute": slices.group_attribute(pod.devices)}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": pod.name, "namespace": NAMESPACE},
        "spec": {"devices": devices},
    }
