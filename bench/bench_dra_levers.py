"""What each slice-layout lever costs kube-scheduler's own DRA allocator (issue 58 item 1).

For each Kubernetes release, `bench/dra-allocator` (k8s.io/dynamic-resource-allocation's structured
allocator at that release, built from its Go module) is given one fleet, half full, in several layouts:
AWS's (the anchor), our driver's default, and our default with one lever changed at a time, then the
best combination. For every claim it builds one allocator over the whole fleet's slices, as
kube-scheduler's DRA plugin does once per pod, and allocates the claim on each node in turn, as the
plugin's Filter does: the figure is the mean time of one node's filter, for the stream's device pods
(the same pods on every layout, each written as that layout's users write it) and, on our layouts,
its core pods. This is the allocator alone, not the scheduler: what it decides, and what the full runs
of `bench_scheduler` (the real kube-scheduler) then confirm for the chosen layouts.

The fleet's occupancy is the same on every layout: each node is filled to a drawn share of its
silicon with pods of the stream placed by the device plugin's allocator (`neuron_model.allocator`);
on AWS's layout a device any of whose cores is held is held whole (it has no cores to hand out).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import SMALL, BenchError, Figure, bench_cache  # noqa: E402
from neuron_dra_driver import slices  # noqa: E402
from simcluster import dra as dra_nodes  # noqa: E402
from simcluster.fleet import NodeSpec, PodSpec, fleet, pod_stream  # noqa: E402

from neuron_model import resources  # noqa: E402
from neuron_model.allocator import choose_cores, choose_devices  # noqa: E402
from neuron_model.instance_types import TopologyKind  # noqa: E402

Slices = list[dict[str, Any]]
GROUP_CLASS = "neurongroup.aws.com"


@dataclass(frozen=True)
class Holding:
    devices: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()


def occupancy(spec: NodeSpec, pods: list[PodSpec], rng: random.Random) -> list[Holding]:
    """The node filled to a drawn share of its cores with the stream's pods, placed as the device
    plugin's allocator places them."""
    topo = spec.topology
    free_devices = set(range(topo.device_count))
    free_cores = set(range(topo.device_count * topo.cores_per_device))
    target = rng.choice((0.0, 0.25, 0.5, 0.75, 0.9))
    total = len(free_cores)
    held: list[Holding] = []
    for pod in rng.sample(pods, len(pods)):
        if total - len(free_cores) >= target * total:
            break
        if pod.devices:
            choice = choose_devices(topo, free_devices, (), pod.devices)
            if not choice.valid:
                continue
            free_devices -= set(choice.ids)
            for d in choice.ids:
                free_cores -= set(topo.cores_of(d))
            held.append(Holding(devices=choice.ids))
        else:
            choice = choose_cores(topo, free_cores, (), pod.cores)
            if not choice.valid:
                continue
            free_cores -= set(choice.ids)
            free_devices -= {topo.device_of(c) for c in choice.ids}
            held.append(Holding(cores=choice.ids))
    return held


# -- layouts: our slices as the driver builds them, then one lever changed --------------------------------


def _devices(node_slices: Slices) -> list[dict[str, Any]]:
    return [d for s in node_slices for d in s["spec"].get("devices") or []]


def _counter_slices(node_slices: Slices) -> Slices:
    return [s for s in node_slices if s["spec"].get("sharedCounters")]


def _repack(node_slices: Slices, devices: list[dict[str, Any]], counters: Slices | None = None) -> Slices:
    """The pool again: its counter slices, then the devices 64 a slice, names and counts made whole."""
    template = node_slices[0]
    node = template["spec"]["nodeName"]
    specs = [copy.deepcopy(s["spec"]) for s in (counters if counters is not None else _counter_slices(node_slices))]
    specs += [
        {**copy.deepcopy(template["spec"]), "devices": devices[i : i + slices.MAX_DEVICES_PER_SLICE]}
        for i in range(0, len(devices), slices.MAX_DEVICES_PER_SLICE)
    ]
    out = []
    for i, spec in enumerate(specs):
        spec.pop("sharedCounters", None) if "devices" in spec else spec.pop("devices", None)
        spec["pool"] = {"name": node, "generation": 1, "resourceSliceCount": len(specs)}
        out.append({**template, "metadata": {"name": slices.slice_name(node, i)}, "spec": spec})
    return out


