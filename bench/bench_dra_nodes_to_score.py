"""What kube-scheduler's `percentageOfNodesToScore` does to DRA scheduling (issue 58 item 5).

kube-scheduler stops filtering once it has found a share of the cluster's nodes feasible (adaptive
by default: 50 % less 1 % per 125 nodes, at least 5 %, and at least 100 nodes: about 42 % of 1,000),
and the DRA plugin's Filter runs kube-scheduler's structured allocator on each node it filters, so a
pod's DRA cost is roughly proportional to that share. Measured with the real kube-scheduler and
kube-apiserver of the pinned release on 1,000 simulated DRA nodes publishing our driver's slices
without cores (`draDriver.publishCores=false`, the chart's default from 1.37; with cores, 1.36's
allocator runs far slower whatever the share, docs/benchmarks.md), the stream's device pods each
with its own claim: at the default, and at 10 % (100 nodes, kube-scheduler's floor) and 100 %.
"""

from __future__ import annotations

import asyncio
import math

from common import SMALL, Figure, work_dir
from simcluster.controlplane import k8s_version
from simcluster.fleet import DEFAULT_SCHEDULER
from simcluster.simulation import DEVICE_PODS, DRA_CLAIMS, SMOKE, Outcome, Size, simulate

# 1,000 nodes in FULL's proportions, 2,000 pods of which the device pods run (about 1,000): the fleet
# does not fill, so every node filtered is feasible and the share alone sets how many are
SIZE = SMOKE if SMALL else Size(nodes=1000, pods=2000, deadline=600.0, quiet=15.0, probes=0, ultraservers=25, groups=0)
# below 10 % of 1,000 nodes kube-scheduler still filters 100 (its minimum), so 5 % is the same as 10 %
SHARES: list[int | None] = [None, 10] if SMALL else [None, 10, 100]
TITLE = (
    f"DRA and kube-scheduler's percentageOfNodesToScore: {SIZE.nodes} simulated nodes, our slices without cores, "
    f"device pods with claims, Kubernetes {k8s_version()}"
)


def _label(share: int | None) -> str:
    return "adaptive default" if share is None else f"{share} %"


def _figures(share: int | None, outcome: Outcome) -> list[Figure]:
    placed = len(outcome.admissions)
    valid = 100.0 * outcome.placed_valid / placed if placed else math.nan
    seconds = outcome.cpu_seconds.get("kube-scheduler", math.nan)
    label = f"percentageOfNodesToScore {_label(share)}"
    return [
        Figure(f"{label}: throughput, first to last binding", outcome.throughput, "pods/s", None, True),
        Figure(f"{label}: placed where a valid set was free", valid, "%", 100.0, True),
        Figure(f"{label}: kube-scheduler CPU per pod placed", seconds / placed if placed else math.nan, "s"),
        Figure(f"{label}: pods placed", placed, "pods", None, True),
    ]


def run() -> list[Figure]:
    figures: list[Figure] = []
    with work_dir("nodes-to-score-") as work:
        for share in SHARES:
            outcome = asyncio.run(
                simulate(
                    SIZE,
                    DEFAULT_SCHEDULER,
                    work / _label(share).replace(" ", "-"),
                    dra=DRA_CLAIMS,
                    kinds=DEVICE_PODS,
                    devices_only=True,
                    nodes_to_score=share,
                )
            )
            figures.extend(_figures(share, outcome))
    return figures
