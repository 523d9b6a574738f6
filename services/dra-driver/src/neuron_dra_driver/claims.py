"""From an allocated ResourceClaim to what a container gets. Pure: the claim object, the node
model and the health verdicts are passed in.

A claim's devices for this driver become, per request, one CDI device: the `/dev/neuronN` nodes
of the devices holding the allocated devices or cores, `NEURON_RT_VISIBLE_CORES` (exactly the
allocated logical cores; all of a whole device's) and `NEURON_LOGICAL_NC_CONFIG` (the node's
setting, so the runtime counts cores as the slices did, unless the request's `NeuronConfig` sets
`logicalNeuronCore`: then both are in that setting, see `parameters`). One CDI device per request, not per
Neuron device: the cores of a request must reach the container as one variable.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra_driver import parameters, slices
from neuron_dra_driver.slices import Taint
from neuron_dra_driver.taints import tolerates
from neuron_driver import cdi, layout
from neuron_driver.inventory import NodeInventory, topology_from
from neuron_model import resources
from neuron_model.allocator import id_list
from neuron_model.instance_types import TopologyKind
from neuron_model.ultraserver import State, UltraServerReading
from neuron_model.ultraserver import ultraserver_env as runtime_env

CLAIM_KIND = f"{slices.DRIVER}/claim"


class ClaimRefused(Exception):
    """The claim cannot be prepared on this node; the message tells the user why."""


class CoresHeld(ClaimRefused):
    """Refused because other prepared claims hold the cores: the kubelet asks again once they are
    unprepared, and the driver checks first that the holders still exist (`Driver._forget_stale`)."""


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    # a share of a device (cores as consumable capacity): the logical cores the driver chose for it;
    # empty for everything else, whose name says what it holds
    cores: tuple[int, ...] = ()
    share_id: str = ""  # the allocation's shareID, returned to the kubelet (it reports it in PodResources)
    # an admin's access to a device in use (adminAccess): the scheduler counts it against nothing, so
    # neither does the driver when it chooses other claims' cores
    admin_access: bool = False

    def share_key(self) -> tuple[str, str, str]:
        return (self.request, self.device, self.share_id)


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it."""

    uid: str
    namespace: str
    name: str


@dataclass(frozen=True)
class PreparedClaim(ClaimRef):
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any] = field(compare=False, repr=False, default_factory=dict)  # the CDI spec

    def to_json(self, with_spec: bool = False) -> dict[str, Any]:
        """The claim as the checkpoint keeps it; `with_spec` adds its CDI spec, so a spec lost with
        /var/run/cdi (a tmpfs: a reboot empties it) can be written again without the API server."""
        raw: dict[str, Any] = {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": [
                {"request": d.request, "pool": d.pool, "device": d.device, "cdiIds": list(d.cdi_ids)}
                | ({"cores": list(d.cores)} if d.cores else {})
                | ({"shareID": d.share_id} if d.share_id else {})
                | ({"adminAccess": True} if d.admin_access else {})
                for d in self.devices
            ],
        }
        if with_spec and self.spec:
            raw["spec"] = dict(self.spec)
        return raw

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PreparedClaim:
        # TypeError, as for a wrong field, so a checkpoint or spec that is JSON but not a claim is
        # set aside or skipped by its reader instead of stopping the driver at every start
        if not isinstance(raw, Mapping):
            raise TypeError(f"a prepared claim is {type(raw).__name__}, not an object")
        spec = raw.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise TypeError(f"claim {raw.get('uid')!r}: its CDI spec is {type(spec).__name__}, not an object")
        return cls(
            str(raw["uid"]),
            str(raw["namespace"]),
            str(raw["name"]),
            tuple(
                PreparedDevice(
                    str(d["request"]),
                    str(d["pool"]),
                    str(d["device"]),
                    tuple(map(str, d["cdiIds"])),
                    tuple(int(c) for c in d.get("cores") or ()),
                    str(d.get("shareID") or ""),
                    bool(d.get("adminAccess", False)),
                )
                for d in raw["devices"]
            ),
            dict(spec),
        )


