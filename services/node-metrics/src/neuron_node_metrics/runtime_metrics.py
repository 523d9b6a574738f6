"""neuron-monitor's reports as metric families, in either naming or both. Pure.

`RuntimeState` keeps the latest report and each runtime's execution counts summed over the
documents it appeared in (neuron-monitor reports counts per period, as neuron-monitor-prometheus
adds them up); a runtime missing from a document is forgotten, so its series disappear with it.

A runtime is attributed through its cores: a per-core series carries the labels of the container
holding that core, a runtime's own series those of the one container holding every core it
reported on (none when its cores have different holders, or none).

`--naming neuron-monitor` gives neuron-monitor-prometheus's names and labels (the instance
labels, `runtime_tag`, `neuroncore`, ...; `shared/reference/neuron-monitor.md` section 3), with
the pod labels added. `--naming both` serves the native families and neuron-monitor-prometheus's
beside them; the two families both name alike (SHARED_NAMES) are served once, with both label sets.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import ALL_FAMILIES, CORE_MEMORY, FAMILIES, Naming
from neuron_node_metrics.collector import Rows, owner_labels, pair
from neuron_node_metrics.monitor_report import Report, Runtime

# families neuron-monitor-prometheus names as this exporter does (with other labels)
SHARED_NAMES = frozenset(name for name, f in ALL_FAMILIES.items() if f.neuron_monitor_name == name)
# neuron-monitor-prometheus's instance labels, from instance_info's fields
INSTANCE_LABELS = (
    ("instance_name", "instance_name"),
    ("instance_id", "instance_id"),
    ("instance_type", "instance_type"),
    ("availability_zone", "instance_availability_zone"),
    ("region", "instance_region"),
    ("subnet_id", "subnet_id"),
)
NATIVE_INSTANCE_LABELS = (
    *INSTANCE_LABELS[:4],
    ("availability_zone_id", "instance_availability_zone_id"),
    INSTANCE_LABELS[4],
    ("ami_id", "ami_id"),
    INSTANCE_LABELS[5],
)
# neuron-monitor-prometheus's system_vcpu_usage_ratio sums these modes
COMPAT_VCPU = {"user": ("user", "nice"), "system": ("system", "io_wait", "irq", "soft_irq")}
_PERCENTILE = re.compile(r"p(\d+(?:\.\d+)?)")


@dataclass
class RuntimeState:
    report: Report | None = None
    statuses: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)
    errors: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)
    duplicates: int = 0  # runtimes listed twice in one document (the second is ignored)
    instance: Mapping[str, str] = field(default_factory=dict)  # the last instance_info: outlives neuron-monitor

    def update(self, report: Report) -> None:
        seen: dict[tuple[int, str], Runtime] = {}
        for rt in report.runtimes:
            if rt.key in seen:
                self.duplicates += 1
                continue
            seen[rt.key] = rt
        for totals in (self.statuses, self.errors):
            for key in [k for k in totals if k not in seen]:
                del totals[key]
        for key, rt in seen.items():
            for totals, counts in ((self.statuses, rt.statuses), (self.errors, rt.errors)):
                mine = totals.setdefault(key, {})
                for name, n in counts.items():
                    mine[name] = mine.get(name, 0) + n
        if report.instance:
            self.instance = report.instance
        self.report = Report(tuple(seen.values()), report.system, report.instance, report.hardware, report.problems)

    def clear(self) -> None:
        """neuron-monitor is gone: what it said no longer holds."""
        self.report = None
        self.statuses.clear()
        self.errors.clear()


def quantile(percentile: str) -> str:
    """neuron-monitor's `p99` as Prometheus's `0.99` (other keys unchanged)."""
    m = _PERCENTILE.fullmatch(percentile)
    return f"{float(m.group(1)) / 100:g}" if m else percentile


def runtime_owner(cores: tuple[int, ...], holders: Mapping[int, Owner]) -> Owner | None:
    owners = {holders.get(c) for c in cores}
    return owners.pop() if len(owners) == 1 else None


def runtime_rows(
    state: RuntimeState,
    families: frozenset[str],
    attribution: Attribution,
    device_of: Mapping[int, int],
    *,
    naming: Naming = Naming.NATIVE,
) -> Iterator[Rows]:
    """Under Naming.BOTH, the two families of one name in both
    namings (SHARED_NAMES) are served once, each series with both namings' labels."""
    if naming is Naming.BOTH:
        native = _rows(state, families, attribution, device_of, compat=False, both=True)
        theirs = (r for r in _rows(state, families, attribution, device_of, compat=True) if r.name not in SHARED_NAMES)
        for rows in itertools.chain(native, theirs):
            yield _first_of_each(rows)
        return
    for rows in _rows(state, families, attribution, device_of, compat=naming is Naming.NEURON_MONITOR):
        yield _first_of_each(rows)


