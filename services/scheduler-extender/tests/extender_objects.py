"""API objects built by hand, shaped as the API server and kube-scheduler send them: NeuronNode
reports (through NodeReport.to_object, the publisher's own serialisation), Pods, and the
extender's wire arguments (k8s.io/kube-scheduler extender/v1 types.go: capitalised Go field names)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oracles.neuron_sets import topology

from neuron_model.allocator import Topology
from neuron_model.instance_types import INSTANCE_TYPES
from neuron_model.report import NodeReport
from neuron_model.ultraserver import X4H_MAP, Mode, State, UltraServerIdentity, UltraServerReading
from neuron_scheduler_extender.groups import LWS_EXCLUSIVE, LWS_GROUP_INDEX, LWS_GROUP_KEY, LWS_NAME, LWS_SIZE
from neuron_scheduler_extender.pods import ResourceNames, pod_record
from neuron_scheduler_extender.state import ClusterView, report_record

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
NAMES = ResourceNames.under()
NEURON, NEURONCORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"


def node_report(
    node: str,
    instance_type: str = "trn1.32xlarge",
    *,
    free_devices: Iterable[int] | None = None,
    free_cores: Iterable[int] | None = None,
    unhealthy: Iterable[int] = (),
    pods: Iterable[str] = (),
    age: float = 0.0,
    lnc: int | None = None,
    ultraserver: UltraServerReading | None = None,
    pod_cores: Mapping[str, Iterable[int]] | None = None,
) -> NodeReport:
    """A report as a node's plugin publishes it: free cores (every healthy one unless given)."""
    it = INSTANCE_TYPES[instance_type]
    topo = topology(instance_type, lnc)
    bad = set(unhealthy)
    if free_cores is None:
        devices = set(range(topo.device_count)) if free_devices is None else set(free_devices)
        free_cores = (c for d in sorted(devices - bad) for c in topo.cores_of(d))
    return NodeReport(
        node=node,
        instance_type=instance_type,
        topology=topo.kind,
        device_count=topo.device_count,
        torus_shape=topo.torus_shape,
        adjacency=topo.adjacency,
        cores_per_device=topo.cores_per_device,
        logical_core_config=lnc or it.family.default_lnc,
        free_cores=frozenset(free_cores),
        unhealthy_devices=frozenset(bad),
        pods=frozenset(pods),
        heartbeat=(NOW - dt.timedelta(seconds=age)).replace(microsecond=0),
        ultraserver=ultraserver,
        pod_cores={pod: frozenset(cores) for pod, cores in (pod_cores or {}).items()},
    )


def trn2u_identity(server: str, node_id: int) -> UltraServerReading:
    """Node `node_id` (0..3) of a 4-node trn2u UltraServer `server` (16 hex digits) in modes X4, X2H
    and X1, as the driver reports it: its 2-node pair's id is the server id with the pair's digit last."""
    pair = X4H_MAP[node_id]
    identity = UltraServerIdentity(
        (Mode.X4, Mode.X2H, Mode.X1), {4: server, 2: server[:15] + str(pair)}, {4: node_id, 2: node_id % 2}
    )
    return UltraServerReading(State.IDENTIFIED, identity)


def ultraserver_reports(server: str, prefix: str = "", **kwargs: Any) -> list[dict[str, Any]]:
    """The four trn2u nodes of one UltraServer, `<prefix or server>-0..3`."""
    name = prefix or server
    return [
        report_object(f"{name}-{i}", "trn2u.48xlarge", ultraserver=trn2u_identity(server, i), **kwargs)
        for i in range(4)
    ]


def report_object(node: str, instance_type: str = "trn1.32xlarge", **kwargs: Any) -> dict[str, Any]:
    obj = node_report(node, instance_type, **kwargs).to_object()
    obj["metadata"].update(resourceVersion="1", uid=f"uid-report-{node}")
    return obj