def spec_file_name(uid: str) -> str:
    return cdi.spec_file_name(CLAIM_KIND, uid)


def cdi_device_name(uid: str, request: str) -> str:
    # unique per claim (the kubelet may hold several claims' specs at once); request names are DNS labels
    return f"{uid}-{request.replace('/', '-')}"


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimRefused("the claim is not allocated")
    results = ((allocation.get("devices") or {}).get("results")) or []
    return [r for r in results if r.get("driver") == slices.DRIVER]


def prepare(
    claim: Mapping[str, Any],
    uid: str,
    node_name: str,
    inventory: NodeInventory,
    unhealthy: Mapping[int, str],
    host_dev_root: Path,
    taints: Mapping[int, Taint] | None = None,
    ultraserver: UltraServerReading | None = None,
    held: Collection[int] = (),
    shared: Collection[int] = (),
    kept: Mapping[tuple[str, str, str], tuple[int, ...]] | None = None,
) -> PreparedClaim:
    """The prepared form of `claim` (as the API server returns it), or `ClaimRefused`: allocated,
    the same UID the kubelet asked for, its devices in this node's pool, known and healthy, or
    tainted (`taints`) with every result on them tolerating the taint (an admin's diagnostic pod).
    `ultraserver`: the node's UltraServer identity as the driver tells it now, for UltraServerConfig.
    `held`: the logical cores other prepared claims hold (`held_cores`); a share of a device (a result
    consuming part of its `cores` capacity) gets the lowest of the device's cores not held. `shared`: the
    cores other claims' shares hold (`share_cores`), which a whole device, core or group must not overlap:
    the scheduler does not count shares allocated before the layout changed. `kept`: the cores this claim's
    shares had when it was prepared before (`PreparedDevice.share_key`), kept when still free, since a
    running container's cores were fixed when it started. An admin-access result (`adminAccess`) is held
    to none of these: the scheduler counts it against nothing."""
    taints = taints or {}
    taken = set(held)
    share_cores: dict[int, tuple[int, ...]] = {}  # result's position -> the cores chosen for its share
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimRefused(f"the claim's UID is {meta.get('uid')!r}, the kubelet asked for {uid!r} (recreated?)")
    per_request: dict[str, tuple[set[int], set[int]]] = {}  # request -> (devices, cores)
    untolerated: set[int] = set()  # devices some result on which does not tolerate their taint
    results = _results(claim)
    allocation = (claim.get("status") or {}).get("allocation") or {}
    try:
        configs = parameters.per_request(allocation, {str(r.get("request")) for r in results})
    except parameters.ConfigError as exc:
        raise ClaimRefused(f"invalid device config: {exc}") from exc
    for position, result in enumerate(results):
        pool, name, request = str(result.get("pool")), str(result.get("device")), str(result.get("request"))
        if pool != node_name:
            raise ClaimRefused(f"device {name} is allocated from pool {pool!r}, this node is {node_name!r}")
        devices, cores = per_request.setdefault(request, (set(), set()))
        admin = bool(result.get("adminAccess"))
        others_shares: Collection[int] = () if admin else shared
        arc = resources.parse_dra_group(name)
        if arc is not None or name == resources.DRA_NODE_NAME:
            members = _arc_members(inventory, name, *arc) if arc is not None else _node_members(inventory, name)
            devices.update(members)
            for member in members:
                cores.update(_unshared(name, inventory.device(member).logical_cores, others_shares))  # type: ignore[union-attr]
                taint = taints.get(member)
                if taint is None or not tolerates(result.get("tolerations") or [], taint):
                    untolerated.add(member)
            continue
        parsed = slices.parse_device_name(name)
        if parsed is None:
            raise ClaimRefused(f"device {name!r} is not a Neuron device, core or group")
        kind, index = parsed
        if kind == slices.DEVICE_KIND:
            device = inventory.device(index)
            if device is None:
                raise ClaimRefused(f"{name}: no such Neuron device on this node")
            devices.add(index)
            share = _share_size(result, name, len(device.logical_cores))
            if share is None:
                cores.update(_unshared(name, device.logical_cores, others_shares))
            else:
                block = _share_block(inventory, configs[request].logical_neuron_core)
                key = (request, name, str(result.get("shareID") or ""))
                chosen = _choose_share(
                    name,
                    tuple(sorted(device.logical_cores)),
                    share,
                    block,
                    set() if admin else taken,
                    (kept or {}).get(key),
                )
                share_cores[position] = chosen
                if not admin:
                    taken.update(chosen)
                cores.update(chosen)
            holder = index
        else:
            core = inventory.core(index)
            if core is None:
                raise ClaimRefused(f"{name}: no such NeuronCore on this node")
            devices.add(core.device)
            cores.update(_unshared(name, (index,), others_shares))
            holder = core.device
        taint = taints.get(holder)
        if taint is None or not tolerates(result.get("tolerations") or [], taint):
            untolerated.add(holder)
    sick = sorted({d for devices, _ in per_request.values() for d in devices if d in unhealthy and d in untolerated})
    if sick:
        raise ClaimRefused(
            "allocated Neuron device(s) are unhealthy: " + "; ".join(f"neuron{d}: {unhealthy[d]}" for d in sick)
        )
    edits = {}
    for request, (devices, cores) in sorted(per_request.items()):
        config = configs[request]
        try:
            request_env = env(inventory, cores, config.logical_neuron_core)
            if config.ultraserver_mode is not None:
                request_env.update(ultraserver_env(ultraserver, config.ultraserver_mode))
        except ValueError as exc:
            raise ClaimRefused(f"request {request!r}: {exc}") from exc
        edits[cdi_device_name(uid, request)] = cdi.container_edits(devices, host_dev_root, request_env)
    first_of_request: set[str] = set()
    prepared: list[PreparedDevice] = []
    for position, result in enumerate(results):
        request = str(result["request"])
        # the request's one CDI device goes with its first device: a container naming the claim
        # or the request gets it exactly once
        ids = () if request in first_of_request else (cdi.qualified_name(CLAIM_KIND, cdi_device_name(uid, request)),)
        first_of_request.add(request)
        prepared.append(
            PreparedDevice(
                request,
                str(result["pool"]),
                str(result["device"]),
                ids,
                share_cores.get(position, ()),
                str(result.get("shareID") or ""),
                bool(result.get("adminAccess")),
            )
        )
    spec = cdi.spec(CLAIM_KIND, edits)
    return PreparedClaim(uid, str(meta.get("namespace", "")), str(meta.get("name", "")), tuple(prepared), spec)


