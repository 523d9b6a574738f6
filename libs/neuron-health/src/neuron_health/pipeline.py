"""The one health pipeline: a counter watch and a kernel-log source, read the same way by every
node agent (the device plugin, the DRA driver, the problem detector), with one error policy.

Each source reads, and hands what it read to its consumer's handler; the consumers differ only
in what they make of it (a device verdict, a NodeCondition and an Event). The error policy
(`ReadFailures`): a read that fails is logged (the first failure of an outage, with why, and the
recovery), counted (`on_error(source)`, every time) and retried after the source's interval;
never silent. A handler that raises is a bug, not a failed read: it ends the loop, and the
service's supervisor fails its probes and exits non-zero.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_common.lifecycle import sleep_or_stop
from neuron_driver import layout
from neuron_driver.counters import (
    CounterKey,
    CounterKind,
    CounterReader,
    FirmwareVerdict,
    device_totals,
    devices_reset,
    firmware_totals,
)
from neuron_driver.inventory import InventoryTracker, NodeInventory
from neuron_driver.kmsg import KmsgRecord
from neuron_health.kernel_log import KmsgFollower, Malformed

log = logging.getLogger(__name__)

OnError = Callable[[str], None]

# The sources' names, as `on_error` counts them.
COUNTERS = "counters"
KERNEL_LOG = "kernel_log"


def _ignore(source: str) -> None:
    pass


class ReadFailures:
    """The error policy of one source: every failed read counted, the first of an outage logged
    with why and when it is tried again, the recovery logged."""

    def __init__(self, source: str, on_error: OnError, retry: float, *, hint: str = "") -> None:
        self.source = source
        self.on_error = on_error
        self.retry = retry
        self.hint = hint
        self.failing = False

    def failed(self, what: str, exc: BaseException) -> None:
        self.on_error(self.source)
        if self.failing:
            log.debug("%s still failing: %s", what, exc)
            return
        self.failing = True
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        hint = f" ({self.hint})" if self.hint else ""
        log.error(
            "cannot read %s: %s%s; retrying every %gs",
            what,
            why,
            hint,
            self.retry,
            exc_info=not isinstance(exc, OSError),
        )

    def succeeded(self, what: str) -> None:
        if self.failing:
            self.failing = False
            log.info("reading %s again", what)


def growth(
    previous: Mapping[tuple[int, str], int] | None, current: Mapping[tuple[int, str], int]
) -> Iterator[tuple[int, str, int, int]]:
    """(device, counter, before, now) for every counter (by device and name,
    `neuron_driver.counters.device_totals`) that grew since `previous`, or is non-zero on the first
    read (the driver counts since it loaded). Both the fault table's findings
    (`device_health.counter_findings`) and the detector's counter rules are made from this."""
    for (device, name), value in current.items():
        before = 0 if previous is None else previous.get((device, name), value)
        if value > before:
            yield device, name, before, value


@dataclass(frozen=True, slots=True)
class CounterRead:
    """One read of the driver's counters, by (device, counter name) as the fault table names them."""

    # as of the read before (None: this is the first), zero for a reloaded device's counters
    previous: Mapping[tuple[int, str], int] | None
    totals: Mapping[tuple[int, str], int]  # this read's values
    reloaded: frozenset[int]  # devices whose counters went back down: the driver was reloaded
    inventory: NodeInventory | None  # the new inventory when the node's devices changed, else None


# How long a heartbeat may stand still before it is stale. The firmware's refresh rate is documented
# nowhere stored here (docs/driver-versions.md), so this is generous: minutes, not seconds.
HEARTBEAT_STALE_AFTER = 300.0


