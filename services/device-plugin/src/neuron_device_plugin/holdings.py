"""Who holds which silicon, across resources, and what that forbids. Pure.

The kubelet accounts each resource on its own: it does not know that `neuron3` and
`neuroncore6`/`neuroncore7` are the same silicon. So the plugin learns the holdings of every
resource (the kubelet's PodResources `List`, plus what it handed out itself since that list
was read, so two admissions in a row cannot race) and:
- reports an ID held through another resource as Unhealthy in its own resource's list, which
  is how a device plugin says "exists, but not allocatable now" (capacity stays, allocatable
  drops);
- refuses, in Allocate, an ID held through another resource, instead of sharing silently.
Holdings through the same resource are the kubelet's business (it reuses an init
container's devices for the app container) and never conflict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from neuron_model.resources import Kind, Resource


@dataclass(frozen=True, slots=True)
class Holder:
    resource: str  # full resource name
    owner: str  # namespace/pod/container, or "pending allocation" for our own recent hand-outs


@dataclass(frozen=True)
class Holdings:
    """Device index -> holders of the whole device; global core index -> holders of the core."""

    devices: Mapping[int, frozenset[Holder]] = field(default_factory=dict)
    cores: Mapping[int, frozenset[Holder]] = field(default_factory=dict)


def build_holdings(entries: Iterable[tuple[Resource, int, str]]) -> Holdings:
    """`entries`: (resource, device or global core index, owner), from the kubelet's List and
    the plugin's own pending hand-outs."""
    devices: dict[int, set[Holder]] = {}
    cores: dict[int, set[Holder]] = {}
    for resource, index, owner in entries:
        holder = Holder(resource.full_name, owner)
        target = devices if resource.kind is Kind.DEVICE else cores
        target.setdefault(index, set()).add(holder)
    return Holdings(
        {k: frozenset(v) for k, v in devices.items()},
        {k: frozenset(v) for k, v in cores.items()},
    )


def conflicts(
    resource: Resource, index: int, holdings: Holdings, cores_of_device: Iterable[int], device_of_core: int | None
) -> list[Holder]:
    """Holders through *other* resources of the silicon behind `resource`'s ID `index`."""
    found: set[Holder] = set()
    if resource.kind is Kind.DEVICE:
        found.update(holdings.devices.get(index, ()))
        for core in cores_of_device:
            found.update(holdings.cores.get(core, ()))
    else:
        found.update(holdings.cores.get(index, ()))
        if device_of_core is not None:
            found.update(holdings.devices.get(device_of_core, ()))
    return sorted((h for h in found if h.resource != resource.full_name), key=lambda h: (h.resource, h.owner))


def unheld_cores(holdings: Holdings, cores_of_devices: Mapping[int, Iterable[int]]) -> frozenset[int]:
    """The cores of `cores_of_devices` (device -> its cores) that no one holds through any resource:
    neither the core itself nor its whole device. Unlike `conflicts`, a holding through the same
    resource counts too: this is what is left for the next pod, whichever resource it asks for."""
    return frozenset(
        core
        for device, cores in cores_of_devices.items()
        if not holdings.devices.get(device)
        for core in cores
        if not holdings.cores.get(core)
    )


def describe(holders: list[Holder]) -> str:
    return "; ".join(f"{h.owner} (as {h.resource})" for h in holders)
