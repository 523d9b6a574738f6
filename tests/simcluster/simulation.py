"""One scheduler over the simulated fleet and pod stream, from an empty control plane to the figures.

`simulate` starts a private control plane (etcd, kube-apiserver), creates the Nodes and their
NeuronNode reports, creates the whole pod stream while no scheduler runs (so the queue takes the
pods in stream order and the measured pace is the scheduler's, not the creator's), then starts the
scheduler under test and lets the simulated kubelets admit what it binds. The run ends when every
pod is bound, or when nothing was bound for `quiet` seconds and the scheduler has reported every
unbound pod unschedulable, or at `deadline`. Each run has a control plane of its own: both
schedulers start from the same empty cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from polling import until_async

from neuron_model.placement import FreeState, PodRequest, place, refusal
from neuron_model.report import NodeReport
from simcluster import dra as dra_nodes
from simcluster.api import Api, bounded
from simcluster.controlplane import ControlPlane, control_plane, free_port, wait_until_ready
from simcluster.dra import DEVICE_CLASSES, chart_device_classes
from simcluster.fleet import (
    DEFAULT_SCHEDULER,
    NAMESPACE,
    GroupSpec,
    NodeSpec,
    PodSpec,
    fleet,
    pod_stream,
    priority_class,
    urgent_stream,
)
from simcluster.nodes import PODS, REPORTS, WRITERS, Admission, SimulatedNodes
from simcluster.profile import WINDOW, profile_windows
from simcluster.schedulers import NEURON_SCHEDULER, extender_command, start_extender, start_scheduler

HERE = Path(__file__).parent
SIMULATED_KUBELETS = "simulated kubelets"


def neuronnode_crd() -> dict[str, Any]:
    """The NeuronNode CRD the simulation installs. The stand-in, until the chart's
    (charts/neuron-helm-chart/templates/scheduler/crd.yaml) lands: switch to it here."""
    crd: dict[str, Any] = yaml.safe_load((HERE / "neuronnode-crd.yaml").read_text())
    return crd


@dataclass(frozen=True)
class Size:
    nodes: int
    pods: int
    seed: int = 1
    report_interval: float = 30.0  # the simulated plugins' heartbeat, as the real plugin's
    quiet: float = 10.0  # seconds without a binding that end the run
    deadline: float = 600.0  # seconds the scheduling may take at most
    probes: int = 100  # extender calls timed per verb and state
    ultraservers: int = 0  # trn2u UltraServers of 4 nodes among `nodes`
    groups: int = 0  # LeaderWorkerSet groups asking to share an UltraServer, beside the `pods`
    profile_window: int = WINDOW  # seconds of each kube-scheduler CPU profile (`simulate`'s `profile`)


FULL = Size(nodes=1000, pods=5000, deadline=900.0, quiet=15.0, probes=200, ultraservers=25, groups=30)
# The reduced run's deadline only ends a run that cannot settle; its pace is the bench's to measure.
# DRA with extended resource names settles in about 40 s on a quiet 2-core machine, past 60 s under load.
REDUCED = Size(nodes=40, pods=300, deadline=150.0, quiet=5.0, probes=20, ultraservers=3, groups=4)
# The DRA runs of tests/test_scheduling_simulation.py, smaller in the same proportions (7.5 pods a
# node, a third of the nodes in UltraServers, a group per 60 pods): the fleet still fills, about half
# the pods are left unbound (52 % bound at 40 nodes, 46-49 % here), every instance type and both kinds
# of claim run. kube-scheduler 1.36's DRA filter costs each pod every node's counter slices for every
# node it filters (kubernetes#138917): at 40 nodes and 300 pods the two runs took 196 s of its CPU
# (161 s on a quiet 2-core machine, 210 s in a CPU-bound make test), here 51 s (55 s).
DRA_REDUCED = Size(nodes=24, pods=180, deadline=150.0, quiet=5.0, probes=20, ultraservers=2, groups=3)
# `make bench` at the size tests/test_bench.py runs it (NEURON_BENCH_SMALL=1): only that every run
# ends and prints its figures. What the reduced run shows is held by tests/test_scheduling_simulation.py.
# One UltraServer and one group keep every path of the run; at 16 nodes and 60 pods its four runs
# took 84 s and 78 CPU-seconds of a CPU-bound make test, at this size 52 s and 39.
# Its runs settle within one 10-second window, so a profiled one is cut into 1-second windows.
SMOKE = Size(nodes=8, pods=24, deadline=60.0, quiet=3.0, probes=5, ultraservers=1, groups=1, profile_window=1)


@dataclass(frozen=True)
class GroupOutcome:
    """Where one group's pods ended."""

    group: GroupSpec
    pods: list[str]
    bound: dict[str, str]  # pod -> node
    domains: set[str | None]  # the server ids of the bound pods' UltraServer groups (None: a node in none)

    @property
    def whole(self) -> bool:
        """Every pod bound, all in one UltraServer group of the group's size."""
        return len(self.bound) == len(self.pods) and len(self.domains) == 1 and None not in self.domains

    @property
    def split(self) -> bool:
        """Pods bound in more than one UltraServer group, or outside any."""
        return len(self.domains) > 1 or None in self.domains

    @property
    def partial(self) -> bool:
        """Some pods bound, not all: a half-placed group holding devices."""
        return 0 < len(self.bound) < len(self.pods)

    @property
    def waiting(self) -> bool:
        return not self.bound


