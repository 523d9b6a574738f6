"""Runs a service's long-running loops; one that dies takes the process down so the kubelet restarts it.

A loop is a coroutine meant to run until the service's `stop` event is set. One that raises, is
cancelled by someone else, or returns while `stop` is not set has died: it is logged with its
traceback, `healthy()` turns false naming it (for /healthz and /readyz), `stop` is set so the
other loops wind down as they would on SIGTERM, and `run` returns exit code 1. A process left
running with a dead loop would look alive and report nothing.

Errors a loop survives on purpose (one bad tick) stay the loop's business.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Loop = Callable[[], Coroutine[Any, Any, object]]


class Supervisor:
    def __init__(self, stop: asyncio.Event, *, grace: float = 10.0) -> None:
        self.stop = stop
        self.grace = grace  # how long the loops get to end once `stop` is set, before they are cancelled
        self.failure: str | None = None  # the first loop's death, as /healthz and /readyz show it
        self._tasks: dict[str, asyncio.Task[object]] = {}
        self._cancelled_by_us: set[str] = set()

    def start(self, name: str, loop: Loop) -> None:
        """Run `loop()` as a task named `name` (the name shows in logs and health)."""
        if name in self._tasks:
            raise ValueError(f"a loop named {name!r} was already started")
        task = asyncio.create_task(loop(), name=name)
        # registered before anyone awaits the task, so it runs before they resume
        task.add_done_callback(functools.partial(self._ended, name))
        self._tasks[name] = task

    def healthy(self) -> tuple[bool, str]:
        """A health check (see neuron_common.health_server): false, naming the loop, once one has died."""
        if self.failure is not None:
            return False, self.failure
        running = [name for name, task in self._tasks.items() if not task.done()]
        return True, "loops running: " + (", ".join(running) or "none")

    async def run(self) -> int:
        """Until `stop` is set (by a signal or by a loop's death), then until every loop has
        ended or `grace` has passed. Returns the exit code: 1 when a loop died, else 0."""
        try:
            await self.stop.wait()
            running = [task for task in self._tasks.values() if not task.done()]
            if running:
                log.info(
                    "stopping: waiting up to %gs for %s", self.grace, ", ".join(task.get_name() for task in running)
                )
                _, late = await asyncio.wait(running, timeout=self.grace)
                for task in late:
                    log.warning("loop %s did not stop within %gs: cancelled", task.get_name(), self.grace)
                    self._cancelled_by_us.add(task.get_name())
                    task.cancel()
                if late:
                    await asyncio.wait(late, timeout=self.grace)  # bounded even for a loop that ignores cancel
        except asyncio.CancelledError:
            for name, task in self._tasks.items():
                self._cancelled_by_us.add(name)
                task.cancel()
            raise
        return 1 if self.failure is not None else 0

    def _ended(self, name: str, task: asyncio.Task[object]) -> None:
        if task.cancelled():
            if name not in self._cancelled_by_us:
                self._died(name, "was cancelled", None)
            return
        error = task.exception()
        if error is not None:
            self._died(name, f"failed: {type(error).__name__}: {error}", error)
        elif not self.stop.is_set():
            self._died(name, "returned while the service was running", None)
        else:
            log.debug("loop %s stopped", name)

    def _died(self, name: str, what: str, error: BaseException | None) -> None:
        log.error(
            "loop %s %s; stopping the service so that it is restarted",
            name,
            what,
            exc_info=error,
            extra={"loop": name},
        )
        if self.failure is None:
            self.failure = f"loop {name} {what}"
        self.stop.set()
