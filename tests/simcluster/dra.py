"""The fleet on DRA: each simulated node publishes the ResourceSlices the real DRA driver builds for
its instance type (`neuron_dra_driver.slices.build` on a simulated node's scanned inventory), the
chart's DeviceClasses as `helm template` renders them, and what the scheduler allocated read back
from each pod's claim as device and core indices, judged by the node model's rules.

No kubelet or driver runs: the slices are what the driver would publish on an idle healthy node,
written once, and a pod's devices are what its claim's allocation says (the driver's prepare
hands out exactly those)."""

from __future__ import annotations

import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml_streams
from neuron_dra_driver import slices

from neuron_driver.inventory import NodeInventory, scan
from neuron_model import resources
from neuron_model.allocator import Topology, choose_cores, choose_devices
from neuron_model.placement import FreeState
from neuron_sim import node as sim
from simcluster.fleet import NodeSpec

REPO = Path(__file__).resolve().parents[2]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def chart_device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses exactly as the chart renders them with the DRA driver on (its defaults:
    the device plugin's resource names mapped, cores and ring arcs published)."""
    helm = REPO / ".venv" / "bin" / "helm"
    out = subprocess.run(
        [str(helm), "template", "x", str(REPO / "charts/neuron-helm-chart"),
         "--set", "devicePlugin.enabled=false,draDriver.enabled=true",
         "--show-only", "templates/dra-driver/deviceclasses.yaml"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml_streams.load_all(out) if d]


@cache
def _inventory(instance_type: str, lnc: int) -> NodeInventory:
    """The scanned inventory of a simulated node of that shape. The node's files go once scanned
    (slices.build reads none): left behind, each run of the simulation left five trees of up to
    12,000 files in the temporary directory, and removing a few hundred of them took minutes."""
    with tempfile.TemporaryDirectory(prefix=f"simcluster-{instance_type}-{lnc}-") as root:
        sim.create(Path(root), instance_type, lnc=lnc)
        return scan(root, env={})


def node_slices(spec: NodeSpec) -> list[dict[str, Any]]:
    """The ResourceSlices the driver publishes for this node, idle and healthy."""
    return slices.build(slices.NodeDevices(spec.name, _inventory(spec.instance_type, spec.lnc)), 1)


def allocated(claim: dict[str, Any], ring: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The device indices and global core indices a claim's allocation holds (a ring arc: its devices)."""
    devices: set[int] = set()
    cores: set[int] = set()
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
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
