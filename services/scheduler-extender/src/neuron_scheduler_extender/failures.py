"""Which UltraServer groups of pods are degraded, and what to do about it. Pure: no I/O, no clock.

A group (`groups`) runs on an UltraServer group of nodes (its bound pods' nodes' domain). When a
node of that UltraServer turns unhealthy, the job that spans it is in trouble even if its own pod
runs elsewhere on the UltraServer (the group's pods talk over NeuronLink): the group is *degraded*.
A node is unhealthy when
- its `NeuronHealth` NodeCondition is True (the problem detector's verdict, `neuron_health.faults`), or
- it carries the problem detector's taint `aws.amazon.com/neuron-unhealthy` (its `--taint`), or
- its NeuronNode report lists unhealthy devices (the device plugin took them out of allocatable).

`plan` turns the degraded groups into what the I/O side does, once per transition: an Event on each
pod of a group when the group becomes degraded or a new failure hits it (and on each of its pods
that has not had one yet, e.g. a pod re-created meanwhile), an Event when it recovers, and, when
eviction is on, the eviction of every pod of a degraded group (each pod once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_model.node_health import CONDITION, UNHEALTHY_TAINT
from neuron_model.report import NodeReport

TAINT_KEY = UNHEALTHY_TAINT
DEGRADED_REASON = "UltraServerGroupDegraded"
RECOVERED_REASON = "UltraServerGroupRecovered"
EVICTED_REASON = "UltraServerGroupEvicted"
MAX_MESSAGE = 1024  # an Event's message is cut to this (the API server refuses very long ones)


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """What the extender keeps of a Node object: its Neuron health verdict."""

    node: str
    condition: str = ""  # "" unless NeuronHealth is True: then "reason: message"
    tainted: bool = False

    @property
    def unhealthy(self) -> bool:
        return bool(self.condition) or self.tainted


def node_health(obj: Mapping[str, Any]) -> NodeHealth | None:
    """The Node object reduced to its Neuron health; None for one without a name."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    status = obj.get("status")
    spec = obj.get("spec")
    condition = ""
    for c in (status.get("conditions") if isinstance(status, Mapping) else None) or ():
        if isinstance(c, Mapping) and c.get("type") == CONDITION and c.get("status") == "True":
            reason, message = str(c.get("reason") or "NeuronHealth"), str(c.get("message") or "")
            condition = f"{reason}: {message}" if message else reason
    taints = (spec.get("taints") if isinstance(spec, Mapping) else None) or ()
    tainted = any(isinstance(t, Mapping) and t.get("key") == TAINT_KEY for t in taints)
    return NodeHealth(name, condition[:512], tainted)


def node_failure(report: NodeReport | None, health: NodeHealth | None) -> str:
    """What is wrong with the node, for a person; "" when nothing is."""
    what = []
    if health is not None and health.condition:
        what.append(f"condition {CONDITION}=True ({health.condition})")
    if health is not None and health.tainted:
        what.append(f"taint {TAINT_KEY}")
    if report is not None and report.unhealthy_devices:
        devices = ", ".join(str(d) for d in sorted(report.unhealthy_devices))
        plural = "s" if len(report.unhealthy_devices) > 1 else ""
        what.append(f"unhealthy device{plural} {devices} in its NeuronNode report")
    if report is not None and report.multi_node_unfit:
        # a failing link (EFA, NeuronLink between servers, the switch): fine for work on the node
        # alone, which this does not judge; a group spanning nodes must not be placed on it
        devices = ", ".join(str(d) for d in sorted(report.multi_node_unfit))
        plural = "s" if len(report.multi_node_unfit) > 1 else ""
        what.append(f"failing link on device{plural} {devices} (unfit for multi-node work) in its NeuronNode report")
    return "; ".join(what)


@dataclass(frozen=True, slots=True)
class GroupPod:
    key: str  # namespace/name
    uid: str
    node: str

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]


@dataclass(frozen=True, slots=True)
class Failure:
    node: str
    what: str
    runs_group: bool  # a pod of the group runs on the node


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """A group as it is placed: its pods bound, and the nodes of the UltraServer(s) they are on."""

    key: str
    name: str  # for a person: "LeaderWorkerSet sim/llama group 3"
    ultraserver: str  # the server id(s) its pods are on, "" when none is known
    pods: tuple[GroupPod, ...]
    nodes: tuple[str, ...]  # every node of those UltraServers, and every node a pod of it runs on


