"""Whether a whole pod's Neuron request fits a node, and on which silicon. Pure: no I/O.

A scheduler extender asks this for every candidate node; it predicts what the kubelet and the
device plugin (`neuron_model.allocator`) will do when the pod is admitted there, so a node
passes only if every container will get a valid set:
- the kubelet admits containers one by one: init containers in order, then app containers;
- per container it allocates `aws.amazon.com/neuron` (devices, `choose_devices`) and then
  `aws.amazon.com/neuroncore` (cores, `choose_cores`) on what is left (the kubelet's own order
  between the two is not fixed; a container asking for both is rare);
- silicon an init container held is reused: a later container takes from it first, and when
  that is not enough the plugin is asked with it as must-include. (When it is enough the
  kubelet picks the reused IDs itself without asking the plugin; here the plugin's choice
  among them stands in.) An app container or a restartable init container (a sidecar) keeps
  what it took out of reuse;
- a device is free for `neuron` only when all its cores are free; a core is free for
  `neuroncore` only when its device is not held whole.
The scheduler counts a pod's request as the kubelet does (`PodRequest.effective`): the larger
of the app containers' sum and the largest init container, per resource.

`fits` is what admission will do, not what hindsight could: the plugin chooses for each
container without knowing the next, so a pod of several containers can be refused where some
other assignment of valid sets exists (see the tests). Admitted there, a container would get an
invalid set; refusing the node is the right answer. For a pod of one container asking for one
resource the two agree: it fits exactly when a valid set is free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from neuron_model.allocator import (
    Choice,
    Leftover,
    Topology,
    choose_cores,
    choose_devices,
    core_refusal,
    device_refusal,
    leftover_score,
    shortage,
)


@dataclass(frozen=True, slots=True)
class FreeState:
    """What a node has free. Build it with `of` or `from_holdings`, which keep the two sets
    consistent: `devices` are the devices all of whose cores are in `cores`."""

    devices: frozenset[int]  # free for `neuron`
    cores: frozenset[int]  # free for `neuroncore` (global logical indices)

    @classmethod
    def of(cls, topo: Topology, free_cores: Iterable[int]) -> FreeState:
        cores = frozenset(free_cores)
        devices = {topo.device_of(c) for c in cores}
        return cls(frozenset(d for d in devices if cores.issuperset(topo.cores_of(d))), cores)

    @classmethod
    def from_holdings(
        cls, topo: Topology, healthy: Iterable[int], held_devices: Iterable[int], held_cores: Iterable[int]
    ) -> FreeState:
        """From the healthy devices and what pods hold: whole devices, and cores."""
        usable = set(healthy) - set(held_devices)
        held = set(held_cores)
        return cls.of(topo, (c for d in usable for c in topo.cores_of(d) if c not in held))

    def without_devices(self, topo: Topology, devices: Iterable[int]) -> FreeState:
        taken = set(devices)
        return FreeState(self.devices - taken, self.cores.difference(c for d in taken for c in topo.cores_of(d)))

    def without_cores(self, topo: Topology, cores: Iterable[int]) -> FreeState:
        taken = set(cores)
        return FreeState(self.devices - {topo.device_of(c) for c in taken}, self.cores - taken)

    def leftover(self, topo: Topology) -> Leftover:
        """How much stays usable here (see `Leftover`): compare it between nodes, greater is better."""
        return leftover_score(topo, self.cores)


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    devices: int = 0  # aws.amazon.com/neuron
    cores: int = 0  # aws.amazon.com/neuroncore
    name: str = ""
    restartable: bool = False  # an init container with restartPolicy Always (a sidecar)


@dataclass(frozen=True, slots=True)
class PodRequest:
    init_containers: tuple[ContainerRequest, ...] = ()
    containers: tuple[ContainerRequest, ...] = ()

    @property
    def effective(self) -> ContainerRequest:
        """The request the scheduler counts, per resource: the larger of the app containers'
        sum and the largest init container (sidecars count from their start on, as upstream)."""
        devices = cores = 0
        sidecar_devices = sidecar_cores = 0
        for init in self.init_containers:
            if init.restartable:
                sidecar_devices += init.devices
                sidecar_cores += init.cores
                devices, cores = max(devices, sidecar_devices), max(cores, sidecar_cores)
            else:
                devices = max(devices, sidecar_devices + init.devices)
                cores = max(cores, sidecar_cores + init.cores)
        devices = max(devices, sidecar_devices + sum(c.devices for c in self.containers))
        cores = max(cores, sidecar_cores + sum(c.cores for c in self.containers))
        return ContainerRequest(devices, cores)


@dataclass(frozen=True, slots=True)
class ContainerPlacement:
    devices: tuple[int, ...]  # device indices, sorted
    cores: tuple[int, ...]  # global logical core indices, sorted


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the pod goes on this node, or why it cannot."""

    containers: tuple[ContainerPlacement, ...]  # init containers in order, then app containers; () if refused
    free_after: FreeState  # the node once the pod holds its silicon; unchanged if refused
    reason: str = ""  # why the pod does not fit, for a person to act on; empty when it fits

    @property
    def fits(self) -> bool:
        return not self.reason


