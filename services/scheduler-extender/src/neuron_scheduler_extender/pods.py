"""What the extender reads from a Pod object: who it is, where it is bound, and its Neuron request.

The request is counted per container exactly as the kubelet and the scheduler count an extended
resource: `requests` when given, else `limits` (the API server defaults one from the other, and
refuses a pod where they differ), summed over `neuron` and its deprecated alias `neurondevice`.
Init containers keep their order; one with `restartPolicy: Always` is a sidecar
(`ContainerRequest.restartable`), which `PodRequest.effective` counts as the kubelet does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from neuron_model import resources
from neuron_model.placement import ContainerRequest, PodRequest
from neuron_scheduler_extender.groups import GroupError, GroupRequest, group_request

# Pods in these phases hold nothing: the kubelet has released their devices.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodError(ValueError):
    """A Pod object that cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The full names of the resources the extender manages, under one prefix."""

    devices: tuple[str, ...]  # counted as whole devices: neuron and its alias neurondevice
    cores: str

    @classmethod
    def under(cls, prefix: str = resources.DEFAULT_PREFIX) -> ResourceNames:
        return cls(
            (resources.neuron(prefix).full_name, resources.neurondevice(prefix).full_name),
            resources.neuroncore(prefix).full_name,
        )

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.devices, self.cores)


def pod_key(pod: Mapping[str, Any]) -> str:
    """`namespace/name`, the way NeuronNode reports name the pods holding Neuron IDs."""
    meta = _mapping(pod.get("metadata"), "metadata")
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        raise PodError("metadata.name: missing")
    return f"{namespace}/{name}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    uid = _mapping(pod.get("metadata"), "metadata").get("uid", "")
    return uid if isinstance(uid, str) else ""


def scheduler_name(pod: Mapping[str, Any]) -> str:
    """The pod's schedulerName; the API server defaults it to default-scheduler."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else "default-scheduler"


def nominated_node(pod: Mapping[str, Any]) -> str:
    """status.nominatedNodeName: where kube-scheduler's preemption made room for the pod, or ""."""
    status = pod.get("status")
    value = status.get("nominatedNodeName", "") if isinstance(status, Mapping) else ""
    return value if isinstance(value, str) else ""


def nomination(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace/name, status.nominatedNodeName) of a pending pod; None for one without a name."""
    try:
        return pod_key(pod), nominated_node(pod)
    except PodError:
        return None


def node_name(pod: Mapping[str, Any]) -> str:
    """The node the pod is bound to, or "" while it is not bound."""
    spec = pod.get("spec")
    value = spec.get("nodeName", "") if isinstance(spec, Mapping) else ""
    return value if isinstance(value, str) else ""


def is_terminal(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES


def neuron_request(pod: Mapping[str, Any], names: ResourceNames) -> PodRequest:
    """The pod's Neuron request, container by container. Raises PodError for a malformed spec."""
    spec = _mapping(pod.get("spec"), "spec")
    inits = tuple(
        _container(c, names, f"spec.initContainers[{i}]", init=True)
        for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers"))
    )
    apps = tuple(
        _container(c, names, f"spec.containers[{i}]", init=False)
        for i, c in enumerate(_list(spec.get("containers"), "spec.containers"))
    )
    return PodRequest(inits, apps)


def asks_for_neuron(request: PodRequest) -> bool:
    return any(c.devices or c.cores for c in (*request.init_containers, *request.containers))


def _container(raw: Any, names: ResourceNames, where: str, *, init: bool) -> ContainerRequest:
    container = _mapping(raw, where)
    res = container.get("resources")
    res = _mapping(res, f"{where}.resources") if res is not None else {}
    requests = _mapping(res.get("requests") or {}, f"{where}.resources.requests")
    limits = _mapping(res.get("limits") or {}, f"{where}.resources.limits")

    def amount(resource: str) -> int:
        raw_value = requests.get(resource, limits.get(resource))
        if raw_value is None:
            return 0
        return whole_quantity(raw_value, f"{where}.resources {resource}")

    name = container.get("name", "")
    return ContainerRequest(
        devices=sum(amount(r) for r in names.devices),
        cores=amount(names.cores),
        name=name if isinstance(name, str) else "",
        restartable=init and container.get("restartPolicy") == "Always",
    )


