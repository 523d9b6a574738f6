"""The controller's view of the fleet: each Node and each bound Pod reduced at once to the few fields
its decisions read (neuron_common.reflector keeps them in step with the API server). Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_model import node_health, remediation, ultraserver
from neuron_model.remediation import WorkflowState

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # the kubelet's copy of a static pod


@dataclass(frozen=True)
class NodeView:
    name: str
    resource_version: str = ""
    neuron: bool = False  # a Neuron node: the detector's condition on it, or Neuron resources in its capacity
    health_reason: str | None = None  # NeuronHealth=True: its reason
    # NeuronHealth's message says a node agent's job (a validation in place, a reset) escalated
    health_escalated: bool = False
    accelerated_reason: str | None = None  # AcceleratedHardwareReady=False: its reason
    unschedulable: bool = False
    tainted: bool = False  # carries the controller's taint
    taints: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)  # all of them: a patch replaces the list
    opted_out: bool = False
    ultraserver: tuple[int, str] | None = None  # (nodes in the UltraServer, its server id)
    approved: bool = False
    requested: bool = False  # carries the request annotation
    boot_id: str = ""
    provider_id: str = ""  # spec.providerID: aws:///<zone>/<instance id> on EC2 (the autoscaling backend's)
    state: WorkflowState | None = None
    state_error: str = ""  # an annotation that does not read as a state
    # the node agent's remediation.VALIDATED_CONDITION as (status, reason, message), None: not there
    validated: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str = "Running"
    deleting_at: float | None = None  # metadata.deletionTimestamp (Unix): the grace period ends then
    controller: str | None = None  # the kind of its controller (ownerReference with controller=true)
    mirror: bool = False
    neuron_resources: bool = False  # a container asks for <prefix>/neuron*
    claims: tuple[str, ...] = ()  # its ResourceClaims' names (resolved by the drain to their drivers)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def _mapping(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ultraserver_of(labels: Mapping[str, str]) -> tuple[int, str] | None:
    """The largest UltraServer group the node is in, from AWS's server-id labels: (its nodes, its id)."""
    for size in sorted(ultraserver.GROUP_SIZES, reverse=True):
        value = labels.get(ultraserver.server_id_label(size))
        if value and value != ultraserver.NO_SERVER:
            return size, value
    return None


def node_view(obj: Mapping[str, Any], resource_prefix: str) -> NodeView | None:
    meta, spec, status = _mapping(obj, "metadata"), _mapping(obj, "spec"), _mapping(obj, "status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = {str(k): str(v) for k, v in _mapping(meta, "labels").items()}
    annotations = {str(k): str(v) for k, v in _mapping(meta, "annotations").items()}
    health: str | None = None
    health_escalated = False
    accelerated: str | None = None
    has_condition = False
    validated: tuple[str, str, str] | None = None
    for c in status.get("conditions") or ():
        if not isinstance(c, Mapping):
            continue
        if c.get("type") == node_health.CONDITION:
            has_condition = True
            if c.get("status") == "True":
                health = str(c.get("reason") or "")
                health_escalated = node_health.escalated_in(str(c.get("message") or ""))
        elif c.get("type") == node_health.ACCELERATED_HARDWARE_CONDITION and c.get("status") == "False":
            accelerated = str(c.get("reason") or "")
        elif c.get("type") == remediation.VALIDATED_CONDITION:
            validated = (str(c.get("status") or ""), str(c.get("reason") or ""), str(c.get("message") or ""))
    capacity = _mapping(status, "capacity")
    neuron = has_condition or any(str(k).startswith(f"{resource_prefix}/neuron") for k in capacity)
    taints = spec.get("taints") or ()
    tainted = any(isinstance(t, Mapping) and t.get("key") == remediation.TAINT for t in taints)
    workflow, error = None, ""
    raw = annotations.get(remediation.STATE_ANNOTATION)
    if raw:
        try:
            workflow = remediation.load(raw)
        except remediation.StateError as exc:
            error = str(exc)
    return NodeView(
        name=name,
        resource_version=str(meta.get("resourceVersion") or ""),
        neuron=neuron,
        health_reason=health,
        health_escalated=health_escalated,
        accelerated_reason=accelerated,
        unschedulable=bool(spec.get("unschedulable")),
        tainted=tainted,
        taints=tuple(t for t in taints if isinstance(t, Mapping)),
        opted_out=labels.get(remediation.OPT_OUT_LABEL, "").lower() == "true",
        ultraserver=ultraserver_of(labels),
        approved=remediation.APPROVED_ANNOTATION in annotations,
        requested=remediation.REQUEST_ANNOTATION in annotations,
        boot_id=str(_mapping(status, "nodeInfo").get("bootID") or ""),
        provider_id=str(spec.get("providerID") or ""),
        state=workflow,
        state_error=error,
        validated=validated,
    )


def pod_view(obj: Mapping[str, Any], resource_prefix: str) -> PodView | None:
    meta, spec, status = _mapping(obj, "metadata"), _mapping(obj, "spec"), _mapping(obj, "status")
    name, namespace, node = meta.get("name"), meta.get("namespace"), spec.get("nodeName")
    if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(node, str) and node):
        return None
    controller = None
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            controller = str(ref.get("kind") or "")
    neuron = False
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = _mapping(c, "resources") if isinstance(c, Mapping) else {}
        for part in ("limits", "requests"):
            if any(str(k).startswith(f"{resource_prefix}/neuron") for k in _mapping(resources, part)):
                neuron = True
    claims: list[str] = []
    generated = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in status.get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    for ref in spec.get("resourceClaims") or ():
        if not isinstance(ref, Mapping):
            continue
        claim = ref.get("resourceClaimName") or generated.get(str(ref.get("name")), "")
        if claim:
            claims.append(str(claim))
    return PodView(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        node=node,
        phase=str(status.get("phase") or "Pending"),
        deleting_at=_time(meta.get("deletionTimestamp")),
        controller=controller,
        mirror=MIRROR_ANNOTATION in _mapping(meta, "annotations"),
        neuron_resources=neuron,
        claims=tuple(claims),
    )
