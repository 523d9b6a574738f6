"""The Neuron collector: reads the driver's counters on each scrape and labels them with their
holders from the latest attribution (read on a timer elsewhere, never here).

It is a prometheus-client `Collector` (`collect()`), and it also renders the text exposition
format itself (`render()`), which `/metrics` uses: label strings are assembled from
fragments escaped once per inventory and once per attribution update, so a scrape of a
trn2.48xlarge (about 5,000 series) costs little more than reading its files. A test checks
that both paths give the same samples.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from neuron_driver import layout
from neuron_driver.counters import CounterKey, CounterKind, CounterReader
from neuron_driver.inventory import InventoryTracker, NodeInventory
from neuron_health import device_health, faults, layout_check
from neuron_health.pipeline import HEARTBEAT_STALE_AFTER, HeartbeatWatch, firmware_counters
from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import (
    FAMILIES,
    FIRMWARE_FAMILIES,
    FIRMWARE_UNHEALTHY,
    HEARTBEAT_STALE,
    MULTI_NODE_UNFIT,
    NEURON_MONITOR_ECC_HELP,
    NEURON_MONITOR_STATUS,
    Naming,
)

log = logging.getLogger(__name__)

ECC_TYPES = {
    "sram_ecc_uncorrected": "sram_uncorrected",
    "mem_ecc_uncorrected": "mem_uncorrected",
    "mem_ecc_repairable_uncorrected": "mem_repairable_uncorrected",
}
# Driver 2.30.2's corrected counts: a family of their own (neuron_device_ecc_corrected_errors_total), so
# that a sum over the uncorrected family, which means "replace this device", never counts a corrected one.
CORRECTED_TYPES = {name: name.replace("_ecc_", "_") for name in layout.CORRECTED_COUNTERS}
ECC_FAMILY = "neuron_device_ecc_errors_total"
CORRECTED_FAMILY = "neuron_device_ecc_corrected_errors_total"

# Which driver files each family needs; families left out of --metrics are not read at all.
_NEEDS: dict[str, set[CounterKind]] = {
    "neuron_core_execution_status_total": {CounterKind.STATUS},
    "neuron_device_hardware_errors_total": {CounterKind.STATUS},
    "neuron_device_ecc_errors_total": {CounterKind.HARDWARE},
    "neuron_device_ecc_corrected_errors_total": {CounterKind.HARDWARE},
    "neuron_core_memory_used_bytes": {CounterKind.CORE_DEVICE_MEM},
    "neuron_device_memory_total_bytes": {CounterKind.CORE_MEM},
    "neuron_device_host_memory_used_bytes": {CounterKind.HOST_MEM},
    # live from driver 2.30.2 only; read only there (`NeuronCollector.live`)
    "neuron_core_busy_seconds_total": {CounterKind.CORE_OTHER},
    "neuron_core_utilization_ratio": {CounterKind.CORE_OTHER},
}
LIVE_KINDS = frozenset({CounterKind.CORE_OTHER})
BUSY_COUNTER = "nc_time_in_use"
# nc_time_in_use's unit: picoseconds, as the driver's own utilization metric divides it
# (`nmetric_post_utilization` in neuron_metrics.c: "in picoseconds", then /1000 to nanoseconds)
BUSY_PER_SECOND = 1e12
UTILIZATION = "neuron_core_utilization_ratio"
UTILIZATION_NAMES = frozenset({UTILIZATION, "neuroncore_utilization_ratio"})  # native, neuron-monitor's


def _wanted(key: CounterKey) -> bool:
    """Only the figures exported: status totals, present memory, device memory totals."""
    if key.kind is CounterKind.STATUS:
        return key.field == "total"
    if key.kind in (CounterKind.CORE_DEVICE_MEM, CounterKind.HOST_MEM):
        return key.field == "present"
    if key.kind is CounterKind.CORE_MEM:
        return key.name == "device_mem" and key.field == "total"
    if key.kind is CounterKind.CORE_OTHER:
        return key.name == BUSY_COUNTER
    return True


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def pair(name: str, value: str) -> str:
    return f'{name}="{escape(value)}"'


_FAULT_LABELS = {c: f'fault="{f.kind}",severity="{f.severity}"' for c, f in faults.BY_COUNTER.items()}


def fault_labels(counter: str) -> str:
    """The fault table's kind and severity for a counter (empty for a counter behind no fault)."""
    return _FAULT_LABELS.get(counter, 'fault="",severity=""')


