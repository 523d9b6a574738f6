"""A node's Neuron report: what one node has free, published to the API server as a `NeuronNode`.

The device plugin is the only writer (it alone knows every holding, from the kubelet's
PodResources, and every device's health); the scheduler extender reads it. The object is
cluster-scoped and named after its node. Everything the extender needs to predict the plugin's
choice is in it, so nothing is kept anywhere else: the topology exactly as the plugin uses it
(adjacency read from sysfs, not assumed from the instance type), the logical cores per device,
the free cores (a device is free exactly when all its cores are), the unhealthy devices, the
pods holding Neuron IDs, and the pending cores: those the plugin handed out in an Allocate that the
kubelet's PodResources List has not shown yet. Allocate does not say for which pod, so a pending
core is held (not free) by a pod the report does not list yet; a pod bound to the node but not
listed is either that pod or one not admitted yet, and the extender tells them apart only through
the pending cores.

The CRD is `charts/neuron-helm-chart/templates/scheduler/crd.yaml`; a test keeps its schema and
printer columns in step with `to_object`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_model.instance_types import TopologyKind
from neuron_model.ultraserver import Mode, State, UltraServerIdentity, UltraServerReading

GROUP = "neuron.aws.com"
VERSION = "v1alpha1"
KIND = "NeuronNode"
PLURAL = "neuronnodes"
API_VERSION = f"{GROUP}/{VERSION}"


class ReportError(ValueError):
    """A NeuronNode object that cannot be read; the message says which field and why."""


@dataclass(frozen=True)
class NodeReport:
    node: str
    instance_type: str | None  # None: sysfs and DMI could not say
    topology: TopologyKind
    device_count: int  # devices the instance has (ring length, torus size), present or not
    torus_shape: tuple[int, int] | None
    adjacency: Mapping[int, tuple[int, ...]]
    cores_per_device: int  # logical, after the logical-core setting
    logical_core_config: int
    free_cores: frozenset[int]  # global logical core indices allocatable now
    unhealthy_devices: frozenset[int]
    pods: frozenset[str]  # "namespace/name" of every pod holding a Neuron ID on this node
    heartbeat: dt.datetime  # when the plugin last wrote it (aware, UTC)
    ultraserver: UltraServerReading | None = None  # None or State.NONE: not an UltraServer node
    pending_cores: frozenset[int] = frozenset()  # held through own hand-outs, by no pod in `pods` yet
    # devices in service here whose link to other nodes fails (the firmware's link_* verdict): the node
    # is unfit for work that spans nodes, such as an UltraServer group
    multi_node_unfit: frozenset[int] = frozenset()
    # "namespace/name" -> the global logical cores it holds (a whole device: all its cores), of the pods
    # in `pods`: what evicting one would free, which a preemption must know to free a connected set
    pod_cores: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def free_devices(self) -> frozenset[int]:
        cores = self.free_cores
        return frozenset(
            d
            for d in range(self.device_count)
            if cores.issuperset(range(d * self.cores_per_device, (d + 1) * self.cores_per_device))
        )

    def age(self, now: dt.datetime) -> float:
        return (now - self.heartbeat).total_seconds()

    def to_object(self) -> dict[str, Any]:
        total_cores = self.device_count * self.cores_per_device
        healthy = self.device_count - len(self.unhealthy_devices)
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.node},
            "status": {
                "instanceType": self.instance_type or "",
                "topology": {
                    "kind": str(self.topology),
                    "deviceCount": self.device_count,
                    **({"torusShape": list(self.torus_shape)} if self.torus_shape else {}),
                    "adjacency": [list(self.adjacency.get(d, ())) for d in range(self.device_count)],
                },
                "coresPerDevice": self.cores_per_device,
                "logicalCoreConfig": self.logical_core_config,
                "freeCores": sorted(self.free_cores),
                "freeDevices": sorted(self.free_devices),
                "unhealthyDevices": sorted(self.unhealthy_devices),
                "pods": sorted(self.pods),
                "pendingCores": sorted(self.pending_cores),
                "multiNodeUnfitDevices": sorted(self.multi_node_unfit),
                "podCores": [{"pod": pod, "cores": sorted(self.pod_cores[pod])} for pod in sorted(self.pod_cores)],
                "heartbeatTime": self.heartbeat.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                # the printer columns' figures, so `kubectl get neuronnodes` reads at a glance
                "devices": f"{len(self.free_devices)}/{self.device_count}",
                "cores": f"{len(self.free_cores)}/{total_cores}",
                "health": "Healthy" if healthy == self.device_count else f"{healthy}/{self.device_count} healthy",
                **({"ultraServer": _ultraserver_status(self.ultraserver)} if _is_ultraserver(self.ultraserver) else {}),
            },
        }

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeReport:
        name = _get(obj, "metadata", "name", kind=str)
        status = _get(obj, "status", kind=dict)

        def field(*path: str, kind: type) -> Any:
            return _get(status, *path, kind=kind, where=f"NeuronNode {name}: status")

        topo = field("topology", kind=dict)
        try:
            kind = TopologyKind(field("topology", "kind", kind=str))
        except ValueError:
            raise ReportError(f"NeuronNode {name}: status.topology.kind: unknown {topo.get('kind')!r}") from None
        count = field("topology", "deviceCount", kind=int)
        cpd = field("coresPerDevice", kind=int)
        if count < 0 or cpd <= 0:
            raise ReportError(f"NeuronNode {name}: status: deviceCount {count} / coresPerDevice {cpd} out of range")
        shape = topo.get("torusShape")
        if shape is not None and not (isinstance(shape, list) and len(shape) == 2 and _ints(shape)):
            raise ReportError(f"NeuronNode {name}: status.topology.torusShape: expected [rows, columns]")
        raw_adjacency = field("topology", "adjacency", kind=list)
        if len(raw_adjacency) != count or not all(isinstance(a, list) and _ints(a) for a in raw_adjacency):
            raise ReportError(f"NeuronNode {name}: status.topology.adjacency: expected {count} lists of devices")
        free_cores = _index_set(field("freeCores", kind=list), count * cpd, name, "freeCores")
        unhealthy = _index_set(field("unhealthyDevices", kind=list), count, name, "unhealthyDevices")
        # absent from the reports of plugins older than the field: nothing is known to be pending
        pending = field("pendingCores", kind=list) if "pendingCores" in status else []
        pending_cores = _index_set(pending, count * cpd, name, "pendingCores")
        # absent from the reports of plugins older than the field: no link is known to fail
        unfit = field("multiNodeUnfitDevices", kind=list) if "multiNodeUnfitDevices" in status else []
        multi_node_unfit = _index_set(unfit, count, name, "multiNodeUnfitDevices")
        pods = field("pods", kind=list)
        if not all(isinstance(p, str) and "/" in p for p in pods):
            raise ReportError(f"NeuronNode {name}: status.pods: expected namespace/name strings")
        # absent from the reports of plugins older than the field: no pod's holdings are known
        raw_holdings = field("podCores", kind=list) if "podCores" in status else []
        pod_cores: dict[str, frozenset[int]] = {}
        for entry in raw_holdings:
            pod = entry.get("pod") if isinstance(entry, dict) else None
            cores = entry.get("cores") if isinstance(entry, dict) else None
            if not isinstance(pod, str) or "/" not in pod or not isinstance(cores, list):
                raise ReportError(f"NeuronNode {name}: status.podCores: expected {{pod: namespace/name, cores: [...]}}")
            pod_cores[pod] = _index_set(cores, count * cpd, name, "podCores")
        beat = field("heartbeatTime", kind=str)
        try:
            heartbeat = dt.datetime.strptime(beat, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        except ValueError:
            raise ReportError(f"NeuronNode {name}: status.heartbeatTime: not RFC 3339 UTC: {beat!r}") from None
        return cls(
            node=name,
            instance_type=field("instanceType", kind=str) or None,
            topology=kind,
            device_count=count,
            torus_shape=(shape[0], shape[1]) if shape else None,
            adjacency={d: tuple(a) for d, a in enumerate(raw_adjacency)},
            cores_per_device=cpd,
            logical_core_config=field("logicalCoreConfig", kind=int),
            free_cores=free_cores,
            unhealthy_devices=unhealthy,
            pods=frozenset(pods),
            heartbeat=heartbeat,
            ultraserver=_ultraserver_from(status.get("ultraServer"), name),
            pending_cores=pending_cores,
            multi_node_unfit=multi_node_unfit,
            pod_cores=pod_cores,
        )


def _is_ultraserver(reading: UltraServerReading | None) -> bool:
    return reading is not None and reading.state is not State.NONE


def ultraserver_summary(reading: UltraServerReading) -> str:
    """The printer column: the largest group's server id and the node's id in it, or the state."""
    identity = reading.identity
    if identity is None or not identity.server_ids:
        return str(reading.state)
    size = max(identity.server_ids)
    return f"{identity.server_ids[size]}/{identity.node_ids[size]} of {size}"


def _ultraserver_status(reading: UltraServerReading | None) -> dict[str, Any]:
    assert reading is not None
    identity = reading.identity
    status: dict[str, Any] = {"state": str(reading.state), "summary": ultraserver_summary(reading)}
    if reading.reason:
        status["reason"] = reading.reason[:1024]
    if identity is not None:
        status["modes"] = [int(m) for m in identity.modes]
        status["groups"] = [
            {"size": size, "serverId": identity.server_ids[size], "nodeId": identity.node_ids[size]}
            for size in sorted(identity.server_ids, reverse=True)
        ]
    return status


def _ultraserver_from(raw: Any, name: str) -> UltraServerReading | None:
    if raw is None:
        return None
    where = f"NeuronNode {name}: status.ultraServer"
    if not isinstance(raw, Mapping):
        raise ReportError(f"{where}: expected an object")
    try:
        state = State(str(raw.get("state")))
        identity = None
        if state is State.IDENTIFIED:
            groups = raw.get("groups") or []
            identity = UltraServerIdentity(
                tuple(Mode(m) for m in raw.get("modes") or []),
                {int(g["size"]): str(g["serverId"]) for g in groups},
                {int(g["size"]): int(g["nodeId"]) for g in groups},
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{where}: {exc}") from None
    return UltraServerReading(state, identity, str(raw.get("reason", "")))


def _ints(values: Iterable[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def _index_set(values: list[Any], bound: int, name: str, what: str) -> frozenset[int]:
    if not _ints(values) or any(v >= bound for v in values):
        raise ReportError(f"NeuronNode {name}: status.{what}: expected indices below {bound}")
    return frozenset(values)


def _get(obj: Mapping[str, Any], *path: str, kind: type, where: str = "NeuronNode") -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            raise ReportError(f"{where}.{'.'.join(path)}: missing")
        value = value[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ReportError(f"{where}.{'.'.join(path)}: expected {kind.__name__}, got {type(value).__name__}")
    return value
