"""The shutdown drain's timing, on a clock the test moves."""

from __future__ import annotations

import asyncio

import pytest

from neuron_device_plugin.drain import Drain


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def drain(self, hold: float) -> Drain:
        """A drain of `hold` seconds that reads and sleeps on this clock."""
        return Drain(hold, clock=self, sleep=self.sleep)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def settle(d: Drain) -> None:
    asyncio.run(d.settled())


def test_no_call_holds_for_the_hold(clock: Clock) -> None:
    d = clock.drain(2.0)
    settle(d)
    assert clock.now == 102.0


def test_an_early_call_does_not_extend_past_the_hold(clock: Clock) -> None:
    d = clock.drain(2.0)
    d.call()  # before the stop, 2 s before the hold ends
    settle(d)
    assert clock.now == 102.0


def test_a_late_call_extends_by_the_quiet_period(clock: Clock) -> None:
    d = clock.drain(2.0)
    assert d.until() == 102.0  # the stop is seen now
    clock.now = 101.9
    d.call()
    assert d.until() == 102.4
    settle(d)
    assert clock.now == 102.4


def test_calls_without_pause_are_cut_at_the_limit(clock: Clock) -> None:
    d = clock.drain(2.0)
    d.until()
    for _ in range(100):
        clock.now += 0.25
        d.call()
        if clock.now >= 108.0:
            break
    assert d.until() == 108.0  # four times the hold after the stop
    settle(d)
    assert clock.now == 108.0


def test_zero_stops_at_once(clock: Clock) -> None:
    d = clock.drain(0.0)
    d.call()
    settle(d)
    assert clock.now == 100.0
    assert clock.slept == []
