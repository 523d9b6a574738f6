"""One neuron-monitor JSON document, parsed. Pure.

The format is the neuron-monitor user guide's (`shared/reference/neuron-monitor.md` section 2).
A document that is not a JSON object is refused whole (`MalformedDocument`); inside one, each
field is taken on its own: a metric group whose `error` is set, a value of the wrong type or a
core index that is not a number is skipped and named in `problems`, and the rest of the document
is kept. Fields the guide does not describe are ignored, and new keys inside the count and
percentile objects (a new error type, a new percentile) pass through as label values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

INSTANCE_FIELDS = (
    "instance_name",
    "instance_id",
    "instance_type",
    "instance_availability_zone",
    "instance_availability_zone_id",
    "instance_region",
    "ami_id",
    "subnet_id",
)
HARDWARE_FIELDS = (
    "neuron_device_type",
    "neuron_device_version",
    "neuroncore_version",
    "neuron_device_count",
    "neuron_device_memory_size",
    "neuroncore_per_device_count",
    "logical_neuroncore_config",
)


_LARGEST = 2**63  # beyond any counter or byte count neuron-monitor writes


class MalformedDocument(ValueError):
    pass


@dataclass(frozen=True)
class Problem:
    kind: str  # wrong_type, group_error, runtime_error
    where: str  # a path into the document, e.g. neuron_runtime_data[0].report.execution_stats


@dataclass(frozen=True)
class Runtime:
    pid: int
    tag: str
    utilization: Mapping[int, float] = field(default_factory=dict)  # logical core -> percent
    flops: Mapping[int, float] = field(default_factory=dict)  # logical core -> per second
    errors: Mapping[str, float] = field(default_factory=dict)  # error type -> count in the period
    statuses: Mapping[str, float] = field(default_factory=dict)  # execution outcome -> count in the period
    latency: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # total|device -> pNN -> seconds
    memory: Mapping[str, float] = field(default_factory=dict)  # host|neuron_device -> bytes
    host_memory: Mapping[str, float] = field(default_factory=dict)  # category -> bytes
    core_memory: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # core -> category -> bytes
    vcpu: Mapping[str, float] = field(default_factory=dict)  # user|system -> percent
    has_execution_stats: bool = False  # the group was reported (its counts may all be absent)

    @property
    def key(self) -> tuple[int, str]:
        return (self.pid, self.tag)

    @property
    def cores(self) -> tuple[int, ...]:
        """The logical cores it reported on, through any group."""
        return tuple(sorted({*self.utilization, *self.flops, *self.core_memory}))


@dataclass(frozen=True)
class System:
    vcpu_average: Mapping[str, float] = field(default_factory=dict)  # user, nice, system, ... -> percent
    vcpu_count: int | None = None
    memory: Mapping[str, float] = field(default_factory=dict)  # memory_total_bytes, ... -> bytes
    ecc: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # device -> event -> count


@dataclass(frozen=True)
class Report:
    runtimes: tuple[Runtime, ...] = ()
    system: System = field(default_factory=System)
    instance: Mapping[str, str] = field(default_factory=dict)
    hardware: Mapping[str, str] = field(default_factory=dict)  # values as label text
    problems: tuple[Problem, ...] = ()


def _fields(obj: Mapping[str, Any] | None, only: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    """An object's fields: all of them, or those named in `only`, in its order, where present."""
    if obj is None:
        return iter(())
    if only is None:
        return iter(obj.items())
    return ((key, obj[key]) for key in only if key in obj)


