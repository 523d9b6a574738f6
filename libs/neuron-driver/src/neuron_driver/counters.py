"""A cheap, repeatable read of the driver's counters for one inventory.

The reader works out the list of files once (per inventory) and then only opens, reads and
parses them, so the exporter and the problem detector can call `read()` often. A file that
holds garbage or has gone away costs that one value: it is absent from the snapshot and
reported as a `ScanIssue`; a device whose directory vanished is reported once.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from neuron_driver import layout
from neuron_driver.attrs import ISSUE_LOG, issue_for_oserror, read_bytes
from neuron_driver.errors import IssueKind, ScanIssue
from neuron_driver.inventory import NodeInventory
from neuron_driver.parse import PowerReading, parse_power_utilization


class CounterKind(enum.StrEnum):
    STATUS = "status"  # per core: stats/status/<name>/{total,present}
    CORE_DEVICE_MEM = "core_device_mem"  # per core: memory_usage/device_mem/<category>/<field>
    CORE_MEM = "core_mem"  # per core: memory_usage/{host_mem,device_mem}/<field>
    CORE_OTHER = "core_other"  # per core: stats/other_info/<name>
    HOST_MEM = "host_mem"  # per device: memory_usage/host_mem/<category>/<field>
    HARDWARE = "hardware"  # per device: stats/hardware/<name> (the corrected ECC counts too, driver 2.30.2)
    HEALTH_STATUS = "health_status"  # per device: stats/hardware/health_status/<name> (driver 2.28)


DEVICE_LEVEL = -1


class CounterKey(NamedTuple):
    kind: CounterKind
    device: int
    core: int  # physical core within the device; DEVICE_LEVEL for device counters
    name: str  # canonical status name, memory category, location or counter name
    field: str  # total / present / peak, or "" for single-valued counters


@dataclass(frozen=True, slots=True)
class FirmwareVerdict:
    """A device's `health_status/unhealthy_components` and `healthcheck_heartbeat` (driver 2.30.2)."""

    unhealthy: frozenset[str] | None  # the failing subsystems; None when unreadable or absent
    heartbeat: str | None  # the heartbeat's text, opaque (its format is documented nowhere here)


@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    values: dict[CounterKey, int]
    power: dict[int, PowerReading]
    issues: tuple[ScanIssue, ...]
    files_read: int
    firmware: dict[int, FirmwareVerdict] = field(default_factory=dict)

    def get(self, kind: CounterKind, device: int, core: int, name: str, field: str = "") -> int | None:
        return self.values.get(CounterKey(kind, device, core, name, field))

    def of_kind(self, kind: CounterKind) -> Iterator[tuple[CounterKey, int]]:
        return ((k, v) for k, v in self.values.items() if k.kind is kind)


ALL_KINDS: frozenset[CounterKind] = frozenset(CounterKind)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if not n.startswith("."))
    except OSError:
        return []


def _listfiles(path: Path, exclude: Collection[str] = ()) -> list[str]:
    """The files of a directory, not its subdirectories (stats/hardware holds health_status/ from 2.28)."""
    return [n for n in _listdir(path) if n not in exclude and not os.path.isdir(path / n)]


def parse_unhealthy_components(text: str) -> frozenset[str]:
    """`hbm,link_efa` -> {"hbm", "link_efa"}; an empty file (nothing failing) -> the empty set."""
    return frozenset(part.strip() for part in text.replace("\n", ",").split(",") if part.strip())


