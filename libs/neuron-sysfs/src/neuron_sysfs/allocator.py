"""Choosing which devices or cores a container gets. Pure: no I/O, no clock, no logging.

Rules (`shared/reference/neuron-stack.md` section 2, "Topology rules"):
- inf1/inf2 are a ring: any N devices contiguous on the ring, never 0,2,4.
- trn1.32xlarge/trn1n.32xlarge and trn2.48xlarge are a 4x4 2D torus: groups of 1, 4 (a row),
  8 (an aligned pair of rows) or 16 devices. The same aligned groups are used on both: the
  Neuron DRA driver publishes the same `devicegroup{1,4,8,16}` sets for trn1 and trn2.
- One device, or all devices, is always valid.
- Cores: packed into the fewest devices, contiguous within each device; whole free devices
  are kept whole where a partly used device can take the request (best fit).
Among valid choices the one that leaves the most large free groups wins; ties go to the
lowest indices, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from neuron_sysfs.instance_types import InstanceType, TopologyKind
from neuron_sysfs.inventory import NodeInventory


@dataclass(frozen=True)
class Topology:
    kind: TopologyKind
    device_count: int  # devices the instance has (ring length, torus size), present or not
    adjacency: Mapping[int, tuple[int, ...]]
    cores_per_device: int  # logical cores per device
    torus_shape: tuple[int, int] | None = None

    @cached_property
    def group_sizes(self) -> tuple[int, ...]:
        """Valid device-group sizes, largest first."""
        n = self.device_count
        if self.kind is TopologyKind.RING:
            return tuple(range(n, 0, -1))
        if self.kind is TopologyKind.TORUS_2D and self.torus_shape:
            rows, cols = self.torus_shape
            sizes = {1, n}
            k = 1
            while k <= rows:
                if rows % k == 0:
                    sizes.add(k * cols)
                k *= 2
            return tuple(sorted(sizes, reverse=True))
        return (1,) if n <= 1 else (n, 1)

    def groups(self, size: int) -> tuple[frozenset[int], ...]:
        return self._groups_by_size.get(size, ())

    @cached_property
    def _groups_by_size(self) -> dict[int, tuple[frozenset[int], ...]]:
        n = self.device_count
        result: dict[int, tuple[frozenset[int], ...]] = {}
        for size in self.group_sizes:
            if size == 1:
                result[1] = tuple(frozenset({d}) for d in range(n))
            elif size == n:
                result[n] = (frozenset(range(n)),)
            elif self.kind is TopologyKind.RING:
                result[size] = tuple(
                    dict.fromkeys(frozenset((s + i) % n for i in range(size)) for s in range(n)).keys()
                )
            elif self.kind is TopologyKind.TORUS_2D and self.torus_shape:
                rows, cols = self.torus_shape
                k = size // cols
                result[size] = tuple(frozenset(range(r * cols, (r + k) * cols)) for r in range(0, rows, k))
        return result

    def device_of(self, core: int) -> int:
        return core // self.cores_per_device

    def cores_of(self, device: int) -> range:
        return range(device * self.cores_per_device, (device + 1) * self.cores_per_device)


def topology_for(instance_type: InstanceType, cores_per_device: int) -> Topology:
    """The topology the instance table promises: what a component without sysfs (the scheduler
    extender) assumes, and what `topology_from` reads on a healthy node."""
    it = instance_type
    return Topology(it.topology, it.devices, it.adjacency(), cores_per_device, it.torus_shape)


def topology_from(inventory: NodeInventory) -> Topology:
    """The topology of a scanned node: the driver's `connected_devices` win over the table."""
    cores_per_device = max(inventory.logical_cores_per_device, 1)
    it = inventory.instance_type
    if it is not None:
        return Topology(it.topology, it.devices, dict(inventory.adjacency), cores_per_device, it.torus_shape)
    count = max((d.index for d in inventory.devices), default=-1) + 1
    # Unknown instance type: only one device or all of them are known to be valid groups.
    return Topology(TopologyKind.SINGLE, count, dict(inventory.adjacency), cores_per_device, None)


@dataclass(frozen=True)
class Choice:
    ids: tuple[int, ...]  # device indices or global core indices, sorted
    valid: bool  # False: no set satisfied the topology rules; `ids` is the best available
    reason: str = ""


def _leftover_score(topo: Topology, free: frozenset[int]) -> tuple[int, ...]:
    """How many valid groups of each size (largest first) remain entirely free."""
    return tuple(sum(1 for g in topo.groups(s) if g <= free) for s in topo.group_sizes)


def _connectivity(topo: Topology, chosen: Iterable[int]) -> int:
    chosen_set = set(chosen)
    return sum(1 for a in chosen_set for b in topo.adjacency.get(a, ()) if b in chosen_set)


def _best_connected(topo: Topology, available: frozenset[int], must: frozenset[int], size: int) -> tuple[int, ...]:
    """Greedy: grow from `must` (or from each seed) by the device with most links into the set."""
    seeds = [must] if must else [frozenset({d}) for d in sorted(available)]
    best: tuple[tuple[int, int], tuple[int, ...]] | None = None
    for seed in seeds:
        chosen = set(seed)
        while len(chosen) < size:
            candidates = sorted(available - chosen)
            if not candidates:
                break
            nxt = max(candidates, key=lambda d: (sum(1 for b in topo.adjacency.get(d, ()) if b in chosen), -d))
            chosen.add(nxt)
        ids = tuple(sorted(chosen))
        key = (_connectivity(topo, ids), -sum(ids))
        if best is None or key > best[0]:
            best = (key, ids)
    return best[1] if best else tuple(sorted(must))


