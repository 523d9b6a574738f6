"""The node's device health, fed by the shared monitors (`neuron_common.health_monitor`) and read
by the slice publisher (an unhealthy device leaves the pool) and NodePrepareResources (a claim
on an unhealthy device is refused with the reason)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from neuron_common.device_health import (
    Finding,
    HealthTracker,
    Verdict,
    expected_devices,
    logged_transitions,
    merged_verdicts,
)
from neuron_sysfs.inventory import NodeInventory

log = logging.getLogger(__name__)


class NodeHealth:
    def __init__(
        self, inventory: NodeInventory, quiet_period: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.tracker = HealthTracker(quiet_period)
        self.external: dict[int, str] = {}
        self.known: set[int] = set()
        self._verdicts: dict[int, Verdict] = {}
        self._event = asyncio.Event()
        self._inventory = inventory
        self.set_inventory(inventory)

    @property
    def inventory(self) -> NodeInventory:
        return self._inventory

    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) on every change of the inventory or of a verdict."""
        return self._event

    def _notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def set_inventory(self, inventory: NodeInventory) -> None:
        self._inventory = inventory
        present = {d.index for d in inventory.devices}
        self.known |= present | expected_devices(inventory)
        self.tracker.observe_presence({i: i in present for i in self.known}, self.clock())
        self.refresh_health()
        self._notify()

    def observe(self, findings: Iterable[Finding]) -> None:
        now = self.clock()
        for finding in findings:
            if finding.device in self.known:
                self.tracker.observe(finding, now)
        self.refresh_health()

    def driver_reloaded(self, devices: Iterable[int]) -> None:
        self.tracker.driver_reloaded(devices)
        self.refresh_health()

    def set_external_verdicts(self, unhealthy: dict[int, str]) -> None:
        if unhealthy != self.external:
            self.external = dict(unhealthy)
            self.refresh_health()

    def refresh_health(self) -> bool:
        verdicts = merged_verdicts(self.tracker, sorted(self.known), self.external, self.clock())
        changed, _ = logged_transitions(self._verdicts, verdicts, log)
        self._verdicts = verdicts
        if changed:
            self._notify()
        return changed

    def unhealthy(self) -> dict[int, str]:
        """Device -> why, for every device not healthy now."""
        return {d: v.reason or "unhealthy" for d, v in self._verdicts.items() if not v.healthy}
