"""The node's EC2 placement (network node layers, capacity block), read from its Node's labels at
start and at every resync; a change re-publishes the slices. Reading needs `get` on nodes; a Node
that is missing or unreadable leaves the attributes out (logged, counted) and is read again later,
so the driver never stops publishing for want of them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from neuron_common.kube import ApiError, ObjectReader
from neuron_common.lifecycle import wait_any
from neuron_dra_driver.metrics import DriverMetrics
from neuron_model.placement_labels import placement_attributes

log = logging.getLogger(__name__)


@dataclass(eq=False)
class NodePlacement:
    api: ObjectReader
    node_name: str
    interval: float
    metrics: DriverMetrics
    on_change: Callable[[], None]
    attributes: dict[str, str] = field(default_factory=dict, init=False)
    _failing: bool = field(default=False, init=False)

    async def refresh(self) -> None:
        try:
            node = await self.api.get(f"/api/v1/nodes/{self.node_name}")
        except ApiError as exc:
            self.metrics.errors.labels("node").inc()
            if not self._failing:  # once per outage: a resync every minute would repeat it
                log.warning("cannot read Node %s for its placement labels (read again later): %s", self.node_name, exc)
            self._failing = True
            return
        self._failing = False
        labels = (node.get("metadata") or {}).get("labels") or {}
        attributes = placement_attributes(labels if isinstance(labels, dict) else {})
        if attributes != self.attributes:
            log.info("placement attributes from the Node's labels", extra={"attributes": attributes})
            self.attributes = attributes
            self.on_change()

    async def run(self, stop: asyncio.Event) -> None:
        # The first read is the caller's, before the first slices are published.
        while not stop.is_set():
            await wait_any(stop, timeout=self.interval)
            if not stop.is_set():
                await self.refresh()
