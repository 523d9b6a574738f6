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

NEURON_BENCH_SMALL=1 (make test) runs the pinned release at the smoke size only.
"""

from __future__ import annotations

import dataclasses

from bench_scheduler import AWS_RATIO, against_aws
from common import SMALL, BenchError, Figure, work_dir
from simcluster.controlplane import (
    k8s_release,
    k8s_version,
    missing_prerequisites,
    next_k8s_version,
    older_k8s_versions,
)
from simcluster.simulation import FULL, SMOKE

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
                found, line = against_aws(SIZE, work / version, version)
            figures += found
            lines.append(line)
    print("\n" + "\n".join(lines), flush=True)
    if not SMALL:
        print(f"  (target: ratio >= {AWS_RATIO} with 100 % valid on every release)")
    return figures
