from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from neuron_common import lifecycle
from neuron_common.health_server import HealthServer
from neuron_common.supervisor import Supervisor


class Ticker:
    """A well-behaved loop: runs until stop, and records how it ended."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.started = asyncio.Event()
        self.ended: str | None = None

    async def run(self) -> None:
        self.started.set()
        try:
            await self.stop.wait()
            self.ended = "stopped"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise


async def test_a_loop_that_raises_stops_the_others_and_fails_the_process(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    ticker = Ticker(stop)
    supervisor.start("ticker", ticker.run)
    await ticker.started.wait()
    assert supervisor.healthy() == (True, "loops running: ticker")

    async def broken() -> None:
        raise RuntimeError("sysfs went away")

    supervisor.start("counters", broken)
    assert await supervisor.run() == 1
    assert ticker.ended == "stopped"  # wound down through stop, as on SIGTERM
    assert supervisor.healthy() == (False, "loop counters failed: RuntimeError: sysfs went away")
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "loop counters failed" in record.getMessage()
    assert record.loop == "counters"  # type: ignore[attr-defined]
    assert record.exc_info is not None
    assert "sysfs went away" in caplog.text
    assert "in broken" in caplog.text  # the traceback, down to the raising frame


async def test_a_loop_that_returns_while_running_is_a_failure() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    ticker = Ticker(stop)
    supervisor.start("ticker", ticker.run)

    async def gives_up() -> None:
        return None

    supervisor.start("watcher", gives_up)
    assert await supervisor.run() == 1
    assert supervisor.healthy() == (False, "loop watcher returned while the service was running")
    assert ticker.ended == "stopped"


async def test_a_loop_cancelled_by_someone_else_is_a_failure() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    ticker = Ticker(stop)
    supervisor.start("ticker", ticker.run)
    await ticker.started.wait()
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "ticker"]
    task.cancel()
    assert await supervisor.run() == 1
    assert supervisor.healthy() == (False, "loop ticker was cancelled")


async def test_a_clean_stop_exits_0_and_every_loop_ends() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    tickers = [Ticker(stop) for _ in range(3)]
    for i, ticker in enumerate(tickers):
        supervisor.start(f"loop{i}", ticker.run)
    await asyncio.gather(*(t.started.wait() for t in tickers))
    stop.set()
    assert await supervisor.run() == 0
    assert [t.ended for t in tickers] == ["stopped"] * 3
    assert supervisor.healthy() == (True, "loops running: none")


async def test_a_loop_that_ignores_stop_is_cancelled_after_the_grace_period(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop, grace=0.05)
    stubborn = Ticker(asyncio.Event())  # waits on an event nobody sets
    supervisor.start("stubborn", stubborn.run)
    await stubborn.started.wait()
    stop.set()
    assert await supervisor.run() == 0  # stopping was asked for; being slow is no failure
    assert stubborn.ended == "cancelled"
    assert "loop stubborn did not stop within 0.05s: cancelled" in caplog.text


async def test_a_loop_that_fails_while_stopping_still_fails_the_process() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)

    async def fails_on_the_way_out() -> None:
        await stop.wait()
        raise OSError("cannot remove the socket")

    supervisor.start("registration", fails_on_the_way_out)
    stop.set()
    assert await supervisor.run() == 1
    assert supervisor.failure == "loop registration failed: OSError: cannot remove the socket"


async def test_a_loop_that_dies_before_run_is_awaited_is_still_seen() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)

    async def broken() -> None:
        raise ValueError("bad rule")

    supervisor.start("rules", broken)
    await asyncio.sleep(0)  # the loop runs and dies
    await asyncio.sleep(0)
    assert stop.is_set()
    assert await supervisor.run() == 1


async def test_names_are_unique() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    supervisor.start("a", Ticker(stop).run)
    with pytest.raises(ValueError, match="'a' was already started"):
        supervisor.start("a", Ticker(stop).run)
    stop.set()
    assert await supervisor.run() == 0


async def test_healthz_and_readyz_name_the_dead_loop() -> None:
    stop = asyncio.Event()
    supervisor = Supervisor(stop)
    release = asyncio.Event()

    async def slow_to_stop() -> None:  # keeps the service shutting down while the probes look
        await release.wait()

    async def broken() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    http = HealthServer(
        "127.0.0.1",
        0,
        CollectorRegistry(),
        live=supervisor.healthy,
        ready=lambda: (True, "registered"),
    )
    await http.start()
    try:
        supervisor.start("registration", slow_to_stop)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{http.bound_port}/readyz") as r:
                assert (r.status, await r.text()) == (200, "registered\n")
            supervisor.start("health", broken)
            run = asyncio.create_task(supervisor.run())
            await stop.wait()
            for path in ("/healthz", "/readyz"):
                async with session.get(f"http://127.0.0.1:{http.bound_port}{path}") as r:
                    assert (r.status, await r.text()) == (503, "loop health failed: RuntimeError: boom\n")
        release.set()
        assert await run == 1
    finally:
        await http.stop()


def test_the_exit_code_reaches_the_process() -> None:
    async def main(stop: asyncio.Event) -> int:
        supervisor = Supervisor(stop)

        async def broken() -> None:
            raise RuntimeError("boom")

        supervisor.start("broken", broken)
        return await supervisor.run()

    assert lifecycle.run(main) == 1