class _Reader:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def wrong(self, where: str) -> None:
        self.problems.append(Problem("wrong_type", where))

    def obj(self, value: Any, where: str) -> dict[str, Any] | None:
        """An object, or None (named as a problem unless absent or null, which the guide allows)."""
        if isinstance(value, dict):
            return value
        if value is not None:
            self.wrong(where)
        return None

    def group(self, parent: Mapping[str, Any], name: str, where: str) -> dict[str, Any] | None:
        g = self.obj(parent.get(name), f"{where}.{name}")
        if g is None:
            return None
        error = g.get("error", "")
        if error:
            self.problems.append(Problem("group_error", f"{where}.{name}"))
            return None
        return g

    def number(self, value: Any, where: str, *, count: bool = False) -> float | None:
        """A finite number (a count: not negative, or a counter would go back)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.wrong(where)
            return None
        if isinstance(value, int):
            if abs(value) > _LARGEST:  # JSON integers are unbounded; a float cannot hold this one
                self.wrong(where)
                return None
        elif not math.isfinite(value):
            self.wrong(where)
            return None
        if count and value < 0:
            self.wrong(where)
            return None
        return value

    def numbers(
        self, value: Any, where: str, *, counts: bool = False, only: Sequence[str] | None = None
    ) -> dict[str, float]:
        """Every numeric field of an object (or those of them named in `only`); others named as problems."""
        out: dict[str, float] = {}
        for key, v in _fields(self.obj(value, where), only):
            n = self.number(v, f"{where}.{key}", count=counts)
            if n is not None:
                out[str(key)] = n
        return out

    def per_core(self, value: Any, where: str) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for key, v in (self.obj(value, where) or {}).items():
            if not (str(key).isascii() and str(key).isdigit()):
                self.wrong(f"{where}.{key}")
                continue
            out[int(key)] = v
        return out

    def texts(self, value: Any, where: str, only: Sequence[str]) -> dict[str, str]:
        """The fields of an object named in `only`, as text."""
        out: dict[str, str] = {}
        for key, v in _fields(self.obj(value, where), only):
            if (t := self.text(v, f"{where}.{key}")) is not None:
                out[key] = t
        return out

    def text(self, value: Any, where: str) -> str | None:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if value is not None:
            self.wrong(where)
        return None


def parse_line(line: str | bytes) -> Report:
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedDocument(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedDocument(f"not a JSON object but {type(doc).__name__}")
    return parse_document(doc)


def parse_document(doc: Mapping[str, Any]) -> Report:
    r = _Reader()
    runtimes: list[Runtime] = []
    entries = doc.get("neuron_runtime_data")
    if entries is not None and not isinstance(entries, list):
        r.wrong("neuron_runtime_data")
        entries = None
    for i, entry in enumerate(entries or ()):
        runtime = _runtime(r, entry, f"neuron_runtime_data[{i}]")
        if runtime is not None:
            runtimes.append(runtime)
    system = _system(r, doc.get("system_data"))
    instance = r.texts(doc.get("instance_info"), "instance_info", INSTANCE_FIELDS)
    hardware: dict[str, str] = {}
    hw = r.obj(doc.get("neuron_hardware_info"), "neuron_hardware_info") or {}
    if hw.get("error"):
        r.problems.append(Problem("group_error", "neuron_hardware_info"))
    else:
        hardware = r.texts(hw, "neuron_hardware_info", HARDWARE_FIELDS)
    return Report(tuple(runtimes), system, instance, hardware, tuple(r.problems))


def _runtime(r: _Reader, entry: Any, where: str) -> Runtime | None:
    e = r.obj(entry, where)
    if e is None:
        return None
    pid = e.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int):
        r.wrong(f"{where}.pid")  # a runtime without an identity cannot be followed from one document to the next
        return None
    tag = r.text(e.get("neuron_runtime_tag"), f"{where}.neuron_runtime_tag")
    if tag is None:
        tag = str(pid)  # neuron-monitor's own default when NEURON_PROCESS_TAG is unset
    if e.get("error"):
        r.problems.append(Problem("runtime_error", where))
    report = r.obj(e.get("report"), f"{where}.report") or {}
    at = f"{where}.report"
    utilization, flops = _core_counters(r, r.group(report, "neuroncore_counters", at), f"{at}.neuroncore_counters")
    stats = r.group(report, "execution_stats", at)
    errors, statuses, latency = _execution_stats(r, stats, f"{at}.execution_stats")
    memory, host_memory, core_memory = _memory_used(r, r.group(report, "memory_used", at), f"{at}.memory_used")
    cpu = r.group(report, "neuron_runtime_vcpu_usage", at) or {}
    vcpu = r.numbers(cpu.get("vcpu_usage"), f"{at}.neuron_runtime_vcpu_usage.vcpu_usage")
    return Runtime(
        pid,
        tag,
        utilization,
        flops,
        errors,
        statuses,
        latency,
        memory,
        host_memory,
        core_memory,
        vcpu,
        has_execution_stats=stats is not None,
    )


def _core_counters(r: _Reader, group: dict[str, Any] | None, at: str) -> tuple[dict[int, float], dict[int, float]]:
    """Utilization and flops, per core in use."""
    utilization: dict[int, float] = {}
    flops: dict[int, float] = {}
    w = f"{at}.neuroncores_in_use"
    for core, data in r.per_core((group or {}).get("neuroncores_in_use"), w).items():
        d = r.numbers(data, f"{w}.{core}", only=("neuroncore_utilization", "flops"))
        if "neuroncore_utilization" in d:
            utilization[core] = d["neuroncore_utilization"]
        if "flops" in d:
            flops[core] = d["flops"]
    return utilization, flops


def _execution_stats(
    r: _Reader, group: dict[str, Any] | None, at: str
) -> tuple[dict[str, float], dict[str, float], dict[str, dict[str, float]]]:
    """Error counts by kind, execution counts by status, and latency percentiles by kind."""
    if group is None:
        return {}, {}, {}
    errors = r.numbers(group.get("error_summary"), f"{at}.error_summary", counts=True)
    statuses = r.numbers(group.get("execution_summary"), f"{at}.execution_summary", counts=True)
    latency: dict[str, dict[str, float]] = {}
    lat = r.obj(group.get("latency_stats"), f"{at}.latency_stats") or {}
    for kind in ("total_latency", "device_latency"):
        if lat.get(kind) is not None:  # null while no model ran in the period
            latency[kind.removesuffix("_latency")] = r.numbers(lat[kind], f"{at}.latency_stats.{kind}")
    return errors, statuses, latency


def _memory_used(
    r: _Reader, group: dict[str, Any] | None, at: str
) -> tuple[dict[str, float], dict[str, float], dict[int, dict[str, float]]]:
    """Bytes used by location (host, device), the host's by kind, and each core's by kind."""
    if group is None:
        return {}, {}, {}
    w = f"{at}.neuron_runtime_used_bytes"
    used = r.obj(group.get("neuron_runtime_used_bytes"), w) or {}
    memory = r.numbers(used, w, only=("host", "neuron_device"))
    breakdown = r.obj(used.get("usage_breakdown"), f"{w}.usage_breakdown") or {}
    host_memory = r.numbers(breakdown.get("host"), f"{w}.usage_breakdown.host")
    wc = f"{w}.usage_breakdown.neuroncore_memory_usage"
    core_memory = {
        core: r.numbers(data, f"{wc}.{core}")
        for core, data in r.per_core(breakdown.get("neuroncore_memory_usage"), wc).items()
    }
    return memory, host_memory, core_memory


def _system(r: _Reader, value: Any) -> System:
    data = r.obj(value, "system_data")
    if data is None:
        return System()
    vcpu_average: dict[str, float] = {}
    vcpu_count: int | None = None
    cpu = r.group(data, "vcpu_usage", "system_data")
    if cpu is not None:
        vcpu_average = r.numbers(cpu.get("average_usage"), "system_data.vcpu_usage.average_usage")
        per_cpu = r.obj(cpu.get("usage_data"), "system_data.vcpu_usage.usage_data")
        if per_cpu is not None:
            vcpu_count = len(per_cpu)
    mem = r.group(data, "memory_info", "system_data")
    names = ("memory_total_bytes", "memory_used_bytes", "swap_total_bytes", "swap_used_bytes")
    memory = r.numbers(mem, "system_data.memory_info", only=names)
    ecc: dict[int, dict[str, float]] = {}
    hw = r.group(data, "neuron_hw_counters", "system_data")
    if hw is not None:
        devices = hw.get("neuron_devices")
        if not isinstance(devices, list):
            if devices is not None:
                r.wrong("system_data.neuron_hw_counters.neuron_devices")
            devices = []
        for i, d in enumerate(devices):
            w = f"system_data.neuron_hw_counters.neuron_devices[{i}]"
            counts = r.numbers({k: v for k, v in (r.obj(d, w) or {}).items() if k != "neuron_device_index"}, w)
            index = d.get("neuron_device_index") if isinstance(d, dict) else None
            if isinstance(index, bool) or not isinstance(index, int):
                if isinstance(d, dict):
                    r.wrong(f"{w}.neuron_device_index")
                continue
            ecc[index] = counts
    return System(vcpu_average, vcpu_count, memory, ecc)
