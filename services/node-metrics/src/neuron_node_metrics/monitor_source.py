"""Runs neuron-monitor and reads its documents, for as long as the exporter runs.

neuron-monitor is optional: without a command the source is `disabled`; a binary that cannot be
started is `not_found`; a process that exits is restarted after a back-off (1 s doubling to a
minute, reset once a process has lived `steady` seconds) and is `exited` meanwhile. Whatever happens to neuron-monitor,
the loop goes on and the sysfs metrics are served as ever; each change of state is logged once,
not on every restart. While neuron-monitor is not running its runtime series are absent: what it
said last no longer holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence

from neuron_common.backoff import Backoff
from neuron_node_metrics.monitor_report import MalformedDocument, parse_line
from neuron_node_metrics.runtime_metrics import RuntimeState

log = logging.getLogger(__name__)

STATES = ("disabled", "not_found", "starting", "running", "exited")
MAX_LINE = 16 << 20  # a trn2.48xlarge document with 32 runtimes is about 300 KiB


class MonitorSource:
    def __init__(
        self,
        command: Sequence[str],
        *,
        backoff: Backoff | None = None,
        grace: float = 5.0,
        steady: float = 60.0,
        max_line: int = MAX_LINE,
    ) -> None:
        self.command = tuple(command)
        self.state = "starting" if self.command else "disabled"
        self.runtime = RuntimeState()
        self.restarts = 0
        self.documents = 0
        self.problems: Counter[str] = Counter()
        self.backoff = backoff or Backoff(initial=1.0, maximum=60.0)
        self.grace = grace  # between SIGTERM and SIGKILL when the exporter stops
        self.max_line = max_line
        self.steady = steady  # a process that lived this long was not crash-looping: back-off starts over
        self._logged: str | None = None  # the last state logged above debug
        self.pid: int | None = None

    def _set(self, state: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        self.state = state
        if state == "starting":
            log.debug(message, *args)
            return
        if state == self._logged:
            level = logging.DEBUG
        self._logged = state
        log.log(level, message, *args, extra={"neuron_monitor_state": state})

    async def run(self, stop: asyncio.Event) -> None:
        if not self.command:
            log.info("neuron-monitor disabled (no --neuron-monitor-command): runtime metrics are not served")
            await stop.wait()
            return
        started = False
        while not stop.is_set():
            if started:
                self.restarts += 1
            started = True
            try:
                await self._run_once(stop)
            finally:
                self.runtime.clear()
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.backoff.next_delay())

    async def _run_once(self, stop: asyncio.Event) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                limit=self.max_line,
            )  # stderr is the exporter's: neuron-monitor's own messages land in the pod's log
        except OSError as exc:
            self._set(
                "not_found",
                "cannot start neuron-monitor %r: %s; runtime metrics are not served, retrying with back-off",
                self.command[0],
                exc,
            )
            return
        self.pid = proc.pid
        born = asyncio.get_running_loop().time()
        self._set("starting", "neuron-monitor started (pid %d)", proc.pid)
        assert proc.stdout is not None
        pump = asyncio.create_task(self._pump(proc.stdout), name="neuron-monitor-reader")
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait((pump, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, stopping):
                task.cancel()
            await asyncio.gather(pump, stopping, return_exceptions=True)
            if not pump.cancelled() and pump.exception() is not None:
                # a fault of ours while reading (none is known: the parser takes any JSON): said loudly, but
                # treated as neuron-monitor's end, so a document that trips it cannot crash-loop the exporter
                # and take the driver's metrics down with it
                self.problems["exporter_error"] += 1
                log.error("reading neuron-monitor failed; restarting it", exc_info=pump.exception())
            code = await self._end(proc)
            if asyncio.get_running_loop().time() - born >= self.steady:
                self.backoff.reset()
        if not stop.is_set():
            self._set(
                "exited",
                "neuron-monitor exited with status %s; restarting with back-off (its runtime "
                "series are absent meanwhile)",
                code,
            )

    async def _end(self, proc: asyncio.subprocess.Process) -> int | None:
        """Its exit status, once it has gone: asked politely first (it may simply have closed stdout)."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), self.grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        return proc.returncode

    async def _pump(self, stdout: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # longer than max_line: the buffer is dropped; the line's tail reads as malformed
                self._problem("too_long", "a neuron-monitor line exceeded %d bytes; skipped", self.max_line)
                continue
            if not line:
                return
            self.feed(line)

    def feed(self, line: bytes | str) -> None:
        """One line of neuron-monitor's output."""
        if not line.strip():
            return
        try:
            report = parse_line(line)
        except MalformedDocument as exc:
            self._problem("malformed", "skipped a neuron-monitor line: %s", exc)
            return
        self.documents += 1
        for problem in report.problems:
            self.problems[problem.kind] += 1
            log.debug("neuron-monitor document: %s at %s skipped", problem.kind, problem.where)
        self.runtime.update(report)
        if self.state != "running":
            self._set(
                "running", "neuron-monitor running (pid %s): serving runtime metrics", self.pid, level=logging.INFO
            )

    def _problem(self, kind: str, message: str, *args: object) -> None:
        self.problems[kind] += 1
        # the first of each kind is worth a warning; a stream of them would drown the log
        log.log(logging.WARNING if self.problems[kind] == 1 else logging.DEBUG, message, *args)
