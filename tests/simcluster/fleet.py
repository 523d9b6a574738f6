"""The simulated fleet and the pod stream: seeded, so both schedulers see the same of each.

Nodes mix inf2.48xlarge, inf2.24xlarge, trn1.32xlarge and trn2.48xlarge (trn2 at both logical-core
settings), and `ultraservers` trn2u UltraServers of 4 trn2u.48xlarge nodes at the end of the list,
each node with the UltraServer identity the driver reports (written by neuron_sim, read back by
neuron_driver: the real path) and AWS's UltraServer labels. Pods ask for one resource in one
container, in sizes people use: inference pods take one device or a few cores, training pods whole
aligned groups (8, 16). Among them, `groups` LeaderWorkerSet groups (GROUP_SHAPES) ask to share an
UltraServer, labelled and annotated as LeaderWorkerSet labels a group's pods, all created at once.
Every hardware fact (device counts, cores, topology, UltraServer identities and labels) comes from
the libraries; nothing about the silicon is written here.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_dra_driver.slices import group_attribute

from neuron_driver.ultraserver import read_ultraserver
from neuron_model.allocator import Topology, topology_for
from neuron_model.instance_types import get_instance_type
from neuron_model.placement import ContainerRequest, PodRequest
from neuron_model.resources import DRA_DRIVER, neuron, neuroncore
from neuron_model.ultraserver import UltraServerReading, domain, node_labels, server_id_label
from neuron_scheduler_extender.groups import LWS_EXCLUSIVE, LWS_GROUP_INDEX, LWS_GROUP_KEY, LWS_NAME, LWS_SIZE
from neuron_scheduler_extender.pods import ResourceNames, neuron_request
from neuron_sim.node import UltraServerSpec, write_ultraserver

if TYPE_CHECKING:
    from simcluster.controlplane import ControlPlane

NEURON, NEURONCORE = neuron().full_name, neuroncore().full_name
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
SIMULATED = "neuron-sim/simulated"  # an annotation on every simulated Node
NAMESPACE = "sim"
DEFAULT_SCHEDULER = "default-scheduler"

# (instance type, logical-core setting): weight
NODE_MIX: Mapping[tuple[str, int], int] = {
    ("inf2.48xlarge", 1): 20,
    ("inf2.24xlarge", 1): 20,
    ("trn1.32xlarge", 1): 30,
    ("trn2.48xlarge", 2): 20,
    ("trn2.48xlarge", 1): 10,
}
DEVICE_POD_SHARE = 0.55  # the rest ask for cores
DEVICE_SIZES: Mapping[int, int] = {1: 40, 2: 20, 4: 20, 8: 12, 16: 8}
CORE_SIZES: Mapping[int, int] = {1: 25, 2: 25, 3: 5, 4: 20, 5: 3, 6: 5, 7: 2, 8: 15}
ULTRASERVER_TYPE = "trn2u.48xlarge"
ULTRASERVER_NODES = 4
# (pods, devices each, nodes of the UltraServer group they share), taken in turn: a whole 4-node
# UltraServer (4 pods of a node each, or 8 of half a node), or one 2-node half of it.
GROUP_SHAPES: tuple[tuple[int, int, int], ...] = ((4, 16, 4), (8, 8, 4), (2, 16, 2))


@dataclass(frozen=True)
class UltraServerSeat:
    """A node's place in a simulated UltraServer."""

    server_id: str  # 16 hex digits
    node_id: int

    @property
    def reading(self) -> UltraServerReading:
        return _reading(self.server_id, self.node_id)


