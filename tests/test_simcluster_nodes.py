"""The simulated plugins publish their NeuronNode as the real plugin does: one write in flight per
node, so the API server never ends up with an older state than the node holds (tests/simcluster)."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from simcluster.api import Api
from simcluster.fleet import NodeSpec, PodSpec
from simcluster.nodes import SimulatedNodes


class SlowReports:
    """Records report writes, each taking a while, and how many were in flight per node at once."""

    def __init__(self) -> None:
        self.in_flight: Counter[str] = Counter()
        self.most_in_flight = 0
        self.stored: dict[str, dict[str, Any]] = {}

    async def apply(self, path: str, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        self.in_flight[name] += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight[name])
        await asyncio.sleep(0.05)
        self.stored[name] = obj
        self.in_flight[name] -= 1
        return obj

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        return [], "1"

    async def watch(self, path: str, version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()
        yield "", {}  # never reached: a watch with no events


async def test_changes_during_a_write_are_written_after_it_in_order() -> None:
    api = SlowReports()
    node = NodeSpec("n1", "trn1.32xlarge", 1)
    nodes = SimulatedNodes(cast(Api, api), [node], report_interval=3600, writers=4)
    stop = asyncio.Event()
    running = asyncio.create_task(nodes.run(stop))
    for i in range(6):  # a burst of admissions, some while a write is in flight
        nodes.admit(f"p{i}", nodes.nodes["n1"], PodSpec(f"p{i}", 1, 0).request)
        await asyncio.sleep(0.03)
    await nodes.drain(10)
    stop.set()
    await running
    assert api.most_in_flight == 1
    assert api.stored["n1"]["status"]["freeCores"] == sorted(nodes.nodes["n1"].free.cores)
    assert api.stored["n1"]["status"]["pods"] == [f"sim/p{i}" for i in range(6)]


def test_a_dra_nodes_simulated_tree_goes_once_its_inventory_is_read() -> None:
    """Each shape's slices come from a simulated node scanned once; its files must not outlive the scan
    (they did: every simulation left five trees of up to 12,000 files in the temporary directory)."""
    from simcluster import dra

    def trees() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("simcluster-inf2.xlarge-1-*")}

    before = trees()
    inventory = dra._inventory.__wrapped__("inf2.xlarge", 1)
    assert len(inventory.devices) == 1
    assert trees() == before
