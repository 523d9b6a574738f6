"""The cluster's Neuron view: what each node has free, from its NeuronNode report and the pods bound to it.
Pure: no I/O, no clock (callers pass `now`), no logging.

Per node:
- the latest report its device plugin published (or none, or one that cannot be read); the
  report alone says what the plugin has admitted: its free cores and the pods holding IDs;
- the pods bound to the node (`spec.nodeName` set, not Succeeded/Failed, asking for Neuron
  resources) that the report does not list yet: the kubelet has not admitted them, or the plugin
  has not published since, or it has handed them their silicon but its PodResources List has not
  named them yet (the report's pending cores). They are *in flight* and counted as if admitted:
  simulated with the plugin's own allocator (`neuron_model.placement.place`) in binding order on
  the report's free and pending cores, so two pods bound back to back never count on the same
  silicon, nor one pod on silicon besides its own; the pending cores no simulated pod takes stay held;
- pods this extender bound a moment ago (`assume`) count the same way before the watch shows
  them bound: the next filter can run before the binding is visible.
A node whose report is missing, unreadable or older than `report_max_age` is refused with that
reason. Nothing here outlives the process: a restarted extender rebuilds all of it from the API
server (the reports and the pods), so no state can go stale across restarts.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from neuron_model.allocator import Leftover, Topology
from neuron_model.placement import FreeState, Placement, PodRequest, place
from neuron_model.report import NodeReport, ReportError
from neuron_model.ultraserver import domain
from neuron_scheduler_extender.failures import GroupPlacement, GroupPod, NodeHealth, node_failure
from neuron_scheduler_extender.groups import GroupRequest
from neuron_scheduler_extender.pdbs import Budget
from neuron_scheduler_extender.pods import PodRecord, asks_for_neuron


class RefusalKind(enum.StrEnum):
    """Why a node is refused, as a metric label."""

    MISSING_REPORT = "missing_report"
    STALE_REPORT = "stale_report"
    INVALID_REPORT = "invalid_report"
    IN_FLIGHT_CONFLICT = "in_flight_conflict"  # a pod bound there does not fit what the report shows free
    NEVER_FITS = "never_fits"  # not even with every healthy device of the node free
    INSUFFICIENT = "insufficient"  # fewer devices or cores free than requested
    NO_CONNECTED_SET = "no_connected_set"  # enough free, but no valid set among them
    RESERVED = "reserved"  # held for an UltraServer group whose pods are not all bound yet
    GROUP_ELSEWHERE = "group_elsewhere"  # the pod's group is placed on another UltraServer
    GROUP_NO_FIT = "group_no_fit"  # no UltraServer has room for the pod's whole group
    PREEMPTION_HOLD = "preemption_hold"  # the free set is held for a pod that preempted for it


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: RefusalKind
    reason: str  # for a person reading `kubectl describe pod`: what is wrong and where


@dataclass(frozen=True, slots=True)
class BadReport:
    """A NeuronNode that cannot be read: the node is refused with `error` until it is fixed."""

    node: str
    error: str


ReportRecord = NodeReport | BadReport


def report_record(obj: Mapping[str, Any]) -> ReportRecord | None:
    """What the view keeps of a NeuronNode object; None for one without a name."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    try:
        return NodeReport.from_object(obj)
    except ReportError as exc:
        return BadReport(name, str(exc))


@dataclass(frozen=True, slots=True)
class BoundPod:
    key: str  # namespace/name
    uid: str
    node: str
    request: PodRequest
    order: int  # binding order, as this process saw it
    group: GroupRequest | None = None
    priority: int | None = None  # spec.priority, from the watch; None (bound by us, not seen yet): never a victim
    labels: tuple[tuple[str, str], ...] = ()


# filter's answer for a pod on a situation: None (it fits) or why not, the same for every node in it
Verdict = Refusal | None
# prioritize's cost of a pod on a situation: (free groups lost, what is left), None if it does not fit
Rank = tuple[tuple[tuple[int, int], ...], Leftover] | None
MEMO_SHAPES = 64  # pod request shapes remembered per situation (a cluster uses a few dozen): bounds the memory


