"""From an allocated ResourceClaim to what a container gets. Pure: the claim object, the node
model and the health verdicts are passed in.

A claim's devices for this driver become, per request, one CDI device: the `/dev/neuronN` nodes
of the devices holding the allocated devices or cores, `NEURON_RT_VISIBLE_CORES` (exactly the
allocated logical cores; all of a whole device's) and `NEURON_LOGICAL_NC_CONFIG` (the node's
setting, so the runtime counts cores as the slices did). One CDI device per request, not per
Neuron device: the cores of a request must reach the container as one variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dra_driver import slices
from neuron_driver import cdi, layout
from neuron_driver.inventory import NodeInventory
from neuron_model.allocator import id_list

CLAIM_KIND = f"{slices.DRIVER}/claim"


class ClaimRefused(Exception):
    """The claim cannot be prepared on this node; the message tells the user why."""


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any] = field(compare=False, repr=False, default_factory=dict)  # the CDI spec

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": [
                {"request": d.request, "pool": d.pool, "device": d.device, "cdiIds": list(d.cdi_ids)}
                for d in self.devices
            ],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            str(raw["uid"]),
            str(raw["namespace"]),
            str(raw["name"]),
            tuple(
                PreparedDevice(str(d["request"]), str(d["pool"]), str(d["device"]), tuple(map(str, d["cdiIds"])))
                for d in raw["devices"]
            ),
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
) -> PreparedClaim:
    """The prepared form of `claim` (as the API server returns it), or `ClaimRefused`: allocated,
    the same UID the kubelet asked for, its devices in this node's pool, known and healthy."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ClaimRefused(f"the claim's UID is {meta.get('uid')!r}, the kubelet asked for {uid!r} (recreated?)")
    per_request: dict[str, tuple[set[int], set[int]]] = {}  # request -> (devices, cores)
    results = _results(claim)
    for result in results:
        pool, name, request = str(result.get("pool")), str(result.get("device")), str(result.get("request"))
        if pool != node_name:
            raise ClaimRefused(f"device {name} is allocated from pool {pool!r}, this node is {node_name!r}")
        parsed = slices.parse_device_name(name)
        devices, cores = per_request.setdefault(request, (set(), set()))
        if parsed is None:
            raise ClaimRefused(f"device {name!r} is not a Neuron device or core")
        kind, index = parsed
        if kind == slices.DEVICE_KIND:
            device = inventory.device(index)
            if device is None:
                raise ClaimRefused(f"{name}: no such Neuron device on this node")
            devices.add(index)
            cores.update(device.logical_cores)
        else:
            core = inventory.core(index)
            if core is None:
                raise ClaimRefused(f"{name}: no such NeuronCore on this node")
            devices.add(core.device)
            cores.add(index)
    sick = sorted({d for devices, _ in per_request.values() for d in devices if d in unhealthy})
    if sick:
        raise ClaimRefused(
            "allocated Neuron device(s) are unhealthy: " + "; ".join(f"neuron{d}: {unhealthy[d]}" for d in sick)
        )
    edits = {
        cdi_device_name(uid, request): cdi.container_edits(devices, host_dev_root, env(inventory, cores))
        for request, (devices, cores) in sorted(per_request.items())
    }
    first_of_request: set[str] = set()
    prepared: list[PreparedDevice] = []
    for result in results:
        request = str(result["request"])
        # the request's one CDI device goes with its first device: a container naming the claim
        # or the request gets it exactly once
        ids = () if request in first_of_request else (cdi.qualified_name(CLAIM_KIND, cdi_device_name(uid, request)),)
        first_of_request.add(request)
        prepared.append(PreparedDevice(request, str(result["pool"]), str(result["device"]), ids))
    spec = cdi.spec(CLAIM_KIND, edits)
    return PreparedClaim(uid, str(meta.get("namespace", "")), str(meta.get("name", "")), tuple(prepared), spec)


def env(inventory: NodeInventory, cores: set[int]) -> dict[str, str]:
    return {
        "NEURON_RT_VISIBLE_CORES": id_list(cores) if cores else "",
        layout.LNC_ENV: str(inventory.lnc.value),
    }
