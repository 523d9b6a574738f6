"""simcluster.profile: kube-scheduler's CPU profile taken over a run and read stage by stage (the
profile issue 58's "Done when" asks for where a target is missed)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest
from polling import until_async
from simcluster.controlplane import control_plane, wait_until_ready
from simcluster.fleet import DEFAULT_SCHEDULER
from simcluster.profile import STAGES, parse_top, profile_windows, stages
from simcluster.schedulers import start_scheduler

HERE = Path(__file__).parent
_UNVERIFIED = ssl.create_default_context()  # kube-scheduler's serving certificate is self-signed
_UNVERIFIED.check_hostname = False
_UNVERIFIED.verify_mode = ssl.CERT_NONE


def test_a_profile_reads_as_the_cpu_of_each_stage() -> None:
    # `go tool pprof -top -cum -nodefraction=0` of kube-scheduler 1.37.2 over AWS's layout at 1,000
    # nodes (bench_dra_defaults), cut to its header and the rows of the stages and a few around them
    found = parse_top((HERE / "data" / "pprof-top-cum.txt").read_text())
    assert found.total_seconds == pytest.approx(526.25)
    assert found.seconds == pytest.approx(
        {
            "DRA Filter": 443.55,
            "  structured allocator": 441.0,
            "    a device tried": 166.92,  # allocateDevice's, not allocateOne's 430.85 beside it
            "    selectors (CEL)": 72.52,
            "    consumable capacity checked": 65.82,
            "    devices rolled back": 40.76,
            "    slices gathered into pools": 6.30,
            "DRA PreFilter": 1.23,  # a row whose flat is pprof's bare "0"
            "scheduling cycle, Filter aside": 1.73,
            "binding cycle": 0.93,
            "informers' event handlers": 0.28,
            "memory allocated (in the rows above)": 183.40,
            "garbage collector's own workers": 68.36,
        }
    )
    assert found.share("DRA Filter") == pytest.approx(0.8429, abs=1e-4)


def test_a_stage_the_profile_lacks_has_no_share_and_units_are_read() -> None:
    text = (
        "Duration: 1s, Total samples = 250ms (25.00%)\n"
        "Showing nodes accounting for 250ms, 100% of 250ms total\n"
        "      flat  flat%   sum%        cum   cum%\n"
        "      10ms  4.00%  4.00%      120ms 48.00%  k8s.io/kubernetes/pkg/scheduler.(*Scheduler).bindingCycle\n"
        "         0     0%  4.00%          0     0%  runtime.gcBgMarkWorker\n"
    )
    found = parse_top(text)
    assert found.total_seconds == pytest.approx(0.25)
    assert found.seconds == pytest.approx({"binding cycle": 0.12, "garbage collector's own workers": 0.0})
    assert found.share("binding cycle") == pytest.approx(0.48)
    assert found.share("DRA Filter") == 0.0
    assert parse_top("Showing nodes accounting for 0, 0% of 0 total\n").share("DRA Filter") == 0.0


def test_text_that_is_not_pprof_output_is_refused() -> None:
    with pytest.raises(ValueError, match="not pprof -top output"):
        parse_top("garbage\n\x00 flat flat%\n")


@pytest.mark.integration
def test_the_scheduler_profiles_only_when_asked_and_the_windows_read(tmp_path: Path) -> None:
    with control_plane(tmp_path / "cp") as cp:
        closed = start_scheduler(cp, DEFAULT_SCHEDULER)
        wait_until_ready(cp.processes, closed.name, closed.port, "/healthz", 60, _UNVERIFIED)
        refused = asyncio.run(_status(closed.port))
        assert refused in (401, 403), f"pprof served without credentials when not asked to: {refused}"
        cp.processes.stop(closed.name)

        opened = start_scheduler(cp, DEFAULT_SCHEDULER, profiling=True)
        wait_until_ready(cp.processes, opened.name, opened.port, "/healthz", 60, _UNVERIFIED)
        profiles = asyncio.run(_windows(opened.port, tmp_path / "profiles"))
    assert 2 <= len(profiles) <= 3, profiles
    assert all(p.stat().st_size > 0 for p in profiles)
    read = stages(profiles)  # Go's pprof reads and merges them, or this raises
    assert all(0.0 <= read.share(stage) <= 1.0 for stage, _ in STAGES)


async def _status(port: int) -> int:
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds=1"
        async with session.get(url, ssl=False) as response:
            return response.status


async def _windows(port: int, directory: Path) -> list[Path]:
    """Profiles in 1-second windows until two are written, then stops: the window open then is dropped."""
    stop = asyncio.Event()
    taking = asyncio.create_task(profile_windows(port, directory, stop, window=1))
    await until_async(lambda: len(list(directory.glob("cpu-*.pb.gz"))) >= 2 or taking.done(), "two windows", 60)
    stop.set()
    return await taking