class CounterReader:
    def __init__(
        self,
        inventory: NodeInventory,
        kinds: Collection[CounterKind] = ALL_KINDS,
        *,
        power: bool = True,
        status_names: Collection[str] | None = None,
        status_fields: Collection[str] = layout.STATUS_FIELDS,
        select: Callable[[CounterKey], bool] | None = None,
        firmware: bool = False,
    ) -> None:
        """`kinds`, `status_names` and `status_fields` narrow what is read; `select`, when
        given, keeps only the counters it accepts (e.g. only `present` memory figures);
        `firmware` also reads each device's firmware verdict (`FirmwareVerdict`) where it has one."""
        self.inventory = inventory
        self._device_dirs = {d.index: d.sysfs_path for d in inventory.devices}
        self._plan: list[tuple[bytes, CounterKey]] = []
        self._power: list[tuple[int, Path]] = []
        self._firmware: list[tuple[int, Path, Path]] = []
        self._status_fields = tuple(f for f in layout.STATUS_FIELDS if f in status_fields)
        self._select = select
        wanted = frozenset(kinds)
        for dev in inventory.devices:
            ddir = Path(dev.sysfs_path)
            if CounterKind.HARDWARE in wanted:
                hardware = layout.hardware_dir(ddir)
                for name in _listfiles(hardware) or list(layout.HARDWARE_COUNTERS):
                    self._add(
                        layout.hardware_counter_file(ddir, name),
                        CounterKind.HARDWARE,
                        dev.index,
                        DEVICE_LEVEL,
                        name,
                        "",
                    )
            health_status = layout.health_status_dir(ddir)
            if CounterKind.HEALTH_STATUS in wanted:
                text_files = (layout.UNHEALTHY_COMPONENTS_FILE, layout.HEARTBEAT_FILE)
                for name in _listfiles(health_status, exclude=text_files):
                    self._add(health_status / name, CounterKind.HEALTH_STATUS, dev.index, DEVICE_LEVEL, name, "")
            if firmware and (health_status / layout.UNHEALTHY_COMPONENTS_FILE).exists():
                self._firmware.append(
                    (
                        dev.index,
                        health_status / layout.UNHEALTHY_COMPONENTS_FILE,
                        health_status / layout.HEARTBEAT_FILE,
                    )
                )
            if CounterKind.HOST_MEM in wanted:
                for cat in layout.HOST_MEM_CATEGORIES:
                    for fld in layout.MEM_FIELDS:
                        self._add(
                            layout.device_host_mem_file(ddir, cat, fld),
                            CounterKind.HOST_MEM,
                            dev.index,
                            DEVICE_LEVEL,
                            cat,
                            fld,
                        )
            if power:
                self._power.append((dev.index, layout.power_file(ddir)))
            for core in range(dev.physical_cores):
                self._plan_core(layout.core_dir(ddir, core), dev.index, core, wanted, status_names)

    def _add(self, path: Path, kind: CounterKind, device: int, core: int, name: str, fld: str) -> None:
        key = CounterKey(kind, device, core, name, fld)
        if self._select is None or self._select(key):
            self._plan.append((os.fsencode(path), key))

    def _plan_core(
        self, cdir: Path, device: int, core: int, wanted: frozenset[CounterKind], status_names: Collection[str] | None
    ) -> None:
        if CounterKind.STATUS in wanted:
            # Listed, not assumed: older drivers write the infer_* names.
            present = _listdir(cdir / "stats" / "status") or list(layout.STATUS_NAMES)
            for raw_name in present:
                name = layout.canonical_status(raw_name)
                if status_names is not None and name not in status_names:
                    continue
                for fld in self._status_fields:
                    self._add(layout.status_file(cdir, raw_name, fld), CounterKind.STATUS, device, core, name, fld)
        if CounterKind.CORE_DEVICE_MEM in wanted:
            for cat in layout.DEVICE_MEM_CATEGORIES:
                for fld in layout.MEM_FIELDS:
                    self._add(
                        layout.core_device_mem_file(cdir, cat, fld), CounterKind.CORE_DEVICE_MEM, device, core, cat, fld
                    )
        if CounterKind.CORE_MEM in wanted:
            for location in ("host_mem", "device_mem"):
                for fld in layout.MEM_FIELDS:
                    self._add(
                        layout.core_mem_total_file(cdir, location, fld),
                        CounterKind.CORE_MEM,
                        device,
                        core,
                        location,
                        fld,
                    )
        if CounterKind.CORE_OTHER in wanted:
            for name in _listdir(cdir / "stats" / "other_info") or list(layout.OTHER_INFO):
                self._add(layout.core_other_info_value_file(cdir, name), CounterKind.CORE_OTHER, device, core, name, "")

    @property
    def keys(self) -> frozenset[CounterKey]:
        """Every counter one read() reads, when all its files can be read."""
        return frozenset(key for _, key in self._plan)

    @property
    def file_count(self) -> int:
        return len(self._plan) + len(self._power) + 2 * len(self._firmware)

    @property
    def firmware_devices(self) -> frozenset[int]:
        """Devices whose firmware verdict one read() reads."""
        return frozenset(device for device, _, _ in self._firmware)

    def paths(self) -> list[bytes]:
        """Every file one read() opens; the benchmark reads these in a tight loop as its floor."""
        firmware = [os.fsencode(p) for _, u, h in self._firmware for p in (u, h)]
        return [p for p, _ in self._plan] + [os.fsencode(p) for _, p in self._power] + firmware

    def read(self) -> CounterSnapshot:
        values: dict[CounterKey, int] = {}
        issues: list[ScanIssue] = []
        vanished: set[int] = set()
        o_flags = os.O_RDONLY | os.O_CLOEXEC
        for path, key in self._plan:
            if key.device in vanished:
                continue
            try:
                fd = os.open(path, o_flags)
                try:
                    raw = os.read(fd, 4096)
                finally:
                    os.close(fd)
            except OSError as exc:
                self._record_failure(key.device, path, exc, issues, vanished)
                continue
            try:
                value = int(raw)
            except ValueError:
                value = -1
            if value < 0 or b"_" in raw:  # int() tolerates "1_000"; the driver never writes it
                issues.append(
                    ScanIssue(IssueKind.MALFORMED, os.fsdecode(path), f"expected a counter, found {raw[:40]!r}")
                )
                continue
            values[key] = value
        power: dict[int, PowerReading] = {}
        for device, ppath in self._power:
            if device in vanished:
                continue
            try:
                power[device] = parse_power_utilization(read_bytes(ppath).decode("ascii", "replace"))
            except OSError as exc:
                self._record_failure(device, os.fsencode(ppath), exc, issues, vanished)
            except ValueError as exc:
                issues.append(ScanIssue(IssueKind.MALFORMED, str(ppath), str(exc)))
        verdicts: dict[int, FirmwareVerdict] = {}
        for device, unhealthy_path, heartbeat_path in self._firmware:
            if device in vanished:
                continue
            unhealthy: frozenset[str] | None = None
            heartbeat: str | None = None
            try:
                unhealthy = parse_unhealthy_components(read_bytes(unhealthy_path).decode("ascii", "replace"))
            except OSError as exc:
                self._record_failure(device, os.fsencode(unhealthy_path), exc, issues, vanished)
            try:
                heartbeat = read_bytes(heartbeat_path).decode("ascii", "replace").strip()
            except OSError as exc:
                if device not in vanished:
                    self._record_failure(device, os.fsencode(heartbeat_path), exc, issues, vanished)
            verdicts[device] = FirmwareVerdict(unhealthy, heartbeat)
        for issue in issues:
            ISSUE_LOG.report(issue)
        return CounterSnapshot(values, power, tuple(issues), self.file_count, verdicts)

    def _record_failure(
        self, device: int, path: bytes, exc: OSError, issues: list[ScanIssue], vanished: set[int]
    ) -> None:
        ddir = self._device_dirs.get(device)
        if ddir is not None and not os.path.isdir(ddir):
            vanished.add(device)
            issues.append(ScanIssue(IssueKind.VANISHED, ddir, "device directory vanished; its counters are unknown"))
            return
        issues.append(issue_for_oserror(os.fsdecode(path), exc))


