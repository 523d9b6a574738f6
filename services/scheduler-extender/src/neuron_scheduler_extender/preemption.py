"""Which pods to evict from a node so that a pod of higher priority gets a valid set there. Pure.

kube-scheduler's own preemption counts: its dry run takes lower-priority pods off a node until the
pod fits its filter plugins, which count devices and cores, never which ones. Evicting the most
recently started one-device pods of a full node frees four devices that are, most of the time, no
connected set; the extender then refuses the node and the pods were evicted for nothing. Here the
question is asked of the silicon: which of the node's lower-priority pods, once gone, leave a set
that `neuron_model.placement` (the device plugin's own rules) would give the pod.

Among the sets of victims that do, the one chosen is the best by kube-scheduler's own order for
comparing candidate nodes (`pickOneNodeForPreemption` in framework/preemption/preemption.go): the
fewest PodDisruptionBudget violations, then the lowest highest victim priority, then the fewest
victims, then the lowest sum of priorities; ties go to evicting the pods bound last (kube-scheduler
keeps the older ones, `MoreImportantPod`). With victims of one priority that is: the fewest pods.
So kube-scheduler's choice between the nodes the extender answers for is made on the same terms
as the extender's choice on each node.

How the best set is found (`choose`):
- the pools in order: victims that violate no budget, then all; within each, the lowest priority
  threshold at which freeing every pod of the pool makes the pod fit (freeing more never makes a
  valid set disappear, so no set of a lower threshold fits);
- within the pool, for a pod of one container asking for whole devices: every valid device group
  of its size (`Topology.groups`) names the pods holding any of its silicon; the best of those sets
  is the best of all, since any set that frees a group contains the holders of that group;
- otherwise (cores, several containers): every set of victims by size, smallest first, up to
  `SEARCH_LIMIT` trials, the first size that fits being the fewest; past the limit, kube-scheduler's
  own method (evict the whole pool, then spare pods, most important first, while the pod still
  fits), which leaves no victim the pod could do without, though perhaps more than the fewest.
Every answer is checked against `neuron_model.placement.refusal` before it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from neuron_model.allocator import Topology
from neuron_model.placement import FreeState, PodRequest, refusal

SEARCH_LIMIT = 256  # sets of victims tried per node and pool when no device group names them (cores)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod on the node that may be evicted: of lower priority than the preemptor, its silicon known."""

    uid: str
    key: str  # namespace/name
    priority: int
    cores: frozenset[int]  # global logical cores it holds (a whole device: all its cores)
    order: int = 0  # binding order: a greater one was bound later
    violates_pdb: bool = False  # evicting it would take a PodDisruptionBudget below its minimum


@dataclass(frozen=True, slots=True)
class Victims:
    pods: tuple[Candidate, ...]  # the most important first: kube-scheduler reads Pods[0] as the highest priority

    @property
    def pdb_violations(self) -> int:
        return sum(1 for p in self.pods if p.violates_pdb)


def cost(pods: Iterable[Candidate]) -> tuple[int, int, int, int, tuple[int, ...], tuple[str, ...]]:
    """The order victim sets are compared in, smaller is better (see the module's docstring)."""
    chosen = list(pods)
    return (
        sum(1 for p in chosen if p.violates_pdb),
        max((p.priority for p in chosen), default=-(2**31)),
        len(chosen),
        sum(p.priority for p in chosen),
        tuple(sorted(-p.order for p in chosen)),  # the latest bound first
        tuple(sorted(p.uid for p in chosen)),  # deterministic to the last tie
    )


def fits(topo: Topology, cores: Iterable[int], pod: PodRequest) -> bool:
    """Whether the pod gets valid sets on these free cores, by the device plugin's rules."""
    return not refusal(topo, FreeState.of(topo, cores), pod)


def choose(
    topo: Topology,
    free: FreeState,
    usable: frozenset[int],
    pod: PodRequest,
    candidates: Sequence[Candidate],
    limit: int = SEARCH_LIMIT,
) -> Victims | None:
    """The victims to evict for the pod; `Victims(())` when it fits without any; None when no set of
    the candidates frees a valid set. `free`: the node's free silicon now; `usable`: its healthy
    cores (a victim's cores on an unhealthy device are not freed for anyone)."""
    if fits(topo, free.cores, pod):
        return Victims(())
    pools: list[list[Candidate]] = []
    levels = sorted({c.priority for c in candidates})
    for spare_budgets in (True, False):
        for level in levels:
            pool = [c for c in candidates if c.priority <= level and not (spare_budgets and c.violates_pdb)]
            if pool and (not pools or pool != pools[-1]):
                pools.append(pool)
    for pool in pools:
        if not fits(topo, _freed(free, usable, pool), pod):
            continue
        best = _fewest(topo, free, usable, pod, pool, limit)
        assert fits(topo, _freed(free, usable, best), pod)
        return Victims(tuple(sorted(best, key=_importance)))
    return None


def _fewest(
    topo: Topology, free: FreeState, usable: frozenset[int], pod: PodRequest, pool: list[Candidate], limit: int
) -> list[Candidate]:
    """The best set of victims from a pool whose eviction as a whole makes the pod fit."""
    groups = _device_groups(topo, pod)
    if groups is not None:
        found = []
        for group in groups:
            cores = frozenset(c for d in group for c in topo.cores_of(d))
            if not cores <= usable:
                continue
            needed = cores - free.cores
            holders = [c for c in pool if c.cores & needed]
            held = frozenset().union(*(c.cores for c in holders))
            if needed <= held and fits(topo, _freed(free, usable, holders), pod):
                found.append(holders)
        if found:
            return min(found, key=cost)
    trials = 0
    for size in range(1, len(pool) + 1):
        fitting = []
        for chosen in combinations(pool, size):
            trials += 1
            if trials > limit:
                return _reprieve(topo, free, usable, pod, pool)
            if fits(topo, _freed(free, usable, chosen), pod):
                fitting.append(list(chosen))
        if fitting:
            return min(fitting, key=cost)
    return list(pool)  # unreachable: the whole pool fits


def _reprieve(
    topo: Topology, free: FreeState, usable: frozenset[int], pod: PodRequest, pool: list[Candidate]
) -> list[Candidate]:
    """kube-scheduler's method: all of the pool, then each pod spared, the most important first,
    while the pod still fits without it."""
    victims = list(pool)
    for spared in sorted(pool, key=_importance):
        rest = [v for v in victims if v is not spared]
        if fits(topo, _freed(free, usable, rest), pod):
            victims = rest
    return victims


def _device_groups(topo: Topology, pod: PodRequest) -> tuple[frozenset[int], ...] | None:
    """The valid device groups the pod could take, for a pod of one container asking for whole
    devices only; None for any other pod (its sets are not one group's)."""
    asking = [c for c in (*pod.init_containers, *pod.containers) if c.devices or c.cores]
    if len(asking) != 1 or asking[0].cores or not asking[0].devices:
        return None
    if asking[0].devices > topo.device_count:
        return ()
    return topo.groups(asking[0].devices)


def _freed(free: FreeState, usable: frozenset[int], victims: Iterable[Candidate]) -> frozenset[int]:
    cores = set(free.cores)
    for victim in victims:
        cores |= victim.cores & usable
    return frozenset(cores)


def _importance(candidate: Candidate) -> tuple[int, int, str]:
    """Most important first: higher priority, then bound earlier (kube-scheduler's MoreImportantPod)."""
    return (-candidate.priority, candidate.order, candidate.uid)
