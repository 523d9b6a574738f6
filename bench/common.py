"""Shared benchmark helpers: timing percentiles, process memory and CPU, deadlines, a result table,
and the reduced size `tests/test_bench.py` runs every bench at (NEURON_BENCH_SMALL=1)."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from neuron_health import faults

# The reduced run proves every bench still runs to the end (no hang, no crash); its figures mean
# nothing, so it shrinks counts and quiet windows to the least that exercises each code path.
SMALL = os.environ.get("NEURON_BENCH_SMALL") == "1"


# Prometheus's scrape of a node exporter, end to end (issue 4): the p99 every exporter bench holds
# its scrapes to, over plain HTTP or TLS with the caller's token reviewed.
SCRAPE_P99_TARGET_MS = 100.0


def scaled(full: int, small: int) -> int:
    return small if SMALL else full


def quiet_seconds(full: float) -> float:
    """An idle-CPU window: long enough to mean something, or a second in the reduced run."""
    return 1.0 if SMALL else full


class BenchError(RuntimeError):
    """A bench could not measure a figure (a wait passed its deadline, a process died)."""


def recoverable_fault() -> faults.Fault:
    """The first fault of the table that takes a device out, shows on a device counter and ends
    with a driver reload (`neuron-sim inject reload-driver`): one a bench can both cause and mend."""
    from neuron_health import faults

    for fault in faults.FAULTS:
        if fault.severity.clears_on_driver_reload and fault.takes_device_out and fault.device_counters:
            return fault
    raise BenchError("the fault table has no device-counter fault that a driver reload clears")


def until(predicate: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.005) -> Any:
    """Wait for `predicate`, failing with `what` (what was awaited) after `timeout` seconds: tests/polling.py's
    wait, at a bench's pace, raising BenchError."""
    from polling import until as poll

    return poll(predicate, what, timeout, interval, error=BenchError)


async def until_async(
    predicate: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.005
) -> Any:
    """`until` inside an event loop; `predicate` may be a coroutine function."""
    from polling import until_async as poll

    return await poll(predicate, what, timeout, interval, error=BenchError)


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    target: float | None = None  # None: reported, no target
    higher_is_better: bool = False

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def time_calls(fn: Callable[[], object], repeat: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def summary_ms(samples: list[float]) -> tuple[float, float, float]:
    return (
        statistics.median(samples) * 1000,
        percentile(samples, 99) * 1000,
        max(samples) * 1000,
    )


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def idle_cpu_percent(pid: int, seconds: float = 10.0) -> float:
    """CPU used by a process (and its children) over a quiet window, in percent of one core."""
    proc = psutil.Process(pid)

    def cpu() -> float:
        total = proc.cpu_times()
        used = total.user + total.system
        for child in proc.children(recursive=True):
            try:
                t = child.cpu_times()
                used += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return used

    start, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - start) / (time.monotonic() - t0) * 100


def print_figures(title: str, figures: list[Figure]) -> None:
    print(f"\n== {title}", flush=True)
    for f in figures:
        target = ""
        if f.target is not None:
            op = ">=" if f.higher_is_better else "<="
            target = f"  target {op} {f.target:g} {f.unit}  {'ok' if f.met else 'MISSED'}"
        print(f"  {f.name:<58} {f.value:>10.3f} {f.unit:<6}{target}", flush=True)


async def idle_cpu(pid: int, seconds: float = 20.0) -> float:
    """`idle_cpu_percent` without blocking the event loop that serves the stand-ins."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, idle_cpu_percent, pid, quiet_seconds(seconds))


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ten seconds (the tests' one way to stop a child)."""
    from processes import stop  # tests/, on the path through run.py

    stop(proc)


def bench_cache() -> Path:
    """Where benches keep what outlives a run (built tools, profiles): the project's cache, outside the clone."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neuron-helm-chart" / "bench"


@contextlib.contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    """A scratch directory, on tmpfs when there is one (run.py: tests/scratch.py)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