def _kind(device: dict[str, Any]) -> str:
    return str(device["attributes"]["resourceType"]["string"])


def cores_by_device(node_slices: Slices) -> Slices:
    """Each device followed by its own cores."""
    devices = _devices(node_slices)
    whole = [d for d in devices if _kind(d) == slices.DEVICE_KIND]
    cores = [d for d in devices if _kind(d) == slices.CORE_KIND]
    rest = [d for d in devices if _kind(d) not in (slices.DEVICE_KIND, slices.CORE_KIND)]
    ordered = []
    for d in whole:
        index = d["attributes"]["deviceId"]["int"]
        ordered += [d, *(c for c in cores if c["attributes"]["deviceId"]["int"] == index)]
    return _repack(node_slices, ordered + rest)


def cores_first(node_slices: Slices) -> Slices:
    devices = _devices(node_slices)
    cores = [d for d in devices if _kind(d) == slices.CORE_KIND]
    return _repack(node_slices, cores + [d for d in devices if _kind(d) != slices.CORE_KIND])


# what a core claim of the recipes selects or matches on; the rest of a core's attributes go
LEAN_CORE_ATTRIBUTES = ("resourceType", "deviceId", "coreId")


def lean_cores(node_slices: Slices) -> Slices:
    devices = copy.deepcopy(_devices(node_slices))
    for d in devices:
        if _kind(d) == slices.CORE_KIND:
            d["attributes"] = {
                k: v
                for k, v in d["attributes"].items()
                if k in LEAN_CORE_ATTRIBUTES or k.startswith(slices.GROUP_DOMAIN)
            }
    return _repack(node_slices, devices)


def split_consumption(node_slices: Slices) -> Slices:
    """A counter set per device holding one counter, `cores`, against one set holding a counter per device."""
    devices = copy.deepcopy(_devices(node_slices))
    for d in devices:
        consumed = []
        for c in d.get("consumesCounters") or []:
            for name, value in c["counters"].items():
                consumed.append({"counterSet": name, "counters": {"cores": value}})
        if consumed:
            d["consumesCounters"] = consumed
    sets = [
        {"name": name, "counters": {"cores": value}}
        for s in _counter_slices(node_slices)
        for counter_set in s["spec"]["sharedCounters"]
        for name, value in counter_set["counters"].items()
    ]
    # at most 8 sets a slice
    counters = [
        {**node_slices[0], "spec": {**node_slices[0]["spec"], "sharedCounters": sets[i : i + 8]}}
        for i in range(0, len(sets), 8)
    ]
    return _repack(node_slices, devices, counters)


def published_groups(spec: NodeSpec) -> Callable[[Slices], Slices]:
    """The torus's connected groups of 4, 8 and 16 devices published as devices (as a ring's arcs
    already are), each consuming its members' whole counters: a claim for k devices asks for one."""

    def layout(node_slices: Slices) -> Slices:
        topo = spec.topology
        if topo.kind is not TopologyKind.TORUS_2D:
            return node_slices
        devices = _devices(node_slices)
        by_index = {d["attributes"]["deviceId"]["int"]: d for d in devices if _kind(d) == slices.DEVICE_KIND}
        groups = []
        for size in sorted(topo.group_sizes):
            if size < 2:
                continue
            for group in topo.groups(size):
                members = sorted(group)
                first = members[0]
                attributes = {
                    k: v for k, v in by_index[first]["attributes"].items() if not k.startswith(slices.GROUP_DOMAIN)
                }
                attributes.pop("deviceId")
                attributes["resourceType"] = {"string": slices.GROUP_KIND}
                attributes["deviceCount"] = {"int": size}
                attributes["firstDeviceId"] = {"int": first}
                consumed: dict[str, dict[str, Any]] = {}
                for d in members:
                    for c in by_index[d]["consumesCounters"]:
                        consumed.setdefault(c["counterSet"], {}).update(c["counters"])
                groups.append(
                    {
                        "name": resources.dra_group_name(size, first),
                        "attributes": attributes,
                        "consumesCounters": [{"counterSet": s, "counters": c} for s, c in sorted(consumed.items())],
                    }
                )
        return _repack(node_slices, devices + groups)

    return layout