@cache
def _reading(server_id: str, node_id: int) -> UltraServerReading:
    """What the node's driver reports: neuron_sim writes the class attributes, neuron_driver reads them."""
    with tempfile.TemporaryDirectory() as root:
        write_ultraserver(Path(root), UltraServerSpec(node_id, server_id, ULTRASERVER_NODES))
        return read_ultraserver(root)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    instance_type: str
    lnc: int  # logical-core setting
    ultraserver: UltraServerSeat | None = None

    @property
    def topology(self) -> Topology:
        return _topology(self.instance_type, self.lnc)

    @property
    def reading(self) -> UltraServerReading | None:
        return self.ultraserver.reading if self.ultraserver is not None else None

    def domain(self, nodes: int) -> str | None:
        """The server id of its UltraServer group of `nodes` nodes, if it is in one."""
        return domain(self.reading, nodes)

    def node_object(self, dra: bool = False) -> dict[str, Any]:
        """A Node as a kubelet would register it, Ready, with the plugin's two resources (none on a
        DRA node: its devices are in ResourceSlices)."""
        topo = self.topology
        resources = {"cpu": "192", "memory": "768Gi", "pods": "110"}
        if not dra:
            resources[NEURON] = str(topo.device_count)
            resources[NEURONCORE] = str(topo.device_count * topo.cores_per_device)
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "simulated",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    INSTANCE_TYPE_LABEL: self.instance_type,
                    **(node_labels(self.reading) if self.reading is not None else {}),
                },
                "annotations": {SIMULATED: "true"},
            },
            "status": {"capacity": resources, "allocatable": resources, "conditions": [ready]},
        }


@dataclass(frozen=True)
class SimulatedCluster:
    """A simulated control plane and the nodes made on it, by name (the Kueue and upstream gang tests)."""

    cp: ControlPlane
    specs: dict[str, NodeSpec]

    def ultraserver(self, node: str) -> str | None:
        return self.specs[node].domain(4)


@cache
def _topology(instance_type: str, lnc: int) -> Topology:
    it = get_instance_type(instance_type)
    return topology_for(it, it.logical_cores_per_device(lnc))


@dataclass(frozen=True)
class GroupSpec:
    """A LeaderWorkerSet group asking to share an UltraServer group of `nodes` nodes."""

    index: int
    size: int  # pods
    nodes: int  # 2 or 4

    @property
    def name(self) -> str:
        return f"group-{self.index:03d}"

    @property
    def topology_key(self) -> str:
        """The node label LeaderWorkerSet's exclusive topology names."""
        return server_id_label(self.nodes)

    def labels(self) -> dict[str, str]:
        return {LWS_NAME: "sim", LWS_GROUP_INDEX: str(self.index), LWS_GROUP_KEY: f"key-{self.index:03d}"}

    def annotations(self) -> dict[str, str]:
        return {LWS_SIZE: str(self.size), LWS_EXCLUSIVE: self.topology_key}


@dataclass(frozen=True)
class PodSpec:
    name: str
    devices: int  # aws.amazon.com/neuron
    cores: int  # aws.amazon.com/neuroncore
    group: GroupSpec | None = None
    priority_class: str = ""  # a PriorityClass name; "" leaves the pod at priority 0

    @property
    def request(self) -> PodRequest:
        return PodRequest(containers=(ContainerRequest(self.devices, self.cores),))

    def claim_object(self) -> dict[str, Any]:
        """The pod's own ResourceClaim, as a user who does not pick the instance type writes it from
        docs/dra.md: N devices of one connected group (`devicegroup<N>_id`; a ring publishes
        groups of 2 too, a torus 4, 8 and 16 only); as many cores as every device of the fleet holds on
        one device, more within one group of 4 devices (which holds all of the largest core request)."""
        if self.devices:
            request = {"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com", "count": self.devices}}
            match = group_attribute(self.devices)
        else:
            request = {"name": "neuron", "exactly": {"deviceClassName": "neuroncore.aws.com", "count": self.cores}}
            one_device = self.cores <= _fewest_cores_per_device()
            match = f"{DRA_DRIVER}/deviceId" if one_device else group_attribute(4)
        devices: dict[str, Any] = {"requests": [request]}
        if self.devices + self.cores > 1:
            devices["constraints"] = [{"requests": ["neuron"], "matchAttribute": match}]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": self.name, "namespace": NAMESPACE},
            "spec": {"devices": devices},
        }

    def pod_object(self, scheduler: str, claim: bool = False) -> dict[str, Any]:
        """The pod; asking for the device plugin's resource names, or (`claim`) for its own claim."""
        limits = {NEURON: str(self.devices)} if self.devices else {NEURONCORE: str(self.cores)}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": NAMESPACE,
                **({"labels": self.group.labels(), "annotations": self.group.annotations()} if self.group else {}),
            },
            "spec": {
                "schedulerName": scheduler,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                **({"priorityClassName": self.priority_class} if self.priority_class else {}),
                "containers": [
                    {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}
                ],
            },
        }
        if claim:
            pod["spec"]["resourceClaims"] = [{"name": "neuron", "resourceClaimName": self.name}]
            pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "neuron"}]}
        return pod