_QUANTITY = re.compile(r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[A-Za-z]*|[eE][+-]?[0-9]+)")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1)}
_DECIMAL.update({"k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12)})
_DECIMAL.update({"P": Fraction(10**15), "E": Fraction(10**18)})


def whole_quantity(value: Any, where: str) -> int:
    """A Kubernetes quantity (`8`, `2000m`, `1e1`) that must be a whole, non-negative number, as
    extended resources must be."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = Fraction(value)
    elif isinstance(value, str) and (match := _QUANTITY.fullmatch(value.strip())):
        suffix = match["suffix"]
        if suffix in _BINARY:
            scale = Fraction(_BINARY[suffix])
        elif suffix in _DECIMAL:
            scale = _DECIMAL[suffix]
        elif suffix[:1] in ("e", "E") and len(suffix) > 1 and abs(int(suffix[1:])) <= 18:
            scale = Fraction(10) ** int(suffix[1:])
        else:
            raise PodError(f"{where}: {value!r} is not a quantity")
        number = Fraction(match["number"]) * scale
    else:
        raise PodError(f"{where}: {value!r} is not a quantity")
    if number < 0 or number.denominator != 1:
        raise PodError(f"{where}: {value!r} must be a whole number of devices or cores")
    return int(number)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PodError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodError(f"{where}: expected a list, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class PodRecord:
    """All the extender keeps of a pod that asks for Neuron resources (a few hundred bytes, where the
    Pod object is kilobytes): enough to count it on its node."""

    key: str  # namespace/name
    uid: str
    node: str  # "" while not bound
    terminal: bool  # Succeeded or Failed: holds nothing
    request: PodRequest | None  # None when the spec cannot be read (`error` says why)
    error: str = ""
    scheduled_at: tuple[str, str] = ("", "")  # PodScheduled transition time, creation time: orders a fresh list
    group: GroupRequest | None = None  # the UltraServer group it belongs to (`groups`), if any
    priority: int = 0  # spec.priority (admission sets it from the PriorityClass): who may preempt it
    labels: tuple[tuple[str, str], ...] = ()  # for the PodDisruptionBudgets that select it


def pod_priority(pod: Mapping[str, Any]) -> int:
    """spec.priority; admission resolves it from the PriorityClass, and a pod without one has 0."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_record(pod: Mapping[str, Any], names: ResourceNames) -> PodRecord | None:
    """The record of a pod that asks for Neuron resources or is one of an UltraServer group's; None
    for any other pod, and for an object without a name (the API server never sends one). A group's
    pod that asks for none (a LeaderWorkerSet leader that only coordinates) holds nothing, but where it
    is bound is where its group is, and it is one of the group's pods placed."""
    try:
        key = pod_key(pod)
    except PodError:
        return None
    try:
        request: PodRequest | None = neuron_request(pod, names)
        error = ""
    except PodError as exc:
        request, error = None, str(exc)
    try:
        group = group_request(pod)
    except GroupError:
        group = None  # counted on its node all the same; its filter said what is wrong
    if request is not None and not asks_for_neuron(request) and group is None:
        return None
    return PodRecord(
        key,
        pod_uid(pod),
        node_name(pod),
        is_terminal(pod),
        request,
        error,
        _scheduled_at(pod),
        group,
        pod_priority(pod),
        _labels(pod),
    )


def _labels(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return ()
    return tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)))


def _scheduled_at(pod: Mapping[str, Any]) -> tuple[str, str]:
    """When the pod was bound, as well as the API server tells: the PodScheduled condition's
    transition time (whole seconds), then its creation time."""
    status, meta = pod.get("status"), pod.get("metadata")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    scheduled = next(
        (
            str(c.get("lastTransitionTime") or "")
            for c in (conditions if isinstance(conditions, list) else [])
            if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
        ),
        "",
    )
    created = str(meta.get("creationTimestamp") or "") if isinstance(meta, Mapping) else ""
    return scheduled or created, created
