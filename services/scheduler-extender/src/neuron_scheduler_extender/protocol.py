"""kube-scheduler's extender wire format (k8s.io/kube-scheduler extender/v1 types.go). Pure.

The Go types carry no json tags, so the keys are the capitalised Go field names; the embedded Pod,
Node and NodeList are ordinary Kubernetes JSON. What the scheduler sends:
- ExtenderArgs {Pod, Nodes (a NodeList, only when nodeCacheCapable is false), NodeNames (only when
  it is true)} to the filter and prioritize verbs;
- ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node} to the bind verb.
What it expects back:
- ExtenderFilterResult {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}: the
  passing nodes in the same form they came in (a returned Node is wrapped as it is, so the
  objects go back untouched);
- HostPriorityList [{Host, Score}], scores 0..10;
- ExtenderBindingResult {Error}.
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