def owner_labels(owner: Owner | None) -> str:
    if owner is None:
        return 'namespace="",pod="",container="",claim=""'
    return (
        f"{pair('namespace', owner.namespace)},{pair('pod', owner.pod)},{pair('container', owner.container)},"
        f"{pair('claim', owner.claim)}"
    )


def number(value: float) -> str:
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return repr(value)


class _Sums:
    """Sums of counters over physical cores, kept only where every part was read: a logical
    core (or device) missing one physical core's value would report a counter going back."""

    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.sums: dict[Any, int] = {}
        self.counts: dict[Any, int] = {}

    def add(self, key: Any, value: int) -> None:
        self.sums[key] = self.sums.get(key, 0) + value
        self.counts[key] = self.counts.get(key, 0) + 1

    def complete(self, expected: Callable[[Any], int]) -> _Sums:
        done = _Sums()
        done.sums = {k: v for k, v in self.sums.items() if self.counts[k] == expected(k)}
        return done


@dataclass
class Rows:
    """One family's samples: (label string without braces, value)."""

    name: str  # sample name as exposed
    type: str
    help: str
    samples: list[tuple[str, float]] = field(default_factory=list)


_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


class NeuronCollector(Collector):
    def __init__(
        self,
        host_root: Path,
        families: frozenset[str],
        attribution: Callable[[], Attribution],
        *,
        naming: Naming = Naming.NATIVE,
        resources_capacity: Callable[[NodeInventory], dict[str, int]] | None = None,
        allocatable: Callable[[], dict[str, int] | None] | None = None,
        runtime_rows: Callable[[Attribution], Iterable[Rows]] | None = None,
        instance_labels: Callable[[], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_stale_after: float = HEARTBEAT_STALE_AFTER,
    ) -> None:
        self.host_root = host_root
        self.families = families
        self.attribution = attribution
        # which names are served: the native ones, neuron-monitor-prometheus's, or both side by side
        self.native = naming.serves_native
        self.compat = naming.serves_neuron_monitor
        self.resources_capacity = resources_capacity
        self.allocatable = allocatable
        # neuron-monitor's families (see runtime_metrics.py), served after the driver's. Under --naming
        # neuron-monitor, the runtime's execution_status_total and neuroncore_memory_usage_* take those names;
        # the driver's figures of the same names are then left out, so no family has two sources.
        self.runtime_rows = runtime_rows
        self.instance_labels = instance_labels  # added to neuron_hardware_info under --naming neuron-monitor
        self.read_errors: Tally[str] = Tally()
        self._owner_cache: tuple[Attribution | None, dict[int, str], dict[int, str]] = (None, {}, {})
        self._tracker = InventoryTracker(host_root)
        self.inventory = self._tracker.inventory
        # what the driver exposes against what is read, logged once at start; the exporter serves the
        # count of `layout.missing` as neuron_exporter_health_sources_missing
        self.layout = layout_check.check_at_start(host_root, self.inventory, log)
        # Before 2.30.2 the driver updates nc_time_in_use when a process exits: a rate of it would show a
        # job's whole run as one burst at its end, so it is served only where the driver keeps it live.
        self.live = self.layout.generation.live_counters
        self._kinds = set().union(*(_NEEDS.get(f, set()) for f in families))
        if not self.live:
            self._kinds -= LIVE_KINDS
        self.clock = clock
        # the firmware's verdict (driver 2.30.2), read only when one of its families is served; its
        # heartbeat judged at each scrape by the watch every node agent uses (--heartbeat-stale-after)
        self.firmware = bool(families & FIRMWARE_FAMILIES)
        self.heartbeats = HeartbeatWatch(heartbeat_stale_after, clock)
        self._busy_before: tuple[float, dict[int, float]] | None = None  # (when, busy seconds per logical core)
        self._build()

    # -- per inventory ------------------------------------------------------------------------
    def _build(self) -> None:
        inv = self.inventory
        self.reader = CounterReader(
            inv,
            kinds=self._kinds,
            power="neuron_device_power_utilization_ratio" in self.families,
            select=_wanted,
            firmware=self.firmware,
        )
        self._logical: dict[tuple[int, int], int] = {}
        for core in inv.cores:
            for physical in core.physical:
                self._logical[(core.device, physical)] = core.index
        self.cores_of_device = {d.index: d.logical_cores for d in inv.devices}
        self._lnc = inv.lnc.value
        self._physical = {d.index: d.physical_cores for d in inv.devices}
        # device and core labels by naming (True: neuron-monitor's); families neuron-monitor does not
        # have take neuron-monitor's labels only when its names replace the native ones
        self._devs = {
            True: {d.index: pair("neuron_device_index", str(d.index)) for d in inv.devices},
            False: {d.index: pair("device", str(d.index)) for d in inv.devices},
        }
        self._cores = {
            True: {c.index: pair("neuroncore", str(c.index)) for c in inv.cores},
            False: {c.index: f"{pair('device', str(c.device))},{pair('core', str(c.index))}" for c in inv.cores},
        }
        self._dev, self._core = self._devs[not self.native], self._cores[not self.native]

    def _namings(self, *, runtime_has_it: bool = False) -> list[bool]:
        """The namings a family with a neuron-monitor name is served in (True: neuron-monitor's);
        `runtime_has_it`: neuron-monitor's name is the runtime's figure when neuron-monitor runs."""
        namings = [False] if self.native else []
        if self.compat and not (runtime_has_it and self.runtime_rows):
            namings.append(True)
        return namings

    def refresh_inventory(self) -> None:
        if self._tracker.refresh():
            self.inventory = self._tracker.inventory
            self._build()
            self._owner_cache = (None, {}, {})
            self._busy_before = None  # other cores, or the same numbers for other ones

    def _owners(self, attribution: Attribution) -> tuple[dict[int, str], dict[int, str]]:
        """Owner label strings per core and per device, rebuilt only when the attribution changes."""
        cached, cores, devices = self._owner_cache
        if cached is not attribution:
            cores = {c: owner_labels(o) for c, o in attribution.cores.items()}
            devices = {d: owner_labels(o) for d, o in attribution.devices.items()}
            self._owner_cache = (attribution, cores, devices)
        return cores, devices

    # -- one scrape ---------------------------------------------------------------------------
    def rows(self) -> Iterator[Rows]:
        self.refresh_inventory()
        snapshot = self.reader.read()
        for issue in snapshot.issues:
            self.read_errors[str(issue.kind)] += 1
        attribution = self.attribution()
        core_owner, device_owner = self._owners(attribution)
        nobody = owner_labels(None)
        families, values = self.families, snapshot.values
        dev = self._dev

        by_kind: dict[CounterKind, list[tuple[CounterKey, int]]] = {k: [] for k in CounterKind}
        for key, value in values.items():
            by_kind[key.kind].append((key, value))

        if families & {"neuron_core_execution_status_total", "neuron_device_hardware_errors_total"}:
            per_core: _Sums = _Sums()
            hw: _Sums = _Sums()
            logical = self._logical
            for key, value in by_kind[CounterKind.STATUS]:
                core = logical.get((key.device, key.core))
                if core is None:
                    continue
                per_core.add((core, key.name), value)
                if key.name.startswith("hw_"):
                    hw.add((key.device, key.name), value)
            per_core = per_core.complete(lambda k: self._lnc)
            hw = hw.complete(lambda k: self._physical[k[0]])
            if "neuron_core_execution_status_total" in families:
                f = FAMILIES["neuron_core_execution_status_total"]
                for compat in self._namings(runtime_has_it=True):
                    rows = Rows("execution_status_total" if compat else f.name, "counter", f.help)
                    label, names = ("status_type", NEURON_MONITOR_STATUS) if compat else ("status", {})
                    status_label = {s: pair(label, names.get(s, s)) for _, s in per_core.sums}
                    core_labels = self._cores[compat]
                    rows.samples = [
                        (f"{core_labels[c]},{status_label[s]},{core_owner.get(c, nobody)}", v)
                        for (c, s), v in per_core.sums.items()
                    ]
                    yield rows
            if "neuron_device_hardware_errors_total" in families:
                f = FAMILIES["neuron_device_hardware_errors_total"]
                rows = Rows(f.name, f.type, f.help)
                rows.samples = [
                    (f"{dev[d]},{pair('kind', s)},{fault_labels(s)},{device_owner.get(d, nobody)}", v)
                    for (d, s), v in sorted(hw.sums.items())
                ]
                yield rows

        ecc_families = families & {ECC_FAMILY, CORRECTED_FAMILY}
        if ecc_families:
            hardware = [
                (key, value)
                for key, value in by_kind[CounterKind.HARDWARE]
                if (CORRECTED_FAMILY if key.name in CORRECTED_TYPES else ECC_FAMILY) in ecc_families
            ]
            for compat in self._namings():
                devs = self._devs[compat]
                if compat:  # neuron-monitor-prometheus has one family for both, by its event_type
                    rows = Rows("hardware_ecc_events_total", "counter", NEURON_MONITOR_ECC_HELP)
                    rows.samples = [
                        (
                            f"{devs[k.device]},{pair('event_type', k.name)},{fault_labels(k.name)},"
                            f"{device_owner.get(k.device, nobody)}",
                            v,
                        )
                        for k, v in hardware
                    ]
                    yield rows
                    continue
                uncorrected = Rows(ECC_FAMILY, "counter", FAMILIES[ECC_FAMILY].help)
                corrected = Rows(CORRECTED_FAMILY, "counter", FAMILIES[CORRECTED_FAMILY].help)
                for key, value in hardware:
                    owner = device_owner.get(key.device, nobody)
                    if key.name in CORRECTED_TYPES:  # no fault behind a corrected error
                        labels = f"{devs[key.device]},{pair('type', CORRECTED_TYPES[key.name])},{owner}"
                        corrected.samples.append((labels, value))
                    else:
                        kind = pair("type", ECC_TYPES.get(key.name, key.name))
                        labels = f"{devs[key.device]},{kind},{fault_labels(key.name)},{owner}"
                        uncorrected.samples.append((labels, value))
                yield from (r for r in (uncorrected, corrected) if r.name in ecc_families)

        if "neuron_core_memory_used_bytes" in families:
            for compat in self._namings(runtime_has_it=True):
                yield from self._memory(by_kind[CounterKind.CORE_DEVICE_MEM], core_owner, nobody, compat)

        if "neuron_device_memory_total_bytes" in families:
            f = FAMILIES["neuron_device_memory_total_bytes"]
            totals = _Sums()
            for key, value in by_kind[CounterKind.CORE_MEM]:
                totals.add(key.device, value)
            totals = totals.complete(lambda d: self._physical[d])
            yield Rows(f.name, f.type, f.help, [(dev[d], v) for d, v in sorted(totals.sums.items())])

        if "neuron_device_host_memory_used_bytes" in families:
            f = FAMILIES["neuron_device_host_memory_used_bytes"]
            rows = Rows(f.name, f.type, f.help)
            rows.samples = [
                (f"{dev[k.device]},{pair('category', k.name)},{device_owner.get(k.device, nobody)}", v)
                for k, v in by_kind[CounterKind.HOST_MEM]
            ]
            yield rows

        if "neuron_device_power_utilization_ratio" in families:
            f = FAMILIES["neuron_device_power_utilization_ratio"]
            rows = Rows(f.name, f.type, f.help)
            for device, reading in sorted(snapshot.power.items()):
                if reading.valid:  # an invalid sample is absent, not zero
                    for stat, value in (
                        ("min", reading.min_power),
                        ("max", reading.max_power),
                        ("avg", reading.avg_power),
                    ):
                        rows.samples.append((f'{dev[device]},stat="{stat}"', value / 100))
            yield rows

        if self.firmware:
            yield from self._firmware(firmware_counters(snapshot.firmware, self.heartbeats))

        busy = self._busy(by_kind[CounterKind.CORE_OTHER]) if self.live else {}
        if busy and "neuron_core_busy_seconds_total" in families:
            f = FAMILIES["neuron_core_busy_seconds_total"]
            rows = Rows(f.name, f.type, f.help)
            rows.samples = [(f"{self._core[c]},{core_owner.get(c, nobody)}", v) for c, v in sorted(busy.items())]
            yield rows
        utilization = self._utilization(busy)

        yield from self._static(attribution)
        monitor_reports = False
        if self.runtime_rows is not None:
            for rows in self.runtime_rows(attribution):
                monitor_reports = monitor_reports or rows.name in UTILIZATION_NAMES
                yield rows
        # neuron-monitor wins while it reports: its figure is per runtime, as AWS's dashboards read it,
        # and one family has one source. sysfs's is served while it does not (or is not run at all).
        if utilization and UTILIZATION in families and not monitor_reports:
            f = FAMILIES[UTILIZATION]
            for compat in self._namings():
                rows = Rows("neuroncore_utilization_ratio" if compat else f.name, f.type, f.help)
                no_runtime = 'runtime_tag="",pid=""' if not compat else 'runtime_tag=""'
                rows.samples = [
                    (f"{self._cores[compat][c]},{no_runtime},{core_owner.get(c, nobody)}", v)
                    for c, v in sorted(utilization.items())
                ]
                yield rows

    def _firmware(self, totals: dict[tuple[int, str], int]) -> Iterator[Rows]:
        """The firmware's verdict as the node agents read it (`firmware_counters`): each listed subsystem,
        the heartbeat's staleness, and the link rule's answer (`device_health.multi_node_unfit`). Devices
        whose verdict could not be read this time have no series (unknown, not healthy)."""
        dev, families = self._dev, self.families
        if FIRMWARE_UNHEALTHY in families:
            f = FAMILIES[FIRMWARE_UNHEALTHY]
            rows = Rows(f.name, f.type, f.help)
            for (device, name), value in sorted(totals.items()):
                if name.startswith(layout.FIRMWARE_COUNTER_PREFIX) and device in dev:
                    component = pair("component", name.removeprefix(layout.FIRMWARE_COUNTER_PREFIX))
                    rows.samples.append((f"{dev[device]},{component},{fault_labels(name)}", value))
            yield rows
        if HEARTBEAT_STALE in families:
            f = FAMILIES[HEARTBEAT_STALE]
            stale: list[tuple[str, float]] = [
                (dev[device], value)
                for (device, name), value in sorted(totals.items())
                if name == layout.HEARTBEAT_STALE_COUNTER and device in dev
            ]
            yield Rows(f.name, f.type, f.help, stale)
        if MULTI_NODE_UNFIT in families:
            f = FAMILIES[MULTI_NODE_UNFIT]
            unfit = device_health.multi_node_unfit(totals)
            judged = sorted({device for device, name in totals if layout.is_firmware_counter(name) and device in dev})
            yield Rows(f.name, f.type, f.help, [(dev[d], 1 if d in unfit else 0) for d in judged])

    def _busy(self, entries: list[tuple[CounterKey, int]]) -> dict[int, float]:
        """Busy seconds per logical core: the mean of its physical cores' nc_time_in_use, so that its rate is
        a fraction of one core's time (0-1) whatever the LNC. Only cores with every physical core read."""
        sums = _Sums()
        for key, value in entries:
            core = self._logical.get((key.device, key.core))
            if core is not None:
                sums.add(core, value)
        done = sums.complete(lambda c: self._lnc).sums
        return {c: v / BUSY_PER_SECOND / self._lnc for c, v in done.items()}

    def _utilization(self, busy: dict[int, float]) -> dict[int, float]:
        """Each logical core's busy fraction since the previous read (none at the first, nor for a core
        whose counter went back: a driver reload)."""
        now = self.clock()
        before, self._busy_before = self._busy_before, (now, busy)
        if before is None or not busy or now <= before[0]:
            return {}
        elapsed = now - before[0]
        return {c: (v - before[1][c]) / elapsed for c, v in busy.items() if c in before[1] and v >= before[1][c]}

    def _memory(
        self, entries: list[tuple[CounterKey, int]], core_owner: dict[int, str], nobody: str, compat: bool
    ) -> Iterator[Rows]:
        f = FAMILIES["neuron_core_memory_used_bytes"]
        partial = _Sums()
        logical = self._logical
        for key, value in entries:
            core = logical.get((key.device, key.core))
            if core is not None:
                partial.add((core, key.name), value)
        sums = partial.complete(lambda k: self._lnc).sums
        core_labels = self._cores[compat]
        if compat:  # neuron-monitor has one family per category
            by_category: dict[str, Rows] = {}
            for (core, category), value in sums.items():
                rows = by_category.setdefault(category, Rows(f"neuroncore_memory_usage_{category}", "gauge", f.help))
                rows.samples.append(
                    (f'{core_labels[core]},memory_location="device",{core_owner.get(core, nobody)}', value)
                )
            yield from by_category.values()
            return
        category_label = {c: pair("category", c) for _, c in sums}
        yield Rows(
            f.name,
            f.type,
            f.help,
            [
                (f"{core_labels[c]},{category_label[cat]},{core_owner.get(c, nobody)}", v)
                for (c, cat), v in sums.items()
            ],
        )

    def _static(self, attribution: Attribution) -> Iterator[Rows]:
        inv, families = self.inventory, self.families
        if "neuron_device_info" in families:
            f = FAMILIES["neuron_device_info"]
            rows = Rows(f.name, f.type, f.help)
            for d in inv.devices:
                labels = ",".join(
                    pair(k, v)
                    for k, v in (
                        ("device", str(d.index)),
                        ("arch_type", d.arch_type or ""),
                        ("family", d.family_name or ""),
                        ("device_name", d.device_name or ""),
                        ("instance_type", inv.instance_type_name or ""),
                        ("serial", d.serial or ""),
                        ("numa_node", "" if d.numa_node is None else str(d.numa_node)),
                    )
                )
                rows.samples.append((labels, 1))
            yield rows
            if self.compat and inv.devices:
                first = inv.devices[0]
                labels = ",".join(
                    pair(k, v)
                    for k, v in (
                        ("neuron_device_type", (first.device_name or "").lower()),
                        ("neuroncore_version", first.arch_type or ""),
                        ("neuron_device_count", str(len(inv.devices))),
                        ("neuroncore_per_device_count", str(inv.logical_cores_per_device)),
                        ("logical_neuroncore_config", str(inv.lnc.value)),
                    )
                )
                instance = self.instance_labels() if self.instance_labels else ""
                labels = f"{labels},{instance}" if instance else labels
                yield Rows("neuron_hardware_info", "gauge", f.help, [(labels, 1)])
        if "neuron_logical_core_config" in families:
            f = FAMILIES["neuron_logical_core_config"]
            yield Rows(f.name, f.type, f.help, [("", inv.lnc.value)])
        if "neuron_core_allocation_info" in families:
            f = FAMILIES["neuron_core_allocation_info"]
            core_owner, _ = self._owners(attribution)
            yield Rows(
                f.name,
                f.type,
                f.help,
                [(f"{self._core[c]},{core_owner[c]}", 1) for c in sorted(attribution.cores) if c in self._core],
            )
        capacity = self.resources_capacity(inv) if self.resources_capacity else {}
        allocatable = self.allocatable() if self.allocatable else None
        for name in ("neuron_resource_capacity", "neuron_resource_allocatable", "neuron_resource_allocated",
                     "neuron_resource_unhealthy"):  # fmt: skip
            if name not in families:
                continue
            f = FAMILIES[name]
            rows = Rows(f.name, f.type, f.help)
            for resource, cap in sorted(capacity.items()):
                if name == "neuron_resource_capacity":
                    value: float = cap
                elif name == "neuron_resource_allocated":
                    value = attribution.allocated.get(resource, 0)
                elif allocatable is None:
                    continue  # unknown while the kubelet cannot be asked
                elif name == "neuron_resource_allocatable":
                    value = allocatable.get(resource, 0)
                else:
                    value = max(cap - allocatable.get(resource, 0), 0)
                rows.samples.append((pair("resource", resource), value))
            yield rows

    # -- outputs ------------------------------------------------------------------------------
    def render(self) -> str:
        return b"".join(self.render_pieces()).decode()

    def render_pieces(self, piece_size: int = 64 * 1024) -> Iterator[bytes]:
        """The text exposition in pieces of about `piece_size` bytes, so /metrics can send each as
        it is made: the page of a trn2.48xlarge (about 600 kB) is never held whole, nor its lines."""
        pending: list[str] = []
        size = 0
        for rows in self.rows():
            base = rows.name.removesuffix("_total") if rows.type == "counter" else rows.name
            help_text = rows.help.replace("\\", "\\\\").replace("\n", "\\n")
            name = rows.name
            pending.append(f"# HELP {base} {help_text}\n# TYPE {base} {rows.type}\n")
            for labels, value in rows.samples:
                line = f"{name}{{{labels}}} {number(value)}\n" if labels else f"{name} {number(value)}\n"
                pending.append(line)
                size += len(line)
                if size >= piece_size:
                    yield "".join(pending).encode()
                    pending.clear()
                    size = 0
        if pending:
            yield "".join(pending).encode()

    def collect(self) -> Iterator[Metric]:
        for rows in self.rows():
            base = rows.name.removesuffix("_total") if rows.type == "counter" else rows.name
            metric = Metric(base, rows.help, rows.type)
            for labels, value in rows.samples:
                parsed = {k: _unescape(v) for k, v in _LABEL_RE.findall(labels)}
                metric.samples.append(Sample(rows.name, parsed, value))
            yield metric

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on the node