@dataclass
class ExtenderFigures:
    filter_seconds: dict[str, list[float]] = field(default_factory=dict)  # state -> latencies
    prioritize_seconds: dict[str, list[float]] = field(default_factory=dict)
    rss_peak_mb: float = 0.0
    rss_end_mb: float = 0.0


@dataclass
class Outcome:
    scheduler: str
    nodes: list[NodeSpec]
    pods: list[PodSpec]
    admissions: list[Admission]  # every binding the simulated kubelets admitted, in order
    unbound: dict[str, str]  # pod -> the scheduler's last message for it ("" if none seen)
    bound_in_api: dict[str, str]  # pod -> node, from a final list of the API server
    reports: dict[str, NodeReport]  # node -> its NeuronNode as the API server has it at the end
    free: dict[str, FreeState]  # node -> what its plugin has free at the end
    bind_times: list[float]  # monotonic, in order
    running_times: list[float]  # monotonic, in order: when the simulated kubelet wrote each pod Running
    timed_out: bool
    # CPU seconds each process used while the scheduler ran: kube-scheduler (or neuron-scheduler),
    # the extender, kube-apiserver, etcd and this process, the simulated kubelets (SIMULATED_KUBELETS)
    cpu_seconds: dict[str, float]
    attempts: dict[str, float]  # the scheduler's scheduling attempts by result: scheduled, unschedulable, error
    extender: ExtenderFigures | None = None
    # the preemption run: the second stream, of higher priority, created once the first has settled,
    # and the pods deleted while they held silicon (preempted: nothing else deletes a pod) -> (node, when)
    urgent: list[PodSpec] = field(default_factory=list)
    deleted: dict[str, tuple[str, float]] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)  # pod -> when its binding was seen
    nominations: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # pod -> (node, when) nominated
    profiles: list[Path] = field(default_factory=list)  # kube-scheduler's CPU profiles (`simulate`'s `profile`)

    def needless_preemptions(self) -> list[str]:
        """Pods preempted on a node that took no pod of the second stream after it: evicted for
        nothing (kube-scheduler's own preemption, counting devices, evicts such pods when the
        ones it frees form no valid set, and the extender then refuses the node)."""
        placed: dict[str, list[float]] = {}
        for admission in self.admissions:
            if admission.pod.startswith("urgent-"):
                placed.setdefault(admission.node, []).append(self.bound_at[admission.pod])
        return [pod for pod, (node, when) in self.deleted.items() if not any(t >= when for t in placed.get(node, ()))]

    @property
    def placed_valid(self) -> int:
        return sum(1 for a in self.admissions if a.valid)

    @property
    def placed_invalid(self) -> int:
        return sum(1 for a in self.admissions if not a.valid)

    @property
    def over_committed(self) -> int:
        return sum(1 for a in self.admissions if a.shortfall)

    @property
    def throughput(self) -> float:
        """Pods bound per second, from the first binding to the last."""
        if len(self.bind_times) < 2:
            return float("nan")
        return (len(self.bind_times) - 1) / (self.bind_times[-1] - self.bind_times[0])

    @property
    def started_throughput(self) -> float:
        """Pods bound and running per second: from the first binding until the last pod bound is
        written Running by its simulated kubelet. Unlike `throughput`, the interval holds every
        write the pods it counts cost the API server (their status, their nodes' reports), so a
        run cannot count pods whose writes it left for after its last binding."""
        if len(self.running_times) < 2 or not self.bind_times:
            return float("nan")
        return len(self.running_times) / (self.running_times[-1] - self.bind_times[0])

    def groups(self) -> list[GroupOutcome]:
        """Each group of the stream, where its pods ended."""
        specs = {n.name: n for n in self.nodes}
        bound = {a.pod: a.node for a in self.admissions}
        members: dict[GroupSpec, list[str]] = {}
        for pod in self.pods:
            if pod.group is not None:
                members.setdefault(pod.group, []).append(pod.name)
        found = []
        for group, names in members.items():
            placed = {p: bound[p] for p in names if p in bound}
            domains = {specs[n].domain(group.nodes) for n in placed.values()}
            found.append(GroupOutcome(group, names, placed, domains))
        return found

    def stranded_groups(self) -> list[str]:
        """Groups left waiting (no pod bound) while some UltraServer group of their size has room for
        every one of their pods at the end (the plugin's allocator, pod after pod)."""
        specs = {n.name: n for n in self.nodes}
        by_pod = {p.name: p for p in self.pods}
        stranded = []
        for outcome in self.groups():
            if not outcome.waiting:
                continue
            group, request = outcome.group, by_pod[outcome.pods[0]].request
            domains: dict[str, list[str]] = {}
            for name, spec in specs.items():
                server = spec.domain(group.nodes)
                if server is not None:
                    domains.setdefault(server, []).append(name)
            for server, names in domains.items():
                room = 0
                for name in names:
                    free = self.free[name]
                    while room < group.size and (p := place(specs[name].topology, free, request)).fits:
                        free, room = p.free_after, room + 1
                if room >= group.size:
                    stranded.append(f"{group.name} ({group.size} pods) while UltraServer {server} had room")
                    break
        return stranded

    def stranded(self) -> list[str]:
        """Unbound pods, not of a group, that some node could take with a valid set at the end
        (a group's pods are `stranded_groups`' to judge: one pod fitting somewhere is not enough)."""
        by_pod = {p.name: p for p in self.pods}
        specs = {n.name: n for n in self.nodes}
        fits: dict[PodRequest, bool] = {}
        for pod in self.unbound:
            if by_pod[pod].group is not None:
                continue
            request = by_pod[pod].request
            if request not in fits:
                fits[request] = any(not refusal(specs[n].topology, free, request) for n, free in self.free.items())
        return [pod for pod in self.unbound if by_pod[pod].group is None and fits[by_pod[pod].request]]


