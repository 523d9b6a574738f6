"""neuron_driver: a full scan and a counter read on the largest simulated node."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from common import Figure, scaled, summary_ms, time_calls

from neuron_driver.counters import CounterReader
from neuron_driver.inventory import scan
from neuron_sim import node as sim


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sim.create(root, "trn2.48xlarge", lnc=1)
        scan_samples = time_calls(lambda: scan(root, env={}), repeat=scaled(30, 2))
        reader = CounterReader(scan(root, env={}))
        read_samples = time_calls(reader.read, repeat=scaled(30, 2))
        paths = reader.paths()

        def floor() -> None:
            for p in paths:
                fd = os.open(p, os.O_RDONLY)
                os.read(fd, 4096)
                os.close(fd)

        floor_samples = time_calls(floor, repeat=scaled(30, 2))
    scan_p50, scan_p99, _ = summary_ms(scan_samples)
    read_p50, read_p99, _ = summary_ms(read_samples)
    floor_p50, _, _ = summary_ms(floor_samples)
    return [
        Figure("scan trn2.48xlarge lnc=1 (16 devices, 128 cores) p50", scan_p50, "ms"),
        Figure("scan p99", scan_p99, "ms"),
        Figure(f"counter read, all kinds ({reader.file_count} files) p50", read_p50, "ms"),
        Figure("counter read p99", read_p99, "ms"),
        Figure("floor: open+read+close of the same files p50", floor_p50, "ms"),
        Figure("counter read p50 / floor p50", read_p50 / floor_p50, "x"),
    ]


TITLE = "neuron_driver on a simulated trn2.48xlarge"
