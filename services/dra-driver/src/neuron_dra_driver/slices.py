"""The node's ResourceSlices (`resource.k8s.io/v1`) built from the node model. Pure: no I/O.

One pool per node (named after it). Its devices:
- `neurondevice<N>`: one Neuron device, all of its logical cores;
- `neuroncore<G>`: one logical NeuronCore (G = the global index NEURON_RT_VISIBLE_CORES counts).
Both kinds consume one shared counter per Neuron device (`neurondevice<N>`, worth the device's
logical cores): a whole device takes all of it, a core takes one, so the scheduler never hands
out a device and one of its cores, or one core twice (partitionable devices, KEP-4815).

Connected groups: `resource.aws.com/devicegroup<k>_id` for every valid group size k of the node's
topology (`Topology.group_sizes`). A claim asking for k devices (or cores) with
`matchAttribute: resource.aws.com/devicegroup<k>_id` gets a valid connected set:
- 4x4 torus (trn1/trn1n/trn2): the valid groups of a size never overlap, so each device carries
  the id of the one group of each size it belongs to: every valid group is reachable, as with
  the AWS driver (same names and sizes 1, 4, 8, 16).
- ring (inf1/inf2): every arc of k consecutive devices is valid and arcs overlap, so one value
  per device cannot name them all. Each size is tiled with the arcs that do not overlap, taken
  from the allocator's valid groups in order (devices 0..k-1, k..2k-1, ...); a device left over
  when k does not divide the ring has no id of that size. Every set the scheduler can pick is a
  valid arc; arcs crossing a tile boundary (e.g. devices 2-5 for k=4) are not reachable.
- switch (trn3, NeuronSwitch): every set of devices is connected, so any k devices are a valid
  group and no attribute needs to narrow a claim. Each device carries the sizes AWS's driver names
  on trn (powers of two up to the node's device count, and the count): `devicegroup1_id` its own
  index, every larger size one id shared by all devices (0), so a claim written for the torus
  (`matchAttribute: resource.aws.com/devicegroup4_id`) runs unchanged and may take any 4. No arcs
  or groups are published as devices: a claim for k `neurondevice`s is already a connected set.
Ids are the lowest device index of the group (an int).
- ring arcs as devices (`publish_groups`, with the shared counters): every valid arc of k >= 2
  devices, overlapping ones too, is also published as one device `neurongroup<k>-<first>`
  (`resourceType=neuron_device_group`, `deviceCount`, `firstDeviceId`) that consumes every
  member's whole counter: a claim for one device of class `neurongroup.aws.com` with
  `deviceCount == k` gets any free arc, and never together with a member or one of its cores.

UltraServer nodes (trn2u): the node's whole set of devices is also one device `neuronnode`
(`resourceType=neuron_node`, as AWS's driver names it; `deviceCount`, `coreCount`, and once the
driver's election is over the node's UltraServer identity: `ultraserverMode`, `ultraserverServerId4`,
`ultraserverNodeId4`, `ultraserverServerId2`, `ultraserverNodeId2`) that consumes every device's
whole counter: AWS's trn2u ResourceClaimTemplates (one `neuron_node` device with `UltraServerConfig`)
run unchanged. It is published only while every device of the node is in the pool.

Cores as consumable capacity (`cores_as_capacity`, KEP-5075, `DRAConsumableCapacity`, Beta in 1.36):
each `neurondevice<N>` allows several allocations and has a capacity `cores` worth its logical cores,
whose default is all of them. A claim for whole devices asks no capacity and takes all of a device; a
claim for k cores asks `capacity.requests.cores: k` of a device, and which cores the share gets is
the driver's choice at prepare (`claims.prepare`). No core devices, no shared counters, so no ring
arcs and no whole UltraServer node either: on 1.36 this is the one layout with cores whose cost in
kube-scheduler stays near a devices-only layout's (docs/benchmarks.md, "The slice layout's levers").

An unhealthy device either leaves the pool (with its cores) or, with device taints on (KEP-5055,
`DRADeviceTaints`, Beta in 1.36), stays in it with a taint `neuron.aws.com/unhealthy=<why>` on the
device and each of its cores: the scheduler then says why a claim waits, allocates it only to a
claim that tolerates the taint (an admin's diagnostic pod), and with `NoExecute` evicts the pods
using it. `<why>` is the fault table's kind, `DeviceAbsent`, or `ProblemDetector`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from neuron_driver import layout
from neuron_driver.inventory import NodeInventory, topology_from
from neuron_model import resources
from neuron_model.allocator import Topology
from neuron_model.instance_types import GIB, TopologyKind
from neuron_model.ultraserver import GROUP_SIZES, MODE_LABEL, State, UltraServerReading, node_labels

DRIVER = layout.DRA_DRIVER_NAME
API_VERSION = "resource.k8s.io/v1"
GROUP_DOMAIN = "resource.aws.com"
DEVICE_KIND = "neuron_device"
CORE_KIND = "neuron_core"
GROUP_KIND = "neuron_device_group"
NODE_KIND = "neuron_node"
COUNTER_SET_PREFIX = "neuroncores"
CORES_CAPACITY = "cores"  # a shareable device's capacity in logical cores (cores_as_capacity)
# API limits (k8s.io/api resource/v1): devices per slice when counters are used, counters per set.
MAX_DEVICES_PER_SLICE = 64
MAX_COUNTERS_PER_SET = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_NAME = 253


device_name = resources.dra_device_name
core_name = resources.dra_core_name


def group_attribute(size: int) -> str:
    return f"{GROUP_DOMAIN}/devicegroup{size}_id"


def group_ids(topo: Topology) -> dict[int, dict[int, int]]:
    """Per valid group size: device -> id of the group of that size it is published in."""
    result: dict[int, dict[int, int]] = {}
    if topo.kind is TopologyKind.SWITCH:
        n = topo.device_count
        sizes = sorted({n, *(1 << k for k in range(n.bit_length()) if 1 << k <= n)})
        return {size: {d: d if size == 1 else 0 for d in range(n)} for size in sizes}
    for size in topo.group_sizes:
        taken: set[int] = set()
        ids: dict[int, int] = {}
        for group in topo.groups(size):
            if taken.isdisjoint(group):
                taken |= group
                ids.update(dict.fromkeys(group, min(group)))
        result[size] = ids
    return result


TAINT_KEY = f"{DRIVER}/unhealthy"
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
ABSENT_TAINT = "DeviceAbsent"
DETECTOR_TAINT = "ProblemDetector"


@dataclass(frozen=True)
class Taint:
    value: str
    effect: str = "NoSchedule"
    key: str = TAINT_KEY

    def to_api(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


def taint_value(text: str) -> str:
    """`text` as a label value (what a taint's value must be): at most 63 of [A-Za-z0-9_.-],
    starting and ending with an alphanumeric."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in text)[:63]
    return cleaned.strip("_.-") or "Unhealthy"


@dataclass(frozen=True)
class NodeDevices:
    """What the slices say about one node: the scanned model plus the health verdicts."""

    node_name: str
    inventory: NodeInventory
    unhealthy: Collection[int] = ()  # device indices taken out of the pool
    driver_version: str | None = None  # the Neuron kernel driver's, when the node tells it
    plugin_version: str = "0.0.0"  # this DRA driver's package version (a semantic version)
    publish_cores: bool = True
    taints: Mapping[int, Taint] = field(default_factory=dict)  # unhealthy devices published tainted
    publish_groups: bool = True  # ring arcs as devices (only with the shared counters of publish_cores)
    cores_as_capacity: bool = False  # with publish_cores: cores as shares of a device, not as devices
    placement: Mapping[str, str] = field(default_factory=dict)  # from the Node's labels (placement_labels)
    ultraserver: UltraServerReading | None = None  # the driver's UltraServer identity, read for each publish
    # device -> its multi-node-unfit faults (a failing link: neuron_health.device_health.multi_node_unfit)
    multi_node_unfit: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        """Cores are published as consumable capacity of their device (no counters, no core devices)."""
        return self.publish_cores and self.cores_as_capacity

    @property
    def counted(self) -> bool:
        """Cores are published as devices sharing their device's counter."""
        return self.publish_cores and not self.cores_as_capacity

    def without_taints(self) -> NodeDevices:
        """The same node with its tainted devices left out instead (an API server that drops taints)."""
        return replace(self, unhealthy=tuple(sorted({*self.unhealthy, *self.taints})), taints={})


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _int(value: int) -> dict[str, int]:
    return {"int": value}


def counter_set_name(device: int) -> str:
    return f"{COUNTER_SET_PREFIX}-{device // MAX_COUNTERS_PER_SET}"


# Set (to the faults' kinds) on a device, core, ring arc or whole node while one of its devices has a
# multi-node-unfit fault: it serves work on this node, and a claim for work spanning nodes selects
# against it with `!("multiNodeUnfit" in device.attributes["neuron.aws.com"])`. Absent otherwise,
# so a healthy node's slices are as before.
MULTI_NODE_UNFIT_ATTRIBUTE = "multiNodeUnfit"

# A device's HBM in GiB (every family's is whole GiB), an attribute, not a `memory` capacity as
# NVIDIA's driver publishes it: with DRAConsumableCapacity on (1.36 and later) kube-scheduler's
# allocator checks every capacity of each candidate device for every node it filters, and at 1,000
# nodes on 1.37.2 that one capacity cost 200 ms of scheduler CPU a device pod, 0.61 of AWS's
# layout's pace against 1.00 without it (docs/benchmarks.md). A claim selects on it with CEL:
# `device.attributes["neuron.aws.com"].memoryGiB >= 96`.
MEMORY_ATTRIBUTE = "memoryGiB"


def _mark_unfit(attributes: dict[str, Any], model: NodeDevices, members: Iterable[int]) -> None:
    kinds = sorted({kind for d in members for kind in model.multi_node_unfit.get(d, ())})
    if kinds:
        attributes[MULTI_NODE_UNFIT_ATTRIBUTE] = _string(",".join(kinds)[:64])


def _common(model: NodeDevices, kind: str, device: int, groups: Mapping[int, Mapping[int, int]]) -> dict[str, Any]:
    inv = model.inventory
    attributes: dict[str, Any] = {
        "resourceType": _string(kind),
        "deviceId": _int(device),
        "logicalNeuronCore": _int(inv.lnc.value),
        "draDriverVersion": {"version": model.plugin_version},
    }
    if inv.instance_type_name:
        attributes["instanceType"] = _string(inv.instance_type_name)
    if model.driver_version:
        attributes["neuronDriverVersion"] = _string(model.driver_version[:64])
    for size, ids in sorted(groups.items()):
        if device in ids:
            # a string, as AWS's driver publishes it (its values are opaque hashes): a claim's CEL that
            # compares it to a string works on either driver
            attributes[group_attribute(size)] = _string(str(ids[device]))
    attributes.update(torus_position(inv, device))
    attributes.update((name, _string(value)) for name, value in sorted(model.placement.items()))
    return attributes


def torus_position(inv: NodeInventory, device: int) -> dict[str, Any]:
    """AWS's driver's position attributes on a trn torus that is not an UltraServer node (its
    "Neuron DRA Driver Attributes Reference"): `topology_x` the row, `topology_y` the column,
    `topology4_id` the row (four connected devices), `topology8_id` the pair of rows."""
    it = inv.instance_type
    if it is None or it.topology is not TopologyKind.TORUS_2D or it.ultraserver or not it.torus_shape:
        return {}
    _, cols = it.torus_shape
    row, col = divmod(device, cols)
    return {
        "topology_x": _int(row),
        "topology_y": _int(col),
        "topology4_id": _int(row),
        "topology8_id": _int(row // 2),
    }


def devices(model: NodeDevices) -> list[dict[str, Any]]:
    """The pool's devices (healthy ones only), whole devices first, then cores, by index."""
    inv = model.inventory
    topo = topology_from(inv)
    groups = group_ids(topo)
    memory = inv.instance_type.memory_bytes_per_device if inv.instance_type else None
    unhealthy = set(model.unhealthy)
    healthy = [d for d in sorted(inv.devices, key=lambda d: d.index) if d.index not in unhealthy]
    result: list[dict[str, Any]] = []
    for d in healthy:
        attributes = _common(model, DEVICE_KIND, d.index, groups)
        attributes["coreCount"] = _int(len(d.logical_cores))
        if memory:
            attributes[MEMORY_ATTRIBUTE] = _int(memory // GIB)
        _mark_unfit(attributes, model, (d.index,))
        entry: dict[str, Any] = {"name": device_name(d.index), "attributes": attributes}
        if model.shared:
            cores = str(len(d.logical_cores))
            entry["allowMultipleAllocations"] = True
            entry["capacity"] = {
                CORES_CAPACITY: {
                    "value": cores,
                    "requestPolicy": {"default": cores, "validRange": {"min": "1", "max": cores, "step": "1"}},
                }
            }
        if model.counted:
            entry["consumesCounters"] = [_consumes(d.index, len(d.logical_cores))]
        _taint(entry, model.taints.get(d.index))
        result.append(entry)
    if model.counted:
        for d in healthy:
            for core in d.logical_cores:
                attributes = _common(model, CORE_KIND, d.index, groups)
                attributes["coreId"] = _int(core)
                _mark_unfit(attributes, model, (d.index,))
                entry = {"name": core_name(core), "attributes": attributes, "consumesCounters": [_consumes(d.index, 1)]}
                _taint(entry, model.taints.get(d.index))
                result.append(entry)
    return result + ring_groups(model) + whole_node(model)


def arc_start(group: frozenset[int], ring: int) -> int:
    """The device an arc starts from, going round the ring (its only member whose predecessor is
    not a member; 0 for the whole ring)."""
    for d in sorted(group):
        if (d - 1) % ring not in group:
            return d
    return 0


def ring_groups(model: NodeDevices) -> list[dict[str, Any]]:
    """Every valid arc of two or more devices of a ring, all members published, as one device."""
    inv = model.inventory
    topo = topology_from(inv)
    if not (model.publish_groups and model.counted) or topo.kind is not TopologyKind.RING:
        return []
    unhealthy = set(model.unhealthy)
    present = {d.index: d for d in inv.devices if d.index not in unhealthy}
    ring = topo.device_count
    result = []
    for size in sorted(topo.group_sizes):
        if size < 2:
            continue
        for group in topo.groups(size):
            if not group <= present.keys():
                continue
            first = arc_start(group, ring)
            members = resources.ring_arc(first, size, ring)
            attributes = _common(model, GROUP_KIND, first, {})
            del attributes["deviceId"]
            attributes["deviceCount"] = _int(size)
            attributes["firstDeviceId"] = _int(first)
            attributes["coreCount"] = _int(sum(len(present[d].logical_cores) for d in members))
            _mark_unfit(attributes, model, members)
            counters: dict[str, dict[str, dict[str, str]]] = {}
            for d in members:
                counters.setdefault(counter_set_name(d), {})[device_name(d)] = {
                    "value": str(len(present[d].logical_cores))
                }
            entry: dict[str, Any] = {
                "name": resources.dra_group_name(size, first),
                "attributes": attributes,
                "consumesCounters": [{"counterSet": s, "counters": c} for s, c in sorted(counters.items())],
            }
            tainted = [model.taints[d] for d in members if d in model.taints]
            _taint(entry, tainted[0] if tainted else None)
            result.append(entry)
    return result


def whole_node(model: NodeDevices) -> list[dict[str, Any]]:
    """The UltraServer node's whole set of devices as one device, while all of them are in the pool."""
    inv = model.inventory
    it = inv.instance_type
    if it is None or not it.ultraserver or not model.counted or not inv.devices:
        return []
    unhealthy = set(model.unhealthy)
    present = [d for d in sorted(inv.devices, key=lambda d: d.index) if d.index not in unhealthy]
    if len(present) != it.devices:
        return []
    attributes = _common(model, NODE_KIND, present[0].index, {})
    del attributes["deviceId"]
    attributes["deviceCount"] = _int(len(present))
    attributes["coreCount"] = _int(sum(len(d.logical_cores) for d in present))
    attributes.update(ultraserver_attributes(model.ultraserver))
    _mark_unfit(attributes, model, (d.index for d in present))
    counters: dict[str, dict[str, dict[str, str]]] = {}
    for d in present:
        counters.setdefault(counter_set_name(d.index), {})[device_name(d.index)] = {"value": str(len(d.logical_cores))}
    entry: dict[str, Any] = {
        "name": resources.DRA_NODE_NAME,
        "attributes": attributes,
        "consumesCounters": [{"counterSet": s, "counters": c} for s, c in sorted(counters.items())],
    }
    tainted = [model.taints[d.index] for d in present if d.index in model.taints]
    _taint(entry, tainted[0] if tainted else None)
    return [entry]


def ultraserver_attributes(reading: UltraServerReading | None) -> dict[str, Any]:
    """The node's UltraServer identity as attributes, once the driver's election is over; none before
    (a claim's selector on them then finds no device rather than a guessed one)."""
    if reading is None or reading.state is not State.IDENTIFIED or reading.identity is None:
        return {}
    identity = reading.identity
    labels = node_labels(reading)
    attributes: dict[str, Any] = {"ultraserverMode": _string(labels[MODE_LABEL])}
    for size in GROUP_SIZES:
        group = identity.group(size)
        if group is not None:
            attributes[f"ultraserverServerId{size}"] = _string(group[0])
            attributes[f"ultraserverNodeId{size}"] = _int(group[1])
    return attributes


def _taint(entry: dict[str, Any], taint: Taint | None) -> None:
    if taint is not None:
        entry["taints"] = [taint.to_api()]


def _consumes(device: int, cores: int) -> dict[str, Any]:
    return {"counterSet": counter_set_name(device), "counters": {device_name(device): {"value": str(cores)}}}


def counter_sets(model: NodeDevices) -> list[dict[str, Any]]:
    """One counter per healthy device, worth its logical cores, in sets of at most 32 counters."""
    sets: dict[str, dict[str, Any]] = {}
    unhealthy = set(model.unhealthy)
    for d in sorted(model.inventory.devices, key=lambda d: d.index):
        if d.index in unhealthy:
            continue
        counters = sets.setdefault(counter_set_name(d.index), {})
        counters[device_name(d.index)] = {"value": str(len(d.logical_cores))}
    return [{"name": name, "counters": counters} for name, counters in sorted(sets.items())]


def slice_name(node_name: str, index: int) -> str:
    """`<node>-neuron.aws.com-<i>`; a node name too long for that (a name is at most 253
    characters) is cut and told apart by a hash of it."""
    name = f"{node_name}-{DRIVER}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"-{digest}-{DRIVER}-{index}")
    return f"{node_name[:keep].rstrip('.-')}-{digest}-{DRIVER}-{index}"


def build(model: NodeDevices, generation: int) -> list[dict[str, Any]]:
    """The ResourceSlice objects of the node's pool: the counters' slice (only one of devices and
    shared counters may be in a slice), then devices at most 64 a slice."""
    specs: list[dict[str, Any]] = []
    if model.counted:
        sets = counter_sets(model)
        if sets:
            # at most 8 counter sets a slice: 8 x 32 devices, more than any instance has
            specs.append({"sharedCounters": sets})
    listed = devices(model)
    for start in range(0, len(listed), MAX_DEVICES_PER_SLICE):
        specs.append({"devices": listed[start : start + MAX_DEVICES_PER_SLICE]})
    if not specs:
        specs.append({"devices": []})  # an empty pool still says "this node has nothing"
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(model.node_name, i)},
            "spec": {
                "driver": DRIVER,
                "nodeName": model.node_name,
                "pool": {"name": model.node_name, "generation": generation, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for i, spec in enumerate(specs)
    ]


def content(slices: list[dict[str, Any]]) -> list[Any]:
    """What the slices publish, without the pool generation: equal content needs no new generation."""
    return [(s["metadata"]["name"], {k: v for k, v in s["spec"].items() if k != "pool"}) for s in slices]


def published_counts(slices: list[dict[str, Any]]) -> dict[str, int]:
    """Devices and cores published (as devices or as a device's capacity; tainted ones too), groups
    (ring arcs and the whole UltraServer node), and how many of them carry a taint."""
    counts = {"device": 0, "core": 0, "group": 0, "tainted": 0}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            kind = d["attributes"]["resourceType"]["string"]
            counts[{DEVICE_KIND: "device", CORE_KIND: "core"}.get(kind, "group")] += 1
            if d.get("allowMultipleAllocations"):  # its cores, as capacity
                counts["core"] += int(d["capacity"][CORES_CAPACITY]["value"])
            counts["tainted"] += bool(d.get("taints"))
    return counts


def tainted(slices: list[dict[str, Any]]) -> bool:
    return any(d.get("taints") for s in slices for d in s["spec"].get("devices") or [])


def counted(slices: list[dict[str, Any]]) -> bool:
    """Whether any device consumes a shared counter (what keeps a device and its cores apart)."""
    return any(d.get("consumesCounters") for s in slices for d in s["spec"].get("devices") or [])


def shareable(slices: list[dict[str, Any]]) -> bool:
    """Whether any device allows several allocations (cores as consumable capacity)."""
    return any(d.get("allowMultipleAllocations") for s in slices for d in s["spec"].get("devices") or [])


def parse_device_name(name: str) -> tuple[str, int] | None:
    """(`neuron_device` or `neuron_core`, index) for a name this driver publishes, else None."""
    parsed = resources.parse_dra_name(name)
    if parsed is None:
        return None
    kind, index = parsed
    return (DEVICE_KIND if kind is resources.Kind.DEVICE else CORE_KIND), index
