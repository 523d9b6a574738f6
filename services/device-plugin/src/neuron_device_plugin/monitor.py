"""The loops that feed `PluginState`: device presence and error counters, the kernel log,
and the problem detector's per-device verdicts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from neuron_common.kmsg_follow import KmsgFollower, Malformed
from neuron_common.lifecycle import sleep_or_stop
from neuron_common.verdicts import read_verdicts
from neuron_device_plugin.health import Finding, counter_findings, hw_error_severity
from neuron_device_plugin.metrics import PluginMetrics
from neuron_device_plugin.state import PluginState
from neuron_sysfs.counters import CounterKey, CounterKind, CounterReader
from neuron_sysfs.inventory import InventoryTracker
from neuron_sysfs.kmsg import parse_hw_error

log = logging.getLogger(__name__)

STATUS_EVERY = 4
WATCHED_STATUSES = frozenset(
    {"hw_nc_ue_error", "hw_hbm_ue_error", "hw_dma_abort_error", "hw_repairable_hbm_ue_error", "hw_collectives_error"}
)


class HealthMonitor:
    """Every `interval`: are the same devices there (rescan if not), did an error counter grow,
    did a transient verdict's quiet period end, do the problem detector's verdicts say more."""

    def __init__(
        self,
        state: PluginState,
        metrics: PluginMetrics,
        host_root: Path,
        interval: float,
        verdict_dir: Path | None = None,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.host_root = host_root
        self.interval = interval
        self.verdict_dir = verdict_dir
        self._previous: dict[CounterKey, int] | None = None
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
        values = dict(self._hardware.read().values)
        if self._ticks % STATUS_EVERY == 0:
            values.update(self._status.read().values)
        self._ticks += 1
        # a counter not read this tick (vanished device, slower cadence) keeps its last value
        current = dict(self._previous or {})
        current.update(values)
        self.state.observe(counter_findings(self._previous, values))
        self._previous = current
        if self.verdict_dir is not None:
            self.state.set_external_verdicts(read_verdicts(self.verdict_dir, self.host_root))
        self.state.refresh_health()
        self.state.expire_pending()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad tick must not end health reporting
                self.metrics.errors.labels("health_tick").inc()
                log.exception("health check failed; trying again next interval")
            await sleep_or_stop(stop, self.interval)


class KmsgWatcher:
    """NEURON_HW_ERR lines naming a device make that device Unhealthy. The whole log of this
    boot is read at start, so a restart of the plugin does not forget an error."""

    def __init__(self, state: PluginState, metrics: PluginMetrics, path: Path, retry: float = 30.0) -> None:
        self.state = state
        self.metrics = metrics
        self.path = path
        self.retry = retry

    async def run(self, stop: asyncio.Event) -> None:
        warned = False
        while not stop.is_set():
            # The problem detector is the prompt reader of the kernel log; here it is a second
            # source, polled gently.
            follower = KmsgFollower(str(self.path), lookback=None, poll_interval=1.0)
            try:
                async for item in follower.follow(stop):
                    if isinstance(item, Malformed):
                        continue
                    error = parse_hw_error(item.message)
                    if error is None:
                        continue
                    if error.device is None:
                        log.warning("NEURON_HW_ERR line names no device (nd-id): %s", item.message[:200])
                        continue
                    core = f" nc-id={error.core}" if error.core is not None else ""
                    self.state.observe([Finding(error.device, f"kernel {error.kind}{core}", hw_error_severity(error))])
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
