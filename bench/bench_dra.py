"""The DRA driver as a process on a simulated trn1.32xlarge, against a private kube-apiserver
(tests/simcluster/controlplane.py), called over its real gRPC socket as the kubelet calls it:
NodePrepareResources latency (one claim a call, each fetched from the API server), the time from a
device error written to sysfs to the ResourceSlices in the API server without that device, and
the driver's resident memory."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    BenchError,
    Figure,
    percentile,
    recoverable_fault,
    rss_mb,
    scaled,
    stop_process,
    until_async,
    work_dir,
)
from grpc import aio
from simcluster.controlplane import ControlPlane, control_plane, missing_prerequisites

from kubelet_api.dra.v1 import api_pb2 as dra
from kubelet_api.dra.v1 import api_pb2_grpc as dra_grpc
from kubelet_api.pluginregistration.v1 import api_pb2 as reg
from kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from neuron_common.kube import Api
from neuron_sim import node as sim

TITLE = "DRA driver (neuron-dra-driver, trn1.32xlarge, real kube-apiserver)"
NODE = "bench-node"
CLAIMS = scaled(100, 3)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


async def _claim(api: Api, name: str, device: str) -> str:
    base = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    claim = await api.create(
        base,
        {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "neuron.aws.com"}}]}},
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "n", "driver": "neuron.aws.com", "pool": NODE, "device": device}]}
        }
    }
    await api.update(f"{base}/{name}/status", claim)
    return str(claim["metadata"]["uid"])


async def _devices(api: Api) -> dict[str, dict[str, Any]]:
    answer = await api.request("GET", SLICES, params={"fieldSelector": f"spec.nodeName={NODE}"})
    return {d["name"]: d for s in answer.get("items") or [] for d in s["spec"].get("devices", [])}


async def _published(api: Api) -> set[str]:
    return set(await _devices(api))


async def _measure(cp: ControlPlane, root: Path, work: Path) -> list[Figure]:
    registry = work / "registry"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "neuron_dra_driver", "--node-name", NODE, "--host-root", str(root),
            "--kubeconfig", str(cp.kubeconfig), "--plugin-dir", str(work / "plugins"),
            "--registry-dir", str(registry), "--cdi-spec-dir", str(work / "cdi"), "--listen", "127.0.0.1:0",
            "--kmsg-path", "none", "--log-level", "warning",
        ],
        env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    api = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    figures: list[Figure] = []
    try:
        socket = registry / "neuron.aws.com-reg.sock"

        def served() -> bool:
            if proc.poll() is not None:
                raise BenchError("the driver ended before it served its registration socket")
            return socket.exists()

        await until_async(served, "the driver to serve its registration socket", 60, 0.05)
        async with aio.insecure_channel(f"unix://{socket}") as ch:
            info = await reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5)
            await reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=5
            )
        await until_async(lambda: _has(api, 48), "48 devices published (16 devices, 32 cores)", 60)
        uids = [await _claim(api, f"bench-{i}", f"neurondevice{i % 16}") for i in range(CLAIMS)]
        prepare: list[float] = []
        unprepare: list[float] = []
        async with aio.insecure_channel(f"unix://{info.endpoint}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            for i, uid in enumerate(uids):
                claim = dra.Claim(uid=uid, namespace="default", name=f"bench-{i}")
                t0 = time.perf_counter()
                answer = await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
                prepare.append(time.perf_counter() - t0)
                assert answer.claims[uid].error == "", answer.claims[uid].error
                t0 = time.perf_counter()
                await stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45)
                unprepare.append(time.perf_counter() - t0)
        figures.append(Figure("NodePrepareResources (1 claim, API GET) p50", percentile(prepare, 50) * 1e3, "ms"))
        figures.append(Figure("NodePrepareResources (1 claim, API GET) p99", percentile(prepare, 99) * 1e3, "ms", 100))
        figures.append(Figure("NodeUnprepareResources (1 claim) p50", percentile(unprepare, 50) * 1e3, "ms"))
        figures.append(Figure("NodeUnprepareResources (1 claim) p99", percentile(unprepare, 99) * 1e3, "ms"))

        # each device in turn (they stay tainted until the driver reloads, which the bench never does)
        fault = recoverable_fault()
        updates: list[float] = []
        for device in range(scaled(16, 2)):
            t0 = time.perf_counter()
            sim.inject_fault(root, fault.kind, device, via="device-counter")
            await until_async(
                lambda device=device: _tainted(api, f"neurondevice{device}"),  # type: ignore[misc]
                f"neurondevice{device} tainted in the ResourceSlices after {fault.kind}",
                30,
            )
            updates.append(time.perf_counter() - t0)
        figures.append(Figure("device error to ResourceSlice tainted p50", percentile(updates, 50) * 1e3, "ms"))
        figures.append(Figure("device error to ResourceSlice tainted p99", percentile(updates, 99) * 1e3, "ms", 2000))
        await asyncio.sleep(2)
        figures.append(Figure("resident memory after the run", rss_mb(proc.pid), "MB", 60))
    finally:
        stop_process(proc)
        await api.close()
    return figures


async def _has(api: Api, count: int) -> bool:
    return len(await _published(api)) == count


async def _tainted(api: Api, name: str) -> bool:
    return bool((await _devices(api)).get(name, {}).get("taints"))


def run() -> list[Figure]:
    missing = missing_prerequisites()
    if missing:
        raise BenchError(f"no kube-apiserver (run make setup): {', '.join(missing)}")
    with work_dir("bench-dra-") as work:
        root = work / "node"
        sim.create(root, "trn1.32xlarge")
        with control_plane(work / "cp") as cp:
            return asyncio.run(_measure(cp, root, work))