class HeartbeatWatch:
    """Whether each device's `healthcheck_heartbeat` still moves. Its format is documented nowhere, so
    its text is opaque: a heartbeat is stale once it has been seen to change and then stands still for
    `stale_after`. One never seen to change is not judged (a firmware whose heartbeat this stack has
    not yet seen move may beat slower than it watched); the problem detector logs it."""

    def __init__(self, stale_after: float, clock: Callable[[], float]) -> None:
        self.stale_after = stale_after
        self.clock = clock
        self._last: dict[int, tuple[str, float, bool]] = {}  # device -> (text, since, seen moving)

    def observe(self, firmware: Mapping[int, FirmwareVerdict]) -> dict[tuple[int, str], int]:
        now = self.clock()
        totals: dict[tuple[int, str], int] = {}
        for device, verdict in firmware.items():
            if verdict.heartbeat is None:
                continue
            text, since, moving = self._last.get(device, (verdict.heartbeat, now, False))
            if verdict.heartbeat != text:
                text, since, moving = verdict.heartbeat, now, True
            self._last[device] = (text, since, moving)
            totals[device, layout.HEARTBEAT_STALE_COUNTER] = int(moving and now - since >= self.stale_after)
        return totals


def firmware_counters(
    firmware: Mapping[int, FirmwareVerdict], heartbeats: HeartbeatWatch
) -> dict[tuple[int, str], int]:
    """The firmware's verdict (driver 2.30.2) as the fault table's counters, by (device, name): each
    subsystem `unhealthy_components` names (1 while listed, else 0) and the heartbeat's staleness. The
    one reading of it: the counter watch's, and the exporter's at each scrape."""
    totals = firmware_totals(firmware)
    totals.update(heartbeats.observe(firmware))
    return totals


