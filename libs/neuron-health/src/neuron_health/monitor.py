"""The loops that feed a node's device health (the device plugin's state, the DRA driver's):
device presence and error counters, the kernel log, and the problem detector's per-device verdicts."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from neuron_common.lifecycle import sleep_or_stop
from neuron_driver.counters import CounterKind, CounterReader, device_totals, devices_reset
from neuron_driver.inventory import InventoryTracker, NodeInventory
from neuron_health import faults
from neuron_health.device_health import Finding, counter_findings
from neuron_health.kernel_log import KmsgFollower, Malformed
from neuron_health.verdicts import read_verdicts

log = logging.getLogger(__name__)


class HealthSink(Protocol):
    """What the monitors feed: the node's current inventory and its health inputs."""

    @property
    def inventory(self) -> NodeInventory: ...

    def set_inventory(self, inventory: NodeInventory) -> None: ...

    def observe(self, findings: Iterable[Finding]) -> None: ...

    def driver_reloaded(self, devices: Iterable[int]) -> None: ...

    def set_external_verdicts(self, unhealthy: dict[int, str]) -> None: ...

    def refresh_health(self) -> bool: ...


def _ignore(kind: str) -> None:
    pass


STATUS_EVERY = 4
# Only the per-core statuses behind a fault that takes a device out are worth reading here.
WATCHED_STATUSES = frozenset(c for f in faults.FAULTS if f.leaves_allocatable for c in f.core_counters)


class HealthMonitor:
    """Every `interval`: are the same devices there (rescan if not), did an error counter grow,
    did a transient verdict's quiet period end, do the problem detector's verdicts say more."""

    def __init__(
        self,
        state: HealthSink,
        host_root: Path,
        interval: float,
        verdict_dir: Path | None = None,
        *,
        on_error: Callable[[str], None] = _ignore,
        after_tick: Callable[[], None] | None = None,
    ) -> None:
        """`on_error` counts a failed tick (by kind); `after_tick` runs after each tick."""
        self.state = state
        self.on_error = on_error
        self.after_tick = after_tick
        self.host_root = host_root
        self.interval = interval
        self.verdict_dir = verdict_dir
        self._previous: dict[tuple[int, str], int] | None = None
        self._tracker = InventoryTracker(host_root, state.inventory)
        self._ticks = 0
        self._make_readers()

    def _make_readers(self) -> None:
        # The device error counters are few and read every tick; the per-core status counters
        # are many (5 a core) and read every `STATUS_EVERY` ticks, to keep idle CPU low.
        self._hardware = CounterReader(self.state.inventory, kinds={CounterKind.HARDWARE}, power=False)
        self._status = CounterReader(
            self.state.inventory,
            kinds={CounterKind.STATUS},
            power=False,
            status_names=WATCHED_STATUSES,
            status_fields=("total",),
        )

    def tick(self) -> None:
        if self._tracker.refresh():
            self.state.set_inventory(self._tracker.inventory)
            self._make_readers()
        values = self._hardware.read().values
        if self._ticks % STATUS_EVERY == 0:
            values = {**values, **self._status.read().values}
        self._ticks += 1
        totals = device_totals(values)
        if self._previous is not None:
            reloaded = devices_reset(self._previous, totals)
            if reloaded:
                log.info("the driver's counters went back down (driver reloaded) on device(s) %s", sorted(reloaded))
                self.state.driver_reloaded(reloaded)
        # a counter not read this tick (vanished device, slower cadence) keeps its last value
        current = dict(self._previous or {})
        current.update(totals)
        self.state.observe(counter_findings(self._previous, totals))
        self._previous = current
        if self.verdict_dir is not None:
            self.state.set_external_verdicts(read_verdicts(self.verdict_dir, self.host_root))
        self.state.refresh_health()
        if self.after_tick is not None:
            self.after_tick()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad tick must not end health reporting
                self.on_error("health_tick")
                log.exception("health check failed; trying again next interval")
            await sleep_or_stop(stop, self.interval)


class KmsgWatcher:
    """NEURON_HW_ERR lines naming a device make that device Unhealthy. The whole log of this
    boot is read at start, so a restart of the plugin does not forget an error."""

    def __init__(
        self,
        state: HealthSink,
        path: Path,
        retry: float = 30.0,
        file_poll: float = 1.0,
        *,
        format: str = "kmsg",
        tz: dt.tzinfo | None = None,
    ) -> None:
        """`file_poll`: how often a kernel-log *file* (a simulated node, a syslog file) is read again;
        /dev/kmsg itself wakes the follower, so this does not apply to it. `format` and `tz`: as
        `KmsgFollower`'s."""
        self.state = state
        self.path = path
        self.retry = retry
        self.file_poll = file_poll
        self.format = format
        self.tz = tz

    def handle(self, message: str) -> None:
        for found in faults.match_kernel_line(message):
            fault = found.fault
            if not fault.leaves_allocatable:
                log.info("kernel log: %s (%s, the device stays in service)", fault.reason, fault.severity)
                continue
            if found.device is None:
                log.warning("kernel log: %s names no device (nd-id): %s", fault.kind, message[:200])
                continue
            core = f" nc-id={found.core}" if found.core is not None else ""
            self.state.observe([Finding(found.device, f"kernel {fault.kind}{core}", fault.severity, fault.kind)])

    async def run(self, stop: asyncio.Event) -> None:
        warned = False
        while not stop.is_set():
            # The problem detector is the prompt reader of the kernel log; here it is a second
            # source, polled gently.
            follower = KmsgFollower(
                str(self.path), lookback=None, poll_interval=self.file_poll, format=self.format, tz=self.tz
            )
            try:
                async for item in follower.follow(stop):
                    if isinstance(item, Malformed):
                        continue
                    self.handle(item.message)
            except OSError as exc:
                if not warned:
                    log.warning(
                        "cannot read the kernel log %s (%s); health comes from the driver's counters only, "
                        "retrying every %.0fs",
                        self.path,
                        exc.strerror or exc,
                        self.retry,
                    )
                    warned = True
                await sleep_or_stop(stop, self.retry)
