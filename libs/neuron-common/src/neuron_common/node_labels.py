"""Keeps a set of labels on this node's Node equal to what a function says they should be.

Written with server-side apply by one field manager that owns only these labels: applying the set
as it is now adds, changes, and (since the manager owned them before) removes labels in one
request, without reading the Node and without touching any other label. The node agents' tokens
may do nothing else to a Node: the chart's admission policy holds them to their own node and to
labels under the prefix they own.

A set is applied when it differs from the last one applied, and a non-empty one again every
`refresh` seconds (a label someone else removed comes back); a node outside any UltraServer costs one
request per start. While the API server is unreachable or refuses, the loop
retries with back-off, applying the set as it is then; one warning per outage.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import Counter

from neuron_common.backoff import Backoff
from neuron_common.kube import Api, ApiError
from neuron_common.lifecycle import wait_any
from neuron_common.metrics import MetricSet
from neuron_model.ultraserver import LABELS_FIELD_MANAGER, UltraServerReading, node_labels

log = logging.getLogger(__name__)

Wait = Callable[..., Awaitable[None]]  # wait_any(*events, timeout=...)


class NodeLabeler:
    def __init__(
        self,
        api: Api,
        node: str,
        desired: Callable[[], Mapping[str, str]],
        *,
        field_manager: str,
        interval: float = 30.0,
        refresh: float = 600.0,
        on_write: Callable[[str], None] = lambda outcome: None,
        clock: Callable[[], float] = time.monotonic,
        wait: Wait = wait_any,
        backoff: Backoff | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.desired = desired  # read again every `interval` seconds: an identity can still change
        self.field_manager = field_manager
        self.interval = interval
        self.refresh = refresh
        self.on_write = on_write  # "success" or "error", for a counter
        self.clock = clock
        self.wait = wait
        self.backoff = backoff or Backoff(initial=1.0, maximum=60.0)
        self.applied: dict[str, str] | None = None  # None until the first successful apply
        self.applied_at = -math.inf
        self.up: bool | None = None

    async def apply(self, labels: Mapping[str, str]) -> bool:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": dict(labels)}}
        try:
            await self.api.apply(f"/api/v1/nodes/{self.node}", body, self.field_manager)
        except ApiError as exc:
            self.on_write("error")
            if self.up is not False:
                log.warning(
                    "cannot label node %s: %s; retrying with back-off",
                    self.node,
                    exc,
                    extra={"node": self.node, "labels": dict(labels)},
                )
            self.up = False
            return False
        self.on_write("success")
        if labels != self.applied:
            log.info("node %s labelled", self.node, extra={"node": self.node, "labels": dict(labels)})
        elif self.up is False:
            log.info("node %s labels written again", self.node, extra={"node": self.node})
        self.up = True
        self.applied, self.applied_at = dict(labels), self.clock()
        self.backoff.reset()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            labels = dict(self.desired())
            # an empty set, once applied, has nothing to restore: the manager owns no label any more
            due = labels != self.applied or (bool(labels) and self.clock() - self.applied_at >= self.refresh)
            if due and not await self.apply(labels):
                await self.wait(stop, timeout=self.backoff.next_delay())
                continue
            await self.wait(stop, timeout=self.interval)


def ultraserver_label_writes(metrics: MetricSet) -> Counter:
    """`<prefix>_node_label_writes`, the counter `ultraserver_labeler` counts its applies in."""
    return metrics.counter(
        "node_label_writes",
        "Applies of this node's UltraServer labels (--ultraserver-labels), by result (success or error)",
        ["result"],
    )


def ultraserver_labeler(api: Api, node: str, read: Callable[[], UltraServerReading], writes: Counter) -> NodeLabeler:
    """AWS's UltraServer labels on this node (--ultraserver-labels of the device plugin and the DRA
    driver), from `read` (the driver's identity), each apply counted in `writes` by result."""
    return NodeLabeler(
        api,
        node,
        lambda: node_labels(read()),
        field_manager=LABELS_FIELD_MANAGER,
        on_write=lambda result: writes.labels(result).inc(),
    )
