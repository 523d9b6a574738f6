from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from standins.kubelet import FakeKubelet

from neuron_device_plugin import config as config_mod
from neuron_device_plugin.app import Plugin
from neuron_sim import node as sim


@pytest.fixture
def short_tmp() -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="ndp-"))
    yield path  # type: ignore[misc]
    shutil.rmtree(path, ignore_errors=True)


class SteppedClock:
    """The monotonic clock plus whatever a test skipped: a quiet period passes without waiting for it."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += seconds


@dataclass
class Harness:
    root: Path
    plugin_dir: Path
    kubelet: FakeKubelet
    plugin: Plugin
    stop: asyncio.Event
    task: asyncio.Task[int]
    clock: SteppedClock

    async def shutdown(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, 15)


@pytest.fixture
async def start_plugin(short_tmp: Path) -> AsyncIterator[Callable[..., object]]:
    harnesses: list[Harness] = []

    async def _start(
        instance_type: str = "trn1.32xlarge",
        *args: str,
        lnc: int | None = None,
        kubelet: bool = True,
        wait: bool = True,
        before_plugin: Callable[[FakeKubelet], Awaitable[object]] | None = None,
        driver_version: str | None = None,
    ) -> Harness:
        root = short_tmp / f"node{len(harnesses)}"
        sim.create(root, instance_type, lnc, driver_version=driver_version)
        plugin_dir = short_tmp / f"dp{len(harnesses)}"
        fake = FakeKubelet(plugin_dir, short_tmp / f"pr{len(harnesses)}")
        if kubelet:
            await fake.start()
            if before_plugin is not None:
                await before_plugin(fake)
        cfg = config_mod.parse(
            [
                "--host-root",
                str(root),
                "--device-plugin-path",
                str(plugin_dir),
                "--pod-resources-socket",
                str(fake.pod_resources_socket),
                "--listen",
                "127.0.0.1:0",
                "--health-interval",
                "0.05",
                "--health-quiet-period",
                "1",
                "--holdings-interval",
                "0.2",
                "--shutdown-drain",  # a test that needs the drain asks for it
                "0",
                *args,
            ],
            env={},
        )
        stop = asyncio.Event()
        clock = SteppedClock()
        # the simulated kernel log is read every 20 ms rather than every second: a line is seen promptly
        plugin = Plugin(cfg, stop, clock=clock, kmsg_file_poll=0.02)
        task = asyncio.create_task(plugin.run())
        h = Harness(root, plugin_dir, fake, plugin, stop, task, clock)
        harnesses.append(h)
        if kubelet and wait:
            await fake.wait_registered([r.full_name for r in cfg.resources])
        return h

    yield _start
    for h in harnesses:
        if not h.task.done():
            h.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(h.task, 15)
        await h.kubelet.stop()
