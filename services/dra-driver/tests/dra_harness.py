"""The DRA driver on a simulated node against a real kube-apiserver, with the kubelet's side of registration and DRA
calls (tests/standins/dra_kubelet.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_driver import config as config_mod
from neuron_dra_driver.app import DraDriver
from polling import until_async
from simcluster.controlplane import ControlPlane, private_control_plane
from standins.dra_kubelet import Kubelet

from neuron_common.kube import Api
from neuron_sim import node as sim


async def eventually(predicate: Callable[[], object], timeout: float = 15.0) -> None:
    await until_async(predicate, timeout=timeout)


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ControlPlane]:
    """A real kube-apiserver (resource.k8s.io/v1 served), shared by the tests of this directory."""
    with private_control_plane("dra-cp-") as cp:
        yield cp


@pytest.fixture(scope="session")
def apiserver_without_taints() -> Iterator[ControlPlane]:
    """A real kube-apiserver with DRADeviceTaints and DRAPartitionableDevices off, as 1.34 and
    1.35 serve by default: it drops device taints and shared counters from the slices it stores."""
    with private_control_plane(
        "dra-cp-notaints-", apiserver_args=["--feature-gates=DRADeviceTaints=false,DRAPartitionableDevices=false"]
    ) as cp:
        yield cp


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer (on tmpfs as
    every test temporary: tests/scratch.py)."""
    path = Path(tempfile.mkdtemp(prefix="dra-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Harness:
    root: Path
    dirs: Path
    node: str
    api: Api
    kubelet: Kubelet
    driver: DraDriver
    stop: asyncio.Event
    task: asyncio.Task[int]

    @property
    def cdi_dir(self) -> Path:
        return self.dirs / "cdi"

    async def shutdown(self) -> int:
        self.stop.set()
        await self.kubelet.close()
        return await asyncio.wait_for(self.task, 20)

    async def slices(self) -> list[dict[str, Any]]:
        answer = await self.api.request(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            params={"fieldSelector": f"spec.nodeName={self.node}"},
        )
        return list(answer.get("items") or [])

    async def device_names(self) -> set[str]:
        return {d["name"] for s in await self.slices() for d in s["spec"].get("devices") or []}


def admin_api(cp: ControlPlane) -> Api:
    return Api(cp.server, ssl_context=cp.credentials.ssl_context())


@pytest.fixture
async def start_driver(apiserver: ControlPlane, short_tmp: Path) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    harnesses: list[Harness] = []
    counter = iter(range(1000))

    async def _start(
        instance_type: str = "trn1.32xlarge",
        *args: str,
        node: str | None = None,
        root: Path | None = None,
        dirs: Path | None = None,
        register: bool = True,
        cp: ControlPlane | None = None,  # another API server than the shared one
    ) -> Harness:
        server = cp or apiserver
        n = next(counter)
        node = node or f"node-{os.getpid()}-{n}-{int(time.time() * 1000) % 100000}"
        if root is None:
            root = short_tmp / f"root{n}"
            sim.create(root, instance_type)
        dirs = dirs or short_tmp / f"d{n}"
        cfg = config_mod.parse(
            [
                "--node-name", node, "--host-root", str(root),
                "--plugin-dir", str(dirs / "plugins"), "--registry-dir", str(dirs / "registry"),
                "--cdi-spec-dir", str(dirs / "cdi"), "--listen", "127.0.0.1:0",
                "--health-interval", "0.05", "--health-quiet-period", "1", *args,
            ],
            env={},
        )  # fmt: skip
        api = admin_api(server)
        stop = asyncio.Event()
        driver = DraDriver(cfg, stop, api)
        task = asyncio.create_task(driver.run())
        kubelet = Kubelet(dirs / "registry")
        h = Harness(root, dirs, node, admin_api(server), kubelet, driver, stop, task)
        harnesses.append(h)
        if register:
            await eventually((dirs / "registry" / "neuron.aws.com-reg.sock").exists)
            await kubelet.register()
        return h

    yield _start
    for h in harnesses:
        if not h.task.done():
            with contextlib.suppress(Exception):
                await h.shutdown()
        await h.api.close()
