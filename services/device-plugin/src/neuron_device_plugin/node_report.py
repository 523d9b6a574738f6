"""`--node-report`: publishes this node's `NeuronNode` for the Neuron-aware scheduler.

The report (`neuron_model.report.NodeReport`) is built from the plugin's own state, the one that
answers the kubelet, so the scheduler extender counts on exactly what the next Allocate will find:
the topology as the allocator uses it, and as free only the cores that no one holds through either
resource (the kubelet's holdings and the plugin's own hand-outs it has not confirmed yet) on
devices that are healthy; and, apart, the cores held only through those hand-outs, whose pods
the report cannot name yet.

Writing: a server-side apply of the whole object, forced, by field manager `neuron-device-plugin`
(the plugin is the object's only writer; an admission policy lets each plugin write only its own
node's object). A change is written at once, but at most one write per `min_gap` seconds, so a
burst of changes is one write; without changes the object is written again every `interval`
seconds, a heartbeat whose age tells the extender the report is current. While the API server is
unreachable nothing queues: each attempt, after back-off, writes the state as it is then. One
warning per outage, one line when writes succeed again; an API error never ends the loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from neuron_common.backoff import Backoff
from neuron_common.kube import Api, ApiError
from neuron_common.lifecycle import wait_any
from neuron_device_plugin.holdings import unheld_cores
from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.state import PluginState
from neuron_model.report import GROUP, PLURAL, VERSION, NodeReport
from neuron_model.ultraserver import UltraServerReading

log = logging.getLogger(__name__)

FIELD_MANAGER = "neuron-device-plugin"
MIN_GAP = 0.5

Apply = Callable[[dict[str, Any]], Awaitable[None]]
Wait = Callable[..., Awaitable[None]]  # wait_any(*events, timeout=...)


class ReportWriteError(Exception):
    """One write failed in a way that a later attempt may not (the API server down, refusing, timing out)."""


def build_report(
    state: PluginState, node: str, now: dt.datetime, ultraserver: UltraServerReading | None = None
) -> NodeReport:
    """What `node` has free now, as the plugin would allocate it, and its UltraServer identity as
    the driver tells it now (read again for each report: it is pending until the election ends)."""
    topology = state.topology
    count = topology.device_count
    healthy = {d: known.cores for d, known in state.known.items() if d < count and state.verdict(d).healthy}
    free_cores = unheld_cores(state.holdings(), healthy)
    return NodeReport(
        node=node,
        instance_type=state.inventory.instance_type_name,
        topology=topology.kind,
        device_count=count,
        torus_shape=topology.torus_shape,
        adjacency=topology.adjacency,
        cores_per_device=topology.cores_per_device,
        logical_core_config=state.inventory.lnc.value,
        free_cores=free_cores,
        # a device of the instance that the plugin does not serve, unhealthy or absent, is not usable
        unhealthy_devices=frozenset(range(count)) - healthy.keys(),
        pods=state.holding_pods(),
        pod_cores=state.pod_cores(),
        heartbeat=now,
        ultraserver=ultraserver,
        # Allocate does not name the pod, so until a List shows it its silicon is held by no pod in
        # `pods`; the extender, which counts the bound pods missing from `pods` itself, needs to know
        # it is among what they hold, or it counts that silicon twice
        pending_cores=unheld_cores(state.listed_holdings(), healthy) - free_cores,
        multi_node_unfit=frozenset(d for d in state.health.multi_node_unfit if d < count),
    )


class NodeReportPublisher:
    def __init__(
        self,
        build: Callable[[], dict[str, Any]],
        apply: Apply,
        metrics: PluginMetrics,
        *,
        interval: float,
        min_gap: float = MIN_GAP,
        clock: Callable[[], float] = time.monotonic,
        wait: Wait = wait_any,
        backoff: Backoff | None = None,
    ) -> None:
        self.build = build  # the object to write, from the state as it is when called
        self.apply = apply  # raises ReportWriteError
        self.metrics = metrics
        self.interval = interval
        self.min_gap = min_gap
        self.clock = clock
        self.wait = wait
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self.up: bool | None = None  # None until the first attempt
        self.written_at = -math.inf

    async def write_once(self) -> bool:
        obj = self.build()
        name = obj["metadata"]["name"]
        try:
            await self.apply(obj)
        except ReportWriteError as exc:
            self.metrics.node_report_writes.labels("error").inc()
            self.metrics.node_report_up.set(0)
            if self.up is not False:
                log.warning(
                    "cannot write NeuronNode %s: %s; retrying with back-off, the state of the moment is written "
                    "when the API server accepts it",
                    name,
                    exc,
                    extra={"node": name},
                )
            self.up = False
            return False
        self.metrics.node_report_writes.labels("success").inc()
        self.metrics.node_report_up.set(1)
        if self.up is not True:
            log.info(
                "NeuronNode %s %s",
                name,
                "written again" if self.up is False else "published",
                extra={"node": name, "devices": obj["status"]["devices"], "cores": obj["status"]["cores"]},
            )
        self.up = True
        self.backoff.reset()
        self.written_at = self.clock()
        return True

    async def run(self, stop: asyncio.Event, changed: Callable[[], asyncio.Event]) -> None:
        """Until `stop`. `changed()` is the event the next change of the state sets (PluginState.changed)."""
        while not stop.is_set():
            change = changed()  # taken before the state is read, so no change slips between read and wait
            if not await self.write_once():
                await self.wait(stop, timeout=self.backoff.next_delay())
                continue
            await self.wait(stop, change, timeout=self.interval)
            gap = self.min_gap - (self.clock() - self.written_at)
            if change.is_set() and gap > 0:
                await self.wait(stop, timeout=gap)


# -- the API server --------------------------------------------------------------------------------
# Through neuron_common.kube, the plugin's one API client (also its labels' and /metrics reviews'):
# the kubernetes client added about 20 MB to a plugin of about 56.


class ServerSideApply:
    """Writes a NeuronNode with a forced server-side apply."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def __call__(self, obj: dict[str, Any]) -> None:
        path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{obj['metadata']['name']}"
        try:
            await self.api.apply(path, obj, FIELD_MANAGER)
        except ApiError as exc:
            if not exc.status:  # no answer: unreachable, reset, timed out, TLS
                raise ReportWriteError(exc.message[:300]) from None
            # neuron_common.kube has taken the message out of the Status already: whole, not cut as raw text is
            raise ReportWriteError(describe_refusal(exc.status, None, exc.message)) from None


def describe_api_error(status: int | None, reason: str | None, body: Any) -> str:
    """The API server's own message (an admission policy's refusal says why), and what a 404 means here."""
    message = ""
    try:
        parsed = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        message = parsed["message"]
    elif isinstance(body, str):
        message = body[:300]
    return describe_refusal(status, reason, message)


def describe_refusal(status: int | None, reason: str | None, message: str) -> str:
    """The API server's message whole (an admission policy's refusal ends with why), and what a 404 means."""
    text = f"HTTP {status} {reason or ''}".rstrip() + (f": {message}" if message else "")
    if status == 404:
        text += f" (is the {PLURAL}.{GROUP} CRD installed? the chart installs it with scheduler.enabled=true)"
    return text