def device_totals(values: Mapping[CounterKey, int], expected: Iterable[CounterKey] = ()) -> dict[tuple[int, str], int]:
    """(device, counter name) -> value: device counters as read, per-core status totals summed over
    the device's cores. The fault table names counters at this level. A sum missing one of the
    `expected` counters (a core's file unreadable this time) is left out: it is unknown, and a sum
    short of a core would read as a driver reload and, when the core is read again, as new errors."""
    totals: dict[tuple[int, str], int] = {}
    for key, value in values.items():
        if key.kind is CounterKind.HARDWARE or (key.kind is CounterKind.STATUS and key.field == "total"):
            totals[key.device, key.name] = totals.get((key.device, key.name), 0) + value
    for key in expected:
        if key not in values:
            totals.pop((key.device, key.name), None)
    return totals


def devices_reset(previous: Mapping[tuple[int, str], int], current: Mapping[tuple[int, str], int]) -> set[int]:
    """Devices whose counters went back down: the driver was reloaded and counts afresh. The firmware's
    verdict (`layout.FIRMWARE_COUNTERS`) is a state, not a count: a subsystem it stops listing mended."""
    return {
        device
        for (device, name), value in current.items()
        if value < previous.get((device, name), 0) and not layout.is_firmware_counter(name)
    }


def firmware_totals(firmware: Mapping[int, FirmwareVerdict]) -> dict[tuple[int, str], int]:
    """The firmware's verdict as counters by (device, name): 1 for each subsystem `unhealthy_components`
    lists, 0 for each it does not; nothing for a device whose list could not be read (unknown)."""
    totals: dict[tuple[int, str], int] = {}
    for device, verdict in firmware.items():
        if verdict.unhealthy is None:
            continue
        for component in layout.UNHEALTHY_COMPONENTS:
            totals[device, layout.firmware_counter(component)] = int(component in verdict.unhealthy)
        for component in sorted(verdict.unhealthy - frozenset(layout.UNHEALTHY_COMPONENTS)):
            totals[device, layout.firmware_counter(component)] = 1  # newer than this stack: seen, not judged
    return totals
