"""Filter, prioritize and the bind check over the cluster's Neuron view. Pure: no I/O, no clock.

- filter: a node passes exactly when `neuron_model.placement` says the pod fits what the node has
  free once the pods in flight there hold their silicon (`refusal`, the same answer as `place`);
- prioritize: among passing nodes, the one the placement costs least (the fewest large free device
  groups broken, then the most left over: the plugin's `Leftover`) scores highest; ranks map onto 0..10;
- bind check: the same question as filter, asked again at the one serialized point, on the
  view as it is now, including pods this extender bound a moment ago;
- UltraServer groups (`groups`): a group's first pod passes only on an UltraServer group of nodes
  where the whole group fits, which is then reserved for it (`ClusterView.reserve`); its other pods
  pass only there, and every other pod is kept off it until the group is whole or the reservation
  lapses. A group that fits nowhere is refused on every node with the reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, cast

from neuron_model.allocator import Leftover, Topology
from neuron_model.placement import FreeState, PodRequest, refusal
from neuron_scheduler_extender import preemption
from neuron_scheduler_extender.groups import GroupRequest
from neuron_scheduler_extender.pdbs import Budget, Subject, violating
from neuron_scheduler_extender.protocol import NodeVictims
from neuron_scheduler_extender.state import (
    HOLD_TTL,
    MEMO_SHAPES,
    ClusterView,
    Domain,
    Hold,
    NodeState,
    Occupant,
    Rank,
    Refusal,
    RefusalKind,
    Share,
    Situation,
    Verdict,
    placement_of,
)

MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority


@dataclass
class FilterOutcome:
    """Every refused node is `FailedAndUnresolvableNodes`, even where evicting pods would free a
    connected set (the count free, the topology not): marking it `FailedNodes` could not make it a
    preemption candidate, and would turn "preemption is not helpful" into an error. Read in
    kube-scheduler v1.36.3: the extender filters only nodes that passed every filter plugin with the
    pods on them (schedule_one.go `findNodesThatPassExtenders`); preemption's dry run on such a node
    (default_preemption.go `SelectVictimsOnNode`) takes the lower-priority pods off and reprieves each
    while the plugins, never an extender, still pass, so every one is reprieved; zero victims is then
    an error status for the node (preemption.go `DryRunPreemption`: "expected at least one victim
    pod on node"), which the PostFilter message and the scheduler's error log carry for every such
    node, and with no other candidate the whole preemption fails with it. The preempt verb
    (`preempt`) only ever sees nodes with victims, those short by count (it could name others, as
    extender.go `convertToVictims` reads any node of its answer, but that is outside the verb's
    documented contract, so it does not). Preemption for a pod whose count fits but whose set does
    not is therefore the nodes short by count, where `preempt` picks victims that free a set."""

    passed: list[str] = field(default_factory=list)
    unresolvable: dict[str, Refusal] = field(default_factory=dict)


def judge(state: NodeState, pod: PodRequest) -> Refusal | None:
    """Why the pod cannot go to this node now, or None when it fits."""
    if state.refusal is not None:
        return state.refusal
    assert state.situation is not None
    return verdict(state.situation, pod)


# Who asks: (namespace/name, priority) of the pod, for the sets preemption holds (`ClusterView.hold`)
Asker = tuple[str, int]


def judge_held(view: ClusterView, state: NodeState, pod: PodRequest, who: Asker | None, now: dt.datetime) -> Verdict:
    """`judge`, and where room is held on the node for other pods of the asker's priority or higher
    (`Hold`), whether the pod, placed as the device plugin will place it, leaves that room: every
    sole owner's request placed after it, then each of a shared hold's owners' on what is left."""
    found = judge(state, pod)
    holds = view.holds_against(state.node, who[1], who[0], now) if who is not None else []
    if not holds or found is not None:
        return found
    assert state.topology is not None
    assert state.free is not None
    topo = state.topology
    ordered = sorted(holds, key=lambda h: len(h.shares))
    after = placement_of(topo, state.free, pod).free_after
    if _room_left(topo, after, ordered):
        return None
    # no room for them even without the pod: victims are still going (each one's deletion is seen
    # apart), and until they are, the pod is kept off the cores the preemptors would take alone
    taken = state.free.cores - after.cores
    if not _room_left(topo, state.free, ordered) and not taken & frozenset().union(*(h.cores for h in holds)):
        return None
    return Refusal(
        RefusalKind.PREEMPTION_HOLD,
        "placed here, it would leave no room for a pod that preempted for it: the set freed here is "
        "held for a pod that preempted for it",
    )


def _room_left(topo: Topology, free: FreeState, holds: Iterable[Hold]) -> bool:
    """Whether every sole owner's request fits on `free`, placed one after the other, then each of
    a shared hold's owners' on what is left."""
    for hold in holds:
        placed = [placement_of(topo, free, s.request) for s in hold.shares.values()]
        if not all(p.fits for p in placed):
            return False
        if len(placed) == 1:
            free = placed[0].free_after
    return True


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


def filter_nodes(
    view: ClusterView,
    pod: PodRequest,
    nodes: Iterable[str],
    now: dt.datetime,
    group: GroupRequest | None = None,
    key: str = "",
    who: Asker | None = None,
) -> FilterOutcome:
    """`key`: the pod's namespace/name, for a pod of a `group` (left out of its group's bound pods);
    `who`: the pod's (namespace/name, priority), kept off sets held for preemptors of its priority or higher."""
    if group is not None:
        return filter_group(view, pod, group, key, nodes, now, who)
    outcome = FilterOutcome()
    passed, unresolvable = outcome.passed, outcome.unresolvable
    asked: dict[Situation, Verdict] = {}  # this call's answers: most nodes share a few situations
    reserved = view.reserved(now)
    for state in view.nodes(nodes, now):
        held = reserved.get(state.node) if reserved else None
        if held is not None:
            unresolvable[state.node] = _reserved(held.group, held.domain)
            continue
        refused = state.refusal
        if refused is None and who is not None and view.holds_against(state.node, who[1], who[0], now):
            refused = judge_held(view, state, pod, who, now)
            if refused is None:
                passed.append(state.node)
                continue
        elif refused is None:
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


def prioritize(
    view: ClusterView, pod: PodRequest, nodes: Iterable[str], now: dt.datetime, group: GroupRequest | None = None
) -> list[tuple[str, int]]:
    """(node, score 0..10) for every node asked about; nodes where the pod does not fit score 0.

    A pod of no UltraServer group goes to a node outside the UltraServers first: they are the only
    place a group can go, and every node of theirs a small pod takes can keep a group waiting.

    The best node is the one the placement costs least: fewest free device groups lost, the
    largest sizes first (`group_loss`), then the most left over (`Leftover`: reach, then the free
    core runs, best fit). Comparing what is left rather than what is lost would send every small
    pod to the emptiest node and break up the large groups everywhere; comparing the loss sends a
    4-device pod to a node with one free row rather than split an empty node a 16-device pod needs.
    Distinct ranks are spread over 0..10, the best getting 10."""
    # node -> its class: (outside the UltraServers or not, the situation's rank), kept by the
    # situation's identity, as hashing a rank for each of a thousand nodes costs more than ranking
    ranked: list[tuple[str, tuple[bool, int] | None]] = []
    asked: dict[Situation, Rank] = {}  # this call's answers: most nodes share a few situations
    classes_of: dict[tuple[bool, int], tuple[bool, Rank]] = {}
    spare = view.ultraserver_nodes() if group is None else frozenset()
    for state in view.nodes(nodes, now):
        situation = state.situation
        if state.refusal is not None or situation is None:
            ranked.append((state.node, None))
            continue
        found = asked.get(situation, _UNKNOWN)
        if found is _UNKNOWN:
            found = asked[situation] = rank(situation, pod)
        if found is None:
            ranked.append((state.node, None))
            continue
        key = (state.node in spare, id(situation))
        if key not in classes_of:
            classes_of[key] = (key[0], found)
        ranked.append((state.node, key))
    # best first: outside the UltraServers, then the smallest loss, then the greatest leftover
    # (stable sorts, the minor key first)
    classes = sorted(set(classes_of.values()), key=lambda c: c[1][1], reverse=True)  # type: ignore[index]
    classes.sort(key=lambda c: c[1][0])  # type: ignore[index]
    classes.sort(key=lambda c: c[0])
    worst = len(classes) - 1
    score = {c: MAX_SCORE if worst == 0 else round(MAX_SCORE * (worst - i) / worst) for i, c in enumerate(classes)}
    by_key = {key: score[c] for key, c in classes_of.items()}
    return [(node, 0 if key is None else by_key[key]) for node, key in ranked]


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


def bind_refusal(
    view: ClusterView,
    pod: PodRequest,
    key: str,
    node: str,
    now: dt.datetime,
    group: GroupRequest | None = None,
    priority: int | None = None,
) -> Refusal | None:
    """Why binding the pod to the node now would over-commit it, or split its group, or take
    capacity held for another group; None when it may go. The pod itself is left out of the node's
    in-flight pods (a retried bind may find itself there)."""
    held = view.reserved(now).get(node)
    here: Domain | None = None
    if group is None:
        if held is not None:
            return _reserved(held.group, held.domain)
    else:
        if held is not None and held.group.key != group.key:
            return _reserved(held.group, held.domain)
        domains, _ = view.placed_domain(group, excluding=key)
        own = view.reservation(group.key, now)
        if own is not None:
            domains.add(own.domain)
        here = view.domain_of(node, group.nodes)
        if here is None:
            return Refusal(
                RefusalKind.GROUP_ELSEWHERE,
                f"{group.name} needs nodes of one UltraServer group of {group.nodes} nodes; "
                f"node {node} reports none (label {group.topology_key})",
            )
        if domains - {here}:
            placed = ", ".join(sorted(d[1] if d else "a node without an UltraServer identity" for d in domains))
            return _elsewhere(group, placed)
    who = (key, priority) if priority is not None else None
    refused = judge_held(view, view.node(node, now, excluding=key), pod, who, now)
    if refused is None and group is not None and here is not None:
        view.reserve(group, here, now)  # held (again) for the rest of the group from this bind on
    return refused


# --- UltraServer groups ------------------------------------------------------------------------------
def filter_group(
    view: ClusterView,
    pod: PodRequest,
    group: GroupRequest,
    key: str,
    nodes: Iterable[str],
    now: dt.datetime,
    who: Asker | None = None,
) -> FilterOutcome:
    """The nodes of the one UltraServer group of nodes the pod's group is on (where its bound pods
    are, or its reservation), else of the one this call picks and reserves: where the rest of the
    group fits, best fit first. Every other node is refused, and every node when nothing fits."""
    offered = list(nodes)
    domains, members = view.placed_domain(group, excluding=key)
    remaining = max(group.size - len(members), 1)
    chosen: Domain | None = None
    if members:
        if len(domains) != 1 or None in domains:
            placed = ", ".join(sorted(d[1] if d else "a node without an UltraServer identity" for d in domains))
            return _refuse_all(offered, Refusal(RefusalKind.GROUP_ELSEWHERE, f"{group.name} is split over {placed}"))
        chosen = next(iter(domains))
    else:
        own = view.reservation(group.key, now)
        if own is not None:
            # kept while it holds: kube-scheduler filters the next pod before the last one's bind
            # reaches the extender, and leaves out the node it assumed it on, so the room counted
            # among the nodes offered would be short by the pods in between and the group would flap
            chosen = own.domain
        else:
            found = _choose(view, pod, group, remaining, offered, now)
            if isinstance(found, Refusal):
                return _refuse_all(offered, found)
            chosen = found
    assert chosen is not None
    view.reserve(group, chosen, now)
    inside = set(view.domain_nodes(chosen))
    outcome = FilterOutcome()
    elsewhere = _elsewhere(group, chosen[1])
    for state in view.nodes(offered, now):
        if state.node not in inside:
            outcome.unresolvable[state.node] = elsewhere
            continue
        refused = judge_held(view, state, pod, who, now)
        if refused is None:
            outcome.passed.append(state.node)
        else:
            outcome.unresolvable[state.node] = refused
    return outcome


def _choose(
    view: ClusterView, pod: PodRequest, group: GroupRequest, remaining: int, offered: list[str], now: dt.datetime
) -> Domain | Refusal:
    """The UltraServer group of nodes among `offered` with room for `remaining` pods like `pod`
    and held for no other group, the tightest fit first (so the emptiest stay whole for larger
    groups), then by server id; or why there is none."""
    candidates = set(offered)
    held = view.reserved(now)
    seen: dict[Domain, int] = {}
    reserved_elsewhere = unhealthy = 0
    for node in offered:
        found = view.domain_of(node, group.nodes)
        if found is None or found in seen:
            continue
        other = held.get(node)
        if other is not None and other.group.key != group.key:
            seen[found] = -1
            reserved_elsewhere += 1
            continue
        if view.unhealthy_in(found):  # the group would be degraded at once (and evicted, with that on)
            seen[found] = -1
            unhealthy += 1
            continue
        seen[found] = _room(view, found, pod, remaining, candidates, now)
    fitting = sorted((room, d[1], d) for d, room in seen.items() if room >= remaining)
    if fitting:
        return fitting[0][2]
    what = (
        f"{group.name} ({group.size} pods of {_describe(pod)}) must share one UltraServer group of {group.nodes} nodes"
    )
    if not seen:
        why = (
            f"none of the {len(offered)} nodes offered is in one (no NeuronNode report shows an UltraServer "
            f"identity in a mode of {group.nodes} nodes)"
        )
    else:
        free = [room for room in seen.values() if room >= 0]
        why = f"none of the {len(seen)} among the nodes offered has room for {remaining} more"
        if free:
            why += f" (the roomiest has room for {max(free)})"
        if reserved_elsewhere:
            why += f"; {reserved_elsewhere} held for other groups until their pods are bound"
        if unhealthy:
            why += f"; {unhealthy} with an unhealthy node"
    return Refusal(RefusalKind.GROUP_NO_FIT, f"{what}: {why}; waiting, with none of its pods placed")


def _room(view: ClusterView, domain: Domain, pod: PodRequest, limit: int, offered: set[str], now: dt.datetime) -> int:
    """How many pods like `pod` the domain's offered nodes take, one after another as the plugin
    would hand out their sets (at most `limit`)."""
    room = 0
    for state in view.nodes((n for n in view.domain_nodes(domain) if n in offered), now):
        if state.refusal is not None or state.topology is None or state.free is None:
            continue
        room += count_placements(state.topology, state.free, pod, limit - room)
        if room >= limit:
            break
    return room


def count_placements(topology: Topology, free: FreeState, pod: PodRequest, limit: int) -> int:
    """How many pods like `pod` fit on one node one after another, each on the set the plugin would hand
    it out of what the ones before left free (at most `limit`)."""
    count = 0
    while count < limit:
        placement = placement_of(topology, free, pod)
        if not placement.fits:
            break
        free = placement.free_after
        count += 1
    return count


def _describe(pod: PodRequest) -> str:
    total = pod.effective
    parts = [f"{total.devices} devices" if total.devices else "", f"{total.cores} cores" if total.cores else ""]
    return " and ".join(p for p in parts if p) or "no Neuron resource"


def _refuse_all(nodes: list[str], why: Refusal) -> FilterOutcome:
    return FilterOutcome([], dict.fromkeys(nodes, why))


def _elsewhere(group: GroupRequest, server: str) -> Refusal:
    return Refusal(
        RefusalKind.GROUP_ELSEWHERE,
        f"{group.name} is placed on UltraServer {server} ({group.topology_key}); this node is not in it",
    )


def _reserved(group: GroupRequest, domain: Domain) -> Refusal:
    return Refusal(
        RefusalKind.RESERVED,
        f"held for {group.name} ({group.size} pods) on UltraServer {domain[1]} until its pods are bound",
    )


# --- preemption ------------------------------------------------------------------------------------
def preempt(
    view: ClusterView,
    pod: PodRequest,
    priority: int,
    candidates: Mapping[str, NodeVictims],
    now: dt.datetime,
    group: GroupRequest | None = None,
    key: str = "",
    preemptor: str = "",
) -> dict[str, NodeVictims]:
    """The preempt verb's answer: of kube-scheduler's candidate nodes, those where evicting some of
    the pods of lower priority than `priority` frees a valid set for the pod, each with the victims
    `preemption.choose` picks; the other candidates are left out.

    On each node the victims are the Neuron pods chosen here, plus those of kube-scheduler's victims
    this view does not know on the node (pods holding no Neuron silicon: its dry run chose them for
    the CPU or memory the pod needs). A pod of the view whose silicon or priority is not known (an
    older plugin's report, a pod this extender bound a moment ago) is never a victim. Where the pod
    has a valid set already, kube-scheduler's victims stand: it evicts them for what it counts.

    Victims are marked against the PodDisruptionBudgets as kube-scheduler marks them (`pdbs`), and
    NumPDBViolations counts the marked ones chosen, plus kube-scheduler's own count when some of its
    victims are kept (which of them broke a budget is not told apart).

    A pod of an UltraServer group preempts only on the UltraServer group of nodes its group is
    placed on or reserved, and only while the rest of the group fits there with every pod of lower
    priority gone; a group with none of its pods placed or reserved preempts nowhere.

    `preemptor`: the pod's namespace/name. The set it would take on the node kube-scheduler picks
    among those answered (the one where a victim named here is then deleted) is held for it
    (`ClusterView.offer`) from other pods of no higher priority until it is bound, or `HOLD_TTL`."""
    inside: set[str] | None = None
    held = view.reserved(now)
    if group is not None:
        inside = _group_room_after_eviction(view, pod, priority, group, key, now)
        if not inside:
            return {}
    answer: dict[str, NodeVictims] = {}
    if preemptor:
        view.withdraw_offers(preemptor, now)
    for state in view.nodes(list(candidates), now):
        node = state.node
        other = held.get(node)
        if (inside is not None and node not in inside) or (
            other is not None and (group is None or other.group.key != group.key)
        ):
            continue
        if state.refusal is not None or state.topology is None or state.free is None or state.capacity is None:
            continue
        occupants = view.occupants(state)
        # a set held for another preemptor of no lower priority is neither free nor to be freed
        others = view.held_against(node, priority, preemptor, now) if preemptor else frozenset()
        usable = state.capacity.cores - others
        free = FreeState.of(state.topology, state.free.cores & usable) if others else state.free
        victims = _victims_of(occupants, priority, view.budgets.values())
        chosen = preemption.choose(state.topology, free, usable, pod, victims)
        if chosen is None:
            continue
        asked = candidates[node]
        if not chosen.pods:
            answer[node] = asked
            continue
        known = {o.pod.uid for o in occupants}
        kept = tuple(u for u in asked.uids if u not in known)
        uids = tuple(v.uid for v in chosen.pods) + kept
        # the budgets kube-scheduler's own victims kept here broke are not known apart: all counted
        answer[node] = NodeVictims(uids, chosen.pdb_violations + (asked.pdb_violations if kept else 0))
        if preemptor:
            freed = FreeState.of(state.topology, free.cores.union(*(v.cores & usable for v in chosen.pods)))
            taken = freed.cores - placement_of(state.topology, freed, pod).free_after.cores
            until = now + dt.timedelta(seconds=HOLD_TTL)
            hold = Hold({preemptor: Share(pod, taken)}, priority, until)
            view.offer(node, (v.uid for v in chosen.pods), preemptor, hold)
    return answer


def _victims_of(
    occupants: Iterable[Occupant], priority: int, budgets: Iterable[Budget] = ()
) -> list[preemption.Candidate]:
    """The pods of lower priority whose silicon is known, each marked when evicting it (after the
    more important ones) would break a PodDisruptionBudget, as kube-scheduler marks them."""
    eligible = sorted(
        (o for o in occupants if o.cores and o.pod.priority is not None and o.pod.priority < priority and o.pod.uid),
        key=lambda o: (-(o.pod.priority or 0), o.pod.order),
    )
    subjects = []
    for o in eligible:
        namespace, name = o.pod.key.split("/", 1)
        subjects.append(Subject(o.pod.uid, name, namespace, dict(o.pod.labels)))
    breaking = violating(subjects, budgets)
    return [
        preemption.Candidate(
            o.pod.uid, o.pod.key, o.pod.priority or 0, o.cores or frozenset(), o.pod.order, o.pod.uid in breaking
        )
        for o in eligible
    ]


def _group_room_after_eviction(
    view: ClusterView, pod: PodRequest, priority: int, group: GroupRequest, key: str, now: dt.datetime
) -> set[str]:
    """The nodes of the group's UltraServer group of nodes (where its pods are bound, or its
    reservation) when the rest of the group fits there once every pod of lower priority is gone;
    else none."""
    domains, members = view.placed_domain(group, excluding=key)
    own = view.reservation(group.key, now)
    if own is not None:
        domains.add(own.domain)
    if len(domains) != 1 or None in domains:
        return set()
    (chosen,) = domains
    assert chosen is not None
    remaining = max(group.size - len(members), 1)
    nodes = view.domain_nodes(chosen)
    room = 0
    for state in view.nodes(nodes, now):
        if state.refusal is not None or state.topology is None or state.free is None or state.capacity is None:
            continue
        free = FreeState.of(
            state.topology,
            state.free.cores
            | {c for v in _victims_of(view.occupants(state), priority) for c in v.cores & state.capacity.cores},
        )
        room += count_placements(state.topology, free, pod, remaining - room)
    return set(nodes) if room >= remaining else set()
