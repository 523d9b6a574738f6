"""neuron-device-plugin, run as its own process against the kubelet stand-in (tests/standins).

Targets (issue 3): Allocate p99 <= 2 ms at 1, 16 and 64 concurrent callers; kubelet restart to
re-registered p99 <= 500 ms; counter written to ListAndWatch update p99 <= 1 s; resident
memory <= 60 MB; idle CPU <= 0.5 % of a core.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from common import Figure, idle_cpu, percentile, rss_mb, stop_process, work_dir
from grpc import aio
from standins.kubelet import FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from neuron_sysfs import sim

TITLE = "neuron-device-plugin on a simulated trn1.32xlarge (kubelet stand-in)"
NEURON, NEURONCORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"


async def _allocate_latencies(socket: Path, callers: int, calls_each: int) -> list[float]:
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["neuroncore3"])])
        await stub.Allocate(request)  # warm the connection
        samples: list[float] = []

        async def caller() -> None:
            for _ in range(calls_each):
                t0 = time.perf_counter()
                await stub.Allocate(request)
                samples.append(time.perf_counter() - t0)

        await asyncio.gather(*(caller() for _ in range(callers)))
        return samples


async def _measure(root: Path, work: Path) -> list[Figure]:
    kubelet = FakeKubelet(work / "dp", work / "pr")
    await kubelet.start()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "neuron_device_plugin",
            "--host-root",
            str(root),
            "--device-plugin-path",
            str(work / "dp"),
            "--pod-resources-socket",
            str(kubelet.pod_resources_socket),
            "--listen",
            "127.0.0.1:0",
            "--health-quiet-period",
            "0.6",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    figures: list[Figure] = []
    try:
        await kubelet.wait_registered([NEURON, NEURONCORE], timeout=30)
        socket = work / "dp" / "neuron-neuroncore.sock"
        for callers, calls in ((1, 400), (16, 40), (64, 12)):
            samples = await _allocate_latencies(socket, callers, calls)
            figures.append(Figure(f"Allocate p50, {callers} concurrent caller(s)", percentile(samples, 50) * 1e3, "ms"))
            figures.append(
                Figure(f"Allocate p99, {callers} concurrent caller(s)", percentile(samples, 99) * 1e3, "ms", 2.0)
            )

        restarts: list[float] = []
        for _ in range(30):
            await kubelet.stop()
            kubelet.registered.clear()
            await kubelet.start()
            t0 = time.perf_counter()  # the new kubelet.sock is served from here
            await kubelet.wait_registered([NEURON, NEURONCORE], timeout=10)
            restarts.append(time.perf_counter() - t0)
        figures.append(Figure("kubelet restart to re-registered p50", percentile(restarts, 50) * 1e3, "ms"))
        figures.append(Figure("kubelet restart to re-registered p99", percentile(restarts, 99) * 1e3, "ms", 500))

        updates: list[float] = []
        for round_ in range(2):
            for device in range(16):
                t0 = time.perf_counter()
                sim.bump_counter(root, device, "mem_ecc_repairable_uncorrected")
                while f"neuron{device}" in kubelet.healthy(NEURON):
                    await asyncio.sleep(0.002)
                updates.append(time.perf_counter() - t0)
            while len(kubelet.healthy(NEURON)) < 16 and round_ == 0:  # recovered after the quiet period
                await asyncio.sleep(0.05)
        figures.append(Figure("counter written to ListAndWatch update p50", percentile(updates, 50) * 1e3, "ms"))
        figures.append(Figure("counter written to ListAndWatch update p99", percentile(updates, 99) * 1e3, "ms", 1000))

        await asyncio.sleep(2)
        figures.append(Figure("resident memory after the run", rss_mb(proc.pid), "MB", 60))
        cpu = await idle_cpu(proc.pid)
        figures.append(Figure("idle CPU (20 s, no calls)", cpu, "%", 0.5))
    finally:
        stop_process(proc)
        await kubelet.stop()
    return figures


def run() -> list[Figure]:
    with work_dir("bench-dp-") as work:
        root = work / "node"
        sim.create(root, "trn1.32xlarge")
        return asyncio.run(_measure(root, work))