def container(
    name: str = "main", *, devices: int = 0, cores: int = 0, use: str = "limits", **extra: Any
) -> dict[str, Any]:
    wanted = {k: str(v) for k, v in ((NEURON, devices), (NEURONCORE, cores)) if v}
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}, "limits": {}}
    if use == "both":
        resources["requests"].update(wanted)
        resources["limits"].update(wanted)
    else:
        resources[use].update(wanted)
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    node: str = "",
    devices: int = 0,
    cores: int = 0,
    containers: Sequence[dict[str, Any]] | None = None,
    init_containers: Sequence[dict[str, Any]] = (),
    phase: str = "Pending",
    scheduled_at: str = "",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """A Pod as the API server returns it (the fields the scheduler and the extender read, and a few more)."""
    spec: dict[str, Any] = {
        "containers": list(containers) if containers is not None else [container(devices=devices, cores=cores)],
        "schedulerName": "neuron-scheduler",
        "restartPolicy": "Never",
    }
    if priority is not None:
        spec["priority"] = priority  # admission resolves it from priorityClassName
    if init_containers:
        spec["initContainers"] = list(init_containers)
    if node:
        spec["nodeName"] = node
    conditions = (
        [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at}] if scheduled_at else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "resourceVersion": "7",
            "creationTimestamp": "2026-03-01T11:59:00Z",
            **({"labels": labels} if labels else {}),
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": spec,
        "status": {"phase": phase, "conditions": conditions, "qosClass": "Burstable"},
    }


def node_object(name: str, instance_type: str = "trn1.32xlarge") -> dict[str, Any]:
    it = INSTANCE_TYPES[instance_type]
    cores = it.devices * it.logical_cores_per_device(it.family.default_lnc)
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-node-{name}",
            "labels": {"node.kubernetes.io/instance-type": instance_type},
        },
        "spec": {},
        "status": {
            "capacity": {NEURON: str(it.devices), NEURONCORE: str(cores), "cpu": "128", "pods": "110"},
            "allocatable": {NEURON: str(it.devices), NEURONCORE: str(cores), "cpu": "127", "pods": "110"},
        },
    }


def extender_args(pod: dict[str, Any], nodes: Sequence[str], *, cache_capable: bool = True) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler marshals it: NodeNames with nodeCacheCapable, else a NodeList."""
    if cache_capable:
        return {"Pod": pod, "Nodes": None, "NodeNames": list(nodes)}
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": [node_object(n) for n in nodes]}, "NodeNames": None}


def preemption_args(pod: dict[str, Any], victims: Mapping[str, Iterable[str]], pdb: int = 0) -> dict[str, Any]:
    """ExtenderPreemptionArgs as kube-scheduler marshals it with nodeCacheCapable: victims by UID."""
    return {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb} for node, uids in victims.items()
        },
    }


def binding_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def view_of(*reports: dict[str, Any], pods: Iterable[dict[str, Any]] = (), max_age: float = 120.0) -> ClusterView:
    """A view as the sources would fill it from these objects."""
    view = ClusterView(report_max_age=max_age)
    view.replace_reports(r for r in map(report_record, reports) if r is not None)
    view.replace_pods((r for r in (pod_record(p, NAMES) for p in pods) if r is not None), listed_after=0.0)
    return view


def trn1() -> Topology:
    return topology("trn1.32xlarge")


A, B = "aaaaaaaaaaaaaaa0", "bbbbbbbbbbbbbbb0"  # server ids of two UltraServers
SERVER_ID_4 = "neuron.amazonaws.com/ultraserver-server-id-4"


def lws_pod(
    name: str, group: str = "g1", *, size: int = 4, devices: int = 16, node: str = "", **kw: Any
) -> dict[str, Any]:
    """A pod of a LeaderWorkerSet group with an UltraServer exclusive topology, as LWS labels it."""
    return pod_object(
        name,
        devices=devices,
        node=node,
        labels={LWS_NAME: "llama", LWS_GROUP_INDEX: group[-1], LWS_GROUP_KEY: f"hash-{group}"},
        annotations={LWS_SIZE: str(size), LWS_EXCLUSIVE: kw.pop("topology", SERVER_ID_4)},
        **kw,
    )