def choose_devices(topo: Topology, available: Iterable[int], must: Iterable[int], size: int) -> Choice:
    avail = frozenset(available) | frozenset(must)
    must_set = frozenset(must)
    if size <= 0:
        return Choice((), True)
    if size > len(avail):
        return Choice(tuple(sorted(avail)), False, f"{size} devices requested, only {len(avail)} available")
    groups = topo.groups(size)
    candidates = [g for g in groups if must_set <= g <= avail]
    if candidates:
        best = max(candidates, key=lambda g: (_leftover_score(topo, avail - g), [-d for d in sorted(g)]))
        return Choice(tuple(sorted(best)), True)
    if not groups:
        reason = (
            f"{topo.kind} topology of {topo.device_count} devices has no group of {size}; "
            f"valid sizes: {', '.join(map(str, sorted(topo.group_sizes)))}"
        )
    else:
        reason = f"no free group of {size} contiguous devices" + (f" containing {sorted(must_set)}" if must_set else "")
    return Choice(_best_connected(topo, avail, must_set, size), False, reason)


def _runs(locals_: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for x in sorted(locals_):
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return runs


def _pick_within(free_locals: list[int], must_locals: set[int], count: int) -> list[int]:
    """`count` cores of one device: contiguous if possible, including `must_locals`, leaving the
    longest free run behind (windows at the edge of the smallest fitting run)."""
    best: tuple[tuple[int, int, int], list[int]] | None = None
    for run in _runs(free_locals):
        for start in range(len(run) - count + 1):
            window = run[start : start + count]
            if not must_locals <= set(window):
                continue
            remaining = [x for x in free_locals if x not in window]
            longest = max((len(r) for r in _runs(remaining)), default=0)
            key = (longest, -len(run), -window[0])
            if best is None or key > best[0]:
                best = (key, window)
    if best is not None:
        return best[1]
    # no contiguous window: the must cores, then the lowest free ones
    rest = [x for x in sorted(free_locals) if x not in must_locals]
    return sorted(must_locals) + rest[: max(count - len(must_locals), 0)]


def choose_cores(topo: Topology, available: Iterable[int], must: Iterable[int], size: int) -> Choice:
    must_set = frozenset(must)
    avail = frozenset(available) | must_set
    if size <= 0:
        return Choice((), True)
    if size > len(avail):
        return Choice(tuple(sorted(avail)), False, f"{size} cores requested, only {len(avail)} available")
    cpd = topo.cores_per_device
    free: dict[int, list[int]] = {}
    for core in sorted(avail):
        free.setdefault(topo.device_of(core), []).append(core - topo.device_of(core) * cpd)

    chosen: set[int] = set()
    # Devices holding must-include cores are used first, as far as the request goes.
    forced = sorted({topo.device_of(c) for c in must_set})
    extra = size - len(must_set)  # cores wanted beyond the must-include ones
    for device in forced:
        must_locals = {c - device * cpd for c in must_set if topo.device_of(c) == device}
        more = min(extra, len(free[device]) - len(must_locals))
        picked = _pick_within(free[device], must_locals, len(must_locals) + more)
        chosen.update(device * cpd + x for x in picked)
        extra -= len(picked) - len(must_locals)
    need = size - len(chosen)
    if need <= 0:
        return Choice(tuple(sorted(chosen)), True)

    others = {d: locs for d, locs in free.items() if d not in forced}
    whole_free = frozenset(d for d, locs in others.items() if len(locs) == cpd)
    whole, remainder = divmod(need, cpd)
    remainder_fits = (
        remainder == 0 or len(whole_free) > whole or any(remainder <= len(locs) < cpd for locs in others.values())
    )
    if whole > len(whole_free) or not remainder_fits:
        # Not enough whole devices: fewest devices means the fullest ones first.
        for device in sorted(others, key=lambda d: (-len(others[d]), d)):
            if need <= 0:
                break
            picked = _pick_within(others[device], set(), min(need, len(others[device])))
            chosen.update(device * cpd + x for x in picked)
            need -= len(picked)
        return Choice(tuple(sorted(chosen)), True)

    anchor: set[int] = set(forced)
    if whole:
        group = choose_devices(topo, whole_free, frozenset(), whole).ids
        for device in group:
            chosen.update(topo.cores_of(device))
        anchor.update(group)
    if remainder:
        candidates = [d for d, locs in others.items() if len(locs) >= remainder and d not in anchor]

        # Best fit: the partly used device with the fewest free cores that still fits,
        # preferring a contiguous run and a neighbour of what was already chosen.
        def fit_key(d: int) -> tuple[bool, tuple[int, ...], int, int, int]:
            contiguous = max(len(r) for r in _runs(others[d])) >= remainder
            near = sum(1 for a in anchor if d in topo.adjacency.get(a, ()))
            return (contiguous, _leftover_score(topo, whole_free - {d}), -len(others[d]), near, -d)

        device = max(candidates, key=fit_key)
        picked = _pick_within(others[device], set(), remainder)
        chosen.update(device * cpd + x for x in picked)
    return Choice(tuple(sorted(chosen)), True)


def exhaustive_devices(topo: Topology, available: Iterable[int], size: int) -> list[tuple[int, ...]]:
    """Every valid group of `size` within `available` (for tests and diagnostics)."""
    avail = frozenset(available)
    return [tuple(sorted(g)) for g in topo.groups(size) if g <= avail]
