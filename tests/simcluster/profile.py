"""kube-scheduler's own CPU profile over a simulated run, and where its CPU went, stage by stage.

kube-scheduler serves Go's pprof at /debug/pprof on its secure port (`enableProfiling`, on by
default); `start_scheduler(..., profiling=True)` lets the harness read it without credentials. A
run is profiled in back-to-back windows (`WINDOW` seconds unless its Size says otherwise) from the
scheduler's start until the run settles (the window open then is dropped: its scheduler is stopped
under it), and `go tool pprof` merges the windows. `stages` reads the merged profile as the CPU each
of kube-scheduler's stages took, a stage being a function of its scheduling cycle and every call
beneath it (pprof's "cum").
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

WINDOW = 10  # seconds a profile request samples; a run loses at most one window's tail

# What a DRA pod's scheduling costs kube-scheduler, as a profile of 1.37 names it (the allocator's
# package is `structured/internal/<channel>` from 1.35, `structured` before). A stage is one function,
# matched at the end of pprof's name; its cost is its cum, that function and all it calls. Filter plugins
# run in workqueue workers whose stacks start outside schedulingCycle, so the scheduling cycle's row
# holds PreFilter and Score but no Filter; the indented rows are inside the row above them.
_ALLOCATOR = r"structured(/internal/\w+)?\.\(\*allocator\)"
STAGES: tuple[tuple[str, str], ...] = (
    ("DRA Filter", r"dynamicresources\.\(\*DynamicResources\)\.Filter"),
    ("  structured allocator", r"structured(/internal/\w+)?\.\(\*Allocator\)\.Allocate"),
    ("    a device tried", _ALLOCATOR + r"\.allocateDevice"),
    ("    selectors (CEL)", _ALLOCATOR + r"\.isSelectable"),
    ("    consumable capacity checked", _ALLOCATOR + r"\.CmpRequestOverCapacity"),
    ("    devices rolled back", _ALLOCATOR + r"\.rollbackDevice"),
    ("    slices gathered into pools", r"structured(/internal/\w+)?\.GatherPools"),
    ("DRA PreFilter", r"dynamicresources\.\(\*DynamicResources\)\.PreFilter"),
    ("scheduling cycle, Filter aside", r"\(\*Scheduler\)\.schedulingCycle"),
    ("binding cycle", r"\(\*Scheduler\)\.bindingCycle"),
    ("informers' event handlers", r"cache\.\(\*processorListener\)\.run"),
    ("memory allocated (in the rows above)", r"runtime\.mallocgc"),
    ("garbage collector's own workers", r"runtime\.gcBgMarkWorker"),
)


async def profile_windows(port: int, directory: Path, stop: asyncio.Event, window: int = WINDOW) -> list[Path]:
    """Takes `window`-second CPU profiles of the kube-scheduler on 127.0.0.1:`port` until `stop` is set;
    the complete ones, in `directory`. A window cut by `stop` is dropped."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    taken: list[Path] = []
    url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={window}"
    timeout = aiohttp.ClientTimeout(total=window + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            fetch = asyncio.ensure_future(_fetch(session, url))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await fetch
                break
            stopped.cancel()
            body = fetch.result()
            if body is None:  # the scheduler is not serving yet (or is going): try the next window
                await asyncio.sleep(0.5)
                continue
            path = directory / f"cpu-{len(taken):03d}.pb.gz"
            await asyncio.to_thread(path.write_bytes, body)
            taken.append(path)
    return taken


async def _fetch(session: aiohttp.ClientSession, url: str) -> bytes | None:
    try:
        async with session.get(url, ssl=False) as response:
            return await response.read() if response.status == 200 else None
    except aiohttp.ClientError:
        return None


@dataclass(frozen=True)
class Stages:
    total_seconds: float  # CPU seconds the profile sampled
    seconds: dict[str, float]  # stage -> CPU seconds (cum), for the stages the profile holds

    def share(self, stage: str) -> float:
        return self.seconds.get(stage, 0.0) / self.total_seconds if self.total_seconds else 0.0


_TOTAL = re.compile(r"of ([\d.]+)(ms|s|us|min|h)? total")
# flat, flat%, sum%, cum, cum%, name; pprof writes a zero flat or cum as a bare "0"
_ROW = re.compile(r"^\s*[\d.]+(?:ms|s|us|min|h)?\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(ms|s|us|min|h)?\s+[\d.]+%\s+(.+)$")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def parse_top(text: str) -> Stages:
    """`go tool pprof -top -cum` output, read as STAGES; raises ValueError on text that is not one."""
    total = _TOTAL.search(text)
    if total is None:
        raise ValueError(f"not pprof -top output: no 'of ... total' line in {text[:200]!r}")
    cum: dict[str, float] = {}
    for line in text.splitlines():
        row = _ROW.match(line)
        if row:
            name = row.group(3).strip().removesuffix(" (inline)")
            cum[name] = max(cum.get(name, 0.0), float(row.group(1)) * _UNIT[row.group(2) or "s"])
    seconds: dict[str, float] = {}
    for stage, pattern in STAGES:
        matcher = re.compile(rf"(^|[./]){pattern}$")
        found = [value for name, value in cum.items() if matcher.search(name)]
        if found:
            seconds[stage] = max(found)
    return Stages(float(total.group(1)) * _UNIT[total.group(2) or "s"], seconds)


def stages(profiles: Sequence[Path]) -> Stages:
    """The merged `profiles`, read as STAGES (needs Go's pprof: the Go that builds the test infrastructure)."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("reading a CPU profile needs Go's pprof (`go tool pprof`); no go command found")
    if not profiles:
        raise ValueError("no profile to read")
    done = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", "-nodecount=1000000", "-nodefraction=0", *map(str, profiles)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"go tool pprof failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return parse_top(done.stdout)
