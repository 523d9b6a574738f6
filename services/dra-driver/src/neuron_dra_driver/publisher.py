"""Keeps this node's ResourceSlices in the API server equal to what the node model says.

On start, and whenever the health or the inventory changes (and every `resync` anyway), the
slices are rebuilt; when their content differs from what the API server has, they are written
with server-side apply under a new pool generation (the scheduler uses only the highest
generation of a pool, so a half-written update is never mixed with the previous one), and slices
no longer needed are deleted. A failed write is retried with back-off.

Device taints need `DRADeviceTaints` on the API server (Beta and on in 1.36, alpha and off in
1.34 and 1.35); an API server without it drops them silently from what it stores, which would
publish an unhealthy device as allocatable. So the publisher checks what the server kept: when
a written taint is gone, it says so (log, `neuron_dra_device_taints_kept` 0) and from then on
leaves unhealthy devices out of the pool instead. Likewise the shared counters that keep a
device and its cores from both being handed out need `DRAPartitionableDevices` (Beta and on in
1.36, alpha and off before): a server that drops them would let the scheduler allocate a device
and one of its cores to two claims, so when they are gone the publisher stops publishing cores
(`neuron_dra_shared_counters_kept` 0) and the node offers whole devices only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from neuron_common.backoff import Backoff
from neuron_common.kube import ApiError, WatchEvent
from neuron_common.lifecycle import wait_any
from neuron_dra_driver import slices
from neuron_dra_driver.metrics import DriverMetrics

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER = "neuron-dra-driver"


@dataclass(frozen=True)
class _Feature:
    """A part of the slices an API server may drop silently, and how the publisher gives it up."""

    used: Callable[[list[dict[str, Any]]], bool]  # whether slices use it
    flag: str  # the publisher's attribute set once the server dropped it
    gauge: str  # the metric set to 0 then
    warning: str


_FEATURES = (
    _Feature(
        slices.tainted,
        "taints_dropped",
        "taints_kept",
        "the API server dropped the device taints (DRADeviceTaints off: Kubernetes before 1.36?); "
        "unhealthy devices are left out of the ResourceSlices instead",
    ),
    _Feature(
        slices.shareable,
        "shares_dropped",
        "shares_kept",
        "the API server dropped the shareable devices (DRAConsumableCapacity off: Kubernetes before 1.36?); "
        "cores are published as devices sharing their device's counter instead",
    ),
    _Feature(
        slices.counted,
        "counters_dropped",
        "counters_kept",
        "the API server dropped the shared counters (DRAPartitionableDevices off: Kubernetes before 1.36?); "
        "a device and its cores could be handed out together, so only whole devices are published",
    ),
)


class SliceApi(Protocol):
    async def get(self, path: str) -> dict[str, Any]: ...

    async def apply(self, path: str, body: Any, field_manager: str) -> dict[str, Any]: ...

    async def delete(self, path: str) -> dict[str, Any]: ...

    async def request(self, method: str, path: str, *, params: Any = None) -> dict[str, Any]: ...

    def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, seconds: float
    ) -> AsyncIterator[WatchEvent]: ...


@dataclass(eq=False)
class SlicePublisher:
    api: SliceApi
    node_name: str
    model: Callable[[], slices.NodeDevices]
    metrics: DriverMetrics
    resync: float = field(kw_only=True)
    generation: int = field(default=0, init=False)
    synced: bool = field(default=False, init=False)  # the API server has the current slices
    taints_dropped: bool = field(default=False, init=False)  # the API server does not keep device taints
    counters_dropped: bool = field(default=False, init=False)  # the API server does not keep shared counters
    shares_dropped: bool = field(default=False, init=False)  # the API server does not keep shareable devices
    _kick: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def kick(self) -> None:
        """Check the API server now: the kubelet deletes a node's slices of a driver it has lost
        (and after its own restart), and registers the driver again afterwards."""
        self._kick.set()

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={slices.DRIVER}"

    async def existing(self) -> list[dict[str, Any]]:
        answer = await self.api.request("GET", SLICES, params={"fieldSelector": self.selector})
        items = answer.get("items") or []
        return [i for i in items if isinstance(i, dict)]

    async def sync(self) -> bool:
        """One pass; True when something was written."""
        model = self.model()
        if self.taints_dropped:
            model = model.without_taints()
        if self.shares_dropped:
            model = replace(model, cores_as_capacity=False)
        if self.counters_dropped:
            model = replace(model, publish_cores=False)
        found = await self.existing()
        found_gen = max((int(s["spec"]["pool"].get("generation", 0)) for s in found), default=0)
        self.generation = max(self.generation, found_gen)
        desired = slices.build(model, self.generation)
        counts = slices.published_counts(desired)
        for kind in ("device", "core", "group"):
            self.metrics.published_devices.labels(kind).set(counts[kind])
        self.metrics.tainted_devices.set(counts["tainted"])
        self.metrics.unhealthy_devices.set(len(set(model.unhealthy) | set(model.taints)))
        self.metrics.taints_kept.set(0 if self.taints_dropped else 1)
        self.metrics.counters_kept.set(0 if self.counters_dropped else 1)
        self.metrics.shares_kept.set(0 if self.shares_dropped else 1)
        one_generation = len({s["spec"]["pool"].get("generation") for s in found}) == 1
        if one_generation and _comparable(found) == _comparable(desired):
            self.synced = True
            return False
        self.generation += 1
        desired = slices.build(model, self.generation)
        stored = [await self.api.apply(f"{SLICES}/{obj['metadata']['name']}", obj, FIELD_MANAGER) for obj in desired]
        if self._dropped_features(desired, stored):
            return await self.sync()
        wanted = {s["metadata"]["name"] for s in desired}
        for obj in found:
            name = obj["metadata"]["name"]
            if name not in wanted:
                await self._delete(name)
        self.metrics.slice_updates.inc()
        self.synced = True
        log.info(
            "published %d device(s) and %d core(s) in %d slice(s), pool generation %d",
            counts["device"],
            counts["core"],
            len(desired),
            self.generation,
            extra={"unhealthy": sorted(model.unhealthy)},
        )
        return True

    async def _delete(self, name: str) -> None:
        """A leftover slice already gone (the kubelet deletes a lost driver's slices) is what was wanted."""
        try:
            await self.api.delete(f"{SLICES}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _dropped_features(self, desired: list[dict[str, Any]], stored: list[dict[str, Any]]) -> bool:
        """Whether the API server stored the slices without a feature they use (a gate that is off before
        Kubernetes 1.36); each such feature is then given up for good, said once in the log and a metric."""
        dropped = False
        for feature in _FEATURES:
            if not getattr(self, feature.flag) and feature.used(desired) and not feature.used(stored):
                setattr(self, feature.flag, True)
                getattr(self.metrics, feature.gauge).set(0)
                log.warning(feature.warning)
                dropped = True
        return dropped

    async def run(self, stop: asyncio.Event, changed: Callable[[], asyncio.Event]) -> None:
        backoff = Backoff(initial=0.5, maximum=30.0)
        while not stop.is_set():
            wake = changed()
            self._kick.clear()
            try:
                await self.sync()
                backoff.reset()
                await wait_any(wake, self._kick, stop, timeout=self.resync)
            except ApiError as exc:
                self.synced = False
                self.metrics.errors.labels("publish").inc()
                delay = backoff.next_delay()
                log.warning("cannot publish the ResourceSlices (%s); again in %.1fs", exc, delay)
                await wait_any(stop, timeout=delay)

    async def watch_deletions(self, stop: asyncio.Event) -> None:
        """Republish at once when one of this node's slices is deleted (the kubelet deletes them
        all when it starts, possibly after the driver has published)."""
        task = asyncio.create_task(self._watch(stop))
        try:
            await stop.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, stop: asyncio.Event) -> None:
        backoff = Backoff(initial=0.5, maximum=30.0)
        while not stop.is_set():
            try:
                answer = await self.api.request("GET", SLICES, params={"fieldSelector": self.selector})
                version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
                async for event in self.api.watch(SLICES, {"fieldSelector": self.selector}, version, 300):
                    backoff.reset()
                    if event.type == "DELETED":
                        self.kick()
            except ApiError as exc:
                delay = backoff.next_delay()
                log.debug("watching the ResourceSlices: %s; again in %.1fs", exc, delay)
                await wait_any(stop, timeout=delay)


def _comparable(objs: list[dict[str, Any]]) -> list[Any]:
    """Slices' content without the pool generation, by name, without the empty defaults the API
    server may add: equal means nothing to write."""
    return [(name, _strip(spec)) for name, spec in sorted(slices.content(objs), key=lambda item: str(item[0]))]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        # timeAdded: the API server stamps each taint with it
        return {k: _strip(v) for k, v in value.items() if v not in (None, [], {}, False) and k != "timeAdded"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value
