"""What the device plugin and the DRA driver do with the health pipeline (`neuron_health.pipeline`):
device presence and error counters, the kernel log, and the problem detector's per-device verdicts
feed a node's device health (the device plugin's state, the DRA driver's)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from neuron_driver.inventory import NodeInventory
from neuron_health import faults
from neuron_health.device_health import Finding, counter_findings, multi_node_unfit
from neuron_health.pipeline import HEARTBEAT_STALE_AFTER, CounterRead, CounterWatch, KernelLogSource, OnError
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

    def set_multi_node_unfit(self, unfit: Mapping[int, tuple[str, ...]]) -> None: ...

    def refresh_health(self) -> bool: ...


def _ignore(kind: str) -> None:
    pass


STATUS_EVERY = 4
# Only the per-core statuses behind a fault that takes a device out are worth reading here.
WATCHED_STATUSES = frozenset(c for f in faults.FAULTS if f.takes_device_out for c in f.core_counters)


class HealthMonitor:
    """The device plugin's and the DRA driver's use of the pipeline's counter watch: every
    `interval`, are the same devices there (a new inventory if not), did an error counter grow, did
    the driver reload, did a transient verdict's quiet period end, do the problem detector's
    verdicts say more. A failed read follows the pipeline's error policy (`pipeline.ReadFailures`)."""

    def __init__(
        self,
        state: HealthSink,
        host_root: Path,
        interval: float,
        verdict_dir: Path | None = None,
        *,
        on_error: OnError = _ignore,
        after_tick: Callable[[], None] | None = None,
        on_inventory: Callable[[NodeInventory], None] | None = None,
        heartbeat_stale_after: float = HEARTBEAT_STALE_AFTER,
    ) -> None:
        """`on_error` counts a failed read (by source); `after_tick` runs after each read;
        `on_inventory` takes a new inventory (by default `state.set_inventory`: the device plugin
        passes its own, which also renumbers its device list); `heartbeat_stale_after`: the
        counter watch's (--heartbeat-stale-after)."""
        self.state = state
        self.on_inventory = on_inventory if on_inventory is not None else state.set_inventory
        self.after_tick = after_tick
        self.host_root = host_root
        self.verdict_dir = verdict_dir
        self.watch = CounterWatch(
            host_root,
            interval,
            WATCHED_STATUSES,
            inventory=state.inventory,
            status_every=STATUS_EVERY,
            on_error=on_error,
            heartbeat_stale_after=heartbeat_stale_after,
        )

    def tick(self) -> None:
        """One read and its handling, at once (tests; the service's loop `health` runs
        `self.watch.run(stop, self.handle)`, which reads on its interval)."""
        self.handle(self.watch.read())

    def handle(self, read: CounterRead) -> None:
        if read.inventory is not None:
            self.on_inventory(read.inventory)
        if read.reloaded:
            log.info("the driver's counters went back down (driver reloaded) on device(s) %s", sorted(read.reloaded))
            self.state.driver_reloaded(read.reloaded)
        self.state.observe(counter_findings(read.previous, read.totals))
        self.state.set_multi_node_unfit(multi_node_unfit(read.totals))
        if self.verdict_dir is not None:
            self.state.set_external_verdicts(read_verdicts(self.verdict_dir, self.host_root))
        self.state.refresh_health()
        if self.after_tick is not None:
            self.after_tick()


class KmsgWatcher:
    """The device plugin's and the DRA driver's use of the pipeline's kernel-log source, when no
    problem detector reads it for them: NEURON_HW_ERR lines naming a device make that device
    Unhealthy. The whole log of this boot is read at start, so a restart does not forget an error."""

    def __init__(
        self,
        state: HealthSink,
        path: Path,
        retry: float = 30.0,
        file_poll: float = 1.0,
        *,
        format: str = "kmsg",
        tz: dt.tzinfo | None = None,
        on_error: OnError = _ignore,
    ) -> None:
        """`file_poll`: how often a kernel-log *file* (a simulated node, a syslog file) is read again;
        /dev/kmsg itself wakes the follower, so this does not apply to it. `format` and `tz`: as
        `KmsgFollower`'s. `on_error` counts a failed read."""
        self.state = state
        # The problem detector is the prompt reader of the kernel log; here it is a second source,
        # polled gently.
        self.source = KernelLogSource(
            path, format=format, tz=tz, lookback=None, file_poll=file_poll, retry=retry, on_error=on_error
        )

    def handle(self, message: str) -> None:
        for found in faults.match_kernel_line(message):
            fault = found.fault
            if not fault.takes_device_out:
                log.info("kernel log: %s (%s, the device stays in service)", fault.reason, fault.severity)
                continue
            if found.device is None:
                log.warning("kernel log: %s names no device (nd-id): %s", fault.kind, message[:200])
                continue
            core = f" nc-id={found.core}" if found.core is not None else ""
            self.state.observe([Finding(found.device, f"kernel {fault.kind}{core}", fault.severity, fault.kind)])

    async def run(self, stop: asyncio.Event) -> None:
        await self.source.run(stop, lambda record: self.handle(record.message))
