"""Simulated kubelets with their device plugins: one per Node, all in this process.

For every pod the scheduler binds to a simulated node, in the order the bindings reach the watch,
this does what the node would:
- the kubelet admits the pod and the device plugin allocates it: `neuron_model.placement.place` on
  the node's free silicon is exactly the sets the plugin would hand out. When no valid set is free
  the kubelet still admits the pod (it only counts IDs), and the plugin hands out its best-effort,
  invalid choice (`choose_devices`/`choose_cores` with `valid=False`); when even the count is short
  on the silicon actually free (the scheduler counts `neuron` and `neuroncore` apart, though they
  are the same silicon), the missing IDs are silicon another pod already holds: `shortfall`;
- the kubelet marks the pod Running (status subresource);
- the plugin publishes the node's `NeuronNode` (`NodeReport.to_object()`) by forced server-side
  apply, as the real plugin does: a change at once but at most one write per `min_gap` seconds
  per node, and a heartbeat every `report_interval` seconds without changes.
Nodes are plain Node objects created Ready (see controlplane: nothing expects node heartbeats).

With `dra`, the nodes are DRA nodes instead (simcluster.dra): each publishes the driver's
ResourceSlices once and no NeuronNode; a bound pod holds what its claim's allocation says (read
from the API server), judged valid by the same rules, and `shortfall` counts allocated silicon
that another pod already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polling import until_async

from neuron_device_plugin.node_report import FIELD_MANAGER, MIN_GAP  # the real plugin's writes
from neuron_model.allocator import Topology, choose_cores, choose_devices
from neuron_model.placement import FreeState, PodRequest, place
from neuron_model.report import GROUP, PLURAL, VERSION, NodeReport
from simcluster import dra as dra_nodes
from simcluster.api import Api, ApiError, bounded
from simcluster.fleet import NAMESPACE, NodeSpec, pod_request

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
REPORTS = f"/apis/{GROUP}/{VERSION}/{PLURAL}"


@dataclass(frozen=True)
class Admission:
    order: int  # position among all admissions, in the order bindings were seen
    pod: str
    node: str
    request: PodRequest
    valid: bool  # the plugin's allocator found a valid set for every container
    devices: tuple[int, ...]  # held through aws.amazon.com/neuron
    cores: tuple[int, ...]  # held through aws.amazon.com/neuroncore (global logical indices)
    shortfall: int  # IDs handed out beyond the free silicon: silicon another pod holds too
    reason: str  # the allocator's refusal when not valid


@dataclass
class SimNode:
    spec: NodeSpec
    topo: Topology
    free: FreeState
    holdings: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    write_pending: bool = False  # a write is scheduled and will carry the state as it is then
    writing: bool = False  # a write is in flight; one at a time, so they land in order
    changed_since_write: bool = False
    last_write: float = float("-inf")

    def report(self, now: dt.datetime) -> dict[str, Any]:
        topo = self.topo
        return NodeReport(
            node=self.spec.name,
            instance_type=self.spec.instance_type,
            topology=topo.kind,
            device_count=topo.device_count,
            torus_shape=topo.torus_shape,
            adjacency=topo.adjacency,
            cores_per_device=topo.cores_per_device,
            logical_core_config=self.spec.lnc,
            free_cores=self.free.cores,
            unhealthy_devices=frozenset(),
            pods=frozenset(f"{NAMESPACE}/{pod}" for pod in self.holdings),
            heartbeat=now,
            ultraserver=self.spec.reading,
            pod_cores={
                f"{NAMESPACE}/{pod}": frozenset(cores).union(*(topo.cores_of(d) for d in devices))
                for pod, (devices, cores) in self.holdings.items()
            },
        ).to_object()


def whole_node(topo: Topology) -> FreeState:
    return FreeState.of(topo, range(topo.device_count * topo.cores_per_device))


# Concurrent status and report writes of the simulated kubelets (each kind). A thousand real kubelets
# write at once; with a handful of writers a fast scheduler outran them and left its pods' writes
# for after its last binding, so its bindings per second counted work the API server had not done yet.
WRITERS = 48


class SimulatedNodes:
    def __init__(
        self,
        api: Api,
        specs: list[NodeSpec],
        *,
        report_interval: float,
        writers: int = WRITERS,
        dra: bool = False,
        requests: Mapping[str, PodRequest] | None = None,
        layout: str = dra_nodes.OURS,
    ) -> None:
        self.api = api
        self.dra = dra
        # whose ResourceSlices a DRA node publishes: our driver's, or AWS's layout (simcluster.dra)
        self.node_slices: Callable[[NodeSpec], list[dict[str, Any]]] = {
            dra_nodes.AWS: dra_nodes.aws_node_slices,
            dra_nodes.OURS_DEVICES: functools.partial(dra_nodes.node_slices, publish_cores=False),
            dra_nodes.OURS_SHARES: functools.partial(dra_nodes.node_slices, cores_as_capacity=True),
        }.get(layout, dra_nodes.node_slices)
        self.requests = requests or {}  # pod -> its request, for pods whose own claim says it (no limits)
        self.nodes = {s.name: SimNode(s, s.topology, whole_node(s.topology)) for s in specs}
        self.report_interval = report_interval
        self.writers = writers
        self.admissions: list[Admission] = []
        self.bound_at: dict[str, float] = {}  # pod -> monotonic time its binding was seen
        self.running_at: dict[str, float] = {}  # pod -> monotonic time its Running status was written
        self.deleted: dict[str, tuple[str, float]] = {}  # pod deleted while holding silicon -> (node, monotonic time)
        self.nominations: dict[str, list[tuple[str, float]]] = {}  # pending pod -> nominatedNodeName as it changed
        self.unschedulable: dict[str, str] = {}  # unbound pod -> the scheduler's last message
        self.report_writes = 0
        self._status_queue: asyncio.Queue[str] = asyncio.Queue()
        self._claim_queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self._report_queue: asyncio.Queue[str] = asyncio.Queue()
        self._statuses_unwritten = 0

    # -- registration -----------------------------------------------------------------------

    async def register(self, connections: int = 16) -> None:
        """Creates every Node and publishes its first report."""

        async def create(node: SimNode) -> None:
            await self.api.create("/api/v1/nodes", node.spec.node_object(dra=self.dra))

        await bounded(self.nodes.values(), create, connections)
        if self.dra:
            objects = [obj for node in self.nodes.values() for obj in self.node_slices(node.spec)]
            await bounded(objects, lambda obj: self.api.create(dra_nodes.SLICES, obj), connections)
            return
        await bounded(self.nodes.values(), self._write_report, connections)
        # A real fleet's plugins started at different times: spread the heartbeats over the
        # interval, as registering every node at once would otherwise time them all together,
        # and a thousand writes every `report_interval` seconds is not what a cluster sees.
        now, spread = time.monotonic(), random.Random(0)
        for node in self.nodes.values():
            node.last_write = now - spread.uniform(0, self.report_interval)

    # -- the kubelets -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Watches the pods and keeps the reports written until `stop`."""
        tasks = [asyncio.create_task(self._watch_pods(), name="pod watch")]
        tasks += [asyncio.create_task(self._status_writer()) for _ in range(self.writers)]
        tasks += [asyncio.create_task(self._report_writer()) for _ in range(self.writers)]
        tasks += [asyncio.create_task(self._claim_reader()) for _ in range(self.writers if self.dra else 0)]
        tasks.append(asyncio.create_task(self._heartbeats()))
        stopped = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopped:
                    task.result()  # a writer or the watch failed: raise it
                    raise RuntimeError(f"{task.get_name()} ended")
        finally:
            for task in [*tasks, stopped]:
                task.cancel()
            for task in [*tasks, stopped]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def drain(self, timeout: float) -> None:
        """Until every pod status and report change seen so far is written (bounded)."""

        def written() -> bool:
            reports = any(n.write_pending or n.writing or n.changed_since_write for n in self.nodes.values())
            return not self._statuses_unwritten and not reports

        await until_async(written, "pod statuses and reports written", timeout, 0.1, TimeoutError)

    async def _watch_pods(self) -> None:
        items, version = await self.api.list(PODS)
        for pod in items:
            self.on_pod("ADDED", pod)
        while True:
            try:
                async for kind, pod in self.api.watch(PODS, version):
                    version = pod["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self.on_pod(kind, pod)
            except ApiError as exc:
                if exc.status != 410:
                    raise
                items, version = await self.api.list(PODS)  # too old: catch up from a fresh list
                for pod in items:
                    self.on_pod("MODIFIED", pod)

    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if kind == "DELETED":
            if node in self.nodes and name in self.nodes[node].holdings:
                self.deleted[name] = (node, time.monotonic())
            self._release(name, node)
            return
        if node and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
            self.unschedulable.pop(name, None)
            if node in self.nodes and self.dra:
                self._statuses_unwritten += 1  # written once its claim is read
                self._claim_queue.put_nowait((name, node, pod))
            elif node in self.nodes:
                self.admit(name, self.nodes[node], pod_request(pod))
                self._statuses_unwritten += 1
                self._status_queue.put_nowait(name)
        elif not node:
            nominated = pod.get("status", {}).get("nominatedNodeName")
            if nominated and self.nominations.get(name, [("", 0.0)])[-1][0] != nominated:
                self.nominations.setdefault(name, []).append((nominated, time.monotonic()))
            scheduled = next(
                (c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), None
            )
            if scheduled and scheduled["status"] == "False":
                self.unschedulable[name] = scheduled.get("message", scheduled.get("reason", ""))

    def admit(self, pod: str, node: SimNode, request: PodRequest) -> Admission:
        placement = place(node.topo, node.free, request)
        shortfall = 0
        if placement.fits:
            devices = sorted({d for c in placement.containers for d in c.devices})
            cores = sorted({k for c in placement.containers for k in c.cores})
            node.free = placement.free_after
        else:
            devices, cores, shortfall = self._best_effort(node, request)
        admission = Admission(
            len(self.admissions), pod, node.spec.name, request, placement.fits,
            tuple(devices), tuple(cores), shortfall, placement.reason,
        )  # fmt: skip
        self.admissions.append(admission)
        node.holdings[pod] = (admission.devices, admission.cores)
        self._changed(node)
        return admission

    async def _claim_reader(self) -> None:
        """Admits each bound DRA pod with what its claim holds: the claim the scheduler made for the
        pod's extended resources (`status.extendedResourceClaimStatus`), else the pod's own claims."""
        while True:
            name, node_name, pod = await self._claim_queue.get()
            node = self.nodes[node_name]
            claims = _claim_names(pod) or _claim_names(await self.api.request("GET", f"{PODS}/{name}"))
            devices: set[int] = set()
            cores: set[int] = set()
            for claim in claims:
                obj = await self.api.request(
                    "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{claim}"
                )
                held_devices, held_cores = dra_nodes.allocated(obj, node.topo.device_count)
                devices.update(held_devices)
                cores.update(held_cores)
                for device, count in dra_nodes.shares(obj):
                    of_device = sorted(node.topo.cores_of(device))
                    if count >= len(of_device):
                        devices.add(device)
                        continue
                    # the driver's choice at prepare (neuron_dra_driver.claims): the lowest cores no other
                    # claim holds; held ones only when the scheduler gave out more than is free
                    free = [c for c in of_device if c in node.free.cores and c not in cores]
                    rest = [c for c in of_device if c not in free and c not in cores]
                    cores.update((free + rest)[:count])
            request = self.requests.get(name) or pod_request(pod)
            self.admit_allocated(name, node, request, tuple(sorted(devices)), tuple(sorted(cores)))
            self._status_queue.put_nowait(name)

    def admit_allocated(
        self, pod: str, node: SimNode, request: PodRequest, devices: tuple[int, ...], cores: tuple[int, ...]
    ) -> Admission:
        """A DRA pod: its allocation is given; judged against the node's free silicon before it."""
        valid = bool(devices or cores) and dra_nodes.valid_set(node.topo, node.free, devices, cores)
        taken = {c for d in devices for c in node.topo.cores_of(d)} | set(cores)
        shortfall = len(taken - node.free.cores)
        node.free = node.free.without_devices(node.topo, devices).without_cores(node.topo, cores)
        reason = "" if valid else "the allocation is not a valid set on the free silicon"
        admission = Admission(
            len(self.admissions), pod, node.spec.name, request, valid, devices, cores, shortfall, reason
        )
        self.admissions.append(admission)
        node.holdings[pod] = (devices, cores)
        return admission

    @staticmethod
    def _best_effort(node: SimNode, request: PodRequest) -> tuple[list[int], list[int], int]:
        """What the plugin hands out when no valid set is free: its best-effort choice per container."""
        devices: list[int] = []
        cores: list[int] = []
        shortfall = 0
        for container in (*request.init_containers, *request.containers):
            if container.devices:
                chosen = choose_devices(node.topo, node.free.devices, (), container.devices).ids
                node.free = node.free.without_devices(node.topo, chosen)
                devices += chosen
                shortfall += container.devices - len(chosen)
            if container.cores:
                chosen = choose_cores(node.topo, node.free.cores, (), container.cores).ids
                node.free = node.free.without_cores(node.topo, chosen)
                cores += chosen
                shortfall += container.cores - len(chosen)
        return sorted(devices), sorted(cores), shortfall

    def _release(self, pod: str, node_name: str | None) -> None:
        node = self.nodes.get(node_name or "")
        if node is None or pod not in node.holdings:
            return
        del node.holdings[pod]
        held_devices = {d for devices, _ in node.holdings.values() for d in devices}
        held_cores = {c for _, cores in node.holdings.values() for c in cores}
        node.free = FreeState.from_holdings(node.topo, range(node.topo.device_count), held_devices, held_cores)
        self._changed(node)

    # -- writes -----------------------------------------------------------------------------

    def _changed(self, node: SimNode) -> None:
        if self.dra:
            return  # a DRA node publishes no NeuronNode; its slices do not change with holdings
        node.changed_since_write = True
        self._schedule_write(node)

    def _schedule_write(self, node: SimNode) -> None:
        """Like the plugin's publisher, one write at a time per node: two in flight could land out of
        order and leave an older state in the API server than the node holds."""
        if node.write_pending or node.writing:
            return  # the scheduled write carries this change; the one in flight schedules the next
        node.write_pending = True
        delay = max(0.0, node.last_write + MIN_GAP - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self._report_queue.put_nowait, node.spec.name)

    async def _write_report(self, node: SimNode) -> None:
        node.write_pending, node.writing, node.changed_since_write = False, True, False
        try:
            await self.api.apply(f"{REPORTS}/{node.spec.name}", node.report(dt.datetime.now(dt.UTC)), FIELD_MANAGER)
        finally:
            node.writing = False
            node.last_write = time.monotonic()
        self.report_writes += 1
        if node.changed_since_write:
            self._schedule_write(node)

    async def _report_writer(self) -> None:
        while True:
            await self._write_report(self.nodes[await self._report_queue.get()])

    async def _status_writer(self) -> None:
        running = {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True"} for t in ("Initialized", "ContainersReady", "Ready")],
        }
        while True:
            name = await self._status_queue.get()
            try:
                await self.api.patch_status(f"{PODS}/{name}", running)
                self.running_at[name] = time.monotonic()
            except ApiError as exc:
                if exc.status != 404:  # deleted meanwhile
                    raise
            finally:
                self._statuses_unwritten -= 1

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for node in self.nodes.values():
                if not (node.write_pending or node.writing) and now - node.last_write >= self.report_interval:
                    self._changed(node)


def _claim_names(pod: dict[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    generated = [
        s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")
    ]
    named = [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
    return ([extended] if extended else []) + generated + named