def _first_of_each(rows: Rows) -> Rows:
    """One sample a series: neuron-monitor-prometheus's labels cannot tell apart two runtimes of one tag in
    one container (the native names can, by pid), and two percentile keys can name one quantile (`p50`,
    `p50.0`). The first one's sample is served, not two samples of one series."""
    first: dict[str, float] = {}
    for labels, value in rows.samples:
        first.setdefault(labels, value)
    if len(first) != len(rows.samples):
        rows.samples = list(first.items())
    return rows


def _rows(
    state: RuntimeState,
    families: frozenset[str],
    attribution: Attribution,
    device_of: Mapping[int, int],
    *,
    compat: bool,
    both: bool = False,
) -> Iterator[Rows]:
    """`both` (native names only): SHARED_NAMES' series carry neuron-monitor's labels as well."""
    instance = ",".join(pair(name, state.instance.get(src, "")) for name, src in INSTANCE_LABELS)
    report = state.report
    if report is None:
        yield from _instance(state.instance, families, compat, instance)
        return
    holders = attribution.cores
    core_owner: dict[int, str] = {}

    def owned(core: int) -> str:
        labels = core_owner.get(core)
        if labels is None:
            labels = core_owner[core] = owner_labels(holders.get(core))
        return labels

    def who(rt: Runtime) -> str:
        tag = pair("runtime_tag", rt.tag)
        return f"{instance},{tag}" if compat else f"{tag},{pair('pid', str(rt.pid))}"

    def core_label(core: int) -> str:
        if compat:
            return pair("neuroncore", str(core))
        device = device_of.get(core)
        return f"{pair('device', '' if device is None else str(device))},{pair('core', str(core))}"

    def family(name: str, compat_name: str | None = None) -> Rows | None:
        if name not in families:
            return None
        f = FAMILIES[name]
        return Rows(compat_name if compat and compat_name else f.name, f.type, f.help)

    runtimes = report.runtimes
    owners = {rt.key: owner_labels(runtime_owner(rt.cores, holders)) for rt in runtimes}

    rows = family("neuron_core_utilization_ratio", "neuroncore_utilization_ratio")
    if rows is not None:
        for rt in runtimes:
            head = who(rt)
            for core, percent in sorted(rt.utilization.items()):
                labels = f"{head},{core_label(core)}" if compat else f"{core_label(core)},{head}"
                rows.samples.append((f"{labels},{owned(core)}", percent / 100))
        yield rows

    for name, compat_name, label, totals in (
        ("neuron_runtime_executions_total", "execution_status_total", ("status", "status_type"), state.statuses),
        ("neuron_runtime_execution_errors_total", "execution_errors_total", ("type", "error_type"), state.errors),
    ):
        rows = family(name, compat_name)
        if rows is not None:
            key = label[1] if compat else label[0]
            for rt in runtimes:
                head, owner = who(rt), owners[rt.key]
                for what, count in sorted(totals.get(rt.key, {}).items()):
                    rows.samples.append((f"{head},{pair(key, what)},{owner}", count))
            yield rows

    rows = family("neuron_runtime_execution_latency_seconds", "execution_latency_seconds")
    if rows is not None:
        for rt in runtimes:
            head, owner = who(rt), owners[rt.key]
            for kind, percentiles in rt.latency.items():
                if compat and kind != "total":
                    continue  # neuron-monitor-prometheus serves the total latency only
                for p, seconds in percentiles.items():
                    labels = (
                        f"{head},{pair('percentile', p)}"
                        if compat
                        else f"{head},{pair('latency', kind)},{pair('quantile', quantile(p))}"
                    )
                    rows.samples.append((f"{labels},{owner}", seconds))
        yield rows

    rows = family("neuron_runtime_memory_used_bytes")
    if rows is not None:
        for rt in runtimes:
            head, owner = who(rt), owners[rt.key]
            for where, used in rt.memory.items():
                theirs, ours = (
                    pair("memory_location", where),
                    pair("location", "device" if where == "neuron_device" else where),
                )
                location = theirs if compat else f"{instance},{ours},{theirs}" if both else ours
                rows.samples.append((f"{head},{location},{owner}", used))
        yield rows

    if not compat:
        rows = family("neuron_runtime_host_memory_used_bytes")
        if rows is not None:
            for rt in runtimes:
                head, owner = who(rt), owners[rt.key]
                for category, used in sorted(rt.host_memory.items()):
                    rows.samples.append((f"{head},{pair('category', category)},{owner}", used))
            yield rows

    if "neuron_runtime_core_memory_used_bytes" in families:
        f = FAMILIES["neuron_runtime_core_memory_used_bytes"]
        if compat:  # one family per category, as neuron-monitor-prometheus has
            by_category = {c: Rows(f"neuroncore_memory_usage_{c}", "gauge", f.help) for c in CORE_MEMORY}
            for rt in runtimes:
                head = who(rt)
                for core, categories in sorted(rt.core_memory.items()):
                    for category, used in categories.items():
                        if category in by_category:
                            by_category[category].samples.append(
                                (f'{head},memory_location="None",{core_label(core)},{owned(core)}', used)
                            )
            yield from by_category.values()
        else:
            rows = Rows(f.name, f.type, f.help)
            for rt in runtimes:
                head = who(rt)
                for core, categories in sorted(rt.core_memory.items()):
                    for category, used in sorted(categories.items()):
                        labels = f"{core_label(core)},{head},{pair('category', category)},{owned(core)}"
                        rows.samples.append((labels, used))
            yield rows

    rows = family("neuron_runtime_vcpu_usage_ratio")
    if rows is not None:
        for rt in runtimes:
            head, owner = who(rt), owners[rt.key]
            for mode, percent in sorted(rt.vcpu.items()):
                theirs, ours = pair("usage_type", mode), pair("mode", mode)
                labels = theirs if compat else f"{instance},{ours},{theirs}" if both else ours
                rows.samples.append((f"{head},{labels},{owner}", percent / 100))
        yield rows

    yield from _system(report, families, compat, instance)
    yield from _instance(state.instance, families, compat, instance)