class CounterWatch:
    """The one counter watch: the node's devices (rescanned when they change) and their error
    counters, read every `interval`. Device counters are read every time; the per-core status
    counters in `status_names` (many: 5 a core) every `status_every` reads, to keep idle CPU low.
    From driver 2.30.2 the firmware's verdict is read with the device counters, as the counters
    `layout.FIRMWARE_COUNTERS` (1 while a subsystem is listed failing or the heartbeat is stale)."""

    def __init__(
        self,
        host_root: Path,
        interval: float,
        status_names: Collection[str],
        *,
        inventory: NodeInventory | None = None,
        status_every: int = 1,
        on_error: OnError = _ignore,
        previous: Mapping[tuple[int, str], int] | None = None,
        heartbeat_stale_after: float = HEARTBEAT_STALE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`inventory`: the node as already scanned (else scanned at the first read). `previous`: the
        values an earlier watch on this boot left (`last`), which the first read is measured against.
        `heartbeat_stale_after`, `clock`: when a heartbeat that stopped moving is stale (`HeartbeatWatch`)."""
        self.host_root = host_root
        self.interval = interval
        self.status_names = frozenset(status_names)
        self.status_every = status_every
        self.failures = ReadFailures(COUNTERS, on_error, interval)
        self._inventory = inventory
        self._tracker: InventoryTracker | None = None
        self._readers: tuple[CounterReader, CounterReader | None] | None = None
        self._previous: dict[tuple[int, str], int] | None = dict(previous) if previous is not None else None
        self._reads = 0
        self.heartbeats = HeartbeatWatch(heartbeat_stale_after, clock)

    @property
    def last(self) -> Mapping[tuple[int, str], int] | None:
        """What the next read is measured against (None before the first)."""
        return self._previous

    def _make_readers(self, inventory: NodeInventory) -> None:
        hardware = CounterReader(inventory, kinds={CounterKind.HARDWARE}, power=False, firmware=True)
        status = None
        if self.status_names:
            status = CounterReader(
                inventory,
                kinds={CounterKind.STATUS},
                power=False,
                status_names=self.status_names,
                status_fields=("total",),
            )
        self._readers = (hardware, status)

    def read(self) -> CounterRead:
        """Read once; raises what the read raised."""
        changed = None
        if self._tracker is None:
            self._tracker = InventoryTracker(self.host_root, self._inventory)
            self._make_readers(self._tracker.inventory)
        elif self._tracker.refresh():
            changed = self._tracker.inventory
            self._make_readers(changed)
        assert self._readers is not None
        hardware, status = self._readers
        snapshot = hardware.read()
        values = snapshot.values
        expected: frozenset[CounterKey] = frozenset()
        if status is not None and self._reads % self.status_every == 0:
            values = {**values, **status.read().values}
            expected = status.keys
        self._reads += 1
        totals = device_totals(values, expected)
        totals.update(firmware_counters(snapshot.firmware, self.heartbeats))
        previous = self._previous
        reloaded = frozenset(devices_reset(previous, totals)) if previous is not None else frozenset()
        if previous is not None and reloaded:
            # A reloaded driver counts from zero: what a reloaded device's counters show now is growth
            # since the reload, and a counter not read this time (slower cadence) must not, on its next
            # read, be measured against its value from before the reload (a second reload, a lost error).
            previous = {key: 0 if key[0] in reloaded else value for key, value in previous.items()}
        # a counter not read this time (vanished device, slower cadence) keeps its last value
        self._previous = {**(previous or {}), **totals}
        return CounterRead(previous, totals, reloaded, changed)

    async def run(self, stop: asyncio.Event, handle: Callable[[CounterRead], None]) -> None:
        """Every `interval` until `stop`: read, and hand the read to `handle`."""
        while not stop.is_set():
            try:
                read = self.read()
            except Exception as exc:  # the error policy: counted, logged, retried
                self.failures.failed(f"the driver's counters under {self.host_root}", exc)
            else:
                self.failures.succeeded(f"the driver's counters under {self.host_root}")
                handle(read)
            await sleep_or_stop(stop, self.interval)


KMSG_HINT = "reading /dev/kmsg needs CAP_SYSLOG where kernel.dmesg_restrict=1"
SYSLOG_HINT = (
    "the host's syslog daemon writes it (rsyslog; Amazon Linux 2023 and Bottlerocket have none: read /dev/kmsg there)"
)


class KernelLogSource:
    """The one kernel-log source: `/dev/kmsg` or a kernel-log file (a simulated node's, the host's
    syslog file), followed for as long as the service runs and opened again after a failure."""

    def __init__(
        self,
        path: Path,
        *,
        format: str = "kmsg",
        tz: dt.tzinfo | None = None,
        lookback: float | None = None,
        file_poll: float = 1.0,
        retry: float = 30.0,
        on_error: OnError = _ignore,
    ) -> None:
        """`lookback`, `format`, `tz`: as `KmsgFollower`'s (None: the whole log of this boot);
        `file_poll`: how often a kernel-log *file* is read again (/dev/kmsg wakes the follower)."""
        self.path = path
        self.format = format
        self.tz = tz
        self.lookback = lookback
        self.file_poll = file_poll
        self.failures = ReadFailures(KERNEL_LOG, on_error, retry, hint=SYSLOG_HINT if format == "syslog" else KMSG_HINT)
        self.following = False  # a record has been read since the last failure

    async def run(
        self,
        stop: asyncio.Event,
        handle: Callable[[KmsgRecord], None],
        *,
        on_malformed: Callable[[Malformed], None] | None = None,
    ) -> None:
        """Every record to `handle`, garbage to `on_malformed`, until `stop`."""
        what = f"the kernel log {self.path}"
        while not stop.is_set():
            follower = KmsgFollower(
                str(self.path), lookback=self.lookback, poll_interval=self.file_poll, format=self.format, tz=self.tz
            )
            try:
                async for item in follower.follow(stop):
                    if not self.following:
                        self.following = True
                        self.failures.succeeded(what)
                    if isinstance(item, Malformed):
                        if on_malformed is not None:
                            on_malformed(item)
                        continue
                    handle(item)
            except OSError as exc:
                self.following = False
                self.failures.failed(what, exc)
                await sleep_or_stop(stop, self.failures.retry)
