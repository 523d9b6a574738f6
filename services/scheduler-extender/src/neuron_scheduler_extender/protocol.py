"""kube-scheduler's extender wire format (k8s.io/kube-scheduler extender/v1 types.go). Pure.

The Go types carry no json tags, so the keys are the capitalised Go field names; the embedded Pod,
Node and NodeList are ordinary Kubernetes JSON. What the scheduler sends:
- ExtenderArgs {Pod, Nodes (a NodeList, only when nodeCacheCapable is false), NodeNames (only when
  it is true)} to the filter and prioritize verbs;
- ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} to the bind verb;
- ExtenderPreemptionArgs {Pod, NodeNameToVictims (node -> {Pods: [Pod], NumPDBViolations}), or,
  when nodeCacheCapable, NodeNameToMetaVictims (node -> {Pods: [{UID}], NumPDBViolations})} to the
  preempt verb: kube-scheduler's candidate nodes and the victims its own dry run chose on each.
What it expects back:
- ExtenderFilterResult {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}: the
  passing nodes in the same form they came in (a returned Node is wrapped as it is, so the
  objects go back untouched);
- HostPriorityList [{Host, Score}], scores 0..10;
- ExtenderBindingResult {Error};
- ExtenderPreemptionResult {NodeNameToMetaVictims}: the nodes where preemption may go on, each
  with its victims by UID (pkg/scheduler/extender.go `ProcessPreemption` maps them back to the pods
  of the node, and fails the attempt on a UID not there); a node left out is no candidate, and a
  node with no victim is an error, so nodes without victims are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any


class ProtocolError(ValueError):
    """A request that is not what kube-scheduler sends; the message says what is wrong."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None  # the full Node objects, when the scheduler sent them

    @property
    def pod_label(self) -> str:
        meta = self.pod.get("metadata")
        if isinstance(meta, Mapping):
            return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
        return "?"


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def extender_args(body: Any) -> ExtenderArgs:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"expected ExtenderArgs, a JSON object, got {type(body).__name__}")
    pod = body.get("Pod")
    if not isinstance(pod, Mapping):
        raise ProtocolError("ExtenderArgs.Pod: missing or not an object")
    names = body.get("NodeNames")
    node_list = body.get("Nodes")
    if names is not None:
        if not isinstance(names, list) or not all(map(isinstance, names, repeat(str))) or "" in names:
            raise ProtocolError("ExtenderArgs.NodeNames: expected a list of node names")
        return ExtenderArgs(pod, tuple(names), None)
    if node_list is None:
        raise ProtocolError("ExtenderArgs: neither NodeNames (nodeCacheCapable: true) nor Nodes was sent")
    items = node_list.get("items") if isinstance(node_list, Mapping) else None
    if items is None and isinstance(node_list, Mapping):
        items = []  # Go encodes an empty NodeList's nil items as null
    if not isinstance(items, list):
        raise ProtocolError("ExtenderArgs.Nodes.items: expected a list of Node objects")
    nodes: list[Mapping[str, Any]] = []
    for i, node in enumerate(items):
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"ExtenderArgs.Nodes.items[{i}].metadata.name: missing")
        nodes.append(node)
    return ExtenderArgs(pod, tuple(n["metadata"]["name"] for n in nodes), tuple(nodes))


@dataclass(frozen=True)
class NodeVictims:
    uids: tuple[str, ...]  # kube-scheduler's victims on the node
    pdb_violations: int  # how many of them its dry run counted against a PodDisruptionBudget


@dataclass(frozen=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    nodes: dict[str, NodeVictims]

    @property
    def pod_label(self) -> str:
        return ExtenderArgs(self.pod, (), None).pod_label


def preemption_args(body: Any) -> PreemptionArgs:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"expected ExtenderPreemptionArgs, a JSON object, got {type(body).__name__}")
    pod = body.get("Pod")
    if not isinstance(pod, Mapping):
        raise ProtocolError("ExtenderPreemptionArgs.Pod: missing or not an object")
    meta, full = body.get("NodeNameToMetaVictims"), body.get("NodeNameToVictims")
    field_name = "NodeNameToMetaVictims" if meta is not None else "NodeNameToVictims"
    raw = meta if meta is not None else full
    if raw is None:
        raw = {}  # Go encodes a nil map as null: no candidates
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"ExtenderPreemptionArgs.{field_name}: expected an object of node names")
    nodes: dict[str, NodeVictims] = {}
    for node, victims in raw.items():
        where = f"ExtenderPreemptionArgs.{field_name}[{node!r}]"
        if not node or not isinstance(victims, Mapping):
            raise ProtocolError(f"{where}: expected {{Pods, NumPDBViolations}}")
        pods = victims.get("Pods") or []
        violations = victims.get("NumPDBViolations") or 0
        if not isinstance(pods, list) or not isinstance(violations, int):
            raise ProtocolError(f"{where}: expected {{Pods: [...], NumPDBViolations: <int>}}")
        uids = []
        for i, victim in enumerate(pods):
            # a MetaPod {UID}, or a whole Pod whose metadata.uid it is
            holder = victim.get("metadata") if isinstance(victim, Mapping) and meta is None else victim
            uid = holder.get("UID" if meta is not None else "uid") if isinstance(holder, Mapping) else None
            if not isinstance(uid, str) or not uid:
                raise ProtocolError(f"{where}.Pods[{i}]: no UID")
            uids.append(uid)
        nodes[node] = NodeVictims(tuple(uids), violations)
    return PreemptionArgs(pod, nodes)


def preemption_result(nodes: Mapping[str, NodeVictims]) -> dict[str, Any]:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in victims.uids], "NumPDBViolations": victims.pdb_violations}
            for node, victims in nodes.items()
            if victims.uids
        }
    }


def binding_args(body: Any) -> BindingArgs:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"expected ExtenderBindingArgs, a JSON object, got {type(body).__name__}")
    fields = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = body.get(key)
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise ProtocolError(f"ExtenderBindingArgs.{key}: missing")
        fields[key] = value
    return BindingArgs(fields["PodName"], fields["PodNamespace"], fields["PodUID"], fields["Node"])


def filter_result(args: ExtenderArgs, passed: list[str], unresolvable: Mapping[str, str]) -> dict[str, Any]:
    """The passing nodes in the form they were sent in; every refused node is unresolvable
    (`decisions.FilterOutcome` says why), so `FailedNodes` is always empty."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": "",
    }
    if args.nodes is None:
        result["NodeNames"] = passed
    else:
        keep = set(passed)
        result["Nodes"] = {"metadata": {}, "items": [n for n in args.nodes if n["metadata"]["name"] in keep]}
    return result


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def priority_list(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": score} for host, score in scores]


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}
