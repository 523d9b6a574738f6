"""Breaks one of a running service's loops and looks at what the kubelet would see: the probes
while the service winds down, and the exit code. One copy for the three services' tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from neuron_common.health_server import HealthServer

Probes = dict[str, tuple[int, str]]  # path: (status, body)


async def break_loop_and_probe(
    http: HealthServer, service: asyncio.Task[int], break_loop: Callable[[], None]
) -> tuple[int, Probes]:
    """`break_loop()` makes a loop of the service running as `service` die; returns the service's
    exit code and /healthz and /readyz as answered after its loops ended."""
    loops_ended = asyncio.Event()
    probed = asyncio.Event()
    stop_http = http.stop

    # The service stops its endpoint last; holding that open lets the probes look without racing it.
    async def stop_after_the_probes() -> None:
        loops_ended.set()
        await probed.wait()
        await stop_http()

    http.stop = stop_after_the_probes  # type: ignore[method-assign]
    break_loop()
    ended = asyncio.ensure_future(loops_ended.wait())
    await asyncio.wait([ended, service], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    ended.cancel()
    assert loops_ended.is_set(), "the service did not stop after its loop died"
    probes: Probes = {}
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(f"http://127.0.0.1:{http.bound_port}{path}") as response:
                probes[path] = (response.status, await response.text())
    probed.set()
    return await asyncio.wait_for(service, 30), probes