async def _wait_established(api: Api, name: str, timeout: float = 30.0) -> None:

    async def established() -> bool:
        crd = await api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )

    await until_async(established, f"CRD {name} established", timeout, 0.2, TimeoutError)


async def prepare(
    api: Api,
    specs: list[NodeSpec],
    report_interval: float,
    dra: bool = False,
    requests: Mapping[str, PodRequest] | None = None,
    layout: str = dra_nodes.OURS,
) -> SimulatedNodes:
    """The pods' namespace, the NeuronNode CRD, and the Nodes with their first reports (with `dra`:
    the chart's DeviceClasses and the Nodes with their ResourceSlices): the fleet, registered and
    ready for its simulated kubelets to `run`."""
    await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    await api.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})
    crd = neuronnode_crd()
    await api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    await _wait_established(api, crd["metadata"]["name"])
    if dra:
        classes = (
            dra_nodes.aws_device_classes()
            if layout == dra_nodes.AWS
            else chart_device_classes(cores_as_capacity=layout == dra_nodes.OURS_SHARES)
        )
        for device_class in classes:
            await api.create(DEVICE_CLASSES, device_class)
    nodes = SimulatedNodes(api, specs, report_interval=report_interval, dra=dra, requests=requests, layout=layout)
    await nodes.register()
    return nodes


