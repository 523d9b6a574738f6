"""Filter, prioritize and the bind check over the cluster's Neuron view. Pure: no I/O, no clock.

- filter: a node passes exactly when `neuron_model.placement` says the pod fits what the node has
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
from typing import Any, cast

from neuron_model.allocator import Leftover, Topology
from neuron_model.placement import FreeState, PodRequest, refusal
from neuron_scheduler_extender.state import (
    MEMO_SHAPES,
    ClusterView,
    NodeState,
    Rank,
    Refusal,
    RefusalKind,
    Situation,
    Verdict,
    placement_of,
)

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority


@dataclass
class FilterOutcome:
    """Every refused node is `FailedAndUnresolvableNodes`, even where evicting pods would free a
    connected set: kube-scheduler's preemption cannot find that out. Its dry run takes lower-priority
    pods off a node and runs its own filter plugins only, never an extender's; a node this extender
    refuses had already passed those plugins with every pod on it, so each victim is reprieved, no
    victim is left and the node is never a candidate. Marking it `FailedNodes` would only make
    kube-scheduler run that futile dry run on it for every attempt of every pod that fits nowhere."""

    passed: list[str] = field(default_factory=list)
    unresolvable: dict[str, Refusal] = field(default_factory=dict)


def judge(state: NodeState, pod: PodRequest) -> Refusal | None:
    """Why the pod cannot go to this node now, or None when it fits."""
    if state.refusal is not None:
        return state.refusal
    assert state.situation is not None
    return verdict(state.situation, pod)


def verdict(situation: Situation, pod: PodRequest) -> Verdict:
    """Whether the pod fits the situation, remembered in it for every node alike."""
    found = situation.verdicts.get(pod, _UNKNOWN)
    if found is _UNKNOWN:
        if len(situation.verdicts) >= MEMO_SHAPES:
            situation.verdicts.clear()
        found = situation.verdicts[pod] = verdict_of(situation.topology, situation.free, situation.capacity, pod)
    return cast(Verdict, found)


def verdict_of(topo: Topology, free: FreeState, capacity: FreeState, pod: PodRequest) -> Verdict:
    """Whether the pod fits `free` (`neuron_model.placement.refusal`), and if not, of which kind
    the refusal is (never, too few free, or no connected set among them). The reason does not name
    the node: kube-scheduler shows it per node, and sums up a pod's refusals by reason
    (`0/1000 nodes are available: 412 <reason>, ...`), which a reason naming its node would turn
    into a thousand lines."""
    reason = refusal(topo, free, pod)
    if not reason:
        return None
    if refusal(topo, capacity, pod):
        return Refusal(RefusalKind.NEVER_FITS, f"{reason}; the node cannot hold it even with every healthy device free")
    if _short(free, topo, pod):
        return Refusal(RefusalKind.INSUFFICIENT, reason)
    return Refusal(RefusalKind.NO_CONNECTED_SET, reason)


_UNKNOWN: Any = object()  # not in a memo yet (None is an answer)


def _short(free: FreeState, topo: Topology, pod: PodRequest) -> bool:
    total = pod.effective
    return total.devices > len(free.devices) or total.devices * topo.cores_per_device + total.cores > len(free.cores)


def filter_nodes(view: ClusterView, pod: PodRequest, nodes: Iterable[str], now: dt.datetime) -> FilterOutcome:
    outcome = FilterOutcome()
    passed, unresolvable = outcome.passed, outcome.unresolvable
    asked: dict[Situation, Verdict] = {}  # this call's answers: most nodes share a few situations
    for state in view.nodes(nodes, now):
        refused = state.refusal
        if refused is None:
            situation = state.situation
            assert situation is not None
            found = asked.get(situation, _UNKNOWN)
            if found is _UNKNOWN:
                found = asked[situation] = verdict(situation, pod)
            if found is None:
                passed.append(state.node)
                continue
            refused = found
        unresolvable[state.node] = refused
    return outcome


def prioritize(view: ClusterView, pod: PodRequest, nodes: Iterable[str], now: dt.datetime) -> list[tuple[str, int]]:
    """(node, score 0..10) for every node asked about; nodes where the pod does not fit score 0.

    The best node is the one the placement costs least: fewest free device groups lost, the
    largest sizes first (`group_loss`), then the most left over (`Leftover`: reach, then the free
    core runs, best fit). Comparing what is left rather than what is lost would send every small
    pod to the emptiest node and break up the large groups everywhere; comparing the loss sends a
    4-device pod to a node with one free row rather than split an empty node a 16-device pod needs.
    Distinct ranks are spread over 0..10, the best getting 10."""
    ranked: list[tuple[str, Rank]] = []
    asked: dict[Situation, Rank] = {}  # this call's answers: most nodes share a few situations
    for state in view.nodes(nodes, now):
        situation = state.situation
        if state.refusal is not None or situation is None:
            ranked.append((state.node, None))
            continue
        found = asked.get(situation, _UNKNOWN)
        if found is _UNKNOWN:
            found = asked[situation] = rank(situation, pod)
        ranked.append((state.node, found))
    # best first: the smallest loss, then the greatest leftover (two stable sorts, the minor key first)
    classes = sorted({r for r in asked.values() if r is not None}, key=lambda c: c[1], reverse=True)
    classes.sort(key=lambda c: c[0])
    worst = len(classes) - 1
    score = {c: MAX_SCORE if worst == 0 else round(MAX_SCORE * (worst - i) / worst) for i, c in enumerate(classes)}
    return [(node, 0 if r is None else score[r]) for node, r in ranked]


def rank(situation: Situation, pod: PodRequest) -> Rank:
    """What placing the pod costs in the situation, remembered in it for every node alike."""
    found = situation.ranks.get(pod, _UNKNOWN)
    if found is _UNKNOWN:
        if len(situation.ranks) >= MEMO_SHAPES:
            situation.ranks.clear()
        found = situation.ranks[pod] = rank_of(situation.topology, situation.free, pod)
    return cast(Rank, found)


def rank_of(topo: Topology, free: FreeState, pod: PodRequest) -> Rank:
    """(free groups lost, what is left) once the pod holds the set the plugin would choose; None
    when it does not fit."""
    placement = placement_of(topo, free, pod)
    if not placement.fits:
        return None
    after = leftover_of(topo, placement.free_after)
    return group_loss(leftover_of(topo, free), after), after


@lru_cache(maxsize=4096)
def leftover_of(topo: Topology, free: FreeState) -> Leftover:
    return free.leftover(topo)


def group_loss(before: Leftover, after: Leftover) -> tuple[tuple[int, int], ...]:
    """(size, free groups of that size lost), largest size first, sizes that lost none left out:
    ordered so that a greater value is a greater loss (a larger group lost outweighs any number
    of smaller ones)."""
    kept = dict(after.groups)
    return tuple((size, count - kept.get(size, 0)) for size, count in before.groups if count > kept.get(size, 0))


def bind_refusal(view: ClusterView, pod: PodRequest, key: str, node: str, now: dt.datetime) -> Refusal | None:
    """Why binding the pod to the node now would over-commit it, or None. The pod itself is left
    out of the node's in-flight pods (a retried bind may find itself there)."""
    return judge(view.node(node, now, excluding=key), pod)
