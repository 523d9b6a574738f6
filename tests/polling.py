"""Waiting for a condition, with a deadline: the one polling loop of the tests and the benchmarks
(tests/test_polling.py fails on a loop that polls anywhere else). `until` blocks the thread,
`until_async` sleeps in the event loop; the benches raise their own error type so that a bench failure
names its bench, and the cluster tests poll through the errors of a cluster still settling (`ignore`).

Both return the predicate's first true answer, so a caller can wait for a thing and use it."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def until(
    predicate: Callable[[], object],
    what: str = "",
    timeout: float = 15.0,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Calls `predicate` every `interval` seconds until it answers true, and returns that answer. The
    timeout only bounds a failure, which raises `error` naming `what` (or the predicate) and the last
    of the `ignore`d exceptions the predicate raised on the way."""
    poll = _Poll(predicate, what, timeout, error, ignore)
    while True:
        try:
            answer = predicate()
        except ignore as e:
            poll.failed(e)
        else:
            if answer:
                return answer
        poll.check_deadline()
        time.sleep(interval)


async def until_async(
    predicate: Callable[[], object],
    what: str = "",
    timeout: float = 15.0,
    interval: float = 0.05,
    error: type[Exception] = AssertionError,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """`until` inside an event loop: `predicate` may be a coroutine function."""
    poll = _Poll(predicate, what, timeout, error, ignore)
    while True:
        try:
            answer = predicate()
            if inspect.isawaitable(answer):
                answer = await answer
        except ignore as e:
            poll.failed(e)
        else:
            if answer:
                return answer
        poll.check_deadline()
        await asyncio.sleep(interval)


class _Poll:
    """The deadline and the last ignored error of one wait."""

    def __init__(
        self,
        predicate: Callable[[], object],
        what: str,
        timeout: float,
        error: type[Exception],
        ignore: tuple[type[BaseException], ...],
    ) -> None:
        self.predicate, self.what, self.timeout, self.error, self.ignore = predicate, what, timeout, error, ignore
        self.deadline = time.monotonic() + timeout
        self.last = ""

    def failed(self, e: BaseException) -> None:
        self.last = f" (last error: {type(e).__name__}: {e})"

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.error(f"gave up after {self.timeout:g} s waiting for {self.what or self.predicate}{self.last}")
