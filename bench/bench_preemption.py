"""Preemption with `neuron-scheduler` on 1,000 simulated nodes (issue 59 item 1): a stream with two
priorities. The bench's 5,000-pod stream fills the fleet at priority 0 (tests/simcluster, as
bench_scheduler runs it); once it has settled, a second stream of pods of 4, 8 or 16 devices at
priority 1000 (`simcluster.fleet.urgent_stream`), which only preemption can place, is created.
kube-scheduler preempts; the extender's preempt verb picks, on each candidate node, the fewest pods
of lower priority whose silicon then forms a valid set, and drops the nodes where none does.

Figures (targets: every placement on a valid set, first stream and second; no pod preempted where
no valid set followed):
- second stream placed, and the pods preempted per pod of it placed;
- "placed where a valid set was free": of every binding, as bench_scheduler judges it (the plugin's
  allocator on the node's free silicon at admission);
- "preempted where no valid set followed": pods deleted (nothing but preemption deletes one here)
  from a node on which no pod of the second stream was bound afterwards;
- second-stream pods left unbound though some node had a valid set at the end.

NEURON_BENCH_SIM_SIZE=reduced runs the test's size (40 nodes, 300 pods, 20 urgent pods).
"""

from __future__ import annotations

import asyncio
import math
import os

from common import SMALL, BenchError, Figure, work_dir
from simcluster.controlplane import missing_prerequisites
from simcluster.schedulers import NEURON_SCHEDULER, extender_command
from simcluster.simulation import FULL, REDUCED, SMOKE, simulate

SIZE = SMOKE if SMALL else REDUCED if os.environ.get("NEURON_BENCH_SIM_SIZE") == "reduced" else FULL
URGENT = 4 if SMALL else 20 if SIZE is REDUCED else 200
TITLE = (
    f"Preemption with neuron-scheduler: {SIZE.nodes} simulated nodes, {SIZE.pods} pods, "
    f"then {URGENT} of higher priority"
)


def run() -> list[Figure]:
    missing = missing_prerequisites()
    if missing:
        raise BenchError(f"no control plane to schedule on (run make setup): {', '.join(missing)}")
    if extender_command() is None:
        raise BenchError("neuron-scheduler-extender is not installed (run make setup)")
    with work_dir("neuron-preemption-") as work:
        outcome = asyncio.run(simulate(SIZE, NEURON_SCHEDULER, work / "neuron", urgent=URGENT))
    if outcome.timed_out:
        print("  (the run had not settled by its deadline: the figures are of a cut-short run)")
    urgent = {p.name for p in outcome.urgent}
    placed = [a for a in outcome.admissions if a.pod in urgent]
    valid = sum(1 for a in placed if a.valid)
    preempted = len(outcome.deleted)
    stranded = [p for p in outcome.stranded() if p in urgent]
    every = len(outcome.admissions)
    return [
        Figure("second stream: pods placed", len(placed), f"of {len(urgent)}"),
        Figure("pods preempted", preempted, "pods"),
        Figure("pods preempted per second-stream pod placed", preempted / len(placed) if placed else math.nan, ""),
        Figure(
            "second stream: placed where a valid set was free",
            100.0 * valid / len(placed) if placed else math.nan,
            "%",
            100.0,
            True,
        ),
        Figure(
            "every pod: placed where a valid set was free",
            100.0 * outcome.placed_valid / every if every else math.nan,
            "%",
            100.0,
            True,
        ),
        Figure("preempted where no valid set followed", len(outcome.needless_preemptions()), "pods", 0.0),
        Figure("second stream: left unbound though a valid set was free", len(stranded), "pods"),
        Figure("scheduling attempts, error", outcome.attempts.get("error", 0.0), ""),
    ]
