"""neuron-device-plugin, run as its own process against the kubelet stand-in (tests/standins).

Targets (issue 3): Allocate p99 <= 2 ms at 1, 16 and 64 concurrent callers; kubelet restart to
re-registered p99 <= 500 ms; counter written to ListAndWatch update p99 <= 1 s; resident
memory <= 60 MB; idle CPU <= 0.5 % of a core.

Concurrent callers call back to back (a closed loop), so at N callers a call waits behind the
N-1 others and p99 is bounded below by N / throughput. Two floors are measured with the same
load so the plugin's figures can be read against them: a do-nothing grpc.aio server (what
Python's gRPC costs per call here) and, when Go is installed, a do-nothing Go gRPC server driven
by the kubelet's own generated client (the stack the kubelet and NVIDIA's plugin use).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import (
    BenchError,
    Figure,
    bench_cache,
    idle_cpu,
    percentile,
    recoverable_fault,
    rss_mb,
    scaled,
    stop_process,
    until,
    until_async,
    work_dir,
)
from grpc import aio
from standins.kubelet import FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from neuron_sim import node as sim

TITLE = "neuron-device-plugin on a simulated trn1.32xlarge (kubelet stand-in)"
NEURON, NEURONCORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"
LOADS = ((1, scaled(400, 4)), (16, scaled(40, 2)), (64, scaled(12, 1)))  # (concurrent callers, calls each)
HERE = Path(__file__).parent
GRPC_CEILING = HERE / "grpc-ceiling"


async def _allocate_latencies(socket: Path, callers: int, calls_each: int) -> tuple[list[float], float]:
    """Latency of every call, and calls per second over the whole run."""
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["neuroncore3"])])
        await stub.Allocate(request, wait_for_ready=True, timeout=10)  # warm the connection
        samples: list[float] = []

        async def caller() -> None:
            for _ in range(calls_each):
                t0 = time.perf_counter()
                await stub.Allocate(request, timeout=10)
                samples.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return samples, len(samples) / (time.perf_counter() - start)


def _load_figures(
    label: str, callers: int, p50_ms: float, p99_ms: float, per_second: float, target: float | None = None
) -> list[Figure]:
    figures = [
        Figure(f"{label} p50, {callers} caller(s)", p50_ms, "ms"),
        Figure(f"{label} p99, {callers} caller(s)", p99_ms, "ms", target),
    ]
    if callers == LOADS[-1][0]:
        figures.append(Figure(f"{label} calls/s, {callers} callers", per_second, "1/s"))
    return figures


async def _allocate_figures(socket: Path, label: str, target: float | None) -> list[Figure]:
    figures = []
    for callers, calls in LOADS:
        samples, rate = await _allocate_latencies(socket, callers, calls)
        figures += _load_figures(
            label, callers, percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3, rate, target
        )
    return figures


async def _python_floor(work: Path) -> list[Figure]:
    socket = work / "do-nothing-aio.sock"
    server = subprocess.Popen([sys.executable, str(HERE / "reference_servicer.py"), str(socket)])
    try:
        return await _allocate_figures(socket, "grpc.aio floor: Allocate", None)
    finally:
        stop_process(server)


def _grpc_ceiling_binary() -> Path:
    """bench/grpc-ceiling built once per source version into the cache."""
    if shutil.which("go") is None:  # make setup builds every pinned tool with it: no Go, no set-up
        raise BenchError("go is not installed: the Go gRPC floor cannot be built (make setup needs Go too)")
    digest = hashlib.sha256(b"".join((GRPC_CEILING / f).read_bytes() for f in ("go.mod", "go.sum", "main.go")))
    cache = bench_cache()
    binary = cache / f"grpc-ceiling-{digest.hexdigest()[:16]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
        subprocess.run(["go", "build", "-trimpath", "-o", f"{binary}.tmp", "."], cwd=GRPC_CEILING, env=env, check=True)
        Path(f"{binary}.tmp").rename(binary)
    return binary


def _go_floor(work: Path) -> list[Figure]:
    binary = _grpc_ceiling_binary()
    socket = work / "do-nothing-go.sock"
    server = subprocess.Popen([str(binary), "serve", str(socket)])
    figures: list[Figure] = []
    label = "Go gRPC floor: Allocate"
    try:

        def served() -> bool:
            if server.poll() is not None:
                raise BenchError(f"the Go floor server ended before it served {socket}")
            return socket.exists()

        until(served, f"the Go floor server to serve {socket}", 10, 0.01)
        for callers, calls in LOADS:
            out = subprocess.run(
                [str(binary), "load", "-socket", str(socket), "-callers", str(callers), "-calls", str(calls * 10)],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout)
            figures += _load_figures(label, callers, result["p50_ms"], result["p99_ms"], result["calls_per_second"])
    finally:
        stop_process(server)
    return figures


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
        figures += await _allocate_figures(kubelet.endpoints[NEURONCORE].socket, "Allocate", 2.0)

        restarts: list[float] = []
        for _ in range(scaled(30, 2)):
            await kubelet.stop()
            kubelet.registered.clear()
            await kubelet.start()
            t0 = time.perf_counter()  # the new kubelet.sock is served from here
            await kubelet.wait_registered([NEURON, NEURONCORE], timeout=10)
            restarts.append(time.perf_counter() - t0)
        figures.append(Figure("kubelet restart to re-registered p50", percentile(restarts, 50) * 1e3, "ms"))
        figures.append(Figure("kubelet restart to re-registered p99", percentile(restarts, 99) * 1e3, "ms", 500))

        # A fault the bench can mend: it takes the device out until the driver reloads, so each
        # round ends with `neuron-sim inject reload-driver` and waits for every device to return.
        fault = recoverable_fault()
        devices = range(scaled(16, 2))
        updates: list[float] = []
        for _ in range(2):
            for device in devices:
                t0 = time.perf_counter()
                sim.inject_fault(root, fault.kind, device, via="device-counter")
                await until_async(
                    lambda device=device: f"neuron{device}" not in kubelet.healthy(NEURON),  # type: ignore[misc]
                    f"neuron{device} to turn unhealthy after {fault.kind}",
                    timeout=10,
                    interval=0.002,
                )
                updates.append(time.perf_counter() - t0)
            sim.reload_driver(root)
            await until_async(
                lambda: len(kubelet.healthy(NEURON)) == 16,
                f"every device healthy again after the driver reload ({fault.kind} clears on reload)",
                timeout=30,
                interval=0.05,
            )
        figures.append(Figure("counter written to ListAndWatch update p50", percentile(updates, 50) * 1e3, "ms"))
        figures.append(Figure("counter written to ListAndWatch update p99", percentile(updates, 99) * 1e3, "ms", 1000))

        await asyncio.sleep(2)
        figures.append(Figure("resident memory after the run", rss_mb(proc.pid), "MB", 60))
        cpu = await idle_cpu(proc.pid)
        figures.append(Figure("idle CPU (20 s, no calls)", cpu, "%", 0.5))
    finally:
        stop_process(proc)
        await kubelet.stop()
    figures += await _python_floor(work)
    figures += _go_floor(work)
    return figures


def run() -> list[Figure]:
    with work_dir("bench-dp-") as work:
        root = work / "node"
        sim.create(root, "trn1.32xlarge")
        return asyncio.run(_measure(root, work))
