"""The chart's DRA defaults against AWS's driver's layout at 1,000 nodes, on every Kubernetes release the
driver supports (issue 58, "Done when": our default at least 0.9 of AWS's layout's throughput on the
device pods, with 100 % valid placements, on 1.34.4, 1.35.4, 1.36.3 and 1.37.2).

Per release (each built into the cache: `make k8s-versions`, `make k8s-next`), the runs of
`bench_scheduler.against_aws` with the real kube-apiserver and kube-scheduler of that release on 1,000
simulated DRA nodes: the stream's device pods on AWS's layout; the same pods on ours as the chart's
defaults publish it there (`helm template --kube-version`: devices only from 1.37, cores as capacity on
1.36, and before 1.36 whole devices, all the API server keeps); the stream's core pods on ours (the
default's cores, or `publishCores=true` where it has none). Each run is cut at 5 minutes. Each release
ends in a line `DRA slices vs AWS's shape, Kubernetes <v>, 1000 nodes: ... ratio=... valid=...`.

Where a release misses the target, the issue asks where the remaining cost is, so on every release
kube-scheduler's CPU is profiled over both device-pod runs (`simcluster.profile`, Go's pprof, kept
in the project's cache under `bench/profiles/<release>/`), and a table gives each stage of its
scheduling cycle in CPU milliseconds per pod placed, AWS's layout beside ours.

NEURON_BENCH_SMALL=1 (make test) runs the pinned release at the smoke size only.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from bench_scheduler import AWS_RATIO, against_aws, scheduler_cpu_ms
from common import SMALL, BenchError, Figure, bench_cache, work_dir
from simcluster.controlplane import (
    k8s_release,
    k8s_version,
    missing_prerequisites,
    next_k8s_version,
    older_k8s_versions,
)
from simcluster.profile import STAGES, stages
from simcluster.simulation import FULL, SMOKE, Outcome

SIZE = SMOKE if SMALL else dataclasses.replace(FULL, deadline=300.0)
TITLE = f"DRA defaults per Kubernetes release vs AWS's layout, {SIZE.nodes} simulated nodes"


def run() -> list[Figure]:
    releases = [k8s_version()] if SMALL else [*older_k8s_versions(), k8s_version(), next_k8s_version()]
    figures: list[Figure] = []
    lines = []
    with work_dir("neuron-dra-defaults-") as work:
        for version in releases:
            with k8s_release(version):
                missing = missing_prerequisites()
                if missing:
                    raise BenchError(
                        f"Kubernetes {version} is not built (make k8s-versions k8s-next): {', '.join(missing)}"
                    )
                kept = bench_cache() / "profiles" / version
                shutil.rmtree(kept, ignore_errors=True)
                found, line, (aws, ours) = against_aws(SIZE, work / version, version, profiles=kept)
            figures += found + _profile_table(version, aws, ours, kept)
            lines.append(line)
    print("\n" + "\n".join(lines), flush=True)
    if not SMALL:
        print(f"  (target: ratio >= {AWS_RATIO} with 100 % valid on every release)")
    return figures


def _profile_table(version: str, aws: Outcome, ours: Outcome, kept: Path) -> list[Figure]:
    """Prints kube-scheduler's stages in CPU ms per pod placed, AWS's layout beside ours, from their
    profiles (each stage's share of the profile times the run's scheduler CPU per pod); the figures of
    the DRA stages."""
    rows: dict[str, list[float]] = {}
    per_pod = []
    for outcome in (aws, ours):
        if not outcome.profiles:
            print(f"  ({version}: no CPU profile of {outcome.scheduler}: the run ended within a window)")
            return []
        found = stages(outcome.profiles)
        cpu_ms = scheduler_cpu_ms(outcome)
        per_pod.append(cpu_ms)
        for stage, _ in STAGES:
            rows.setdefault(stage, []).append(found.share(stage) * cpu_ms)
    print(f"\n  {version}: kube-scheduler CPU a pod placed, by stage (profiles in {kept})")
    print(f"  {'stage':<34} {'AWS, ms':>9} {'ours, ms':>9} {'ours - AWS':>11}")
    print(f"  {'all of kube-scheduler':<34} {per_pod[0]:>9.0f} {per_pod[1]:>9.0f} {per_pod[1] - per_pod[0]:>+11.0f}")
    for stage, (theirs, mine) in rows.items():
        print(f"  {stage:<34} {theirs:>9.0f} {mine:>9.0f} {mine - theirs:>+11.0f}")
    prefix = f"{version.removeprefix('v')}, {SIZE.nodes} nodes, kube-scheduler CPU a pod placed in"
    return [
        Figure(f"{prefix} {stage}, {who}", value, "ms")
        for stage in ("DRA Filter", "DRA PreFilter")
        for who, value in zip(("AWS's layout", "ours"), rows[stage], strict=True)
    ]