def group_claim(pod: PodSpec) -> dict[str, Any]:
    """A device pod's claim on a layout that publishes its connected groups: one group of k devices
    (`neurongroup.aws.com`, `deviceCount == k`), no constraint; one device as before."""
    claim = pod.claim_object()
    if pod.devices < 2:
        return claim
    claim["spec"]["devices"] = {
        "requests": [
            {
                "name": "neuron",
                "exactly": {
                    "deviceClassName": GROUP_CLASS,
                    "count": 1,
                    "selectors": [
                        {"cel": {"expression": f'device.attributes["{slices.DRIVER}"].deviceCount == {pod.devices}'}}
                    ],
                },
            }
        ]
    }
    return claim


# -- cores as consumable capacity (KEP-5075, DRAConsumableCapacity beta and on in 1.36 and 1.37) ---------
#
# The driver's --cores-as-capacity (the chart's default on 1.36): each device published once, shareable,
# with a capacity `cores` worth its logical cores whose default is all of them: a claim for whole devices
# (no capacity asked) takes all of a device, a claim for cores asks for `cores: k` of one device (or k/m of
# each of m connected ones, `simcluster.dra.capacity_claim_object`). No core devices and no shared
# counters; which cores a share gets is the driver's choice at prepare.
CORES_CAPACITY = slices.CORES_CAPACITY


def capacity_layout(spec: NodeSpec) -> Slices:
    return dra_nodes.node_slices(spec, cores_as_capacity=True)


capacity_claim = dra_nodes.capacity_claim_object


def capacity_shares(spec: NodeSpec, held: list[Holding]) -> list[list[str]]:
    topo = spec.topology
    shares = []
    for i, h in enumerate(held):
        per_device: dict[int, int] = {}
        for d in h.devices:
            per_device[d] = topo.cores_per_device
        for c in h.cores:
            per_device[topo.device_of(c)] = per_device.get(topo.device_of(c), 0) + 1
        for d, n in sorted(per_device.items()):
            shares.append([slices.DRIVER, spec.name, slices.device_name(d), f"{spec.name}-{i}", CORES_CAPACITY, str(n)])
    return shares


def no_cores(spec: NodeSpec) -> Slices:
    """The driver's own slices with cores (and so arcs) off: what it publishes where counters are dropped."""
    return dra_nodes.node_slices(spec, publish_cores=False)


@dataclass(frozen=True)
class Layout:
    name: str
    node_slices: Callable[[NodeSpec], Slices]
    claim: Callable[[PodSpec], dict[str, Any]]
    aws: bool = False
    shares: bool = False  # devices allow several allocations: holdings are shares of capacity
    cores: bool = True  # core pods run on it


def _ours(*levers: Callable[[NodeSpec], Callable[[Slices], Slices]]) -> Callable[[NodeSpec], Slices]:
    def build(spec: NodeSpec) -> Slices:
        out = dra_nodes.node_slices(spec)
        for lever in levers:
            out = lever(spec)(out)
        return out

    return build


def _static(f: Callable[[Slices], Slices]) -> Callable[[NodeSpec], Callable[[Slices], Slices]]:
    return lambda _spec: f


def layouts() -> list[Layout]:
    own = PodSpec.claim_object
    return [
        Layout("AWS's layout", dra_nodes.aws_node_slices, lambda p: p.claim_object(), aws=True),
        Layout(CORES_AS_DEVICES, _ours(), own),
        Layout("cores by device", _ours(_static(cores_by_device)), own),
        Layout("cores first", _ours(_static(cores_first)), own),
        Layout("lean cores", _ours(_static(lean_cores)), own),
        Layout("a counter set per device", _ours(_static(split_consumption)), own),
        Layout("published groups", _ours(published_groups), group_claim),
        Layout("published groups + lean cores", _ours(published_groups, _static(lean_cores)), group_claim),
        Layout(CORES_AS_CAPACITY_LAYOUT, capacity_layout, capacity_claim, shares=True),
        Layout("no cores (devices only)", no_cores, own, cores=False),
    ]


