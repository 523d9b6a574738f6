"""Which pods must share an UltraServer: what a Pod object says of its group. Pure.

Two ways to say it:
- a LeaderWorkerSet group whose exclusive topology is an UltraServer server-id label (AWS's examples:
  `leaderworkerset.sigs.k8s.io/exclusive-topology: neuron.amazonaws.com/ultraserver-server-id-4`).
  LeaderWorkerSet's webhook and controller give every pod of a group the label `group-key` (a hash,
  unique per group), `name` and `group-index`, and the annotations `size` (pods in the group) and
  `exclusive-topology` (the worker pods get them from the worker StatefulSet's template, which the
  controller creates once the leader is bound). Names as in kubernetes-sigs/lws
  `api/leaderworkerset/v1/leaderworkerset_types.go`.
- for any other controller, this chart's own pair: the label `neuron.aws.com/ultraserver-group`
  (the group's name, unique in its namespace) and the annotation `neuron.aws.com/ultraserver-group-size`
  (how many pods); `neuron.aws.com/ultraserver-group-nodes` (2 or 4, default 4) picks the UltraServer
  group of nodes (the `...-server-id-<nodes>` label) the pods share.

Kubernetes' own groups (the Workload API, alpha in 1.36, docs/scheduling.md): a Pod names its PodGroup
in `spec.schedulingGroup.podGroupName` (core/v1 PodSchedulingGroup; 1.35's `spec.workloadRef` is gone,
its protobuf tag tombstoned, and is not read). The PodGroup and this chart's label name one group in
one namespace of names, so that pods saying it either way are counted as one group, never two:
- the label and a PodGroup reference on one pod must name the same group (GroupError otherwise);
- a pod with a PodGroup reference and the size annotation, without the label, is of the group of
  that name, keyed as the label would key it;
- a pod with a PodGroup reference alone is no group here: the extender cannot see the PodGroup's
  `minCount`, and kube-scheduler's GangScheduling and topology constraint place it (or, with these
  alpha gates off, nothing does).
A LeaderWorkerSet group stays keyed by LeaderWorkerSet's group key: its PodGroup's name is another
controller's choice, not comparable with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_model.ultraserver import GROUP_SIZES, server_id_label, topology_nodes

LWS = "leaderworkerset.sigs.k8s.io/"
LWS_NAME = LWS + "name"  # label
LWS_GROUP_INDEX = LWS + "group-index"  # label
LWS_GROUP_KEY = LWS + "group-key"  # label: unique per group (and per re-creation of it)
LWS_SIZE = LWS + "size"  # annotation: pods in the group
LWS_EXCLUSIVE = LWS + "exclusive-topology"  # annotation: the topology key the group has to itself

GROUP_LABEL = "neuron.aws.com/ultraserver-group"
GROUP_SIZE_ANNOTATION = "neuron.aws.com/ultraserver-group-size"
GROUP_NODES_ANNOTATION = "neuron.aws.com/ultraserver-group-nodes"
DEFAULT_GROUP_NODES = 4
POD_GROUP_FIELD = "spec.schedulingGroup.podGroupName"  # Kubernetes 1.36+, gate GenericWorkload
MAX_GROUP_PODS = 1024  # a bound on what a malformed annotation can make the filter count


class GroupError(ValueError):
    """A pod that asks for a group but says it wrongly; the message names the label or annotation."""


@dataclass(frozen=True, slots=True)
class GroupRequest:
    key: str  # identifies the group in the cluster: namespace/...
    name: str  # for a person: "LeaderWorkerSet sim/llama group 3", "group sim/train"
    size: int  # pods in the group
    nodes: int  # the UltraServer group of nodes they share: 2 or 4

    @property
    def topology_key(self) -> str:
        return server_id_label(self.nodes)


def group_request(pod: Mapping[str, Any]) -> GroupRequest | None:
    """The pod's group, None when it asks for none; GroupError when it asks wrongly."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    labels = _strings(meta.get("labels"))
    annotations = _strings(meta.get("annotations"))
    namespace = meta.get("namespace") or "default"
    own = labels.get(GROUP_LABEL)
    pod_group = pod_group_name(pod)
    if own:
        if pod_group is not None and pod_group != own:
            raise GroupError(f"label {GROUP_LABEL}: {own!r}, but {POD_GROUP_FIELD}: {pod_group!r}: one group, one name")
        return _own_group(namespace, own, annotations)
    exclusive = annotations.get(LWS_EXCLUSIVE)
    if LWS_NAME not in labels or not exclusive:
        if pod_group is not None and GROUP_SIZE_ANNOTATION in annotations:
            return _own_group(namespace, pod_group, annotations)
        return None
    nodes = topology_nodes(exclusive)
    if nodes is None:
        return None  # exclusive on another topology (a zone, a rack): not an UltraServer's to place
    group_key = labels.get(LWS_GROUP_KEY)
    if not group_key:
        raise GroupError(f"label {LWS_GROUP_KEY}: missing (LeaderWorkerSet's webhook sets it on every pod of a group)")
    size = _size(annotations, LWS_SIZE)
    index = labels.get(LWS_GROUP_INDEX, "?")
    return GroupRequest(
        f"{namespace}/{LWS_GROUP_KEY}={group_key}",
        f"LeaderWorkerSet {namespace}/{labels[LWS_NAME]} group {index}",
        size,
        nodes,
    )


def pod_group_name(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup the pod names (`spec.schedulingGroup.podGroupName`), None when it names none."""
    spec = pod.get("spec")
    ref = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    name = ref.get("podGroupName") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def _own_group(namespace: str, name: str, annotations: Mapping[str, str]) -> GroupRequest:
    nodes_text = annotations.get(GROUP_NODES_ANNOTATION, str(DEFAULT_GROUP_NODES))
    if nodes_text not in {str(n) for n in GROUP_SIZES}:
        sizes = " or ".join(str(n) for n in sorted(GROUP_SIZES))
        raise GroupError(f"annotation {GROUP_NODES_ANNOTATION}: {nodes_text!r}: expected {sizes}")
    size = _size(annotations, GROUP_SIZE_ANNOTATION)
    # one key (and name) for the label and the PodGroup of one name: one group, however its pods say it
    return GroupRequest(f"{namespace}/{GROUP_LABEL}={name}", f"group {namespace}/{name}", size, int(nodes_text))


def _size(annotations: Mapping[str, str], key: str) -> int:
    text = annotations.get(key)
    if text is None:
        raise GroupError(f"annotation {key}: missing (how many pods the group has)")
    try:
        size = int(text)
    except ValueError:
        raise GroupError(f"annotation {key}: {text!r} is not a number of pods") from None
    if not 1 <= size <= MAX_GROUP_PODS:
        raise GroupError(f"annotation {key}: {size} pods: expected 1 to {MAX_GROUP_PODS}")
    return size


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