@cache
def _fewest_cores_per_device() -> int:
    return min(_topology(instance_type, lnc).cores_per_device for instance_type, lnc in NODE_MIX)


def fleet(count: int, seed: int, ultraservers: int = 0) -> list[NodeSpec]:
    """`count` nodes, the last `ultraservers` * 4 of them trn2u UltraServers."""
    rng = random.Random(f"fleet-{seed}")
    kinds = list(NODE_MIX)
    plain = count - ultraservers * ULTRASERVER_NODES
    picks = rng.choices(kinds, weights=[NODE_MIX[k] for k in kinds], k=plain)
    nodes = [NodeSpec(f"node-{i:04d}", it, lnc) for i, (it, lnc) in enumerate(picks)]
    lnc = get_instance_type(ULTRASERVER_TYPE).family.default_lnc
    for u in range(ultraservers):
        server_id = random.Random(f"ultraserver-{seed}-{u}").getrandbits(64).to_bytes(8).hex()
        for node_id in range(ULTRASERVER_NODES):
            seat = UltraServerSeat(server_id, node_id)
            nodes.append(NodeSpec(f"node-{len(nodes):04d}", ULTRASERVER_TYPE, lnc, seat))
    return nodes


def pod_stream(count: int, seed: int, groups: int = 0) -> list[PodSpec]:
    """`count` pods, and the pods of `groups` groups each inserted whole at a random point. Named in
    stream order: the scheduler's queue takes pods listed at start in name order."""
    rng = random.Random(f"pods-{seed}")
    group_rng = random.Random(f"groups-{seed}")  # apart, so the single pods are the same with or without groups
    starts = sorted(group_rng.sample(range(count), min(groups, count)))

    def size(mix: Mapping[int, int]) -> int:
        return rng.choices(list(mix), weights=list(mix.values()))[0]

    pods: list[PodSpec] = []
    for i in range(count):
        while starts and starts[0] == i:
            starts.pop(0)
            index = len({p.group for p in pods if p.group})
            members, devices, nodes = GROUP_SHAPES[index % len(GROUP_SHAPES)]
            group = GroupSpec(index, members, nodes)
            for _ in range(members):
                pods.append(PodSpec(f"pod-{len(pods):05d}", devices, 0, group))
        if rng.random() < DEVICE_POD_SHARE:
            pods.append(PodSpec(f"pod-{len(pods):05d}", size(DEVICE_SIZES), 0))
        else:
            pods.append(PodSpec(f"pod-{len(pods):05d}", 0, size(CORE_SIZES)))
    return pods


# The preemption run (bench/bench_preemption.py): after the stream above has filled the fleet at
# priority 0, a second stream of larger pods at this priority, which only preemption can place.
URGENT_CLASS = "neuron-bench-urgent"
URGENT_PRIORITY = 1000
URGENT_SIZES: Mapping[int, int] = {4: 6, 8: 3, 16: 1}


def priority_class(name: str = URGENT_CLASS, value: int = URGENT_PRIORITY) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def urgent_stream(count: int, seed: int) -> list[PodSpec]:
    """`count` pods of 4, 8 or 16 devices at URGENT_PRIORITY, named after the first stream's."""
    rng = random.Random(f"urgent-{seed}")
    return [
        PodSpec(
            f"urgent-{i:05d}",
            rng.choices(list(URGENT_SIZES), weights=list(URGENT_SIZES.values()))[0],
            0,
            priority_class=URGENT_CLASS,
        )
        for i in range(count)
    ]


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """The Neuron request of a Pod object, read exactly as the scheduler extender reads it."""
    return neuron_request(pod, ResourceNames.under())
