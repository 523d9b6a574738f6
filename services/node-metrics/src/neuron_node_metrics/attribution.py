"""Which container holds which device and core, from the kubelet's PodResources `List`. Pure.

A `neuron` (or `neurondevice`) holding covers the device and every logical core on it; a
`neuroncore` holding covers that core. A device's own series (memory, ECC, power) name a
container only when one container holds all of it or all its held cores.

Devices held through DRA claims of driver `neuron.aws.com` (`neurondevice<N>`, `neuroncore<G>`)
and ring arcs (`neurongroup<k>-<first>`: each of its devices) are attributed the same way, with
the claim's name as well; they are not counted in `allocated`
(the device plugin's extended resources).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubelet_api.podresources_client import Holding
from neuron_model.resources import DRA_DRIVER, Kind, Resource, parse_dra_group, parse_dra_name, parse_id, ring_arc


@dataclass(frozen=True, slots=True)
class Owner:
    namespace: str
    pod: str
    container: str
    claim: str = ""  # the DRA claim the devices were allocated through ("" for the device plugin's)


@dataclass(frozen=True)
class Attribution:
    cores: Mapping[int, Owner] = field(default_factory=dict)  # global logical core -> owner
    devices: Mapping[int, Owner] = field(default_factory=dict)  # device -> sole owner
    allocated: Mapping[str, int] = field(default_factory=dict)  # resource full name -> IDs held
    dropped: int = 0  # owners beyond the cap, left unattributed


def attribute(
    holdings: Iterable[Holding],
    resources: Iterable[Resource],
    cores_of_device: Mapping[int, tuple[int, ...]],
    *,
    max_owners: int,
    max_label_length: int = 128,
    ring: int | None = None,  # the ring's length when the node's devices are a ring (DRA arcs)
) -> Attribution:
    by_name = {r.full_name: r for r in resources}
    core_owner: dict[int, Owner] = {}
    device_owners: dict[int, set[Owner]] = {}
    # device -> the holdings of it whole (or of a share of it): a DRA claim once, however many containers
    # use it; a device plugin's owner as itself
    whole_holders: dict[int, set[object]] = {}
    allocated: dict[str, int] = {}
    owners_seen: dict[Owner, None] = {}
    dropped: set[Owner] = set()
    for h in holdings:
        kind: Kind
        members: tuple[int, ...] = ()
        if h.resource == DRA_DRIVER:
            arc = parse_dra_group(h.device_id)
            if arc is not None and ring:
                kind, index, members = Kind.DEVICE, arc[1], ring_arc(arc[1], arc[0], ring)
            else:
                dra = parse_dra_name(h.device_id)
                if dra is None:
                    continue
                kind, index = dra
        else:
            resource = by_name.get(h.resource)
            if resource is None:
                continue
            parsed = parse_id(h.device_id)
            if parsed is None or parsed[0] is not resource.kind:
                continue
            kind, index = parsed
            allocated[h.resource] = allocated.get(h.resource, 0) + 1
        owner = Owner(*(v[:max_label_length] for v in (h.namespace, h.pod, h.container, h.claim)))
        if owner not in owners_seen:
            if len(owners_seen) >= max_owners:
                dropped.add(owner)
                continue
            owners_seen[owner] = None
        elif owner in dropped:
            continue
        if kind is Kind.DEVICE:
            for device in members or (index,):  # an arc: each of its devices
                for core in cores_of_device.get(device, ()):
                    core_owner[core] = owner
                device_owners.setdefault(device, set()).add(owner)
                whole_holders.setdefault(device, set()).add((owner.namespace, owner.claim) if owner.claim else owner)
        else:
            core_owner[index] = owner
            for device, cores in cores_of_device.items():
                if index in cores:
                    device_owners.setdefault(device, set()).add(owner)
                    break
    # a device two claims hold by name is shared by capacity (DRA's cores as capacity: each a share of its
    # cores, which the DRA driver chose at prepare and PodResources does not tell): its cores are left
    # unattributed rather than all given to whichever owner came last
    for device, holders in whole_holders.items():
        if len(holders) > 1:
            for core in cores_of_device.get(device, ()):
                core_owner.pop(core, None)
    devices = {d: next(iter(o)) for d, o in device_owners.items() if len(o) == 1}
    return Attribution(core_owner, devices, allocated, len(dropped))