def _probe_pod(spec: PodSpec, index: int) -> dict[str, Any]:
    # without its group: a probe of a group's pod would reserve an UltraServer for the group
    pod = dataclasses.replace(spec, group=None).pod_object(NEURON_SCHEDULER)
    pod["metadata"].update(name=f"probe-{index:05d}", uid=f"00000000-0000-0000-0000-{index:012d}")
    return pod


async def _time_extender(
    url: str, nodes: list[str], pods: list[PodSpec], count: int
) -> tuple[list[float], list[float]]:
    """Filter and prioritize latencies of `count` calls each, over every node, one at a time as the
    scheduler makes them; the pods follow the stream's mix but are not in the API server. Timed by
    `simcluster.probe`, in a process of its own."""
    calls = [{"Pod": _probe_pod(pods[i % len(pods)], i), "NodeNames": nodes} for i in range(count)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    probe = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simcluster.probe", url,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, _ = await probe.communicate(json.dumps(calls).encode())
    if probe.returncode != 0:
        raise RuntimeError(f"simcluster.probe exited with {probe.returncode}")
    timed = json.loads(out)
    return timed["filter"], timed["prioritize"]


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process (children not included)."""
    used = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        used[name] = float(times.user + times.system)
    return used


def _rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


async def _until_settled(
    size: Size, stream: list[PodSpec], nodes: SimulatedNodes, cp: ControlPlane, watch: Callable[[], None]
) -> bool:
    """Until every pod is bound, or nothing was bound for `size.quiet` seconds and every unbound
    pod was reported unschedulable; True when `size.deadline` came first."""
    begun = time.monotonic()

    def settled() -> bool:
        cp.processes.check()
        watch()
        unbound = [p.name for p in stream if p.name not in nodes.bound_at]
        if not unbound:
            return True
        last = max([begun, *nodes.bound_at.values()])
        return time.monotonic() - last >= size.quiet and all(p in nodes.unschedulable for p in unbound)

    try:
        await until_async(settled, "every pod bound or refused", size.deadline, 0.5, TimeoutError)
    except TimeoutError:
        return True
    return False


# The DRA runs (the default scheduler only): the nodes are DRA nodes, and the same pods either ask for
# the device plugin's resource names, which the chart's DeviceClasses map (extendedResourceName: the
# scheduler makes a claim without constraints), or each has its own claim with a group constraint
# (`PodSpec.claim_object`).
DRA_EXTENDED = "extended resource names"
DRA_CLAIMS = "claims with group constraints"
# AWS's layout (issue 58 item 1): the nodes publish what AWS's driver would (simcluster.dra.aws_node_slices:
# whole devices only), AWS's DeviceClass, each pod its own claim as AWS's published templates write it.
# It has no cores: only the stream's device pods run (`kinds=DEVICE_PODS`).
DRA_AWS = "AWS's layout, claims as AWS's templates"
DEVICE_PODS = "device pods"
CORE_PODS = "core pods"


async def simulate(
    size: Size,
    scheduler: str,
    work: Path,
    log: Callable[[str], None] = print,
    dra: str | None = None,
    urgent: int = 0,
    kinds: str | None = None,
    devices_only: bool = False,
    nodes_to_score: int | None = None,
    layout: str | None = None,
    profile: Path | None = None,
) -> Outcome:
    """One run of `scheduler` (DEFAULT_SCHEDULER or NEURON_SCHEDULER) in `work`, an empty directory
    the caller removes afterwards; `dra`: DRA_EXTENDED or DRA_CLAIMS, with the default scheduler.
    `urgent`: once the stream has settled, a second stream of so many pods of higher priority
    (`fleet.urgent_stream`), which only preemption can place on the full fleet. `kinds`: DEVICE_PODS or
    CORE_PODS runs only the stream's pods of that kind (with their names and order; DRA_AWS needs DEVICE_PODS).
    `devices_only`: our driver's slices without cores (`--no-publish-cores`; needs DEVICE_PODS).
    `nodes_to_score`: kube-scheduler's percentageOfNodesToScore (None: its adaptive default).
    `layout`: which of our layouts a DRA run of our slices publishes (`simcluster.dra`: OURS, OURS_DEVICES,
    OURS_SHARES, e.g. `chart_default_layout(version)`); None: OURS, or OURS_DEVICES with `devices_only`.
    `profile`: a directory for kube-scheduler's CPU profiles over the run (`simcluster.profile`), listed
    in the outcome's `profiles`."""
    if dra is not None and (scheduler != DEFAULT_SCHEDULER or dra not in (DRA_EXTENDED, DRA_CLAIMS, DRA_AWS)):
        raise ValueError(f"no DRA run {dra!r} of {scheduler}")
    if kinds not in (None, DEVICE_PODS, CORE_PODS) or (dra == DRA_AWS and kinds != DEVICE_PODS):
        raise ValueError(f"no run of {kinds!r} with {dra!r}")
    claims = dra in (DRA_CLAIMS, DRA_AWS)
    specs, stream = fleet(size.nodes, size.seed, size.ultraservers), pod_stream(size.pods, size.seed, size.groups)
    if kinds is not None:
        stream = [p for p in stream if bool(p.devices) == (kinds == DEVICE_PODS)]
    if devices_only:
        if layout not in (None, dra_nodes.OURS_DEVICES):
            raise ValueError(f"devices_only and the layout {layout!r}")
        layout = dra_nodes.OURS_DEVICES
    if layout == dra_nodes.OURS_DEVICES and (dra not in (DRA_EXTENDED, DRA_CLAIMS) or kinds != DEVICE_PODS):
        raise ValueError("our devices-only layout runs the device pods of a DRA run of our slices")
    if layout == dra_nodes.OURS_SHARES and dra != DRA_CLAIMS:
        raise ValueError("cores as capacity runs with each pod's own claim (no mapping of the core resource)")
    if layout not in (None, dra_nodes.OURS, dra_nodes.OURS_DEVICES, dra_nodes.OURS_SHARES) or (
        layout is not None and dra == DRA_AWS
    ):
        raise ValueError(f"no layout {layout!r} of our slices for {dra!r}")
    layout = dra_nodes.AWS if dra == DRA_AWS else layout or dra_nodes.OURS
    instance_types = sorted({s.instance_type for s in specs})
    second = urgent_stream(urgent, size.seed)
    names = [s.name for s in specs]
    command = extender_command() if scheduler == NEURON_SCHEDULER else None
    if scheduler == NEURON_SCHEDULER and command is None:
        raise RuntimeError("neuron-scheduler needs the extender's command, which make setup installs")
    started = time.monotonic()
    with control_plane(work) as cp:
        # the pod creator's 16 before the scheduler starts; then the kubelets' status and report writers
        # (WRITERS each) share them all
        async with Api(cp, connections=WRITERS + 16) as api:
            requests = {p.name: p.request for p in (*stream, *second)}
            if second:
                await api.create("/apis/scheduling.k8s.io/v1/priorityclasses", priority_class())
            nodes = await prepare(
                api, specs, size.report_interval, dra=dra is not None, requests=requests, layout=layout
            )
            stop = asyncio.Event()
            kubelets = asyncio.create_task(nodes.run(stop))

            async def create(pod: PodSpec) -> None:
                if claims:
                    claim = (
                        dra_nodes.aws_claim_object(pod, instance_types)
                        if layout == dra_nodes.AWS
                        else dra_nodes.capacity_claim_object(pod)
                        if layout == dra_nodes.OURS_SHARES
                        else pod.claim_object()
                    )
                    await api.create(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", claim)
                await api.create(PODS, pod.pod_object(scheduler, claim=claims))

            await bounded(stream, create, 16)
            ready = time.monotonic() - started
            log(f"  [{scheduler}] {len(specs)} nodes, their reports and {len(stream)} pods ready in {ready:.0f}s")

            extender: ExtenderFigures | None = None
            extender_pid = 0
            url = ""
            if command is not None:
                extender = ExtenderFigures()
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                extender_pid = start_extender(cp, command, port, report_max_age=4 * size.report_interval)
                await asyncio.to_thread(wait_until_ready, cp.processes, "the extender", port, "/readyz", 60, None)
                f, p = await _time_extender(url, names, stream, size.probes)
                extender.filter_seconds["empty fleet"], extender.prioritize_seconds["empty fleet"] = f, p
            kube_scheduler = start_scheduler(
                cp, scheduler, url or None, nodes_to_score=nodes_to_score, profiling=profile is not None
            )
            pids = {**cp.processes.pids(), SIMULATED_KUBELETS: os.getpid()}
            cpu_before = _cpu_seconds(pids)
            profiled = asyncio.Event()
            profiler = (
                asyncio.create_task(profile_windows(kube_scheduler.port, profile, profiled, size.profile_window))
                if profile is not None
                else None
            )

            def watch() -> None:
                if kubelets.done():
                    kubelets.result()  # raises what ended the simulated kubelets
                if extender is not None:
                    extender.rss_peak_mb = max(extender.rss_peak_mb, _rss_mb(extender_pid))

            begun = time.monotonic()
            timed_out = await _until_settled(size, stream, nodes, cp, watch)
            if second and not timed_out:
                await bounded(second, create, 16)
                log(f"  [{scheduler}] the first stream settled; {len(second)} pods of higher priority created")
                timed_out = await _until_settled(size, second, nodes, cp, watch)
            cpu_after = _cpu_seconds(pids)
            profiled.set()
            profiles = await profiler if profiler is not None else []
            attempts = await kube_scheduler.attempts()
            cp.processes.stop(kube_scheduler.name)
            settled = f"{time.monotonic() - begun:.0f}s{' (deadline)' if timed_out else ''}"
            log(f"  [{scheduler}] scheduling settled in {settled}")
            await nodes.drain(60)  # the extender is timed again once the last reports are in

            if extender is not None:
                f, p = await _time_extender(url, names, stream, size.probes)
                extender.filter_seconds["end of run"], extender.prioritize_seconds["end of run"] = f, p
                extender.rss_end_mb = _rss_mb(extender_pid)
                extender.rss_peak_mb = max(extender.rss_peak_mb, extender.rss_end_mb)

            pods, _ = await api.list(PODS)
            # the watch may lag the list by a few events; past 10 s the accounting will show which
            with contextlib.suppress(TimeoutError):
                await until_async(
                    lambda: all(not p["spec"].get("nodeName") or p["metadata"]["name"] in nodes.bound_at for p in pods),
                    "the watch to see every binding listed",
                    10,
                    0.1,
                    TimeoutError,
                )
            await nodes.drain(60)
            objects, _ = await api.list(REPORTS)
            stop.set()
            await kubelets
    return Outcome(
        scheduler=(f"DRA, {dra}" if dra else scheduler) + (f", {kinds}" if kinds else ""),
        nodes=specs,
        pods=[*stream, *second],
        admissions=list(nodes.admissions),
        unbound={
            p.name: nodes.unschedulable.get(p.name, "") for p in (*stream, *second) if p.name not in nodes.bound_at
        },
        bound_in_api={p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")},
        reports={o["metadata"]["name"]: NodeReport.from_object(o) for o in objects},
        free={name: node.free for name, node in nodes.nodes.items()},
        bind_times=sorted(nodes.bound_at.values()),
        running_times=sorted(nodes.running_at.values()),
        timed_out=timed_out,
        cpu_seconds={n: cpu_after[n] - cpu_before[n] for n in pids},
        attempts=attempts,
        extender=extender,
        urgent=second,
        deleted=dict(nodes.deleted),
        bound_at=dict(nodes.bound_at),
        nominations=dict(nodes.nominations),
        profiles=profiles,
    )
