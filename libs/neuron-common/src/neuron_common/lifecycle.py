"""Run a service until SIGTERM or SIGINT, then let it shut down cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


def run(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """`main(stop)` runs until `stop` is set by a signal and returns the exit code."""

    async def _wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _on_signal, stop, sig)
        return await main(stop)

    return asyncio.run(_wrapper())


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    if stop.is_set():
        return
    log.info("received %s: shutting down", sig.name, extra={"signal": sig.name})
    stop.set()


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, returning early (True) when `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:  # noqa: ASYNC109
    """Until one of `events` is set (or `timeout` passes)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
