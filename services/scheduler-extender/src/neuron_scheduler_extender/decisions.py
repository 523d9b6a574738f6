"""Filter, prioritize and the bind check over the cluster's Neuron view. Pure: no I/O, no clock.

- filter: a node passes exactly when `neuron_sysfs.placement` says the pod fits what the node has
  free once the pods in flight there hold their silicon (`refusal`, the same answer as `place`);
- prioritize: among passing nodes, the one the placement costs least (the fewest large free device
  groups broken, then the most left over: the plugin's `Leftover`) scores highest; ranks map onto 0..10;
- bind check: the same question as filter, asked again at the one serialized point, on the
  view as it is now, including pods this extender bound a moment ago.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from neuron_scheduler_extender.state import ClusterView, NodeState, Refusal, RefusalKind, placement_of
from neuron_sysfs.allocator import Leftover, Topology
from neuron_sysfs.placement import FreeState, PodRequest, refusal

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority


@lru_cache(maxsize=8192)  # keys share their free states with the view and the placements
def refusal_of(topo: Topology, free: FreeState, pod: PodRequest) -> str:
    """`refusal`, memoized: most nodes of a cluster share a few shapes and free states."""
    return refusal(topo, free, pod)


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, Refusal] = field(default_factory=dict)  # preemption could make room
    unresolvable: dict[str, Refusal] = field(default_factory=dict)  # nothing the scheduler does helps


def judge(state: NodeState, pod: PodRequest) -> Refusal | None:
    """Why the pod cannot go to this node now, or None when it fits."""
    if state.refusal is not None:
        return state.refusal
    assert state.topology is not None
    assert state.free is not None
    assert state.capacity is not None
    reason = refusal_of(state.topology, state.free, pod)
    if not reason:
        return None
    if refusal_of(state.topology, state.capacity, pod):
        kind = RefusalKind.NEVER_FITS
        reason = f"{reason}; node {state.node} cannot hold it even with every healthy device free"
    elif _short(state.free, state.topology, pod):
        kind = RefusalKind.INSUFFICIENT
    else:
        kind = RefusalKind.NO_CONNECTED_SET
    return Refusal(kind, reason)


def _short(free: FreeState, topo: Topology, pod: PodRequest) -> bool:
    total = pod.effective
    return total.devices > len(free.devices) or total.devices * topo.cores_per_device + total.cores > len(free.cores)


def filter_nodes(view: ClusterView, pod: PodRequest, nodes: Iterable[str], now: dt.datetime) -> FilterOutcome:
    outcome = FilterOutcome()
    for node in nodes:
        refused = judge(view.node(node, now), pod)
        if refused is None:
            outcome.passed.append(node)
        elif refused.kind.resolvable_by_preemption:
            outcome.failed[node] = refused
        else:
            outcome.unresolvable[node] = refused
    return outcome


def prioritize(view: ClusterView, pod: PodRequest, nodes: Iterable[str], now: dt.datetime) -> list[tuple[str, int]]:
    """(node, score 0..10) for every node asked about; nodes where the pod does not fit score 0.

    The best node is the one the placement costs least: fewest free device groups lost, the
    largest sizes first (`group_loss`), then the most left over (`Leftover`: reach, then the free
    core runs, best fit). Comparing what is left rather than what is lost would send every small
    pod to the emptiest node and break up the large groups everywhere; comparing the loss sends a
    4-device pod to a node with one free row rather than split an empty node a 16-device pod needs.
    Distinct ranks are spread over 0..10, the best getting 10."""
    ranked: dict[str, tuple[tuple[tuple[int, int], ...], Leftover]] = {}
    order = []
    for node in nodes:
        order.append(node)
        state = view.node(node, now)
        if state.refusal is not None or state.topology is None or state.free is None:
            continue
        placement = placement_of(state.topology, state.free, pod)
        if placement.fits:
            after = leftover_of(state.topology, placement.free_after)
            ranked[node] = (group_loss(leftover_of(state.topology, state.free), after), after)
    # best first: the smallest loss, then the greatest leftover
    classes = sorted(set(ranked.values()), key=lambda c: (c[0], _Descending(c[1])))
    position = {c: i for i, c in enumerate(classes)}
    worst = len(classes) - 1

    def score(node: str) -> int:
        if node not in ranked:
            return 0
        return MAX_SCORE if worst == 0 else round(MAX_SCORE * (worst - position[ranked[node]]) / worst)

    return [(node, score(node)) for node in order]


@lru_cache(maxsize=4096)
def leftover_of(topo: Topology, free: FreeState) -> Leftover:
    return free.leftover(topo)


def group_loss(before: Leftover, after: Leftover) -> tuple[tuple[int, int], ...]:
    """(size, free groups of that size lost), largest size first, sizes that lost none left out:
    ordered so that a greater value is a greater loss (a larger group lost outweighs any number
    of smaller ones)."""
    kept = dict(after.groups)
    return tuple((size, count - kept.get(size, 0)) for size, count in before.groups if count > kept.get(size, 0))


class _Descending:
    """Inverts the order of a value, to sort it greatest first inside an ascending key."""

    __slots__ = ("value",)

    def __init__(self, value: Leftover) -> None:
        self.value = value

    def __lt__(self, other: _Descending) -> bool:
        return other.value < self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def bind_refusal(view: ClusterView, pod: PodRequest, key: str, node: str, now: dt.datetime) -> Refusal | None:
    """Why binding the pod to the node now would over-commit it, or None. The pod itself is left
    out of the node's in-flight pods (a retried bind may find itself there)."""
    return judge(view.node(node, now, excluding=key), pod)
