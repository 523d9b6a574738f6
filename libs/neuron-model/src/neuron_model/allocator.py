"""Choosing which devices or cores one request gets. Pure: no I/O, no clock, no logging.

The device plugin answers `GetPreferredAllocation` with it and the scheduler extender predicts
that answer with it, so a node the extender passes is a node where the plugin finds the set.

Devices (`shared/reference/neuron-stack.md` section 2, "Topology rules"):
- inf1/inf2 are a ring: any N devices contiguous on the ring, never 0,2,4.
- trn1.32xlarge/trn1n.32xlarge and trn2.48xlarge/trn2u.48xlarge are a 4x4 2D torus: groups of
  1, 4 (a row), 8 (an aligned pair of rows) or 16 devices. The same aligned groups are used on
  both: the Neuron DRA driver publishes the same `devicegroup{1,4,8,16}` sets for trn1 and trn2.
- trn3 (Trainium3) devices are joined by NeuronSwitch, all to all (`TopologyKind.SWITCH`): any
  set of a node's devices is connected, whatever links the driver's `connected_devices` lists, so
  every size is valid and k free devices always make a group of k. All free devices being alike,
  the lowest indices are taken.
- One device, or all devices, is always valid.
Among valid groups the one that leaves the most large free groups wins (`Leftover.groups`);
ties go to the lowest indices, so the choice is deterministic.

Cores: the Neuron runtime needs the devices behind one process to be connected, and takes
`NEURON_RT_VISIBLE_CORES` best as one range. Core sets are ranked; the first difference decides:
1. valid: the devices holding the cores are connected in the topology's adjacency (the ring's
   or torus' links, as the driver's `connected_devices` lists them) and the must-include cores
   are in the set;
2. the fewest devices;
3. one contiguous global core range (e.g. 6-13);
4. contiguous cores within each device;
5. leftover (`Leftover`): the most large device groups left entirely free, then the largest
   core request that still fits (free cores on one connected set of devices), then the longest
   free core runs left in partly used devices (best fit: the fullest device that can take them);
6. the lowest core indices.
Every range of the fewest devices is ranked; when there is none, the connected sets of the
fewest devices are ranked up to `CANDIDATE_LIMIT` of them, found in index order.
When no valid set exists, like for devices, the choice is `valid=False` with a reason and a
best-effort set: the fewest devices, fullest first, contiguous within each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import combinations
from math import comb

from neuron_model.instance_types import InstanceType, TopologyKind

# Sets of the fewest devices ranked when no range fits. The 4x4 torus has 96 connected sets of 3
# devices and 280 of 4; on a fragmented node ranking them all would cost tens of milliseconds.
CANDIDATE_LIMIT = 64


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _mask(ids: Iterable[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask


def _piece(links: tuple[int, ...], devices: int) -> int:
    """The connected piece of `devices` (bitmasks; `links` per device) holding its lowest device."""
    piece = frontier = devices & -devices
    while frontier:
        reached = 0
        for d in _bits(frontier):
            reached |= links[d] if d < len(links) else 0
        frontier = reached & devices & ~piece
        piece |= frontier
    return piece


@dataclass(frozen=True)
class Topology:
    kind: TopologyKind
    device_count: int  # devices the instance has (ring length, torus size), present or not
    adjacency: Mapping[int, tuple[int, ...]]
    cores_per_device: int  # logical cores per device
    torus_shape: tuple[int, int] | None = None

    def __hash__(self) -> int:  # so results can be memoized per topology (the adjacency is a mapping)
        return self._hash

    @cached_property
    def _hash(self) -> int:
        links = tuple(sorted((d, tuple(sorted(n))) for d, n in self.adjacency.items()))
        return hash((self.kind, self.device_count, self.cores_per_device, self.torus_shape, links))

    @cached_property
    def group_sizes(self) -> tuple[int, ...]:
        """Valid device-group sizes, largest first."""
        n = self.device_count
        if self.kind in (TopologyKind.RING, TopologyKind.SWITCH):
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
        if self.kind is TopologyKind.SWITCH:  # every set: C(n, size) of them, so made only when asked
            if not 1 <= size <= self.device_count:
                return ()
            return tuple(frozenset(c) for c in combinations(range(self.device_count), size))
        return self._groups_by_size.get(size, ())

    @cached_property
    def _groups_by_size(self) -> dict[int, tuple[frozenset[int], ...]]:
        n = self.device_count
        result: dict[int, tuple[frozenset[int], ...]] = {}
        if self.kind is TopologyKind.SWITCH:
            return result  # groups() makes them; nothing here enumerates a switch's 2^n sets
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

    @cached_property
    def group_masks(self) -> dict[int, tuple[int, ...]]:
        """The valid groups of each size as device bitmasks, largest size first (none for a
        switch: its every set is valid, and `_groups_left` counts them without listing them)."""
        if self.kind is TopologyKind.SWITCH:
            return {}
        return {size: tuple(_mask(g) for g in self.groups(size)) for size in self.group_sizes}

    @cached_property
    def neighbour_masks(self) -> tuple[int, ...]:
        """Each device's linked devices as a bitmask, indexed by device."""
        count = max([self.device_count, *(d + 1 for d in self.adjacency)])
        if self.kind is TopologyKind.SWITCH:  # all to all, whatever the driver lists
            everyone = (1 << count) - 1
            return tuple(everyone & ~(1 << d) for d in range(count))
        return tuple(_mask(self.adjacency.get(d, ())) for d in range(count))

    def connected(self, devices: int) -> bool:
        """Whether the devices (a bitmask) form one connected piece of the adjacency (on a switch:
        always)."""
        if self.kind is TopologyKind.SWITCH:
            return True
        return _piece(self.neighbour_masks, devices) == devices

    def device_of(self, core: int) -> int:
        return core // self.cores_per_device

    def cores_of(self, device: int) -> range:
        return range(device * self.cores_per_device, (device + 1) * self.cores_per_device)


