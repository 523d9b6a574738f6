"""The start-up and shut-down sequence every service follows, once: serve /healthz, /readyz and
/metrics (with the server's own loops, such as a certificate reload), start the service's loops under
the supervisor, wait until a loop dies or a signal stops them, then stop serving and release what the
service holds. A service differs only in what it prepares first, which loops it runs, and what it
releases last."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

from neuron_common.health_server import HealthServer
from neuron_common.supervisor import Loop, Supervisor


async def run_service(
    http: HealthServer,
    supervisor: Supervisor,
    stop: asyncio.Event,
    loops: Callable[[], Mapping[str, Loop]],
    *,
    release: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """`loops` is asked once the HTTP server is up (a loop may need its bound port); `release`
    runs after serving has stopped. Returns the supervisor's exit code: non-zero when a loop died."""
    await http.start()
    http.supervise(supervisor, stop)
    for name, loop in loops().items():
        supervisor.start(name, loop)
    code = await supervisor.run()
    with contextlib.suppress(Exception):  # a server that fails to close must not hide the loop's exit code
        await http.stop()
    if release is not None:
        await release()
    return code