def scenario(layout: Layout, specs: list[NodeSpec], holdings: dict[str, list[Holding]], pods: list[PodSpec],
             filtered: list[str], instance_types: Iterable[str]) -> dict[str, Any]:  # fmt: skip
    all_slices = [s for spec in specs for s in layout.node_slices(spec)]
    allocated: list[list[str]] = []
    shared: list[list[str]] = []
    for spec in specs:
        topo = spec.topology
        if layout.shares:
            shared += capacity_shares(spec, holdings[spec.name])
            continue
        for h in holdings[spec.name]:
            if layout.aws or not layout.cores:
                devices = set(h.devices) | {topo.device_of(c) for c in h.cores}
                allocated += [[slices.DRIVER, spec.name, slices.device_name(d)] for d in sorted(devices)]
            else:
                allocated += [[slices.DRIVER, spec.name, slices.device_name(d)] for d in h.devices]
                allocated += [[slices.DRIVER, spec.name, slices.core_name(c)] for c in h.cores]
    if layout.aws:
        claims = [{"kind": "device", "claim": dra_nodes.aws_claim_object(p, instance_types)} for p in pods if p.devices]
        classes = dra_nodes.aws_device_classes()
    else:
        claims = [
            {"kind": "device" if p.devices else "core", "claim": layout.claim(p)}
            for p in pods
            if layout.cores or p.devices
        ]
        classes = dra_nodes.chart_device_classes(cores_as_capacity=layout.shares)
    return {"classes": classes, "slices": all_slices, "nodes": filtered, "allocated": allocated, "shared": shared,
            "claims": claims}  # fmt: skip


RELEASES = ("1.34.4", "1.35.4", "1.36.3", "1.37.2")
# Releases whose API server drops shared counters and consumable capacity (DRAPartitionableDevices and
# DRAConsumableCapacity alpha, off): the driver then publishes devices only, so that is our default there.
DEVICES_ONLY_RELEASES = ("1.34.4", "1.35.4")
BUILD_TAGS = {"1.34.4": "k8s134", "1.35.4": "k8s135"}
ALLOCATOR = Path(__file__).resolve().parent / "dra-allocator"
CORES_AS_DEVICES = "ours, cores as devices"  # the driver's layout with cores before --cores-as-capacity
CORES_AS_CAPACITY_LAYOUT = "cores as capacity"
AWS = "AWS's layout"
NO_CORES = "no cores (devices only)"


def _chart_default(release: str) -> str:
    """The layout of `layouts()` the chart's defaults publish on `release` (`simcluster.dra.chart_default_layout`)."""
    return {
        dra_nodes.OURS: CORES_AS_DEVICES,
        dra_nodes.OURS_DEVICES: NO_CORES,
        dra_nodes.OURS_SHARES: CORES_AS_CAPACITY_LAYOUT,
    }[dra_nodes.chart_default_layout(release)]


@dataclass(frozen=True)
class Size:
    nodes: int
    claims: int  # the stream's first pods (groups aside), each filtered on...
    filtered: int  # ...this many nodes of the fleet, drawn once
    claims_136: int = 0  # fewer on 1.36, whose allocator costs every node all the fleet's counter slices


TITLE = "DRA slice layouts in kube-scheduler's own allocator, against AWS's layout (issue 58 item 1)"

SIZES = (Size(8, 6, 4, 6),) if SMALL else (Size(200, 80, 60, 30), Size(1000, 40, 40, 10))


def allocator_binary(release: str) -> Path:
    """bench/dra-allocator built for `release` (its own go.<release>.mod) once per source version into
    the cache."""
    if shutil.which("go") is None:
        raise BenchError("go is not installed: the DRA allocator bench cannot be built (make setup needs Go too)")
    modfile = "go.mod" if release == RELEASES[-1] else f"go.v{release}.mod"
    sources = [*sorted(p.name for p in ALLOCATOR.glob("*.go")), modfile, modfile.removesuffix(".mod") + ".sum"]
    digest = hashlib.sha256(b"".join((ALLOCATOR / f).read_bytes() for f in sources)).hexdigest()[:16]
    cache = bench_cache()
    binary = cache / f"dra-allocator-{release}-{digest}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
        tags = ["-tags", BUILD_TAGS[release]] if release in BUILD_TAGS else []
        command = ["go", "build", "-trimpath", f"-modfile={modfile}", *tags, "-o", f"{binary}.tmp", "."]
        subprocess.run(command, cwd=ALLOCATOR, env=env, check=True)
        Path(f"{binary}.tmp").rename(binary)
    return binary