@dataclass(frozen=True, slots=True)
class DegradedGroup:
    group: GroupPlacement
    failures: tuple[Failure, ...]  # by node name

    @property
    def signature(self) -> frozenset[tuple[str, str]]:
        """What changes it: a new or different failure is a new transition."""
        return frozenset((f.node, f.what) for f in self.failures)

    def message(self) -> str:
        where = f"UltraServer {self.group.ultraserver}" if self.group.ultraserver else "its UltraServer"
        parts = [
            f"node {f.node} ({'runs pods of the group' if f.runs_group else 'no pod of the group'}): {f.what}"
            for f in self.failures
        ]
        text = f"{self.group.name} on {where} is degraded: " + "; ".join(parts)
        return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def degraded_groups(
    groups: Iterable[GroupPlacement], reports: Mapping[str, NodeReport], health: Mapping[str, NodeHealth]
) -> dict[str, DegradedGroup]:
    """Group key -> the group, for every group one of whose UltraServer's nodes is unhealthy."""
    found: dict[str, DegradedGroup] = {}
    for group in groups:
        pod_nodes = {p.node for p in group.pods}
        failures = tuple(
            Failure(node, what, node in pod_nodes)
            for node in sorted(group.nodes)
            if (what := node_failure(reports.get(node), health.get(node)))
        )
        if failures:
            found[group.key] = DegradedGroup(group, failures)
    return found


@dataclass(frozen=True, slots=True)
class EventAction:
    group: str  # its key
    pod: GroupPod
    reason: str
    message: str
    warning: bool


@dataclass
class FailureMemory:
    """What has been done, so each transition acts once: per degraded group the failures last
    announced and the pods told of them; the pods whose eviction succeeded."""

    announced: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)  # group -> signature
    told: dict[str, set[str]] = field(default_factory=dict)  # group -> pod uids told of that signature
    evicted: set[str] = field(default_factory=set)  # pod uids
    names: dict[str, tuple[str, tuple[GroupPod, ...]]] = field(default_factory=dict)  # group -> (name, pods)


@dataclass(frozen=True, slots=True)
class Plan:
    events: tuple[EventAction, ...]
    evictions: tuple[tuple[GroupPod, str], ...]  # (pod, why) to evict


def plan(
    degraded: Mapping[str, DegradedGroup], memory: FailureMemory, *, evict: bool, live: Iterable[str] = ()
) -> Plan:
    """What to do now, given what was done (`memory`, updated as if every action succeeds; the I/O
    side calls `retry_event` / `retry_eviction` for the ones that failed). `live`: the UIDs of every
    pod of a group still bound (the evictions remembered are of those only)."""
    events: list[EventAction] = []
    evictions: list[tuple[GroupPod, str]] = []
    for key, group in sorted(degraded.items()):
        signature = group.signature
        if memory.announced.get(key) != signature:
            memory.announced[key] = signature
            memory.told[key] = set()
        told = memory.told[key]
        message = group.message()
        memory.names[key] = (group.group.name, group.group.pods)
        for pod in group.group.pods:
            if pod.uid not in told:
                told.add(pod.uid)
                events.append(EventAction(key, pod, DEGRADED_REASON, message, True))
        if evict:
            for pod in group.group.pods:
                if pod.uid not in memory.evicted:
                    memory.evicted.add(pod.uid)
                    evictions.append((pod, message))
    for key in sorted(set(memory.announced) - set(degraded)):
        name, pods = memory.names.pop(key, (key, ()))
        del memory.announced[key]
        memory.told.pop(key, None)
        recovered = f"{name}: no node of its UltraServer is unhealthy any more"
        events.extend(EventAction(key, pod, RECOVERED_REASON, recovered, False) for pod in pods)
    memory.evicted &= {p.uid for g in degraded.values() for p in g.group.pods} | set(live)  # forget gone pods
    return Plan(tuple(events), tuple(evictions))


def retry_event(memory: FailureMemory, action: EventAction) -> None:
    """The Event could not be created: tell the pod again on the next round."""
    if action.reason == DEGRADED_REASON:
        memory.told.get(action.group, set()).discard(action.pod.uid)


def retry_eviction(memory: FailureMemory, pod: GroupPod) -> None:
    """The eviction was refused (a PodDisruptionBudget, the API server away): try again next round."""
    memory.evicted.discard(pod.uid)
