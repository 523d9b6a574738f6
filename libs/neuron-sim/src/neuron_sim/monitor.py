"""STAND-IN for AWS's `neuron-monitor` (aws-neuronx-tools), which needs Neuron hardware and a
Neuron runtime to report anything. Protocol-faithful to the neuron-monitor user guide
(aws-neuron-sdk `tools/neuron-sys-tools/neuron-monitor-user-guide.rst`; see
`shared/reference/neuron-monitor.md` section 2): one complete JSON document per period on stdout,
one per line, with `neuron_runtime_data[]` (pid, address, neuron_runtime_tag, error, report with
the four runtime metric groups), `system_data` (neuron_hw_counters, vcpu_usage, memory_info),
`instance_info` and `neuron_hardware_info`, every metric group carrying `period` and `error`.
`-c FILE` takes neuron-monitor's configuration file; only its top-level `period` is honoured.

The figures are made up (seeded, so reproducible); the node's shape is the simulated node's
(devices, logical cores, LNC), read from `--root` like the exporter reads it. For tests it can
also make runtimes appear and go away (`--churn-every`, or a `--runtimes-file` it rereads before
every document, where a runtime can be idle: loaded, running nothing, as a stuck job's), write
malformed lines (`--malformed-every`) and exit (`--exit-after`).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from neuron_driver.inventory import scan
from neuron_model.instance_types import GIB, get_instance_type

# neuron_hardware_info's names for each family (device type, device version, core version)
HARDWARE_NAMES = {
    "inf1": ("inferentia", "v1", "v1"),
    "inf2": ("inferentia2", "v3", "v2"),
    "trn1": ("trainium", "v2", "v2"),
    "trn2": ("trainium2", "v4", "v3d"),
}
PERCENTILES = ("p0", "p1", "p25", "p50", "p75", "p99", "p100")
ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
STATUS_TYPES = (
    "completed",
    "completed_with_err",
    "completed_with_num_err",
    "timed_out",
    "incorrect_input",
    "failed_to_queue",
)
CORE_MEMORY = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
HOST_MEMORY = ("application_memory", "constants", "dma_buffers", "tensors")
# Malformed lines `--malformed-every` cycles through: not JSON, cut short, not an object, wrong types.
MALFORMED = (
    "neuron-monitor: this is not JSON",
    '{"neuron_runtime_data": [{"pid": 1, "neuron_runtime_tag": "cut", "report": {',
    "[1, 2, 3]",
    '{"neuron_runtime_data": "none", "system_data": 7, "instance_info": [], "neuron_hardware_info": null}',
)


@dataclass(frozen=True)
class Node:
    instance_type: str
    family: str
    devices: int
    cores_per_device: int  # logical
    lnc: int
    device_memory: int
    vcpus: int = 8

    @property
    def cores(self) -> int:
        return self.devices * self.cores_per_device


@dataclass(frozen=True)
class Runtime:
    pid: int
    tag: str
    cores: tuple[int, ...]  # global logical NeuronCore indices
    idle: bool = False  # loaded, running nothing (a stuck job): 0 % busy, no executions, no latency


def node_from_root(root: Path) -> Node:
    inv = scan(root, env={})
    if inv.instance_type is None or not inv.devices:
        raise ValueError(f"no simulated Neuron node under {root}")
    it = inv.instance_type
    return Node(
        it.name,
        it.family.name,
        len(inv.devices),
        inv.logical_cores_per_device,
        inv.lnc.value,
        it.memory_bytes_per_device,
    )


def node_from_type(instance_type: str, lnc: int | None = None) -> Node:
    it = get_instance_type(instance_type)
    lnc = lnc or it.family.default_lnc
    return Node(it.name, it.family.name, it.devices, it.logical_cores_per_device(lnc), lnc, it.memory_bytes_per_device)


def group(period: float, **data: Any) -> dict[str, Any]:
    return {"period": period, **data, "error": ""}


def runtime_entry(node: Node, rt: Runtime, rng: random.Random, period: float) -> dict[str, Any]:
    busy = 0.0 if rt.idle else 1.0  # an idle runtime draws the same figures (the others' stay put), zeroed
    in_use: dict[str, Any] = {}
    for core in rt.cores:
        entry: dict[str, Any] = {
            "neuroncore_utilization": round(rng.uniform(0, 100), 2) * busy,
            "flops": int(rng.randrange(10**12) * busy),
        }
        if node.family == "trn2":  # the physical cores behind the logical one
            entry["v3d"] = {
                f"nc_v3.{core * node.lnc + i}": {"neuroncore_utilization": round(rng.uniform(0, 100), 2) * busy}
                for i in range(node.lnc)
            }
        in_use[str(core)] = entry
    latency = sorted(round(rng.uniform(0.001, 0.05), 8) for _ in PERCENTILES)
    core_memory = {str(c): {k: rng.randrange(0, 1 << 30, 4096) for k in CORE_MEMORY} for c in rt.cores}
    host_memory = {k: rng.randrange(0, 1 << 32, 4096) for k in HOST_MEMORY}
    errors = {k: int(rng.randrange(3) * busy) for k in ERROR_TYPES}
    statuses = {k: int((rng.randrange(100) if k == "completed" else rng.randrange(3)) * busy) for k in STATUS_TYPES}
    return {
        "pid": rt.pid,
        "address": "",
        "neuron_runtime_tag": rt.tag,
        "error": "",
        "report": {
            "neuroncore_counters": group(period, neuroncores_in_use=in_use),
            "execution_stats": group(
                period,
                error_summary=errors,
                execution_summary=statuses,
                latency_stats={  # null while no model ran in the period
                    "total_latency": None if rt.idle else dict(zip(PERCENTILES, latency, strict=True)),
                    "device_latency": None
                    if rt.idle
                    else {p: round(v * 0.9, 8) for p, v in zip(PERCENTILES, latency, strict=True)},
                },
            ),
            "memory_used": group(
                period,
                neuron_runtime_used_bytes={
                    "host": sum(host_memory.values()),
                    "neuron_device": sum(sum(m.values()) for m in core_memory.values()),
                    "usage_breakdown": {"host": host_memory, "neuroncore_memory_usage": core_memory},
                },
                loaded_models=[],
            ),
            "neuron_runtime_vcpu_usage": group(
                period, vcpu_usage={"user": round(rng.uniform(0, 100), 2), "system": round(rng.uniform(0, 20), 2)}
            ),
        },
    }


def _vcpu(rng: random.Random) -> dict[str, float]:
    user, system = round(rng.uniform(0, 60), 2), round(rng.uniform(0, 30), 2)
    return {
        "user": user,
        "nice": 0,
        "system": system,
        "idle": round(100 - user - system, 2),
        "io_wait": 0,
        "irq": 0,
        "soft_irq": 0,
    }


def document(node: Node, runtimes: Sequence[Runtime], rng: random.Random, period: float = 1.0) -> dict[str, Any]:
    device_type, device_version, core_version = HARDWARE_NAMES.get(node.family, (node.family, "", ""))
    return {
        "neuron_runtime_data": [runtime_entry(node, rt, rng, period) for rt in runtimes],
        "system_data": {
            "neuron_hw_counters": group(
                period,
                neuron_devices=[
                    {
                        "neuron_device_index": d,
                        "mem_ecc_corrected": 0,
                        "mem_ecc_uncorrected": 0,
                        "sram_ecc_uncorrected": 0,
                        "sram_ecc_corrected": 0,
                    }
                    for d in range(node.devices)
                ],
            ),
            "vcpu_usage": group(
                period,
                average_usage=_vcpu(rng),
                usage_data={str(i): _vcpu(rng) for i in range(node.vcpus)},
                context_switch_count=rng.randrange(10**6),
            ),
            "memory_info": group(
                period,
                memory_total_bytes=64 * GIB,
                memory_used_bytes=rng.randrange(GIB, 32 * GIB),
                swap_total_bytes=0,
                swap_used_bytes=0,
            ),
        },
        "instance_info": {
            "instance_name": "sim",
            "instance_id": "i-0000000000000000a",
            "instance_type": node.instance_type,
            "instance_availability_zone": "us-west-2b",
            "instance_availability_zone_id": "usw2-az2",
            "instance_region": "us-west-2",
            "ami_id": "ami-0000000000000000b",
            "subnet_id": "subnet-00000000",
            "error": "",
        },
        "neuron_hardware_info": {
            "neuron_device_type": device_type,
            "neuron_device_version": device_version,
            "neuroncore_version": core_version,
            "neuron_device_count": node.devices,
            "neuron_device_memory_size": node.device_memory,
            "neuroncore_per_device_count": node.cores_per_device,
            "logical_neuroncore_config": node.lnc,
            "error": "",
        },
    }


def spread(node: Node, count: int, cores_each: int, first_pid: int = 1000) -> list[Runtime]:
    """`count` runtimes on consecutive cores (wrapping round the node), tagged rt-<n>."""
    return [
        Runtime(first_pid + i, f"rt-{i}", tuple((i * cores_each + j) % node.cores for j in range(cores_each)))
        for i in range(count)
    ]


def read_runtimes(path: Path) -> list[Runtime]:
    """`[{"pid": 1, "tag": "a", "cores": [0, 1], "idle": false}, ...]` (`idle` optional); a missing or
    unreadable file is no runtimes."""
    try:
        entries = json.loads(path.read_text())
        return [
            Runtime(int(e["pid"]), str(e["tag"]), tuple(int(c) for c in e["cores"]), bool(e.get("idle", False)))
            for e in entries
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def write_runtimes(path: Path, runtimes: Sequence[Runtime]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(
        json.dumps(
            [
                {"pid": r.pid, "tag": r.tag, "cores": list(r.cores)} | ({"idle": True} if r.idle else {})
                for r in runtimes
            ]
        )
    )
    tmp.replace(path)  # the stand-in never reads half a file


@dataclass
class Scenario:
    runtimes: int = 2
    cores_each: int = 2
    churn_every: int = 0  # every N documents the oldest runtime exits and a new one starts
    malformed_every: int = 0  # every N documents, a malformed line first
    runtimes_file: Path | None = None
    seed: int = 0


def lines(node: Node, scenario: Scenario, period: float) -> Iterator[str]:
    """The stand-in's output, one line per document (and per malformed line), forever."""
    rng = random.Random(scenario.seed)
    current = spread(node, scenario.runtimes, scenario.cores_each)
    started = len(current)
    n = 0
    while True:
        n += 1
        if scenario.malformed_every and n % scenario.malformed_every == 0:
            yield MALFORMED[(n // scenario.malformed_every - 1) % len(MALFORMED)]
        if scenario.runtimes_file is not None:
            current = read_runtimes(scenario.runtimes_file)
        elif scenario.churn_every and n % scenario.churn_every == 0 and current:
            fresh = spread(node, started + 1, scenario.cores_each)[-1]
            current = [*current[1:], fresh]
            started += 1
        yield json.dumps(document(node, current, rng, period), separators=(",", ":"))


def config_period(path: Path | None, default: float) -> float:
    """neuron-monitor's `-c` file: `{"period": "1s", ...}` (s or ms)."""
    if path is None:
        return default
    text = str(json.loads(path.read_text()).get("period", "")).strip()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s")) if text else default


def run(
    node: Node,
    scenario: Scenario,
    period: float,
    *,
    count: int = 0,
    exit_after: int = 0,
    out: TextIO = sys.stdout,
) -> int:
    """Write documents every `period` seconds: `count` of them (0: forever), or exit with status 1
    after `exit_after` (as a neuron-monitor that crashed)."""
    for written, line in enumerate(lines(node, scenario, period), 1):
        try:
            out.write(line + "\n")
            out.flush()
        except BrokenPipeError:  # the reader went away, as neuron-monitor's would
            return 0
        if exit_after and written >= exit_after:
            return 1
        if count and written >= count:
            return 0
        time.sleep(period)
    return 0  # pragma: no cover