def measure(binary: Path, data: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(data, f)
    try:
        out = subprocess.run([str(binary), "--scenario", f.name], check=False, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise BenchError(f"{binary.name}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
    return dict(json.loads(out.stdout)["kinds"])


def _row(release: str, size: Size, name: str, device: dict[str, Any], core: dict[str, Any], aws_us: float) -> str:
    line = (
        f"  {release} {size.nodes:5} nodes  {name:32} device pods {device['mean_us']:8.0f} us a node "
        f"(p99 {device['p99_us']:7.0f}, AWS's/this {aws_us / device['mean_us']:5.2f}, "
        f"fit {device['fits']}/{device['filters']})"
    )
    if core:
        line += f"  core pods {core['mean_us']:8.0f} us a node (fit {core['fits']}/{core['filters']})"
    errors = device.get("errors", 0) + core.get("errors", 0)
    if errors:
        line += f"  {errors} errors, the first: {device.get('first_error') or core.get('first_error')}"
    return line


def run_release(release: str, size: Size) -> tuple[list[Figure], list[str]]:
    binary = allocator_binary(release)
    seed = 1
    specs = fleet(size.nodes, seed, size.nodes // 40)
    stream = pod_stream(size.nodes * 5, seed, 0)
    rng = random.Random(f"levers-{seed}")
    holdings = {s.name: occupancy(s, stream, rng) for s in specs}
    claims = size.claims_136 if release == "1.36.3" and size.claims_136 else size.claims
    pods = [p for p in stream if p.group is None][:claims]
    filtered = [s.name for s in rng.sample(specs, min(size.filtered, len(specs)))]
    instance_types = sorted({s.instance_type for s in specs})
    wanted = (AWS, NO_CORES) if release in DEVICES_ONLY_RELEASES else None
    rows: dict[str, dict[str, Any]] = {}
    lines = []
    for layout in layouts():
        if wanted is not None and layout.name not in wanted:
            continue
        rows[layout.name] = measure(binary, scenario(layout, specs, holdings, pods, filtered, instance_types))
        device, core = rows[layout.name].get("device", {}), rows[layout.name].get("core", {})
        lines.append(_row(release, size, layout.name, device, core, rows[AWS]["device"]["mean_us"]))
        print(lines[-1], flush=True)
    aws_us = rows[AWS]["device"]["mean_us"]
    default = _chart_default(release)
    with_cores = [name for name, r in rows.items() if "core" in r]
    figures = [
        Figure(f"DRA allocator {release}, {size.nodes} nodes: our default's device-pod filter pace / AWS's layout's",
               aws_us / rows[default]["device"]["mean_us"], "x", 0.9, higher_is_better=True),
    ]  # fmt: skip
    summary = (
        f"DRA allocator vs AWS's shape, Kubernetes {release}, {size.nodes} nodes: device pods "
        f"{aws_us:.0f} us a node AWS's, {rows[default]['device']['mean_us']:.0f} ours (default: {default})"
    )
    if with_cores:
        best = min(with_cores, key=lambda name: rows[name]["device"]["mean_us"])
        ratio = aws_us / rows[best]["device"]["mean_us"]
        figures.append(
            Figure(
                f"DRA allocator {release}, {size.nodes} nodes: best layout with cores ({best}) / AWS's layout's",
                ratio,
                "x",
                0.5,
                higher_is_better=True,
            )
        )
        summary += f", {rows[best]['device']['mean_us']:.0f} the best with cores ({best}, ratio={ratio:.2f})"
    summary += f"; ratio={aws_us / rows[default]['device']['mean_us']:.2f}"
    return figures, [*lines, summary]


def run() -> list[Figure]:
    figures: list[Figure] = []
    summaries = []
    for size in SIZES:
        for release in RELEASES[-1:] if SMALL else RELEASES:
            found, lines = run_release(release, size)
            figures += found
            summaries.append(lines[-1])
    print("\n" + "\n".join(summaries), flush=True)
    return figures


if __name__ == "__main__":
    # one release and size by hand: bench_dra_levers.py RELEASE NODES CLAIMS FILTERED
    release, nodes, claims, filtered = sys.argv[1], *map(int, sys.argv[2:5])
    for line in run_release(release, Size(nodes, claims, filtered))[1]:
        print(line)
