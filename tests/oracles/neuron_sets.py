"""Valid Neuron device and core sets found the slow way: every subset, tried one by one.

Written without the allocator's bitmasks or searches, so that a test comparing the two can fail.
Used by the allocator's and the placement's tests, and by anything that must agree with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import combinations, pairwise

from neuron_model.allocator import Topology, topology_for
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_model.placement import PodRequest


def topology(name: str, lnc: int | None = None) -> Topology:
    """An instance type's topology at a logical-core setting (its family's default if None)."""
    it = INSTANCE_TYPES[name]
    return topology_for(it, it.logical_cores_per_device(lnc or it.family.default_lnc))


def devices_of(t: Topology, cores: Iterable[int]) -> set[int]:
    return {t.device_of(c) for c in cores}


def per_device(t: Topology, cores: Iterable[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for c in sorted(cores):
        out.setdefault(t.device_of(c), []).append(c)
    return out


def pieces(t: Topology, devices: set[int]) -> list[set[int]]:
    """The connected pieces of `devices` (breadth-first over the adjacency)."""
    left, found = set(devices), []
    while left:
        piece, frontier = set(), {min(left)}
        while frontier:
            piece |= frontier
            frontier = {b for a in frontier for b in t.adjacency.get(a, ()) if b in left} - piece
        left -= piece
        found.append(piece)
    return found


def connected(t: Topology, devices: set[int]) -> bool:
    return len(pieces(t, devices)) <= 1


def is_range(cores: Iterable[int]) -> bool:
    ordered = sorted(cores)
    return not ordered or ordered == list(range(ordered[0], ordered[0] + len(ordered)))


def longest_run(cores: Iterable[int]) -> int:
    ordered = sorted(cores)
    best = run = 1
    for a, b in pairwise(ordered):
        run = run + 1 if b == a + 1 else 1
        best = max(best, run)
    return best if ordered else 0


def contiguous_per_device(t: Topology, cores: Iterable[int]) -> bool:
    return all(is_range(on_device) for on_device in per_device(t, cores).values())


def ranges_on(t: Topology, available: set[int], size: int, devices: int) -> bool:
    """Whether a free global range of `size` cores lies on `devices` connected devices."""
    return any(
        set(range(start, start + size)) <= available
        and len(devices_of(t, range(start, start + size))) == devices
        and connected(t, devices_of(t, range(start, start + size)))
        for start in range(t.device_count * t.cores_per_device - size + 1)
    )


def exhaustive_devices(t: Topology, available: Iterable[int], size: int) -> list[tuple[int, ...]]:
    """Every valid group of `size` devices within `available`."""
    avail = frozenset(available)
    return [tuple(sorted(g)) for g in t.groups(size) if g <= avail]


def valid_core_sets(t: Topology, available: Iterable[int], must: Iterable[int], size: int) -> Iterator[set[int]]:
    """Every set of `size` cores within `available`, holding `must`, on connected devices."""
    for cores in combinations(sorted(set(available) | set(must)), size):
        if set(must) <= set(cores) and connected(t, devices_of(t, cores)):
            yield set(cores)


SetsOf = Callable[[set[int], set[int], int], Iterable[set[int]]]  # (available, must, size) -> valid sets


def exhaustive_fits(t: Topology, free_cores: set[int], pod: PodRequest) -> bool:
    """Whether some valid set for each container, in the kubelet's order and with its reuse of
    init containers' silicon, fits these free cores (a device is free when all its cores are)."""
    ordered = [(c, not c.restartable) for c in pod.init_containers] + [(c, False) for c in pod.containers]

    def options(reused: set[int], free: set[int], size: int, sets_of: SetsOf) -> Iterable[set[int]]:
        if not size:
            return [set()]
        if len(reused) >= size:
            return sets_of(reused, set(), size)
        return sets_of(free | reused, reused, size)

    def device_sets(available: set[int], must: set[int], size: int) -> Iterator[set[int]]:
        return (set(g) for g in exhaustive_devices(t, available, size) if must <= set(g))

    def core_sets(available: set[int], must: set[int], size: int) -> Iterator[set[int]]:
        return valid_core_sets(t, available, must, size)

    def go(i: int, cores: set[int], reused_devices: set[int], reused_cores: set[int]) -> bool:
        if i == len(ordered):
            return True
        container, lends = ordered[i]
        free_devices = {d for d in range(t.device_count) if set(t.cores_of(d)) <= cores}
        for devices in options(reused_devices, free_devices, container.devices, device_sets):
            left = cores - {c for d in devices for c in t.cores_of(d)}
            for taken in options(reused_cores, left, container.cores, core_sets):
                if lends:
                    reused = (reused_devices | devices, reused_cores | taken)
                else:
                    reused = (reused_devices - devices, reused_cores - taken)
                if go(i + 1, left - taken, *reused):
                    return True
        return False

    return go(0, set(free_cores), set(), set())
