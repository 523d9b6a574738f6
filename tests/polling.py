"""Waiting for a condition inside an event loop, with a deadline: one copy for the service tests
and the benchmarks (which raise their own error type so a bench failure names its bench)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


async def until_async(
    predicate: Callable[[], object],
    what: str = "",
    timeout: float = 15.0,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
) -> None:
    """Polls `predicate` (plain or a coroutine function) until true; the timeout only bounds a failure,
    which raises `error` naming `what` (or the predicate)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = predicate()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        if time.monotonic() > deadline:
            raise error(f"gave up after {timeout:g} s waiting for {what or predicate}")
        await asyncio.sleep(interval)