class Situation:
    """What a node offers: its topology, what is free and what could ever be. Filter's and
    prioritize's answers depend on nothing else, so they are kept here per pod request, computed
    once for every node in the same situation (a fleet's empty nodes of one shape share one) and
    forgotten with it: the view makes a new situation whenever a node's free silicon changes.
    `verdicts` and `ranks` are filled by `decisions`, the only code that computes them."""

    __slots__ = ("__weakref__", "capacity", "free", "ranks", "topology", "verdicts")

    def __init__(self, topology: Topology, free: FreeState, capacity: FreeState) -> None:
        self.topology = topology
        self.free = free
        self.capacity = capacity
        self.verdicts: dict[PodRequest, Verdict] = {}
        self.ranks: dict[PodRequest, Rank] = {}


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as the filter sees it: refused, or its topology and what is free once the pods in
    flight hold their silicon."""

    node: str
    refusal: Refusal | None
    topology: Topology | None = None
    free: FreeState | None = None
    capacity: FreeState | None = None  # every healthy device free: what the node could ever offer
    in_flight: tuple[str, ...] = ()
    situation: Situation | None = None  # topology, free and capacity, shared with the nodes alike
    in_flight_cores: tuple[frozenset[int], ...] = ()  # per pod of `in_flight`: the cores it was simulated on


@dataclass(frozen=True, slots=True)
class Occupant:
    """A pod holding silicon on a node, as a preemption sees it."""

    pod: BoundPod
    cores: frozenset[int] | None  # the global logical cores it holds (a device: all its cores); None: unknown


@lru_cache(maxsize=4096)  # a few KB each (two frozensets): about 20 MB when full
def placement_of(topo: Topology, free: FreeState, pod: PodRequest) -> Placement:
    """`place`, memoized: the same (shape, free state, request) recurs across nodes and calls."""
    return place(topo, free, pod)


# An UltraServer group of nodes: (nodes in it, its server id), the value of `server_id_label(nodes)`
Domain = tuple[int, str]


@dataclass(frozen=True, slots=True)
class Reservation:
    """An UltraServer group of nodes held for a group of pods until they are all bound, or `until`."""

    group: GroupRequest
    domain: Domain
    until: dt.datetime


@dataclass(frozen=True, slots=True)
class Share:
    """What one preemptor would take where its victims go: its request, and the cores it would be
    given there when the victims were chosen."""

    request: PodRequest
    cores: frozenset[int]


@dataclass(frozen=True, slots=True)
class Hold:
    """Room a preemption makes on a node for its preemptor, kept from other pods of no higher
    priority until the preemptor is bound, or `until`. kube-scheduler counts the nominated pod on its
    node against those pods, but only by count: a core pod is not counted against a device pod's
    devices, and would take the freed set, and the preemptor preempt again elsewhere.

    What is kept is room, not cores: another pod passes where, placed as the device plugin will
    place it, it leaves the preemptor a set (`decisions.judge_held`). Keeping it off the cores
    alone is not enough: the victims often free more than the preemptor takes, and the plugin,
    which knows nothing of holds, gives the next pod cores of the held set as readily as others.

    `shares`: preemptor (namespace/name) -> its share. One owner once the extender knows whom
    kube-scheduler evicted for; until then every preemptor the victims were named for
    (`ClusterView._victim_gone`), none of them kept off the hold, and others kept off as though
    each of them were the owner (not all of them together: the room of one was made)."""

    shares: Mapping[str, Share]
    priority: int
    until: dt.datetime

    @property
    def owners(self) -> frozenset[str]:
        return frozenset(self.shares)

    @property
    def cores(self) -> frozenset[int]:
        return frozenset().union(*(s.cores for s in self.shares.values()))

    def keeping(self, owners: Callable[[str], bool]) -> Hold | None:
        """The hold of the owners `owners` keeps; None when none is left."""
        shares = {k: s for k, s in self.shares.items() if owners(k)}
        if len(shares) == len(self.shares):
            return self
        return Hold(shares, self.priority, self.until) if shares else None


HOLD_TTL = 120.0  # seconds a hold outlives the preemption: victims end, the preemptor is retried and bound


@dataclass
class _Assumed:
    pod: BoundPod
    at: float  # monotonic seconds when this process bound it


@dataclass
class ViewStats:
    reports: int
    invalid_reports: int
    stale_reports: int
    bound_pods: int
    assumed_pods: int
    in_flight_pods: int
    group_reservations: int = 0  # UltraServer groups of nodes held for a group of pods now
    groups_partial: int = 0  # groups with some pods bound, not all


@dataclass
class ClusterView:
    report_max_age: float  # seconds
    assume_ttl: float = 300.0  # an assumed binding the watch never confirms is dropped after this
    reports: dict[str, NodeReport] = field(default_factory=dict)
    invalid_reports: dict[str, str] = field(default_factory=dict)  # node -> why its NeuronNode cannot be read
    unreadable_pods: dict[str, str] = field(default_factory=dict)  # pod key -> why (counted nowhere)
    _bound: dict[str, BoundPod] = field(default_factory=dict)  # from the watch
    _assumed: dict[str, _Assumed] = field(default_factory=dict)  # bound by us, not yet seen bound
    _by_node: dict[str, set[str]] = field(default_factory=dict)  # node -> keys of pods bound or assumed there
    _order: int = 0
    # node -> (its report's heartbeat in POSIX seconds, +inf without one; its state without the
    # staleness check, which depends on the time); dropped whenever the node's report or pods change
    _cache: dict[str, tuple[float, NodeState]] = field(default_factory=dict)
    _topologies: dict[tuple[Any, ...], Topology] = field(default_factory=dict)
    group_ttl: float = 120.0  # seconds a reservation outlives the last filter or bind of its group's pods
    reservations: dict[str, Reservation] = field(default_factory=dict)  # group key -> its reservation
    _members: dict[str, set[str]] = field(default_factory=dict)  # group key -> keys of its pods bound or assumed
    _group_of: dict[str, str] = field(default_factory=dict)  # pod key -> its group key
    _domains: dict[Domain, tuple[str, ...]] | None = None  # from the reports' identities; None: to rebuild
    _ever_reserved: set[str] = field(default_factory=set)  # groups this process has reserved for
    _spare: tuple[Any, frozenset[str]] | None = None  # (the domain index it was made from, its nodes)
    # node -> its Neuron health from the Node (condition, taint), kept by group_health.NodeHealthIndex
    health: dict[str, NodeHealth] = field(default_factory=dict)
    _situations: weakref.WeakValueDictionary[tuple[Topology, FreeState, FreeState], Situation] = field(
        default_factory=weakref.WeakValueDictionary
    )
    # pod key -> the node it held silicon on, of pods the watch showed deleted or finished while their
    # node's report still lists them: see `_compute`
    _gone: dict[str, str] = field(default_factory=dict)
    _holds: dict[str, list[Hold]] = field(default_factory=dict)  # node -> the holds there
    # victim uid -> (preemptor key, node) -> the hold it would take there: the preempt verb's answers,
    # taken on the node kube-scheduler picks, which the deletion of a victim or the nomination tells
    _offers: dict[str, dict[tuple[str, str], Hold]] = field(default_factory=dict)
    budgets: dict[str, Budget] = field(default_factory=dict)  # namespace/name -> PodDisruptionBudget
    _evicted: dict[str, dict[str, str]] = field(
        default_factory=dict
    )  # node -> key -> uid of victims evicted (`nominated`)
    # pending pod key -> its status.nominatedNodeName, from the watch of nominated pods: whom
    # kube-scheduler's preemption chose each node for, so a hold there is that pod's alone
    nominations: dict[str, str] = field(default_factory=dict)

    # --- reports ---------------------------------------------------------------------------------
    def replace_reports(self, records: Iterable[ReportRecord]) -> None:
        """A fresh list of every NeuronNode."""
        before = set(self.reports) | set(self.invalid_reports)
        self.reports.clear()
        self.invalid_reports.clear()
        self._domains = None
        for record in records:
            self._put_report(record)
        for node in before | set(self.reports) | set(self.invalid_reports):
            self._touch(node)

    def apply_report(self, event: str, record: ReportRecord) -> None:
        """A watch event on a NeuronNode."""
        if event == "DELETED":
            if self.reports.pop(record.node, None) is not None:
                self._domains = None
            self.invalid_reports.pop(record.node, None)
            self._gone = {k: n for k, n in self._gone.items() if n != record.node}
            self._touch(record.node)
        else:
            self._put_report(record)

    def _put_report(self, record: ReportRecord) -> None:
        self._touch(record.node)
        if isinstance(record, BadReport):
            if self.reports.pop(record.node, None) is not None:
                self._domains = None
            self.invalid_reports[record.node] = record.error
            return
        self.invalid_reports.pop(record.node, None)
        old = self.reports.get(record.node)
        if old is None or old.ultraserver != record.ultraserver:
            self._domains = None
        self.reports[record.node] = record
        if self._gone:
            self._gone = {k: n for k, n in self._gone.items() if n != record.node or k in record.pods}
        evicted = self._evicted.get(record.node)
        if evicted:
            for key in evicted.keys() - record.pods:
                del evicted[key]
            if not evicted:
                del self._evicted[record.node]
        for key in self._by_node.get(record.node, set()) & record.pods:
            assumed = self._assumed.get(key)
            if assumed is not None and assumed.pod.node == record.node:
                # the plugin has admitted it: the report counts it from now on
                del self._assumed[key]
                self._reindex(key, record.node)

    # --- pods ------------------------------------------------------------------------------------
    def replace_pods(self, records: Iterable[PodRecord], listed_after: float) -> None:
        """A fresh list of the bound, non-terminal pods. Assumed bindings made before the list
        began (`listed_after`, monotonic seconds) and absent from it are gone: the pod finished
        or was deleted meanwhile."""
        old = self._bound
        self._bound = {}
        self.unreadable_pods.clear()
        for record in sorted(records, key=lambda r: r.scheduled_at):
            self._put_pod(record, old)
        for key, pod in old.items():
            if key not in self._bound:
                self._gone[key] = pod.node
                self._victim_gone(pod.uid)
        for key, assumed in list(self._assumed.items()):
            if assumed.at < listed_after and key not in self._bound:
                del self._assumed[key]
        self._rebuild_index()

    def apply_pod(self, event: str, record: PodRecord) -> None:
        before = self._node_of(record.key)
        if before and (event == "DELETED" or record.terminal):
            self._gone[record.key] = before
            self._victim_gone(record.uid)
        if event == "DELETED":
            self._bound.pop(record.key, None)
            self.unreadable_pods.pop(record.key, None)
            assumed = self._assumed.get(record.key)
            if assumed is not None and assumed.pod.uid == record.uid:
                del self._assumed[record.key]
        else:
            self._put_pod(record, self._bound)
        self._reindex(record.key, before)

    def _put_pod(self, record: PodRecord, previous: Mapping[str, BoundPod]) -> None:
        key = record.key
        self.unreadable_pods.pop(key, None)
        if record.terminal:
            self._bound.pop(key, None)
            assumed = self._assumed.get(key)
            if assumed is not None and assumed.pod.uid == record.uid:
                del self._assumed[key]  # it ran and finished before the watch showed it bound
            return
        if not record.node:  # an event from before the binding: an assumed binding stands
            self._bound.pop(key, None)
            return
        if self._holds or self._offers:
            self.release_holds(key, record.node)
        evicted = self._evicted.get(record.node)
        if evicted and evicted.get(key, record.uid) != record.uid:
            del evicted[key]  # a new pod of the same name: what the report lists for it is its own
        if record.request is None:
            self.unreadable_pods[key] = record.error
            self._bound.pop(key, None)
            return
        known = previous.get(key)
        assumed = self._assumed.pop(key, None)
        if known is not None and known.uid == record.uid and known.node == record.node:
            order = known.order
        elif assumed is not None and assumed.pod.uid == record.uid and assumed.pod.node == record.node:
            order = assumed.pod.order  # the watch confirms our binding: it keeps its place in line
        else:
            order = self._next_order()
        self._bound[key] = BoundPod(
            key, record.uid, record.node, record.request, order, record.group, record.priority, record.labels
        )

    def assume(
        self, key: str, uid: str, node: str, request: PodRequest, now: float, group: GroupRequest | None = None
    ) -> None:
        """This process is binding the pod: count it on the node from now on (`now`: monotonic seconds)."""
        self.release_holds(key, node)
        before = self._node_of(key)
        self._assumed[key] = _Assumed(BoundPod(key, uid, node, request, self._next_order(), group), now)
        self._reindex(key, before)

    def forget(self, key: str, uid: str) -> None:
        """The binding of an assumed pod failed: it holds nothing."""
        assumed = self._assumed.get(key)
        if assumed is not None and assumed.pod.uid == uid:
            before = self._node_of(key)
            del self._assumed[key]
            self._reindex(key, before)

    def expire_assumed(self, now: float) -> list[str]:
        """Drop assumed bindings older than `assume_ttl`, which neither the watch nor a report confirmed."""
        gone = [k for k, a in self._assumed.items() if now - a.at > self.assume_ttl]
        for key in gone:
            before = self._node_of(key)
            del self._assumed[key]
            self._reindex(key, before)
        return gone

    def bound_to(self, key: str) -> str:
        """The node a pod is bound (or being bound) to, or ""."""
        return self._node_of(key)

    def _node_of(self, key: str) -> str:
        pod = self._pod(key)
        return pod.node if pod is not None else ""

    def _pod(self, key: str) -> BoundPod | None:
        assumed = self._assumed.get(key)
        return assumed.pod if assumed is not None else self._bound.get(key)

    def _reindex(self, key: str, before: str) -> None:
        self._regroup(key)
        after = self._node_of(key)
        if before:
            self._by_node.get(before, set()).discard(key)
            self._touch(before)
        if after:
            self._by_node.setdefault(after, set()).add(key)
            self._touch(after)

    def _regroup(self, key: str) -> None:
        """Keep the pod's group membership in step with whether it is bound (or assumed) now."""
        pod = self._pod(key)
        group = pod.group.key if pod is not None and pod.group is not None else ""
        was = self._group_of.get(key, "")
        if was == group:
            return
        if was:
            members = self._members.get(was, set())
            members.discard(key)
            if not members:
                self._members.pop(was, None)
            del self._group_of[key]
        if group:
            self._members.setdefault(group, set()).add(key)
            self._group_of[key] = group

    def _rebuild_index(self) -> None:
        touched = set(self._by_node)
        self._by_node = {}
        self._members, self._group_of = {}, {}
        for key in set(self._bound) | set(self._assumed):
            self._by_node.setdefault(self._node_of(key), set()).add(key)
            self._regroup(key)
        for node in touched | set(self._by_node):
            self._touch(node)

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _touch(self, node: str) -> None:
        self._cache.pop(node, None)

    # --- PodDisruptionBudgets -------------------------------------------------------------------------
    def replace_budgets(self, records: Iterable[Budget], _listed_after: float = 0.0) -> None:
        self.budgets = {b.key: b for b in records}

    def apply_budget(self, event: str, record: Budget) -> None:
        if event == "DELETED":
            self.budgets.pop(record.key, None)
        else:
            self.budgets[record.key] = record

    # --- preemption holds ----------------------------------------------------------------------------
    def offer(self, node: str, victims: Iterable[str], key: str, hold: Hold) -> None:
        """The preempt verb named `victims` on the node for preemptor `key`: should kube-scheduler pick
        the node (it deletes them), `hold` is taken there. One pod may be named for several preemptors."""
        for uid in victims:
            self._offers.setdefault(uid, {})[(key, node)] = hold

    def withdraw_offers(self, key: str, now: dt.datetime | None = None) -> None:
        """The preemptor's answers: before a new one, or once it is placed; with `now`, every offer
        whose hold would have lapsed by then too (its preemptor deleted while pending). Its nomination
        is forgotten too: preempting again, kube-scheduler nominates it anew, and its victims may go
        before the watch shows where (taken as nominated where it was, the pod would be left out of
        the hold they make); placed, it leaves the watch."""
        self.nominations.pop(key, None)
        for uid in list(self._offers):
            offered = self._offers[uid]
            for where in [w for w, h in offered.items() if w[0] == key or (now is not None and h.until < now)]:
                del offered[where]
            if not offered:
                del self._offers[uid]

    def nominated(self, key: str, node: str) -> None:
        """kube-scheduler asks again for a preemptor it nominated to `node` (the pod's
        status.nominatedNodeName): it evicted the victims it was answered there, and its cache, which
        passed the node's count before asking, has them gone, so they have stopped (the API server
        removes a bound pod once its kubelet has). Their silicon is free for it even while this
        view's watch has yet to show their deletion; refused for that lag, the preemptor would go
        elsewhere or preempt again. The hold there is its alone from now on, and it owns no other."""
        victims = {u for u, offered in self._offers.items() if (key, node) in offered}
        hold: Hold | None = None
        if victims:
            hold = self._offers[next(iter(victims))][(key, node)]
            gone = {p.key: p.uid for k in self._by_node.get(node, ()) if (p := self._pod(k)) and p.uid in victims}
            self._evicted.setdefault(node, {}).update(gone)
            for uid in victims:
                del self._offers[uid][(key, node)]
                if not self._offers[uid]:
                    del self._offers[uid]
            self._touch(node)
        for where in list(self._holds):
            kept = []
            for held in self._holds[where]:
                if key not in held.owners:
                    kept.append(held)
                elif where == node:
                    own = held.keeping(lambda k: k == key)
                    hold = hold or own
                elif (rest := held.keeping(lambda k: k != key)) is not None:
                    kept.append(rest)
            if where == node and hold is not None:
                kept.append(hold)
            self._set_holds(where, kept)
        if hold is not None and node not in self._holds:
            self._holds[node] = [hold]

    # --- nominations: the watch of pending pods kube-scheduler has nominated -----------------------
    def replace_nominations(self, records: Iterable[tuple[str, str]]) -> None:
        self.nominations = {}
        for key, node in records:
            self._nomination(key, node)

    def apply_nomination(self, event: str, record: tuple[str, str]) -> None:
        key, node = record
        if event == "DELETED" or not node:  # bound, deleted, or the nomination cleared
            self.nominations.pop(key, None)
        else:
            self._nomination(key, node)

    def _nomination(self, key: str, node: str) -> None:
        """kube-scheduler nominated the pod to `node`: it preempted there for it (or is about to; it
        deletes the victims after the nomination). Its offers elsewhere are void, a hold it shares
        elsewhere is the others'; a hold it shares on `node` is kept for the preemptors nominated
        there. Unlike `nominated`, nothing is taken to be evicted: the victims may still run."""
        if self.nominations.get(key) == node:
            return
        self.nominations[key] = node
        if self._offers:
            for uid in list(self._offers):
                offered = self._offers[uid]
                for offer in [w for w in offered if w[0] == key and w[1] != node]:
                    del offered[offer]
                if not offered:
                    del self._offers[uid]
        for where in [n for n, held in self._holds.items() if any(key in h.owners for h in held)]:
            # on `node`: the pods nominated there (as `_victim_gone` takes it once the nomination shows)
            keep = (lambda k: self.nominations.get(k) == node) if where == node else (lambda k: k != key)
            self._set_holds(where, [h for held in self._holds[where] if (h := held.keeping(keep)) is not None])

    def _may_be_for(self, node: str) -> Callable[[str], bool]:
        """Whether a preemptor may be the one a victim on `node` was evicted for: nominated there, or
        its nomination not seen yet (it preempted a moment before: its nomination is on its way)."""
        return lambda k: self.nominations.get(k, node) == node

    def _victim_gone(self, uid: str) -> None:
        """A pod named as a victim is gone: its node's set is held. kube-scheduler evicted it for the
        preemptor it nominated to the node: when the nominations' watch has shown whom, the hold is
        that pod's (or those pods', should several be nominated there); else it is the hold of every
        preemptor it was named for there, not known to be nominated elsewhere, together, none of them
        kept off it, every other pod of no higher priority kept off, until the nomination shows.
        A victim of the same answer as one gone before on the node (the same share of a preemptor)
        is of the same eviction: the hold is narrowed to the preemptors both were named for, not
        taken again (`decisions.judge_held` would place the preemptor once per hold)."""
        by_node: dict[str, list[tuple[str, Hold]]] = {}
        for (key, node), hold in self._offers.pop(uid, {}).items():
            by_node.setdefault(node, []).append((key, hold))
        for node, offered in by_node.items():
            chosen = [(k, h) for k, h in offered if self.nominations.get(k) == node]
            # none known: those it may be for; none of those either (every one nominated elsewhere
            # since, one perhaps after this eviction): all, rather than hold nothing
            picked = chosen or [(k, h) for k, h in offered if self._may_be_for(node)(k)] or offered
            hold = Hold(
                {k: s for _, h in picked for k, s in h.shares.items()},
                max(h.priority for _, h in picked),
                max(h.until for _, h in picked),
            )
            kept = []
            for held in self._holds.get(node, ()):
                # a victim of the same answer to a preemptor as one gone before: the same eviction, for
                # a preemptor both were named for (held again, its room would be counted twice)
                same = {k: s for k, s in hold.shares.items() if held.shares.get(k) == s}
                if same:
                    hold = Hold(same, max(held.priority, hold.priority), max(held.until, hold.until))
                else:
                    kept.append(held)
            self._holds[node] = [*kept, hold]

    def release_holds(self, key: str, node: str = "") -> None:
        """The preemptor is bound (or being bound) to `node`: a hold there that may be its is used up,
        and it owns no other."""
        if self._offers:
            self.withdraw_offers(key)
        for where in [n for n, held in self._holds.items() if any(key in h.owners for h in held)]:
            kept = []
            for held in self._holds[where]:
                if key not in held.owners:
                    kept.append(held)
                elif where != node and (rest := held.keeping(lambda k: k != key)) is not None:
                    kept.append(rest)
            self._set_holds(where, kept)

    def expire_holds(self, now: dt.datetime) -> None:
        """Drop every hold and offer lapsed by `now`: `holds_against` drops them on the nodes asked
        about only, and a hold kept makes every bound pod's event look for its owner."""
        for node in [n for n, held in self._holds.items() if any(h.until < now for h in held)]:
            self._set_holds(node, [h for h in self._holds[node] if h.until >= now])
        for uid in list(self._offers):
            offered = self._offers[uid]
            for where in [w for w, h in offered.items() if h.until < now]:
                del offered[where]
            if not offered:
                del self._offers[uid]

    def _set_holds(self, node: str, holds: list[Hold]) -> None:
        if holds:
            self._holds[node] = holds
        else:
            self._holds.pop(node, None)

    def holds_against(self, node: str, priority: int, key: str, now: dt.datetime) -> list[Hold]:
        """The holds on the node for other pods than `key` of `priority` or higher: whom
        kube-scheduler counts a nominated pod against (framework.go `addGENominatedPods`)."""
        held = self._holds.get(node)
        if not held:
            return []
        if any(h.until < now for h in held):
            held = [h for h in held if h.until >= now]
            self._set_holds(node, held)
        return [h for h in held if h.priority >= priority and key not in h.owners]

    def held_against(self, node: str, priority: int, key: str, now: dt.datetime) -> frozenset[int]:
        """The cores of `holds_against`: what the preemptors would take, neither free nor to be freed
        for another preemption."""
        return frozenset().union(*(h.cores for h in self.holds_against(node, priority, key, now)))

    # --- per node --------------------------------------------------------------------------------
    def node(self, node: str, now: dt.datetime, *, excluding: str = "") -> NodeState:
        """The node's state at `now`; `excluding` leaves one pod out of the in-flight ones (the pod
        being bound, should it already show as bound)."""
        if excluding and excluding in self._by_node.get(node, set()):
            report = self.reports.get(node)
            if report is not None and report.heartbeat < self._fresh_from(now):
                return NodeState(node, _stale(report, now, self.report_max_age))
            return self._compute(node, excluding)
        return next(self.nodes((node,), now))

    def nodes(self, nodes: Iterable[str], now: dt.datetime) -> Iterator[NodeState]:
        """`node(n, now)` for each of `nodes`, in order: the filter's loop over a thousand names."""
        fresh_from = self._fresh_from(now).timestamp()
        cache = self._cache
        for node in nodes:
            cached = cache.get(node)
            if cached is None:
                report = self.reports.get(node)
                heartbeat = report.heartbeat.timestamp() if report is not None else math.inf
                cached = cache[node] = (heartbeat, self._compute(node, ""))
            if cached[0] < fresh_from:
                report = self.reports[node]
                yield NodeState(node, _stale(report, now, self.report_max_age))
            else:
                yield cached[1]

    def _fresh_from(self, now: dt.datetime) -> dt.datetime:
        """The oldest heartbeat still fresh at `now`: a report is stale when its age exceeds the limit."""
        return now - dt.timedelta(seconds=self.report_max_age)

    def _compute(self, node: str, excluding: str) -> NodeState:
        report = self.reports.get(node)
        if report is None:
            if node in self.invalid_reports:
                return NodeState(node, Refusal(RefusalKind.INVALID_REPORT, self.invalid_reports[node]))
            return NodeState(
                node,
                Refusal(
                    RefusalKind.MISSING_REPORT,
                    f"no NeuronNode report for node {node}: is the Neuron device plugin running there, "
                    "with scheduler reports enabled?",
                ),
            )
        topo = self.topology(report)
        unhealthy = {c for d in report.unhealthy_devices for c in topo.cores_of(d)}
        # A pod the watch showed deleted or finished holds nothing any more (the API server removes
        # a bound pod once its kubelet has stopped it), though its report may list it a while yet:
        # until the plugin's next List. Its cores count as free, so a pod preemption made room for
        # passes at its next attempt rather than being refused, and preempting again elsewhere.
        evicted = self._evicted.get(node, {})
        released = [
            report.pod_cores.get(k, ())
            for k in report.pods
            if (self._gone.get(k) == node and k not in self._bound and k not in self._assumed) or k in evicted
        ]
        free = FreeState.of(topo, report.free_cores.union(*released) - unhealthy)
        capacity = FreeState.of(
            topo, (c for d in range(topo.device_count) if d not in report.unhealthy_devices for c in topo.cores_of(d))
        )
        in_flight = sorted(
            (p for k in self._by_node.get(node, ()) if k != excluding and k not in report.pods if (p := self._pod(k))),
            key=lambda p: p.order,
        )
        # Some unlisted pods may already hold silicon the report leaves out of its free cores: the
        # plugin's hand-outs its PodResources List has not named a pod for yet (pending_cores).
        # Placed on the free cores alone, such a pod would take other silicon besides its own, held
        # twice until the next List (8 devices free of 10 in the e2e run). Placed on the free and
        # pending cores, it lands where the plugin put it; whatever pending silicon no placement
        # accounts for (a pod this view does not know) stays held.
        keys = tuple(p.key for p in in_flight)
        pending = report.pending_cores - unhealthy if in_flight else frozenset()
        placed = FreeState.of(topo, free.cores | pending) if pending else free
        taken: list[frozenset[int]] = []
        for pod in in_flight:
            placement = placement_of(topo, placed, pod.request)
            if not placement.fits:
                return NodeState(
                    node,
                    Refusal(
                        RefusalKind.IN_FLIGHT_CONFLICT,
                        f"pod {pod.key} is bound to node {node} but not admitted yet, and does not fit what its "
                        f"NeuronNode report shows free ({placement.reason}); waiting for the next report",
                    ),
                    topo,
                    placed,
                    capacity,
                    keys,
                )
            taken.append(placed.cores - placement.free_after.cores)
            placed = placement.free_after
        free = FreeState.of(topo, placed.cores & free.cores) if pending else placed
        situation = self._situation(topo, free, capacity)
        return NodeState(node, None, topo, situation.free, situation.capacity, keys, situation, tuple(taken))

    def occupants(self, state: NodeState) -> list[Occupant]:
        """The pods holding silicon on the node of `state` (a state `node` returned, not refused):
        those its report lists, with the cores the report gives them, and those in flight, with the
        cores they were simulated on. A pod holding nothing (a group's leader) is left out."""
        report = self.reports.get(state.node)
        if report is None:
            return []
        found: list[Occupant] = []
        simulated = dict(zip(state.in_flight, state.in_flight_cores, strict=True))
        evicted = self._evicted.get(state.node, {})
        for key in sorted(self._by_node.get(state.node, ())):
            pod = self._pod(key)
            if pod is None or not asks_for_neuron(pod.request) or evicted.get(key) == pod.uid:
                continue
            cores = simulated.get(key) if key not in report.pods else report.pod_cores.get(key)
            found.append(Occupant(pod, cores))
        return found

    def _situation(self, topo: Topology, free: FreeState, capacity: FreeState) -> Situation:
        """The one situation of nodes alike, so their answers are computed once."""
        key = (topo, free, capacity)
        situation = self._situations.get(key)
        if situation is None:
            situation = self._situations[key] = Situation(topo, free, capacity)
        return situation

    def topology(self, report: NodeReport) -> Topology:
        """The report's topology, one shared object per shape, so per-shape caches are shared too."""
        adjacency = tuple(tuple(report.adjacency.get(d, ())) for d in range(report.device_count))
        key = (report.topology, report.device_count, report.cores_per_device, report.torus_shape, adjacency)
        topo = self._topologies.get(key)
        if topo is None:
            topo = self._topologies[key] = Topology(
                report.topology,
                report.device_count,
                dict(enumerate(adjacency)),
                report.cores_per_device,
                report.torus_shape,
            )
        return topo

    # --- UltraServer groups ---------------------------------------------------------------------
    def domain_of(self, node: str, nodes: int) -> Domain | None:
        """The node's UltraServer group of `nodes` nodes, from its report's identity."""
        report = self.reports.get(node)
        server = domain(report.ultraserver, nodes) if report is not None else None
        return (nodes, server) if server is not None else None

    def domain_nodes(self, domain_: Domain) -> tuple[str, ...]:
        """Every node whose report places it in the domain, by name."""
        if self._domains is None:
            found: dict[Domain, list[str]] = {}
            for name, report in self.reports.items():
                for nodes in (2, 4):
                    server = domain(report.ultraserver, nodes)
                    if server is not None:
                        found.setdefault((nodes, server), []).append(name)
            self._domains = {d: tuple(sorted(names)) for d, names in found.items()}
        return self._domains.get(domain_, ())

    def ultraserver_nodes(self) -> frozenset[str]:
        """Every node whose report places it in an UltraServer group of 2 or 4 nodes."""
        self.domain_nodes((0, ""))  # builds the index
        assert self._domains is not None
        if self._spare is None or self._spare[0] is not self._domains:
            self._spare = (self._domains, frozenset(n for names in self._domains.values() for n in names))
        return self._spare[1]

    def members(self, group: str, excluding: str = "") -> list[BoundPod]:
        """The group's pods bound (or being bound), in binding order."""
        found = (self._pod(k) for k in self._members.get(group, ()) if k != excluding)
        return sorted((p for p in found if p is not None), key=lambda p: p.order)

    def reservation(self, group: str, now: dt.datetime) -> Reservation | None:
        """The group's reservation while it holds: until the group is whole; while none of its pods
        is bound, until `until` too. A partly bound group keeps its UltraServer however long its
        last pods take: kube-scheduler may hold a pod it refused once for minutes (its unschedulable
        queue, then the back of a long queue), and a TTL lapsing meanwhile lets other pods take the
        group's last nodes and leaves it half placed (at 1,000 simulated nodes, 11 of 30 groups)."""
        held = self.reservations.get(group)
        if held is None:
            return None
        bound = len(self._members.get(group, ()))
        if (held.until < now and not bound) or bound >= held.group.size:
            del self.reservations[group]
            return None
        return held

    def reserve(self, group: GroupRequest, domain_: Domain, now: dt.datetime) -> Reservation:
        held = self.reservations[group.key] = Reservation(group, domain_, now + dt.timedelta(seconds=self.group_ttl))
        self._ever_reserved.add(group.key)
        return held

    def placed_domain(self, group: GroupRequest, excluding: str = "") -> tuple[set[Domain | None], list[BoundPod]]:
        """The domains the group's bound pods are on (None for a node without such an identity), and those pods."""
        members = self.members(group.key, excluding)
        return {self.domain_of(m.node, group.nodes) for m in members}, members

    def _adopt(self, now: dt.datetime) -> None:
        """Reserve for every group that is partly bound, on one domain, and has never been reserved
        for by this process: after a restart its bound pods say where the rest of it goes, and the
        capacity stays held for them (for `group_ttl`) before any of them is filtered again."""
        for key, pods in self._members.items():
            if key in self._ever_reserved:
                continue
            first = self._pod(next(iter(pods)))
            group = first.group if first is not None else None
            if group is None or len(pods) >= group.size:
                continue
            domains, _ = self.placed_domain(group)
            if len(domains) == 1 and None not in domains:
                self.reserve(group, next(iter(domains)), now)  # type: ignore[arg-type]

    def reserved(self, now: dt.datetime) -> dict[str, Reservation]:
        """node -> the reservation holding it, of every reservation that holds now."""
        held: dict[str, Reservation] = {}
        if not self._members.keys() <= self._ever_reserved:
            self._adopt(now)
        for group in list(self.reservations):
            found = self.reservation(group, now)
            if found is not None:
                for node in self.domain_nodes(found.domain):
                    held[node] = found
        return held

    def unhealthy_in(self, domain_: Domain) -> list[str]:
        """The domain's unhealthy nodes (as `failures.node_failure` judges them): a group placed there
        would be degraded at once."""
        return [n for n in self.domain_nodes(domain_) if node_failure(self.reports.get(n), self.health.get(n))]

    def group_placements(self) -> list[GroupPlacement]:
        """Every group with pods bound (or being bound): its pods, and the nodes of the UltraServer
        groups they are on (a pod on a node of no known UltraServer adds just its node)."""
        placements = []
        for key in sorted(self._members):
            members = self.members(key)
            group = members[0].group if members else None
            if group is None:
                continue
            nodes = {m.node for m in members}
            servers = set()
            for m in members:
                found = self.domain_of(m.node, group.nodes)
                if found is not None:
                    servers.add(found[1])
                    nodes.update(self.domain_nodes(found))
            pods = tuple(GroupPod(m.key, m.uid, m.node) for m in members)
            placements.append(GroupPlacement(key, group.name, ", ".join(sorted(servers)), pods, tuple(sorted(nodes))))
        return placements

    def stats(self, now: dt.datetime) -> ViewStats:
        in_flight = 0
        for node, keys in self._by_node.items():
            report = self.reports.get(node)
            unreported = keys - report.pods if report is not None else keys
            # a group's pod that holds nothing (a LeaderWorkerSet leader) is never in a report
            in_flight += sum(1 for k in unreported if (p := self._pod(k)) is not None and asks_for_neuron(p.request))
        return ViewStats(
            reports=len(self.reports),
            invalid_reports=len(self.invalid_reports),
            stale_reports=sum(1 for r in self.reports.values() if r.heartbeat < self._fresh_from(now)),
            bound_pods=len(self._bound),
            assumed_pods=len(self._assumed),
            in_flight_pods=in_flight,
            group_reservations=len({r.domain for r in self.reserved(now).values()}),
            groups_partial=sum(
                1
                for members in self._members.values()
                if (p := self._pod(next(iter(members)))) and p.group and len(members) < p.group.size
            ),
        )


def _stale(report: NodeReport, now: dt.datetime, max_age: float) -> Refusal:
    return Refusal(
        RefusalKind.STALE_REPORT,
        f"the NeuronNode report of node {report.node} is {_duration(report.age(now))} old "
        f"(heartbeatTime {report.heartbeat.strftime('%Y-%m-%dT%H:%M:%SZ')}, limit {_duration(max_age)}): "
        "is the Neuron device plugin running there and able to reach the API server?",
    )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