def topology_for(instance_type: InstanceType, cores_per_device: int) -> Topology:
    """The topology the instance table promises: what a component without sysfs (the scheduler
    extender) assumes, and what `topology_from` reads on a healthy node."""
    it = instance_type
    return Topology(it.topology, it.devices, it.adjacency(), cores_per_device, it.torus_shape)


@dataclass(frozen=True)
class Choice:
    ids: tuple[int, ...]  # device indices or global core indices, sorted
    valid: bool  # False: no set satisfied the topology rules; `ids` is the best available
    reason: str = ""


@dataclass(frozen=True, order=True, slots=True)
class Leftover:
    """What stays free, ordered so that more (of the larger) compares greater; comparable
    between nodes of different shapes."""

    groups: tuple[tuple[int, int], ...]  # (group size, valid device groups of it entirely free), largest first
    reach: int  # the most free cores on one connected set of devices: the largest core request that fits
    fragments: tuple[int, ...]  # free core runs within partly used devices, longest first


@lru_cache(maxsize=1 << 16)  # a pure function of a node's free devices, asked again for every candidate
def _groups_left(topo: Topology, free_devices: int) -> tuple[tuple[int, int], ...]:
    # Sizes with no free group are left out: then larger-first comparison reads "keeps the
    # largest group", and agrees with comparing counts size by size on one topology.
    if topo.kind is TopologyKind.SWITCH:  # every set of the f free devices: C(f, k) groups of k
        free = (free_devices & ((1 << topo.device_count) - 1)).bit_count()
        return tuple((size, comb(free, size)) for size in range(free, 0, -1))
    counts = ((size, sum(1 for g in masks if g & free_devices == g)) for size, masks in topo.group_masks.items())
    return tuple((size, count) for size, count in counts if count)


def _pieces(links: tuple[int, ...], devices: int) -> list[int]:
    """The connected pieces of a set of devices (bitmasks)."""
    pieces = []
    while devices:
        pieces.append(_piece(links, devices))
        devices &= ~pieces[-1]
    return pieces


def _reach(links: tuple[int, ...], free_per_device: Mapping[int, int]) -> int:
    """The most free cores on one connected piece of the devices that have free cores."""
    pieces = _pieces(links, _mask(d for d, n in free_per_device.items() if n))
    return max((sum(free_per_device[d] for d in _bits(piece)) for piece in pieces), default=0)