def _share_size(result: Mapping[str, Any], name: str, device_cores: int) -> int | None:
    """The cores a result takes as a share of its device (`consumedCapacity.cores`, cores as consumable
    capacity), or None for the whole device: no capacity consumed, or all of it."""
    consumed = (result.get("consumedCapacity") or {}).get(slices.CORES_CAPACITY)
    if consumed is None:
        return None
    try:
        share = int(str(consumed))
    except ValueError:
        raise ClaimRefused(f"{name}: consumed capacity cores={consumed!r} is not a whole number of cores") from None
    if not 1 <= share <= device_cores:
        raise ClaimRefused(f"{name}: consumed capacity cores={share}, the device has {device_cores}")
    return None if share == device_cores else share


def _share_block(inventory: NodeInventory, lnc: int | None) -> int:
    """How many of the node's logical cores make one logical core of a request's `logicalNeuronCore`
    `lnc`: a share must be whole blocks, aligned on the device's cores, or `relogical` refuses it."""
    node = inventory.lnc.value
    return lnc // node if lnc is not None and lnc > node and lnc % node == 0 else 1


def _choose_share(
    name: str,
    device_cores: tuple[int, ...],
    share: int,
    block: int,
    taken: Collection[int],
    kept: tuple[int, ...] | None,
) -> tuple[int, ...]:
    """The cores of a share of `share` cores of a device: `kept` (its cores from an earlier prepare)
    when none is taken now, else the lowest aligned blocks of `block` cores none of which is taken;
    `ClaimRefused` saying why when there are not enough."""
    if share % block:
        raise ClaimRefused(
            f"{name}: a share of {share} core(s) cannot be counted in logicalNeuronCore {block} x the node's"
            f" setting: ask for a multiple of {block} cores"
        )
    if kept and len(kept) == share and not set(kept) & set(taken) and set(kept) <= set(device_cores):
        return kept
    blocks = [device_cores[i : i + block] for i in range(0, len(device_cores) - block + 1, block)]
    free = [b for b in blocks if not set(b) & set(taken)]
    if len(free) * block < share:
        held = sum(1 for c in device_cores if c in taken)
        raise CoresHeld(
            f"{name}: the claim's share is {share} core(s) but only {len(free) * block} of the device's"
            f" {len(device_cores)} are free in blocks of {block} ({held} held by other claims on this node)"
        )
    return tuple(c for b in free[: share // block] for c in b)


def _unshared(name: str, cores: Iterable[int], shared: Collection[int]) -> Iterable[int]:
    """`cores`, or `ClaimRefused` when another claim's share of a device holds some of them."""
    overlap = sorted(set(cores) & set(shared))
    if overlap:
        raise CoresHeld(
            f"{name}: cores {id_list(overlap)} are held by another claim's share of the device (allocated"
            " before the slice layout changed? drain the node's Neuron pods when changing draDriver.coresAsCapacity)"
        )
    return cores


def share_cores(claims: Iterable[PreparedClaim]) -> set[int]:
    """The logical cores `claims` hold as shares of devices (cores as capacity); admin access holds none."""
    return {c for claim in claims for d in claim.devices if not d.admin_access for c in d.cores}


def held_cores(claims: Iterable[PreparedClaim], inventory: NodeInventory) -> set[int]:
    """The logical cores `claims` hold on this node: a share's chosen cores, a whole device's all, a
    core device its one, a group's every member's (names this node does not have hold nothing; admin
    access holds nothing, as the scheduler counts it against nothing)."""
    held: set[int] = set()
    for claim in claims:
        for d in claim.devices:
            if d.admin_access:
                continue
            if d.cores:
                held.update(d.cores)
                continue
            members: tuple[int, ...] = ()
            arc = resources.parse_dra_group(d.device)
            if arc is not None:
                size, first = arc
                members = resources.ring_arc(first, size, topology_from(inventory).device_count)
            elif d.device == resources.DRA_NODE_NAME:
                members = tuple(x.index for x in inventory.devices)
            elif (parsed := slices.parse_device_name(d.device)) is not None:
                kind, index = parsed
                if kind == slices.CORE_KIND:
                    held.add(index)
                    continue
                members = (index,)
            for member in members:
                device = inventory.device(member)
                if device is not None:
                    held.update(device.logical_cores)
    return held


def _node_members(inventory: NodeInventory, name: str) -> tuple[int, ...]:
    """Every device of an UltraServer node, or `ClaimRefused` when it is not one or misses a device."""
    it = inventory.instance_type
    if it is None or not it.ultraserver:
        raise ClaimRefused(f"{name}: this node is not an UltraServer node, so it publishes no whole-node device")
    members = tuple(range(it.devices))
    if any(inventory.device(d) is None for d in members):
        raise ClaimRefused(f"{name}: this node does not have all {it.devices} of its Neuron devices")
    return members


def _arc_members(inventory: NodeInventory, name: str, size: int, first: int) -> tuple[int, ...]:
    """The devices of a published ring arc, or `ClaimRefused` when this node has no such arc."""
    topo = topology_from(inventory)
    if topo.kind is not TopologyKind.RING:
        raise ClaimRefused(f"{name}: this node's devices are not a ring, so it publishes no arcs")
    members = resources.ring_arc(first, size, topo.device_count)
    if frozenset(members) not in topo.groups(size) or any(inventory.device(d) is None for d in members):
        raise ClaimRefused(f"{name}: no such arc of connected Neuron devices on this node")
    return members


def ultraserver_env(reading: UltraServerReading | None, nodes: int) -> dict[str, str]:
    """The runtime's UltraServer variables for a request's `UltraServerConfig` spanning `nodes` nodes
    (`neuron_model.ultraserver.ultraserver_env`), or ValueError naming the config: refused, not
    guessed, when the node's identity is none, pending or invalid, or it is in no group of `nodes`;
    while pending the kubelet asks again."""
    try:
        return runtime_env(reading, nodes)
    except ValueError as exc:
        again = "; the kubelet will ask again" if reading is not None and reading.state is State.PENDING else ""
        raise ValueError(f"UltraServerConfig ultraserverMode {nodes}: {exc}{again}") from None


def env(inventory: NodeInventory, cores: set[int], lnc: int | None = None) -> dict[str, str]:
    """The runtime's variables for `cores` (logical, in the node's setting), counted in `lnc`
    (None: the node's setting). ValueError when `lnc` is not supported here or splits a core."""
    if lnc is None or lnc == inventory.lnc.value:
        visible, setting = cores, inventory.lnc.value
    else:
        visible, setting = relogical(inventory, cores, lnc), lnc
    return {
        "NEURON_RT_VISIBLE_CORES": id_list(visible) if visible else "",
        layout.LNC_ENV: str(setting),
    }


def relogical(inventory: NodeInventory, cores: set[int], lnc: int) -> set[int]:
    """`cores` (logical indices in the node's setting) as the runtime counts them with `lnc`
    physical cores per logical one: every physical core behind them, regrouped by `lnc`.

    The runtime numbers logical cores device by device, `physical_cores // lnc` per device; the
    regrouped set must cover whole logical cores (two cores of a pair at LNC 2), or the container
    would be handed a core half of which another claim holds."""
    family = inventory.instance_type.family if inventory.instance_type else None
    supported = family.supported_lnc if family else (inventory.lnc.value,)
    if lnc not in supported:
        name = family.name if family else "this node"
        raise ValueError(
            f"logicalNeuronCore {lnc} is not supported on {name} (supported: {', '.join(map(str, supported))})"
        )
    physical: dict[int, set[int]] = {}  # device -> its physical cores behind `cores`
    per_device: dict[int, int] = {}
    for index in cores:
        core = inventory.core(index)
        holder = inventory.device(core.device) if core else None
        if core is None or holder is None:
            raise ValueError(f"neuroncore{index}: no such NeuronCore on this node")
        physical.setdefault(core.device, set()).update(core.physical)
        per_device[core.device] = holder.physical_cores
    visible: set[int] = set()
    for device, held in sorted(physical.items()):
        if per_device[device] % lnc:
            raise ValueError(f"neuron{device}'s {per_device[device]} physical cores do not divide by {lnc}")
        for group in range(per_device[device] // lnc):
            members = set(range(group * lnc, (group + 1) * lnc))
            if members <= held:
                visible.add(device * (per_device[device] // lnc) + group)
            elif members & held:
                raise ValueError(
                    f"with logicalNeuronCore {lnc} the allocated cores of neuron{device} split a logical core"
                    f" (physical cores {sorted(members)}, of which {sorted(members & held)} allocated):"
                    " allocate whole devices or cores in pairs"
                )
    return visible
