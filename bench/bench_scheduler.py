"""The default kube-scheduler and `neuron-scheduler` on 1,000 simulated Neuron nodes and a stream of
5,000 pods (tests/simcluster: a private etcd, kube-apiserver and the real kube-scheduler; simulated
kubelets that admit each pod with the device plugin's own allocator).

Targets (issue 15, item 6): neuron-scheduler places every pod on a node where a valid set is free
(100 %), leaves no pod unbound while some node has a valid set for it, schedules at least half as
many pods per second as the default scheduler on the same stream; the extender's filter and
prioritize p99 at 1,000 nodes <= 20 ms; its resident memory <= 100 MB.

How each figure is taken:
- "placed where a valid set was free": of the pods bound, those for which the plugin's allocator
  (`neuron_model.placement.place`) found a valid set on the node's free silicon at admission, in
  the order the bindings happened. The rest were admitted anyway: the kubelet counts IDs, and the
  plugin hands out an invalid set ("on silicon another pod holds": not even the count was free,
  because the scheduler counts `neuron` and `neuroncore` apart though they are the same silicon);
- "left unschedulable though a node had a valid set": unbound at the end while the allocator
  finds a valid set on some node's free silicon then;
- throughput: pods bound per second from the first binding to the last (the pods are all created
  before the scheduler starts); beside it, pods bound and running per second, to the last pod the
  simulated kubelets wrote Running: equal when the kubelets keep up, lower when a scheduler binds
  faster than the cluster starts pods. The simulated kubelets write concurrently, as a thousand
  real ones do (`simcluster.nodes.WRITERS`): with a few writers the default scheduler left a third
  of its pods' writes for after its last binding and its bindings per second counted work the API
  server had not done yet. On two shared cores it depends on everything else running, so the CPU
  time each process took while the scheduler ran is shown too, per pod placed: the scheduler, the
  extender, kube-apiserver, etcd and the simulated kubelets (this process);
- extender latencies: filter and prioritize called over HTTP with all 1,000 node names, one call
  at a time as kube-scheduler makes them, with pods of the stream's mix, on the empty fleet before
  scheduling and on the full one after, from a process of their own (as kube-scheduler calls);
  client time, so an upper bound of the extender's own;
- extender memory: its resident set, sampled every half second during the run, the peak;
- UltraServer groups (issue 26 item 4; targets for neuron-scheduler: 100 % of the groups with a pod
  placed whole on one UltraServer group of their size, none split, none half-placed, none waiting
  while an UltraServer had room for it at the end): 25 trn2u UltraServers of 4 nodes are among the
  1,000 nodes, and 30 LeaderWorkerSet groups (4 pods of a node each or 8 of half a node on a
  4-node UltraServer, 2 pods of a node on a 2-node half; `simcluster.fleet.GROUP_SHAPES`) among the
  pods, labelled as LeaderWorkerSet labels them, without the affinity its webhook adds: the
  extender alone keeps them together. The default scheduler's figures show what happens without.

The DRA runs (issue 30 item 8; targets: 100 % valid, throughput at least 0.8 of the default's) use
the default kube-scheduler on the same fleet as DRA nodes (each with the ResourceSlices the driver
builds for it, the chart's DeviceClasses) and the same pods: once asking for the device plugin's
names (the DeviceClasses' extendedResourceName; the scheduler's claim has no constraint, so no
target), once each with its own claim constrained to one connected group (`PodSpec.claim_object`).
"Valid" judges what the claim was allocated by the plugin's allocator rules on the node's free
silicon (simcluster.dra.valid_set); "on silicon another pod holds" would be the shared counters
failing.

Our slices against AWS's layout (issue 58 item 1): per Kubernetes release (the pinned one and
`make k8s-next`'s) at 200 nodes (1,000 nodes on every release: bench_dra_defaults), three DRA runs of
the default kube-scheduler in the same bench: the stream's device pods on AWS's layout (whole devices
only, AWS's attributes and DeviceClass, claims as AWS's published templates write them:
`simcluster.dra.aws_node_slices`, which says what is AWS's and what is inferred), the same device
pods on our slices as the chart's defaults publish them on that release (with `docs/dra.md`'s
claims), and the stream's core pods on ours, which AWS's layout cannot place. Each ends in a line
`DRA slices vs AWS's shape ... ratio=<ours/AWS's device pods per second> valid=<percent of our
device pods' placements that are valid sets>`.

NEURON_BENCH_SIM_SIZE=reduced runs the test's size (40 nodes, 300 pods) for a quick look.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from pathlib import Path

from common import SMALL, BenchError, Figure, percentile, work_dir
from simcluster.controlplane import k8s_release, k8s_version, missing_prerequisites, next_k8s_version
from simcluster.dra import OURS, OURS_DEVICES, chart_default_layout, keeps_cores
from simcluster.fleet import DEFAULT_SCHEDULER
from simcluster.schedulers import NEURON_SCHEDULER, extender_command
from simcluster.simulation import (
    CORE_PODS,
    DEVICE_PODS,
    DRA_AWS,
    DRA_CLAIMS,
    DRA_EXTENDED,
    FULL,
    REDUCED,
    SMOKE,
    Outcome,
    Size,
    simulate,
)

SIZE = SMOKE if SMALL else REDUCED if os.environ.get("NEURON_BENCH_SIM_SIZE") == "reduced" else FULL
# On Kubernetes 1.36 a DRA run at 1,000 nodes places a few dozen pods in 15 minutes (docs/benchmarks.md):
# its pace is taken over 5 minutes, and the figures say the run was cut short.
DRA_SIZE = SIZE if SIZE is not FULL else dataclasses.replace(SIZE, deadline=300.0)
TITLE = (
    f"Neuron-aware scheduling: default kube-scheduler vs neuron-scheduler, "
    f"{SIZE.nodes} simulated nodes, {SIZE.pods} pods"
)
LATENCY_TARGET_MS = 20.0
DRA_RATIO = 0.8  # issue 30 item 8: DRA with claims at least 0.8 of the default scheduler's pods per second
RSS_TARGET_MB = 100.0
# issue 58: our default at least 0.9 of AWS's layout on the device pods (at 1,000 nodes), 100 % valid
AWS_RATIO = 0.9
# 200 nodes in FULL's proportions (5 pods a node, a fortieth of the nodes in UltraServers, a group per
# 170 pods); each DRA run is cut at 4 minutes (our slices on 1.36 place under a pod a second here)
AWS_200 = Size(nodes=200, pods=1000, deadline=240.0, quiet=10.0, probes=0, ultraservers=5, groups=6)
# 1,000 nodes on every release the driver supports: bench_dra_defaults
AWS_SIZES = (SMOKE,) if SMALL else (dataclasses.replace(SIZE, deadline=240.0),) if SIZE is REDUCED else (AWS_200,)
AWS_LINE = "DRA slices vs AWS's shape"


def _placement_figures(outcome: Outcome, default_throughput: float | None, ratio: float = 0.5) -> list[Figure]:
    """The figures of one run; targets only where the default's pace is given: `ratio` of it, all
    pods placed on valid sets, none left unbound beside a valid set."""
    label = outcome.scheduler
    neuron = default_throughput is not None
    placed = len(outcome.admissions)
    valid_share = 100.0 * outcome.placed_valid / placed if placed else math.nan
    figures = [
        Figure(f"{label}: pods placed", placed, "pods"),
        Figure(f"{label}: placed where a valid set was free", valid_share, "%", 100.0 if neuron else None, True),
        Figure(f"{label}: placed without a valid set", outcome.placed_invalid, "pods"),
        Figure(f"{label}:   of which on silicon another pod holds", outcome.over_committed, "pods"),
        Figure(f"{label}: left unschedulable", len(outcome.unbound), "pods"),
        Figure(
            f"{label}: left unbound though a valid set was free",
            len(outcome.stranded()),
            "pods",
            0.0 if neuron else None,
        ),
        Figure(
            f"{label}: throughput, first to last binding",
            outcome.throughput,
            "pods/s",
            default_throughput * ratio if default_throughput is not None else None,
            True,
        ),
        Figure(f"{label}: throughput, first binding to last pod running", outcome.started_throughput, "pods/s"),
    ]
    figures += _group_figures(outcome, neuron)
    for result in ("scheduled", "unschedulable", "error"):
        figures.append(Figure(f"{label}: scheduling attempts, {result}", outcome.attempts.get(result, 0.0), ""))
    for process, seconds in outcome.cpu_seconds.items():
        per_pod_ms = 1000 * seconds / placed if placed else math.nan
        figures.append(Figure(f"{label}: CPU per pod placed, {process}", per_pod_ms, "ms"))
    if outcome.timed_out:
        print(f"  ({label} had not settled by its deadline: the figures are of a cut-short run)")
    return figures


def _group_figures(outcome: Outcome, targets: bool) -> list[Figure]:
    """UltraServer groups (issue 26 item 4): of the groups with a pod placed, the share whole on one
    UltraServer group of their size (target 100 %), split ones, half-placed ones holding devices,
    and groups waiting while an UltraServer had room for them (target 0)."""
    label = outcome.scheduler
    groups = outcome.groups()
    if not groups:
        return []
    placed = [g for g in groups if not g.waiting]
    whole = 100.0 * sum(g.whole for g in placed) / len(placed) if placed else math.nan
    return [
        Figure(f"{label}: UltraServer groups placed whole", sum(g.whole for g in groups), f"of {len(groups)}"),
        Figure(f"{label}: groups with a pod placed that are whole", whole, "%", 100.0 if targets else None, True),
        Figure(f"{label}: groups split over UltraServers", sum(g.split for g in groups), "", 0.0 if targets else None),
        Figure(f"{label}: groups half-placed", sum(g.partial for g in groups), "", 0.0 if targets else None),
        Figure(f"{label}: groups waiting", sum(g.waiting for g in groups), ""),
        Figure(
            f"{label}: groups waiting though an UltraServer had room",
            len(outcome.stranded_groups()),
            "",
            0.0 if targets else None,
        ),
    ]


def _extender_figures(outcome: Outcome) -> list[Figure]:
    extender = outcome.extender
    assert extender is not None
    figures = []
    for verb, by_state in (("filter", extender.filter_seconds), ("prioritize", extender.prioritize_seconds)):
        for state, samples in by_state.items():
            figures.append(Figure(f"extender {verb} p50, {state}", percentile(samples, 50) * 1000, "ms"))
            figures.append(
                Figure(f"extender {verb} p99, {state}", percentile(samples, 99) * 1000, "ms", LATENCY_TARGET_MS)
            )
    figures.append(Figure("extender resident memory, peak", extender.rss_peak_mb, "MB", RSS_TARGET_MB))
    figures.append(Figure("extender resident memory, end of run", extender.rss_end_mb, "MB"))
    return figures


def _valid_share(outcome: Outcome) -> float:
    placed = len(outcome.admissions)
    return 100.0 * outcome.placed_valid / placed if placed else math.nan


def against_aws(
    size: Size, work: Path, version: str, profiles: Path | None = None
) -> tuple[list[Figure], str, tuple[Outcome, Outcome]]:
    """The runs of one release and size (run inside its `k8s_release`): AWS's layout and ours as the
    chart's defaults publish it on that release (`simcluster.dra.chart_default_layout`) on the stream's
    device pods; from 1.36 (before, the API server keeps no cores) ours on its core pods, with the
    default's cores, or where the default has none with `draDriver.publishCores=true` (cores as devices);
    the figures, the summary line and the two device-pod runs (AWS's, ours). `profiles`: a directory
    for kube-scheduler's CPU profiles of the device-pod runs, in `aws/` and `ours/`."""
    layout = chart_default_layout(version)
    core_layout = None if not keeps_cores(version) else OURS if layout == OURS_DEVICES else layout
    aws = asyncio.run(
        simulate(
            size,
            DEFAULT_SCHEDULER,
            work / "aws",
            dra=DRA_AWS,
            kinds=DEVICE_PODS,
            profile=profiles / "aws" if profiles else None,
        )
    )
    ours = asyncio.run(
        simulate(
            size,
            DEFAULT_SCHEDULER,
            work / "ours",
            dra=DRA_CLAIMS,
            kinds=DEVICE_PODS,
            layout=layout,
            profile=profiles / "ours" if profiles else None,
        )
    )
    cores = (
        asyncio.run(
            simulate(size, DEFAULT_SCHEDULER, work / "cores", dra=DRA_CLAIMS, kinds=CORE_PODS, layout=core_layout)
        )
        if core_layout is not None
        else None
    )
    version = version.removeprefix("v")
    prefix = f"{version}, {size.nodes} nodes"
    ratio = ours.throughput / aws.throughput
    default = f"ours (default: {layout.removeprefix('ours, ') if layout != OURS else 'cores as devices'})"
    with_cores = default if core_layout == layout else "ours, publishCores=true"
    runs = [(aws, "AWS's layout, device pods"), (ours, f"{default}, device pods")]
    if cores is not None:
        runs.append((cores, f"{with_cores}, core pods"))
    figures = []
    for outcome, name in runs:
        label = f"{prefix}, {name}"
        figures += [
            Figure(f"{label}: pods placed", len(outcome.admissions), f"of {len(outcome.pods)}"),
            Figure(f"{label}: placed on valid sets", _valid_share(outcome), "%", 100.0, True),
            Figure(f"{label}: throughput", outcome.throughput, "pods/s"),
            Figure(f"{label}: kube-scheduler CPU per pod", scheduler_cpu_ms(outcome), "ms"),
        ]
        if outcome.timed_out:
            print(
                f"  ({label} had not settled by its deadline of {size.deadline:.0f} s: its pace is of a cut-short run)"
            )
    target = AWS_RATIO if size.nodes == FULL.nodes else None  # issue 58's target is at 1,000 nodes
    figures.append(Figure(f"{prefix}: ours / AWS's layout, device pods per second", ratio, "x", target, True))
    core_count = f"{len(cores.pods)} core pods" if cores is not None else "no core pods (no cores on this release)"
    table = [
        f"\n  {prefix}, {len(ours.pods)} device pods and {core_count} (machine shared: read the ratio)",
        f"  {'layout':<48} {'placed':>12} {'valid':>7} {'pods/s':>8} {'sched. CPU/pod':>15}",
    ]
    for outcome, name in runs:
        placed = f"{len(outcome.admissions)}/{len(outcome.pods)}"
        cut = " (cut)" if outcome.timed_out else ""
        table.append(
            f"  {name:<48} {placed:>12} {_valid_share(outcome):>6.1f}% {outcome.throughput:>8.3f} "
            f"{scheduler_cpu_ms(outcome):>12.0f} ms{cut}"
        )
    print("\n".join(table), flush=True)
    core_part = (
        f"our core pods {cores.throughput:.3g} pods/s ({_valid_share(cores):.1f} % valid)"
        if cores is not None
        else "no cores on this release"
    )
    line = (
        f"{AWS_LINE}, Kubernetes {version}, {size.nodes} nodes: device pods {ours.throughput:.3g} pods/s ours "
        f"({default.removeprefix('ours (').removesuffix(')')}), {aws.throughput:.3g} AWS's "
        f"({_valid_share(aws):.1f} % valid); {core_part}; ratio={ratio:.3g} valid={_valid_share(ours):.1f}%"
    )
    print(line, flush=True)
    return figures, line, (aws, ours)


def scheduler_cpu_ms(outcome: Outcome) -> float:
    """kube-scheduler's CPU over the run a pod placed, in ms (NaN when none was placed)."""
    placed = len(outcome.admissions)
    seconds = outcome.cpu_seconds.get("kube-scheduler", math.nan)
    return 1000 * seconds / placed if placed else math.nan


def _against_aws_everywhere(work: Path) -> list[Figure]:
    """`against_aws` on every size, on the pinned release and (full size only) `make k8s-next`'s; the
    summary lines again at the end."""
    figures: list[Figure] = []
    lines = []
    releases = [k8s_version()] + ([] if SMALL else [next_k8s_version()])
    for version in releases:
        with k8s_release(version):
            missing = missing_prerequisites()
            if missing:
                raise BenchError(f"Kubernetes {version} is not built (make k8s-next): {', '.join(missing)}")
            for size in AWS_SIZES:
                found, line, _ = against_aws(size, work / f"aws-{version}-{size.nodes}", version)
                figures += found
                lines.append(line)
    print("\n" + "\n".join(lines), flush=True)
    return figures


def _next_release(work: Path) -> list[Figure]:
    """The default scheduler and DRA with claims again on the newer release `make k8s-next` builds,
    whose scheduler has the fix for kubernetes#138917, when it is built."""
    version = next_k8s_version()
    if SMALL:
        print(f"  the comparison on Kubernetes {version} runs at full size only (the same simulation, another binary)")
        return []
    with k8s_release(version):
        missing = missing_prerequisites()
        if missing:  # make bench builds it first: missing, the set-up is broken
            raise BenchError(f"Kubernetes {version} is not built (make k8s-next): {', '.join(missing)}")
        default = asyncio.run(simulate(SIZE, DEFAULT_SCHEDULER, work / "next-default"))
        claims = asyncio.run(simulate(DRA_SIZE, DEFAULT_SCHEDULER, work / "next-dra-claims", dra=DRA_CLAIMS))
    default = dataclasses.replace(default, scheduler=f"{version}: {default.scheduler}")
    claims = dataclasses.replace(claims, scheduler=f"{version}: {claims.scheduler}")
    ratio = Figure(f"{version}: DRA with claims: throughput / default's", claims.throughput / default.throughput, "x")
    return [*_placement_figures(default, None), *_placement_figures(claims, default.throughput, DRA_RATIO), ratio]


def run() -> list[Figure]:
    missing = missing_prerequisites()
    if missing:
        raise BenchError(f"no control plane to schedule on (run make setup): {', '.join(missing)}")
    with work_dir("neuron-scheduling-") as work:
        default = asyncio.run(simulate(SIZE, DEFAULT_SCHEDULER, work / "default"))
        figures = _placement_figures(default, None)
        # DRA (issue 30 item 8): the same pods through the chart's extendedResourceName mapping (the
        # scheduler's claim has no constraint: figures only), and with their own group-constrained claims
        extended = asyncio.run(simulate(DRA_SIZE, DEFAULT_SCHEDULER, work / "dra-extended", dra=DRA_EXTENDED))
        figures += _placement_figures(extended, None)
        claims = asyncio.run(simulate(DRA_SIZE, DEFAULT_SCHEDULER, work / "dra-claims", dra=DRA_CLAIMS))
        figures += _placement_figures(claims, default.throughput, DRA_RATIO)
        figures.append(Figure("DRA with claims: throughput / default's", claims.throughput / default.throughput, "x"))
        figures += _next_release(work)
        figures += _against_aws_everywhere(work)
        if extender_command() is None:
            raise BenchError("neuron-scheduler-extender is not installed (run make setup)")
        neuron = asyncio.run(simulate(SIZE, NEURON_SCHEDULER, work / "neuron"))
    return figures + _placement_figures(neuron, default.throughput) + _extender_figures(neuron)