def leftover_score(topo: Topology, free_cores: Iterable[int]) -> Leftover:
    """How much stays usable on a node whose free cores are `free_cores` (a device with every
    core free is a free device): the valid device groups entirely free, largest first; the
    largest core request that still fits; the free core runs of partly used devices."""
    per_device: dict[int, list[int]] = {}
    for core in sorted(set(free_cores)):
        per_device.setdefault(topo.device_of(core), []).append(core % topo.cores_per_device)
    whole = _mask(d for d, locals_ in per_device.items() if len(locals_) == topo.cores_per_device)
    fragments = sorted(
        (len(run) for d, locals_ in per_device.items() if not whole >> d & 1 for run in _runs(locals_)), reverse=True
    )
    reach = _reach(topo.neighbour_masks, {d: len(locals_) for d, locals_ in per_device.items()})
    return Leftover(_groups_left(topo, whole), reach, tuple(fragments))


def id_list(ids: Iterable[int], *, ranges: bool = False) -> str:
    """`1,2,3,5` or, with `ranges`, `1-3,5` (how NEURON_RT_VISIBLE_CORES writes ranges)."""
    ordered = sorted(set(ids))
    if not ranges:
        return ",".join(map(str, ordered)) or "none"
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in _runs(ordered)) or "none"


def shortage(requested: str, free: Collection[int], unit: str, *, ranges: bool = False) -> str:
    """Why a request cannot fit by count alone, with what is free."""
    return f"{requested} requested, only {len(free)} {unit} free (free: {id_list(free, ranges=ranges)})"


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
    if topo.kind is TopologyKind.SWITCH:
        # Every set is connected and every free device alike: the must devices, then the lowest.
        if len(must_set) <= size <= len(avail):
            rest = sorted(d for d in avail - must_set if 0 <= d < topo.device_count)
            chosen = tuple(sorted(must_set | set(rest[: size - len(must_set)])))
            if len(chosen) == size:
                return Choice(chosen, True)
        return Choice(tuple(sorted(avail))[:size], False, _devices_refused(topo, avail, must_set, size))
    candidates = [g for g in topo.groups(size) if must_set <= g <= avail]
    if candidates:
        free = _mask(avail)
        best = max(candidates, key=lambda g: (_groups_left(topo, free & ~_mask(g)), [-d for d in sorted(g)]))
        return Choice(tuple(sorted(best)), True)
    best_effort = tuple(sorted(avail)) if size > len(avail) else _best_connected(topo, avail, must_set, size)
    return Choice(best_effort, False, _devices_refused(topo, avail, must_set, size))


def device_refusal(topo: Topology, available: Iterable[int], size: int) -> str:
    """Why `choose_devices` would find no valid group of `size` among `available` (and no
    must-include), or "" when it would find one: the same answer, without choosing."""
    avail = frozenset(available)
    free = _mask(avail)
    if topo.kind is TopologyKind.SWITCH and 0 < size <= len(avail & frozenset(range(topo.device_count))):
        return ""
    if size <= 0 or any(g & free == g for g in topo.group_masks.get(size, ())):
        return ""
    return _devices_refused(topo, avail, frozenset(), size)


def _devices_refused(topo: Topology, avail: frozenset[int], must: frozenset[int], size: int) -> str:
    if size > len(avail):
        return shortage(f"{size} devices", avail, "devices")
    if len(must) > size:
        return f"{len(must)} must-include devices exceed the {size} requested"
    if topo.kind is TopologyKind.SWITCH:
        on_node = avail & frozenset(range(topo.device_count))
        where = f"{topo.device_count}-device switch"
        return f"only {len(on_node)} of the free devices are on this {where} (free: {id_list(avail)})"
    if not topo.groups(size):
        return (
            f"{topo.kind} topology of {topo.device_count} devices has no group of {size}; "
            f"valid sizes: {', '.join(map(str, sorted(topo.group_sizes)))}"
        )
    containing = f" containing {id_list(must)}" if must else ""
    return f"no connected set of {size} free devices{containing} (free: {id_list(avail)})"