def _system(report: Report, families: frozenset[str], compat: bool, instance: str) -> Iterator[Rows]:
    system = report.system
    prefix = f"{instance}," if compat else ""
    if "neuron_system_vcpu_count" in families and system.vcpu_count is not None:
        f = FAMILIES["neuron_system_vcpu_count"]
        yield Rows(
            "system_vcpu_count" if compat else f.name, f.type, f.help, [(instance if compat else "", system.vcpu_count)]
        )
    if "neuron_system_vcpu_usage_ratio" in families and system.vcpu_average:
        f = FAMILIES["neuron_system_vcpu_usage_ratio"]
        avg = system.vcpu_average
        if compat:
            samples = [
                (f"{prefix}{pair('usage_type', mode)}", min(sum(avg.get(m, 0) for m in parts), 100.0) / 100)
                for mode, parts in COMPAT_VCPU.items()
            ]
            yield Rows("system_vcpu_usage_ratio", f.type, f.help, samples)
        else:
            yield Rows(f.name, f.type, f.help, [(pair("mode", m), v / 100) for m, v in sorted(avg.items())])
    memory = system.memory
    for name, measure in (("neuron_system_memory_size_bytes", "total"), ("neuron_system_memory_used_bytes", "used")):
        if name not in families:
            continue
        f = FAMILIES[name]
        present = [
            (kind, memory[f"{kind}_{measure}_bytes"])
            for kind in ("memory", "swap")
            if f"{kind}_{measure}_bytes" in memory
        ]
        if compat:
            for kind, value in present:
                yield Rows(f"system_{kind}_{measure}_bytes", f.type, f.help, [(instance, value)])
        elif present:
            samples = [(pair("memory", "ram" if kind == "memory" else kind), value) for kind, value in present]
            yield Rows(f.name, f.type, f.help, samples)


def _instance(known: Mapping[str, str], families: frozenset[str], compat: bool, instance: str) -> Iterator[Rows]:
    if "neuron_instance_info" in families and known:
        f = FAMILIES["neuron_instance_info"]
        if compat:
            yield Rows("instance_info", f.type, f.help, [(instance, 1)])
        else:
            labels = ",".join(pair(name, known.get(src, "")) for name, src in NATIVE_INSTANCE_LABELS)
            yield Rows(f.name, f.type, f.help, [(labels, 1)])


def instance_labels(state: RuntimeState) -> Callable[[], str]:
    """neuron-monitor-prometheus's instance labels, for the sysfs families that carry them too ('' until known)."""

    def labels() -> str:
        known = state.instance
        return ",".join(pair(name, known.get(src, "")) for name, src in INSTANCE_LABELS) if known else ""

    return labels
