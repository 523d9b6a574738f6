"""The I/O side of `failures`: Node health from a watch, Events on the pods of degraded groups and,
when `--evict-degraded-groups` is on, their eviction. Only the leader acts (the standby's memory
stays empty, so a new leader announces every group degraded at that moment once more, counted on
the Events already there)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from neuron_common.kube import ApiError, create_or_count, event_object, news_name
from neuron_common.lifecycle import sleep_or_stop
from neuron_scheduler_extender.failures import (
    EVICTED_REASON,
    DegradedGroup,
    FailureMemory,
    GroupPod,
    NodeHealth,
    degraded_groups,
    plan,
    retry_event,
    retry_eviction,
)
from neuron_scheduler_extender.state import ClusterView

log = logging.getLogger(__name__)

COMPONENT = "neuron-scheduler-extender"


class EventApi(Protocol):
    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def get(self, path: str) -> dict[str, Any]: ...

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]: ...


class NodeHealthIndex:
    """Node name -> its Neuron health, kept by a Reflector on the Nodes (in `nodes`, which may be
    the view's own `health`: the placement of a new group avoids an UltraServer with a failed node)."""

    def __init__(self, nodes: dict[str, NodeHealth] | None = None) -> None:
        self.nodes: dict[str, NodeHealth] = {} if nodes is None else nodes

    def replace(self, records: list[NodeHealth], _: float) -> None:
        self.nodes.clear()
        self.nodes.update((r.node, r) for r in records)

    def apply(self, event: str, record: NodeHealth) -> None:
        if event == "DELETED":
            self.nodes.pop(record.node, None)
        else:
            self.nodes[record.node] = record


class GroupHealthMonitor:
    def __init__(
        self,
        api: EventApi,
        view: ClusterView,
        health: NodeHealthIndex,
        *,
        leading: Callable[[], bool],
        synced: Callable[[], bool],
        evict: bool = False,
        interval: float = 5.0,
        identity: str = COMPONENT,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api, self.view, self.health = api, view, health
        self.leading, self.synced = leading, synced
        self.evict, self.interval, self.identity = evict, interval, identity
        self.wall_clock = wall_clock
        self.memory = FailureMemory()
        self.events_sent = 0
        self.evictions = 0
        self.failures = 0
        # rounds acted on (leading, synced): who waits for the monitor to have seen a state counts
        # two more, since one may have begun before the state
        self.rounds = 0

    def degraded(self) -> dict[str, DegradedGroup]:
        return degraded_groups(self.view.group_placements(), self.view.reports, self.health.nodes)

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.interval):
            await self.step()

    async def step(self) -> None:
        """One round: act on the transitions since the last one."""
        if not self.leading() or not self.synced():
            self.memory = FailureMemory()  # a standby keeps nothing: the leader acts
            return
        placements = self.view.group_placements()
        degraded = degraded_groups(placements, self.view.reports, self.health.nodes)
        live = (p.uid for g in placements for p in g.pods)
        actions = plan(degraded, self.memory, evict=self.evict, live=live)
        for event in actions.events:
            if event.warning:
                log.warning("%s: %s", event.pod.key, event.message, extra={"group": event.group})
            try:
                await self._event(event.pod, event.reason, event.message, warning=event.warning)
                self.events_sent += 1
            except ApiError as exc:
                self.failures += 1
                retry_event(self.memory, event)
                log.warning("could not create Event on pod %s: %s", event.pod.key, exc)
        for pod, why in actions.evictions:
            try:
                await self._evict(pod)
                self.evictions += 1
                log.warning("evicted pod %s: %s", pod.key, why)
                await self._event(pod, EVICTED_REASON, f"evicted so its controller places the group again: {why}")
            except ApiError as exc:
                if exc.status in (404, 409):
                    continue  # gone already, or re-created under its name (the UID precondition)
                self.failures += 1
                retry_eviction(self.memory, pod)
                log.warning("could not evict pod %s (trying again): %s", pod.key, exc)
        self.rounds += 1

    async def _event(self, pod: GroupPod, reason: str, message: str, *, warning: bool = True) -> None:
        now = self.wall_clock().timestamp()
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        name = news_name(pod.name, pod.uid, reason, message)
        event = event_object(
            name=name, namespace=pod.namespace, involved=involved, reason=reason,
            message=message, type="Warning" if warning else "Normal", count=1, first=now, last=now,
            component=COMPONENT, instance=self.identity,
        )  # fmt: skip
        await create_or_count(self.api, event, now)

    async def _evict(self, pod: GroupPod) -> None:
        await self.api.create(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                # the UID: never evict a pod re-created under the same name meanwhile
                "deleteOptions": {"preconditions": {"uid": pod.uid}},
            },
        )
