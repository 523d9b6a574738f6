"""What the plugin advertises, in one place: devices and cores, their health, who holds what.

Every input (a rescan, a health finding, a PodResources list, an allocation) goes through
here; any change wakes the ListAndWatch streams, which send the complete list again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kubelet_api import HEALTHY, UNHEALTHY
from kubelet_api.podresources_client import Holding
from neuron_device_plugin.holdings import Holdings, build_holdings, conflicts, describe
from neuron_device_plugin.metrics import PluginMetrics
from neuron_driver.inventory import NodeInventory, topology_from
from neuron_driver.lnc import LncSource
from neuron_health.device_health import DeviceHealth, Finding, Verdict
from neuron_model import resources
from neuron_model.allocator import Topology
from neuron_model.resources import Kind, Resource
from neuron_model.ultraserver import State, UltraServerReading, ultraserver_env

log = logging.getLogger(__name__)

# The kubelet records an allocation right after Allocate returns; a List made this long after
# a hand-out that does not show it means the hand-out did not stick.
LIST_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class AdvertisedId:
    id: str
    healthy: bool
    numa_node: int | None


@dataclass(frozen=True, slots=True)
class KnownDevice:
    index: int
    numa_node: int | None
    cores: tuple[int, ...]


class AllocationRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # unknown_id / conflict / unhealthy / ultraserver (a metric label)


class PluginState:
    def __init__(
        self,
        inventory: NodeInventory,
        plugin_resources: Iterable[Resource],
        metrics: PluginMetrics,
        *,
        quiet_period: float,
        pending_ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.resources = {r.full_name: r for r in plugin_resources}
        self.pending_ttl = pending_ttl
        self._kubelet: list[Holding] = []
        self._pending: dict[tuple[str, int], tuple[float, Resource]] = {}
        self._holdings: Holdings | None = None  # cached until the next change
        self._event = asyncio.Event()
        # Set by the first List: until then any ID may be held through the other resource (a pod
        # admitted before this process started), so nothing can be offered as free.
        self.holdings_known = asyncio.Event()
        self.known: dict[int, KnownDevice] = {}
        self.topology = topology_from(inventory)
        # Every health change wakes the ListAndWatch streams (and the node report) through `notify`.
        self.health = DeviceHealth(
            inventory,
            quiet_period,
            clock,
            logger=log,
            on_change=self.notify,
            on_transition=self._count_transition,
            warn_unknown_devices=True,
        )
        self._learn_devices(inventory, renumbered=False)

    # -- change notification -------------------------------------------------------------------
    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) on every change: await it, then read the lists again."""
        return self._event

    def notify(self) -> None:
        self._holdings = None
        event, self._event = self._event, asyncio.Event()
        event.set()

    # -- inputs ----------------------------------------------------------------------------------
    @property
    def inventory(self) -> NodeInventory:
        return self.health.inventory

    def set_inventory(self, inventory: NodeInventory) -> None:
        topology = topology_from(inventory)
        renumbered = bool(self.known) and topology.cores_per_device != self.topology.cores_per_device
        if renumbered:
            log.warning(
                "logical cores per device changed from %d to %d; core IDs are renumbered",
                self.topology.cores_per_device,
                topology.cores_per_device,
            )
        self.topology = topology
        # A renumbering starts the device list afresh: only devices present or promised stay. The
        # streams `health` wakes run only after this returns, so they read the new `known`.
        self.health.set_inventory(inventory, forget_vanished=renumbered)
        self._learn_devices(inventory, renumbered=renumbered)

    def _learn_devices(self, inventory: NodeInventory, *, renumbered: bool) -> None:
        """One entry per device health knows of; a device gone from sysfs keeps its last NUMA node."""
        numa = {} if renumbered else {i: d.numa_node for i, d in self.known.items()}
        numa |= {d.index: d.numa_node for d in inventory.devices}
        self.known = {
            i: KnownDevice(i, numa.get(i), topology_cores(self.topology, i)) for i in sorted(self.health.known)
        }

    # The health inputs (`neuron_health.monitor.HealthSink`) go to `health`, which wakes
    # the streams through `notify` when a verdict changes.
    def observe(self, findings: Iterable[Finding]) -> None:
        self.health.observe(findings)

    def driver_reloaded(self, devices: Iterable[int]) -> None:
        self.health.driver_reloaded(devices)

    def set_external_verdicts(self, unhealthy: dict[int, str]) -> None:
        self.health.set_external_verdicts(unhealthy)

    def set_multi_node_unfit(self, unfit: Mapping[int, tuple[str, ...]]) -> None:
        self.health.set_multi_node_unfit(unfit)

    def refresh_health(self) -> bool:
        return self.health.refresh_health()

    def _count_transition(self, device: int, verdict: Verdict) -> None:
        self.metrics.health_transitions.labels(str(device), "healthy" if verdict.healthy else "unhealthy").inc()

    def set_kubelet_holdings(self, holdings: Iterable[Holding], started_at: float) -> None:
        """A List answer. Own hand-outs stay counted until a List made after them settles
        them: either it reports them (the kubelet tracks them from here on), or it was made
        `LIST_GRACE` seconds after them and does not (the pod is gone, or its admission
        failed)."""
        new = [h for h in holdings if h.resource in self.resources]
        reported = {(h.resource, h.device_id) for h in new}
        before = len(self._pending)
        self._pending = {
            key: (t, r)
            for key, (t, r) in self._pending.items()
            if t > started_at or ((key[0], _id_for(r, key[1])) not in reported and t > started_at - LIST_GRACE)
        }
        if new != self._kubelet or len(self._pending) != before or not self.holdings_known.is_set():
            self._kubelet = new
            self.holdings_known.set()
            self.notify()

    def record_allocation(self, resource: Resource, indices: Iterable[int]) -> None:
        now = self.clock()
        added = False
        for i in indices:
            key = (resource.full_name, i)
            added = added or key not in self._pending
            self._pending[key] = (now, resource)
        if added:  # the same IDs again (a retried admission) change nothing advertised
            self.notify()

    def expire_pending(self) -> None:
        now = self.clock()
        before = len(self._pending)
        self._pending = {k: (t, r) for k, (t, r) in self._pending.items() if now - t < self.pending_ttl}
        if len(self._pending) != before:
            log.info(
                "%d own allocation(s) were never confirmed by the kubelet and expired", before - len(self._pending)
            )
            self.notify()

    # -- views -----------------------------------------------------------------------------------
    def holdings(self) -> Holdings:
        if self._holdings is None:
            self._holdings = self._build_holdings()
        return self._holdings

    def listed_holdings(self) -> Holdings:
        """The holdings of the kubelet's last List alone: those of the pods `holding_pods` names."""
        return build_holdings(self._listed_entries())

    def _build_holdings(self) -> Holdings:
        entries = self._listed_entries()
        entries.extend((r, i, "a pending allocation") for (_, i), (_, r) in self._pending.items())
        return build_holdings(entries)

    def _listed_entries(self) -> list[tuple[Resource, int, str]]:
        entries: list[tuple[Resource, int, str]] = []
        for h in self._kubelet:
            resource = self.resources[h.resource]
            parsed = resources.parse_id(h.device_id)
            if parsed is not None and parsed[0] is resource.kind:
                entries.append((resource, parsed[1], f"{h.namespace}/{h.pod}/{h.container}"))
        return entries

    def holding_pods(self) -> frozenset[str]:
        """The pods ("namespace/name") the kubelet's last List showed holding one of our IDs."""
        return frozenset(f"{h.namespace}/{h.pod}" for h in self._kubelet)

    def pod_cores(self) -> dict[str, frozenset[int]]:
        """Per pod of `holding_pods`, the global logical cores its IDs cover (a device: all its cores)."""
        held: dict[str, set[int]] = {}
        for resource, index, owner in self._listed_entries():
            pod = owner.rsplit("/", 1)[0]
            cores = self.topology.cores_of(index) if resource.kind is Kind.DEVICE else (index,)
            held.setdefault(pod, set()).update(cores)
        return {pod: frozenset(cores) for pod, cores in held.items()}

    def verdict(self, device: int) -> Verdict:
        return self.health.verdict(device)

    def advertised(self, resource: Resource) -> list[AdvertisedId]:
        holdings = self.holdings()
        result: list[AdvertisedId] = []
        for index in sorted(self.known):
            dev = self.known[index]
            healthy = self.verdict(index).healthy
            if resource.kind is Kind.DEVICE:
                free = not conflicts(resource, index, holdings, dev.cores, None)
                result.append(AdvertisedId(resources.device_id(index), healthy and free, dev.numa_node))
            else:
                for core in dev.cores:
                    free = not conflicts(resource, core, holdings, (), index)
                    result.append(AdvertisedId(resources.core_id(core), healthy and free, dev.numa_node))
        for health in (HEALTHY, UNHEALTHY):
            count = sum(1 for a in result if a.healthy == (health == HEALTHY))
            self.metrics.devices.labels(resource.full_name, health).set(count)
        return result

    def check_allocation(self, resource: Resource, ids: Iterable[str]) -> list[int]:
        """The indices behind `ids`, or AllocationRefused naming the first problem found."""
        indices: list[int] = []
        holdings = self.holdings()
        for raw in ids:
            parsed = resources.parse_id(raw)
            if parsed is None or parsed[0] is not resource.kind:
                raise AllocationRefused("unknown_id", f"unknown device ID {raw!r} for {resource.full_name}")
            index = parsed[1]
            device = index if resource.kind is Kind.DEVICE else self.topology.device_of(index)
            known = self.known.get(device)
            if known is None or (resource.kind is Kind.CORE and index not in known.cores):
                raise AllocationRefused("unknown_id", f"unknown device ID {raw!r} for {resource.full_name}")
            held = conflicts(resource, index, holdings, known.cores, device if resource.kind is Kind.CORE else None)
            if held:
                raise AllocationRefused(
                    "conflict",
                    f"{raw} is the same silicon already held by {describe(held)}; refusing to share it. "
                    "Request either whole devices or cores on a node, or wait for the holder to finish.",
                )
            verdict = self.verdict(device)
            if not verdict.healthy:
                raise AllocationRefused("unhealthy", f"{raw} is on unhealthy device neuron{device}: {verdict.reason}")
            indices.append(index)
        return indices

    def visible_cores(self, resource: Resource, indices: Iterable[int]) -> list[int]:
        if resource.kind is Kind.CORE:
            return sorted(indices)
        return sorted(c for d in indices for c in self.known[d].cores)

    def devices_of(self, resource: Resource, indices: Iterable[int]) -> list[int]:
        if resource.kind is Kind.DEVICE:
            return sorted(set(indices))
        return sorted({self.topology.device_of(c) for c in indices})

    def holds_every_device(self, resource: Resource, indices: Iterable[int]) -> bool:
        """Whether `indices` of `resource` are all of the node's silicon: every device the plugin
        knows, whole (as devices, or as every one of their cores)."""
        every = {c for d in self.known.values() for c in d.cores}
        return bool(self.known) and set(self.visible_cores(resource, indices)) == every

    @property
    def lnc_env(self) -> str | None:
        lnc = self.inventory.lnc
        return None if lnc.source is LncSource.DEFAULT else str(lnc.value)


def whole_node_ultraserver_env(nodes: int, reading: UltraServerReading) -> dict[str, str]:
    """The runtime's UltraServer variables for a container holding all of the node's devices, with
    --ultraserver-env `nodes`: none on a node outside any UltraServer (a trn1 beside the trn2u nodes
    the flag is meant for: nothing to tell); the driver's identity for a group of `nodes`; ValueError
    while the identity is pending, unreadable, or has no such group. Refused, not started without
    them: AWS's init script refuses too, the DRA driver refuses an UltraServerConfig it cannot
    honour, and a job that spans nodes started without its identity (or with a guessed one) would
    fail later and less clearly."""
    if reading.state is State.NONE:
        return {}
    return ultraserver_env(reading, nodes)


def topology_cores(topology: Topology, device: int) -> tuple[int, ...]:
    return tuple(topology.cores_of(device))


def _id_for(resource: Resource, index: int) -> str:
    return resources.device_id(index) if resource.kind is Kind.DEVICE else resources.core_id(index)
