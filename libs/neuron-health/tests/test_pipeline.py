"""The health pipeline's sources (neuron_health.pipeline) on a simulated node: what a counter read
hands on, and the one error policy: a failed read is counted every time, logged once per outage
(and its end), and retried; a handler that raises ends the loop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from neuron_driver import layout
from neuron_driver.kmsg import KmsgRecord
from neuron_health import pipeline
from neuron_health.pipeline import CounterRead, CounterWatch, KernelLogSource
from neuron_sim import node as sim


@pytest.fixture
def node(tmp_path: Path) -> Path:
    sim.create(tmp_path / "node", "inf2.24xlarge")
    return tmp_path / "node"


def test_a_read_hands_on_growth_reloads_and_a_new_inventory(node: Path) -> None:
    watch = CounterWatch(node, 1.0, {"hw_nc_ue_error"}, status_every=2)
    first = watch.read()
    assert first.previous is None
    assert first.inventory is None
    assert first.reloaded == frozenset()
    assert first.totals[1, "mem_ecc_uncorrected"] == 0
    assert first.totals[1, "hw_nc_ue_error"] == 0  # status counters on the first read
    sim.bump_counter(node, 1, "mem_ecc_uncorrected", by=2)
    sim.bump_counter(node, 1, "hw_nc_ue_error", core=0)
    second = watch.read()
    assert second.previous is not None
    assert second.previous[1, "mem_ecc_uncorrected"] == 0
    assert second.totals[1, "mem_ecc_uncorrected"] == 2
    assert (1, "hw_nc_ue_error") not in second.totals  # status counters every second read
    third = watch.read()
    assert third.totals[1, "hw_nc_ue_error"] == 1
    assert third.previous is not None
    assert third.previous[1, "hw_nc_ue_error"] == 0
    sim.reload_driver(node)
    assert watch.read().reloaded == {1}
    sim.vanish(node, 3)
    vanished = watch.read()
    assert vanished.inventory is not None
    assert 3 not in {d.index for d in vanished.inventory.devices}


async def test_a_failed_counter_read_is_counted_logged_once_and_retried(
    node: Path, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[str] = []
    watch = CounterWatch(node, 0.0, set(), on_error=errors.append)
    real_read, failures = watch.read, 3

    def read() -> CounterRead:
        nonlocal failures
        if failures:
            failures -= 1
            raise OSError(5, "Input/output error")
        return real_read()

    watch.read = read  # type: ignore[method-assign]
    stop = asyncio.Event()
    handled: list[CounterRead] = []

    def handle(read: CounterRead) -> None:
        handled.append(read)
        stop.set()

    with caplog.at_level(logging.INFO, logger=pipeline.__name__):
        await asyncio.wait_for(watch.run(stop, handle), 10)
    assert errors == [pipeline.COUNTERS] * 3
    assert len(handled) == 1
    said = [r.getMessage() for r in caplog.records if r.name == pipeline.__name__ and r.levelno >= logging.INFO]
    assert said == [
        f"cannot read the driver's counters under {node}: Input/output error; retrying every 0s",
        f"reading the driver's counters under {node} again",
    ]


async def test_a_handler_that_raises_ends_the_counter_loop(node: Path) -> None:
    errors: list[str] = []
    watch = CounterWatch(node, 0.0, set(), on_error=errors.append)

    def handle(read: CounterRead) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(watch.run(asyncio.Event(), handle), 10)
    assert errors == []  # not a failed read


async def test_an_unreadable_kernel_log_is_counted_and_followed_once_it_appears(
    node: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kmsg = layout.HostLayout(node).kmsg
    kmsg.rename(kmsg.with_name("kmsg.away"))
    errors: list[str] = []
    failed_thrice = asyncio.Event()

    def count(source: str) -> None:
        errors.append(source)
        if len(errors) >= 3:
            failed_thrice.set()

    source = KernelLogSource(kmsg, lookback=None, file_poll=0.01, retry=0.01, on_error=count)
    stop = asyncio.Event()
    seen: list[str] = []

    def handle(record: KmsgRecord) -> None:
        seen.append(record.message)
        if "NEURON_HW_ERR" in record.message:
            stop.set()

    with caplog.at_level(logging.INFO, logger=pipeline.__name__):
        task = asyncio.create_task(source.run(stop, handle))
        await asyncio.wait_for(failed_thrice.wait(), 10)
        assert not source.following
        kmsg.with_name("kmsg.away").rename(kmsg)
        sim.inject_hw_error(node, "DMA_ERROR", 2, 0)
        await asyncio.wait_for(task, 10)
    assert source.following
    assert set(errors) == {pipeline.KERNEL_LOG}
    assert any("NEURON_HW_ERR=DMA_ERROR" in m for m in seen)
    said = [r.getMessage() for r in caplog.records if r.name == pipeline.__name__ and r.levelno >= logging.INFO]
    assert said == [
        f"cannot read the kernel log {kmsg}: No such file or directory ({pipeline.KMSG_HINT}); retrying every 0.01s",
        f"reading the kernel log {kmsg} again",
    ]


def test_after_a_reload_the_counters_grow_from_zero(node: Path) -> None:
    """The driver counts afresh after a reload: an error between the reload and the read that sees
    it is news, though the counter is below what it was before the reload; and a per-core status
    counter read on a slower cadence is not taken, on its next read, for a second reload."""
    watch = CounterWatch(node, 1.0, {"hw_nc_ue_error"}, status_every=2)
    sim.bump_counter(node, 1, "mem_ecc_repairable_uncorrected", by=3)
    sim.bump_counter(node, 1, "hw_nc_ue_error", core=0, by=2)
    watch.read()  # with the status counters
    sim.reload_driver(node)
    sim.bump_counter(node, 1, "mem_ecc_repairable_uncorrected")  # an error since the reload
    reload = watch.read()  # without the status counters
    assert reload.reloaded == {1}
    assert list(pipeline.growth(reload.previous, reload.totals)) == [(1, "mem_ecc_repairable_uncorrected", 0, 1)]
    sim.bump_counter(node, 1, "hw_nc_ue_error", core=0)  # below its value before the reload
    after = watch.read()  # with the status counters
    assert after.reloaded == frozenset()
    assert list(pipeline.growth(after.previous, after.totals)) == [(1, "hw_nc_ue_error", 0, 1)]


def test_a_core_counter_that_cannot_be_read_is_no_reload(node: Path) -> None:
    """A per-core status counter is summed over the device's cores: one core's file unreadable for a
    read leaves the sum unknown, not smaller, so it is neither a driver reload nor, after, new growth."""
    watch = CounterWatch(node, 1.0, {"hw_repairable_hbm_ue_error"})
    sim.bump_counter(node, 1, "hw_repairable_hbm_ue_error", core=0)
    sim.bump_counter(node, 1, "hw_repairable_hbm_ue_error", core=1)
    watch.read()
    sim.set_counter_raw(node, 1, "hw_repairable_hbm_ue_error", "garbage\n", core=0)
    garbled = watch.read()
    assert garbled.reloaded == frozenset()
    assert list(pipeline.growth(garbled.previous, garbled.totals)) == []
    sim.set_counter_raw(node, 1, "hw_repairable_hbm_ue_error", "1\n", core=0)
    again = watch.read()
    assert again.reloaded == frozenset()
    assert list(pipeline.growth(again.previous, again.totals)) == []
