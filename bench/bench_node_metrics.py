"""neuron-node-metrics, run as its own process, on a simulated trn2.48xlarge with --lnc 1
(16 devices, 128 cores) and 128 attributed pods (kubelet stand-in's PodResources).

Targets (issue 4): scrape p50 <= 2x the floor (reading the same files in a tight loop, in
this run) and p99 <= 100 ms (common.SCRAPE_P99_TARGET_MS); resident memory <= 60 MB; idle CPU
<= 0.5 % of a core.

Then again with neuron-monitor (issue 25; figures marked `+32 runtimes`): the `neuron-sim monitor`
stand-in as its command, 32 runtimes on 4 cores each (all 128) reporting every second, held to
the same targets (scrape p50 against the same floor, p99, memory); the CPU the exporter spends
reading the documents is reported. The stand-in's own CPU is not counted.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from common import (
    SCRAPE_P99_TARGET_MS,
    BenchError,
    Figure,
    idle_cpu,
    percentile,
    quiet_seconds,
    rss_mb,
    scaled,
    stop_process,
    time_calls,
    until_async,
    work_dir,
)
from standins.kubelet import Allocation, FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from neuron_node_metrics.attribution import Attribution
from neuron_node_metrics.catalogue import FAMILIES
from neuron_node_metrics.collector import NeuronCollector
from neuron_sim import node as sim

TITLE = "neuron-node-metrics on a simulated trn2.48xlarge, LNC=1, 128 attributed pods"
SCRAPES = scaled(100, 3)


def _floor(root: Path) -> tuple[float, int]:
    paths = NeuronCollector(root, frozenset(FAMILIES), Attribution).reader.paths()

    def read_all() -> None:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            os.read(fd, 4096)
            os.close(fd)

    samples = time_calls(read_all, repeat=scaled(40, 2))
    return percentile(samples, 50), len(paths)


RUNTIMES, CORES_EACH = 32, 4


def attributed_kubelet(work: Path) -> FakeKubelet:
    """The kubelet stand-in's PodResources with 128 pods, one core each, in 8 namespaces (not started)."""
    kubelet = FakeKubelet(work / "dp", work / "pr")
    for core in range(128):
        kubelet.allocations.append(
            Allocation(f"team-{core % 8}", f"worker-{core}", "main", "aws.amazon.com/neuroncore",
                       [f"neuroncore{core}"], dp.ContainerAllocateResponse())
        )  # fmt: skip
    return kubelet


def exporter_command(root: Path, kubelet: FakeKubelet, port: int, *extra: str) -> list[str]:
    """neuron-node-metrics over the simulated node `root`, attributing through `kubelet`."""
    return [sys.executable, "-m", "neuron_node_metrics", "--host-root", str(root),
            "--pod-resources-socket", str(kubelet.pod_resources_socket), "--listen", f"127.0.0.1:{port}",
            "--log-level", "warning", *extra]  # fmt: skip


async def serving(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], ready: str, **request: Any
) -> str:
    """The exporter `proc`'s first answer at `url` that has every pod attributed and `ready` in it;
    `request`: more arguments of each GET (TLS, a token)."""
    text = ""

    async def attributed() -> bool:
        nonlocal text
        if proc.poll() is not None:
            raise BenchError(f"the exporter exited with {proc.returncode}")
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=10), **request) as r:
                text = await r.text()
        except aiohttp.ClientError:
            return False
        return 'pod="worker-127"' in text and ready in text

    await until_async(attributed, f"the exporter to serve metrics with {ready}", 30, 0.2)
    return text


async def timed_get(session: aiohttp.ClientSession, url: str, **request: Any) -> tuple[float, int]:
    """One GET read to its end: seconds taken and the status."""
    t0 = time.perf_counter()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10), **request) as r:
        await r.read()
    return time.perf_counter() - t0, r.status


async def _measure(root: Path, work: Path, *, monitor: bool = False) -> list[Figure]:
    kubelet = attributed_kubelet(work)
    await kubelet.start()
    port = 19841 if monitor else 19840
    extra: list[str] = []
    if monitor:
        command = [sys.executable, "-m", "neuron_sim.cli", "monitor", "--root", str(root), "--period", "1",
                   "--runtimes", str(RUNTIMES), "--cores-per-runtime", str(CORES_EACH)]  # fmt: skip
        extra = ["--neuron-monitor-command", shlex.join(command)]
    proc = subprocess.Popen(exporter_command(root, kubelet, port, *extra), stderr=subprocess.DEVNULL)
    ready = f'runtime_tag="rt-{RUNTIMES - 1}"' if monitor else 'pod="worker-127"'
    prefix = f"+{RUNTIMES} runtimes: " if monitor else ""
    figures: list[Figure] = []
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        async with aiohttp.ClientSession() as session:
            text = await serving(session, url, proc, ready)
            series = sum(1 for line in text.splitlines() if not line.startswith("#"))
            ps = psutil.Process(proc.pid)
            cpu_before = sum(ps.cpu_times()[:2])
            samples = []
            for _ in range(SCRAPES):
                samples.append((await timed_get(session, url))[0])
            cpu_per_scrape = (sum(ps.cpu_times()[:2]) - cpu_before) / SCRAPES
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        floor_p50, files = _floor(root)
        if monitor:
            window = quiet_seconds(10)
            cpu_before = sum(ps.cpu_times()[:2])
            await asyncio.sleep(window)
            reading = (sum(ps.cpu_times()[:2]) - cpu_before) / window * 100
            return [
                # issue 25: the same targets as without neuron-monitor, the floor being the same sysfs read
                Figure(f"{prefix}series per scrape", series, "count"),
                Figure(f"{prefix}scrape p50 (HTTP, end to end)", p50 * 1e3, "ms"),
                Figure(f"{prefix}scrape p50 / floor p50", p50 / floor_p50, "x", 2.0),
                Figure(f"{prefix}scrape p99 (HTTP, end to end)", p99 * 1e3, "ms", SCRAPE_P99_TARGET_MS),
                Figure(f"{prefix}CPU seconds per scrape", cpu_per_scrape, "s"),
                Figure(f"{prefix}resident memory after {SCRAPES} scrapes", rss_mb(proc.pid), "MB", 60),
                Figure(f"{prefix}exporter CPU reading documents, no scrapes", reading, "%"),
            ]
        figures += [
            Figure(f"series per scrape ({files} files read)", series, "count"),
            Figure("floor: read the same files, tight loop, p50", floor_p50 * 1e3, "ms"),
            Figure("scrape p50 (HTTP, end to end)", p50 * 1e3, "ms"),
            Figure("scrape p50 / floor p50", p50 / floor_p50, "x", 2.0),
            Figure("scrape p99 (HTTP, end to end)", p99 * 1e3, "ms", SCRAPE_P99_TARGET_MS),
            Figure("CPU seconds per scrape", cpu_per_scrape, "s"),
            Figure(f"resident memory after {SCRAPES} scrapes", rss_mb(proc.pid), "MB", 60),
        ]
        cpu = await idle_cpu(proc.pid)
        figures.append(Figure("idle CPU (20 s, no scrapes; attribution every 10 s)", cpu, "%", 0.5))
    finally:
        stop_process(proc)
        await kubelet.stop()
    return figures


def run() -> list[Figure]:
    with work_dir("bench-nm-") as work:
        root = work / "node"
        sim.create(root, "trn2.48xlarge", lnc=1)
        figures = asyncio.run(_measure(root, work))
        return figures + asyncio.run(_measure(root, work / "with-monitor", monitor=True))