_Chooser = Callable[[Topology, Iterable[int], Iterable[int], int], Choice]


def place(topo: Topology, free: FreeState, pod: PodRequest) -> Placement:
    """Allocate the pod as the kubelet would, container by container, with the plugin's choices."""
    total = pod.effective
    if total.devices > len(free.devices):
        return Placement((), free, shortage(f"{total.devices} devices", free.devices, "devices"))
    if total.devices * topo.cores_per_device + total.cores > len(free.cores):
        requested = f"{total.devices} devices and {total.cores} cores" if total.devices else f"{total.cores} cores"
        return Placement((), free, shortage(requested, free.cores, "cores", ranges=True))

    ordered = [(c, not c.restartable) for c in pod.init_containers] + [(c, False) for c in pod.containers]
    named = sum(1 for c, _ in ordered if c.devices or c.cores) > 1
    state = free
    reused_devices: frozenset[int] = frozenset()
    reused_cores: frozenset[int] = frozenset()
    placed: list[ContainerPlacement] = []
    for position, (container, lends) in enumerate(ordered):
        devices = _allocate(topo, choose_devices, state.devices, reused_devices, container.devices)
        cores = Choice((), True)
        if devices.valid:
            state = state.without_devices(topo, devices.ids)
            cores = _allocate(topo, choose_cores, state.cores, reused_cores, container.cores)
            state = state.without_cores(topo, cores.ids)
        refused = next((choice.reason for choice in (devices, cores) if not choice.valid), "")
        if refused:
            return Placement((), free, f"{_label(pod, position)}: {refused}" if named else refused)
        if lends:  # an init container that ran to completion: later containers take its silicon first
            reused_devices |= set(devices.ids)
            reused_cores |= set(cores.ids)
        else:
            reused_devices -= set(devices.ids)
            reused_cores -= set(cores.ids)
        placed.append(ContainerPlacement(devices.ids, cores.ids))
    return Placement(tuple(placed), state)


def refusal(topo: Topology, free: FreeState, pod: PodRequest) -> str:
    """`place(topo, free, pod).reason` ("" when the pod fits), without choosing the sets when
    only one container asks, and for one resource: a filter's usual question, asked per node."""
    asking = [c for c in (*pod.init_containers, *pod.containers) if c.devices or c.cores]
    if len(asking) == 1 and not (asking[0].devices and asking[0].cores):
        if asking[0].devices:
            return device_refusal(topo, free.devices, asking[0].devices)
        return core_refusal(topo, free.cores, asking[0].cores)
    return place(topo, free, pod).reason


def _allocate(topo: Topology, choose: _Chooser, free: frozenset[int], reused: frozenset[int], size: int) -> Choice:
    if size == 0:
        return Choice((), True)
    if len(reused) >= size:
        return choose(topo, reused, (), size)
    return choose(topo, free | reused, reused, size)


def _label(pod: PodRequest, position: int) -> str:
    if position < len(pod.init_containers):
        name = pod.init_containers[position].name
        return f'init container "{name}"' if name else f"init container {position + 1}"
    name = pod.containers[position - len(pod.init_containers)].name
    return f'container "{name}"' if name else f"container {position - len(pod.init_containers) + 1}"