def _runs(locals_: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for x in sorted(locals_):
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return runs


def _contiguous(ids: Iterable[int]) -> bool:
    ordered = sorted(ids)
    return not ordered or ordered[-1] - ordered[0] == len(ordered) - 1


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


_Rank = tuple[bool, bool, Leftover, list[int]]


class _CoreSearch:
    """One `choose_cores` call's view of the free cores, per device, with device sets as bitmasks."""

    def __init__(self, topo: Topology, avail: frozenset[int], must: frozenset[int]) -> None:
        self.topo = topo
        cpd = topo.cores_per_device
        self.free: dict[int, list[int]] = {}
        for core in sorted(avail):
            self.free.setdefault(core // cpd, []).append(core % cpd)
        self.must: dict[int, set[int]] = {d: set() for d in self.free}
        for core in must:
            self.must[core // cpd].add(core % cpd)
        self.must_cores = must
        self.usable = _mask(self.free)
        self.forced = _mask(d for d, locals_ in self.must.items() if locals_)
        self.whole = _mask(d for d, locals_ in self.free.items() if len(locals_) == cpd)
        self.fragments = {d: [len(r) for r in _runs(self.free[d])] for d in self.free if not self.whole >> d & 1}
        # per device: the fewest cores a contiguous pick must take (to span its must cores) and the most it can
        self.span = {d: _span(m) for d, m in self.must.items()}
        self.room = {d: _window_room(self.free[d], m) for d, m in self.must.items()}
        self.links = topo.neighbour_masks + (0,) * (max(self.free) + 1 - len(topo.neighbour_masks))
        self.pieces = [(p, sum(len(self.free[d]) for d in _bits(p))) for p in _pieces(self.links, self.usable)]
        self.prefix = [0]  # free cores below each global index, for O(1) range checks
        for core in range((max(self.free) + 1) * cpd):
            self.prefix.append(self.prefix[-1] + (core in avail))
        self._groups: dict[int, tuple[tuple[int, int], ...]] = {}
        self._picks: dict[tuple[int, int], list[int]] = {}

    def fewest_possible(self, size: int) -> int:
        """Devices needed if connectivity did not matter: the must devices, then the fullest."""
        count = self.forced.bit_count()
        total = sum(len(self.free[d]) for d in _bits(self.forced))
        for free in sorted((len(v) for d, v in self.free.items() if not self.forced >> d & 1), reverse=True):
            if total >= size:
                break
            total += free
            count += 1
        return max(count, 1)

    def most_possible(self, size: int) -> int:
        # every device holds at least one chosen core, a must device all of its must cores
        return min(self.usable.bit_count(), size - len(self.must_cores) + self.forced.bit_count())

    def ranges(self, size: int, devices: int) -> list[int]:
        """Start cores of every free global range of `size` cores, holding the must cores, on
        exactly `devices` connected devices."""
        cpd = self.topo.cores_per_device
        end = len(self.prefix) - 1
        lo = min(self.must_cores, default=end)
        hi = max(self.must_cores, default=-1)
        starts = []
        connected: dict[int, bool] = {}
        for start in range(max(0, hi - size + 1), min(lo, end - size) + 1):
            if self.prefix[start + size] - self.prefix[start] != size:
                continue
            first, last = start // cpd, (start + size - 1) // cpd
            if last - first + 1 != devices:
                continue
            if first not in connected:
                connected[first] = self.topo.connected(((1 << devices) - 1) << first)
            if connected[first]:
                starts.append(start)
        return starts

    def connected_sets(self, devices: int, size: int, limit: int) -> list[int]:
        """Connected sets of exactly `devices` usable devices holding every must device and at
        least `size` free cores, as bitmasks: at most `limit`, in index order.

        ESU enumeration (Wernicke 2006): grown from a root only through neighbours that are
        not next to the set already, so each set is met once; pruned by the free cores the
        remaining picks could add at most."""
        caps = {d: len(v) for d, v in self.free.items()}
        spare = self.usable.bit_count() - devices
        if comb(self.usable.bit_count(), spare) <= limit:
            # Nearly every usable device: fewer sets to try by what they leave out than by growing them.
            return [
                chosen
                for left_out in combinations(_bits(self.usable & ~self.forced), spare)
                if sum(caps[d] for d in left_out) <= sum(caps.values()) - size
                and self.topo.connected(chosen := self.usable & ~_mask(left_out))
            ][:limit]
        by_cap = {cap: _mask(d for d, c in caps.items() if c == cap) for cap in sorted({*caps.values()}, reverse=True)}
        links, forced = self.links, self.forced
        found: list[int] = []

        def most(candidates: int, picks: int) -> int:
            """The most free cores `picks` more devices among `candidates` could add."""
            total = 0
            for cap, having in by_cap.items():
                n = min(picks, (candidates & having).bit_count())
                total += n * cap
                picks -= n
                if not picks:
                    break
            return total

        def grow(chosen: int, extension: int, closed: int, cores: int, allowed: int) -> None:
            count = chosen.bit_count()
            if count == devices:
                if cores >= size and chosen & forced == forced:
                    found.append(chosen)
                return
            while extension and len(found) < limit:
                # Devices already tried at this level, and those before the root, never join later sets.
                if cores + most(allowed & ~chosen, devices - count) < size:
                    return
                if (forced & ~chosen & ~allowed).bit_count() or (forced & ~chosen).bit_count() > devices - count:
                    return
                pick = extension & -extension
                extension ^= pick
                d = pick.bit_length() - 1
                grown = extension | (links[d] & allowed & ~closed)
                grow(chosen | pick, grown, closed | links[d], cores + caps[d], allowed)
                allowed &= ~pick

        roots = [forced & -forced] if forced else [1 << d for d in _bits(self.usable)]
        for root in roots:
            if len(found) >= limit:
                break
            d = root.bit_length() - 1
            # With must devices every set holds the root; otherwise each set is grown from its lowest device.
            allowed = self.usable & ~root if forced else self.usable & ~((root << 1) - 1)
            grow(root, links[d] & allowed, root | links[d], caps[d], allowed)
        return found

    def groups_left(self, devices: int) -> tuple[tuple[int, int], ...]:
        """The device groups left entirely free once these devices are (partly) taken."""
        groups = self._groups.get(devices)
        if groups is None:
            groups = self._groups[devices] = _groups_left(self.topo, self.whole & ~devices)
        return groups

    def contiguous_fits(self, devices: int, size: int) -> bool:
        """Whether `size` cores fit these devices contiguously within each (one or more on each)."""
        members = list(_bits(devices))
        return sum(self.span[d] for d in members) <= size <= sum(self.room[d] for d in members)

    def shortlist(self, sets: list[int], size: int) -> list[int]:
        """The sets that can still rank first: steps 4 and 5's device groups depend on the set alone."""
        outline = {s: (self.contiguous_fits(s, size), self.groups_left(s)) for s in sets}
        best = max(outline.values())
        return [s for s in sets if outline[s] == best]

    def assign(self, devices: int, size: int) -> list[int]:
        """`size` cores on exactly these devices: at least one on each, the must cores, runs
        contiguous within each device where the free cores allow, fullest devices filled first."""
        cpd = self.topo.cores_per_device
        members = list(_bits(devices))
        contiguous = self.contiguous_fits(devices, size)
        take = {d: self.span[d] if contiguous else max(1, len(self.must[d])) for d in members}
        left = size - sum(take.values())
        for d in sorted(members, key=lambda d: (len(self.free[d]), d)):
            more = min(left, (self.room[d] if contiguous else len(self.free[d])) - take[d])
            take[d] += more
            left -= more
        return sorted(d * cpd + x for d in members for x in self.pick(d, take[d]))

    def pick(self, device: int, count: int) -> list[int]:
        key = (device, count)
        if key not in self._picks:
            self._picks[key] = _pick_within(self.free[device], self.must[device], count)
        return self._picks[key]

    def rank(self, cores: list[int], is_range: bool) -> _Rank:
        """The ranking of the module docstring, from step 3 on (greater is better)."""
        cpd = self.topo.cores_per_device
        by_device: dict[int, set[int]] = {}
        for core in cores:
            by_device.setdefault(core // cpd, set()).add(core % cpd)
        fragments = [n for d, lengths in self.fragments.items() if d not in by_device for n in lengths]
        for d, taken in by_device.items():
            fragments.extend(len(r) for r in _runs([x for x in self.free[d] if x not in taken]))
        contiguous = all(_contiguous(taken) for taken in by_device.values())
        groups = self.groups_left(_mask(by_device))
        reach = self.reach_after({d: len(taken) for d, taken in by_device.items()})
        return (
            is_range,
            contiguous,
            Leftover(groups, reach, tuple(sorted(fragments, reverse=True))),
            [-c for c in cores],
        )

    def reach_after(self, taken: Mapping[int, int]) -> int:
        """`Leftover.reach` once `taken` cores per device are gone: only pieces the choice
        touches change, and only one it empties a device of can split."""
        best = 0
        for piece, total in self.pieces:
            touched = [d for d in taken if piece >> d & 1]
            if any(taken[d] == len(self.free[d]) for d in touched):
                best = max(best, _reach(self.links, {d: len(self.free[d]) - taken.get(d, 0) for d in _bits(piece)}))
            else:
                best = max(best, total - sum(taken[d] for d in touched))
        return best


def _span(must_locals: set[int]) -> int:
    """The fewest cores a contiguous window holding every must core has (at least one)."""
    return max(must_locals) - min(must_locals) + 1 if must_locals else 1


def _window_room(free_locals: list[int], must_locals: set[int]) -> int:
    """The most cores one contiguous window of this device can hold with every must core in it."""
    fitting = [len(run) for run in _runs(free_locals) if must_locals <= set(run)]
    return max(fitting, default=0)


def choose_cores(topo: Topology, available: Iterable[int], must: Iterable[int], size: int) -> Choice:
    must_set = frozenset(must)
    avail = frozenset(available) | must_set
    if size <= 0:
        return Choice((), True)
    if size > len(avail):
        return Choice(tuple(sorted(avail)), False, _cores_refused(avail, must_set, size))
    if len(must_set) > size:
        return Choice(tuple(sorted(must_set)), False, f"{len(must_set)} must-include cores exceed the {size} requested")
    search = _CoreSearch(topo, avail, must_set)
    for devices in range(search.fewest_possible(size), search.most_possible(size) + 1):
        starts = search.ranges(size, devices)
        if starts:
            # Step 5's device groups depend on the devices alone: rank fully only the ranges keeping the most.
            kept = {s: search.groups_left(((1 << devices) - 1) << (s // topo.cores_per_device)) for s in starts}
            most = max(kept.values())
            ranges = [list(range(s, s + size)) for s in starts if kept[s] == most]
            return Choice(tuple(max((search.rank(cores, True), cores) for cores in ranges)[1]), True)
        sets = search.connected_sets(devices, size, CANDIDATE_LIMIT)
        if sets:
            picks = [search.assign(s, size) for s in search.shortlist(sets, size)]
            return Choice(tuple(max((search.rank(cores, False), cores) for cores in picks)[1]), True)
    # Best effort: the fewest devices, must devices and then the fullest, connected or not.
    chosen, total = search.forced, sum(len(search.free[d]) for d in _bits(search.forced))
    for d in sorted(search.free, key=lambda d: (-len(search.free[d]), d)):
        if total >= size:
            break
        if not chosen >> d & 1:
            chosen |= 1 << d
            total += len(search.free[d])
    return Choice(tuple(search.assign(chosen, size)), False, _cores_refused(avail, must_set, size))


def core_refusal(topo: Topology, available: Iterable[int], size: int) -> str:
    """Why `choose_cores` would find no valid set of `size` among `available` (and no
    must-include), or "" when it would find one: the same answer, without choosing."""
    avail = frozenset(available)
    if size <= 0:
        return ""
    if size <= len(avail):
        free_per_device = Counter(core // topo.cores_per_device for core in avail)
        # a connected piece with enough free cores holds a connected set of at most `size` devices
        if max(free_per_device.values()) >= size or _reach(topo.neighbour_masks, free_per_device) >= size:
            return ""
    return _cores_refused(avail, frozenset(), size)


def _cores_refused(avail: frozenset[int], must: frozenset[int], size: int) -> str:
    if size > len(avail):
        return shortage(f"{size} cores", avail, "cores", ranges=True)
    including = f" including {id_list(must, ranges=True)}" if must else ""
    return f"no connected set of {size} free cores{including} (free: {id_list(avail, ranges=True)})"
