"""neuron-problem-detector, run as its own process on a simulated trn1.32xlarge, against the
API-server stand-in (tests/standins/apiserver.py).

Targets (issue 5): kernel line written to condition visible through the API p99 <= 1 s;
parsing >= 50,000 lines/s; resident memory <= 100 MB (with where it goes); idle CPU <= 0.5 %.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from common import BenchError, Figure, idle_cpu, percentile, rss_mb, scaled, stop_process, until_async, work_dir
from standins.apiserver import FakeApiServer

from neuron_driver.kmsg import format_record, parse_record
from neuron_problem_detector import rules as rules_mod
from neuron_sim import node as sim

TITLE = "neuron-problem-detector on a simulated trn1.32xlarge (API-server stand-in)"
NODE = "bench-node"
KINDS = ["SRAM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "HBM_UNCORRECTABLE_ERROR", "DMA_ERROR"]


def _parse_rate() -> float:
    rules = rules_mod.default_rules()
    count = scaled(50_000, 500)
    lines = [format_record(6, i, i, f"eth0: unrelated kernel message number {i}").rstrip("\n") for i in range(count)]
    t0 = time.perf_counter()
    for line in lines:
        rules_mod.match_message(rules, parse_record(line).message)
    return len(lines) / (time.perf_counter() - t0)


_RSS = "print([line.split()[1] for line in open('/proc/self/status') if line.startswith('VmRSS')][0])"


def _import_cost() -> list[Figure]:
    """Where the memory goes: a bare interpreter, then each group of imports on its own."""
    figures = []
    for label, code in (
        ("python interpreter alone", "pass"),
        ("interpreter + neuron_common.kube (its API client) only", "import neuron_common.kube"),
        ("interpreter + kubernetes.client only (what the detector no longer imports)", "import kubernetes.client"),
        ("interpreter + aiohttp and prometheus_client only", "import aiohttp, prometheus_client"),
        ("interpreter + every module of the detector", "import neuron_problem_detector.app"),
    ):
        out = subprocess.run(
            # VmRSS, not ru_maxrss: the latter is inherited across fork+exec from this (large) process
            [sys.executable, "-c", f"{code}\n{_RSS}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        figures.append(Figure(f"memory: {label}", int(out.stdout) / 1024, "MB"))
    return figures


def _condition_is(api: FakeApiServer, **fields: str) -> bool:
    condition = api.condition(NODE, "NeuronHealth")
    return condition is not None and all(condition.get(k) == v for k, v in fields.items())


async def _measure(work: Path) -> list[Figure]:
    root = work / "node"
    sim.create(root, "trn1.32xlarge")
    api = FakeApiServer(NODE)
    await api.up()
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_problem_detector", "--host-root", str(root), "--node-name", NODE,
         "--kubeconfig", str(api.kubeconfig(work / "kubeconfig")), "--listen", "127.0.0.1:0",
         "--state-file", str(work / "state.json"), "--verdict-dir", str(work / "verdicts"), "--log-level", "warning"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    figures: list[Figure] = []
    try:
        await until_async(lambda: api.condition(NODE, "NeuronHealth") is not None, "the first NeuronHealth", 30, 0.05)
        latencies = []
        for i in range(scaled(40, 5)):
            if i and i % 4 == 0:  # a new boot clears the condition, so every sample is a transition
                proc.terminate()
                proc.wait(10)
                sim.reboot(root)
                proc = subprocess.Popen(proc.args, stderr=subprocess.DEVNULL)
                await until_async(
                    lambda: _condition_is(api, status="False"), "NeuronHealth False after a reboot", 30, 0.05
                )
            kind = KINDS[i % 4]
            t0 = time.perf_counter()
            sim.inject_hw_error(root, kind, i % 16, 0)
            await until_async(
                lambda kind=kind: _condition_is(api, reason=f"NeuronHasError_{kind}"),  # type: ignore[misc]
                f"NeuronHealth reason NeuronHasError_{kind}",
                10,
            )
            if proc.poll() is not None:
                raise BenchError(f"the detector exited with {proc.returncode}")
            latencies.append(time.perf_counter() - t0)
        figures.append(Figure("kernel line to condition visible p50", percentile(latencies, 50) * 1e3, "ms"))
        figures.append(Figure("kernel line to condition visible p99", percentile(latencies, 99) * 1e3, "ms", 1000))
        await asyncio.sleep(1)
        figures.append(Figure("resident memory (running detector)", rss_mb(proc.pid), "MB", 100))
        cpu = await idle_cpu(proc.pid)
        figures.append(Figure("idle CPU (20 s, quiet kernel log)", cpu, "%", 0.5))
    finally:
        stop_process(proc)
        await api.down()
    return figures


def run() -> list[Figure]:
    figures = [Figure("parsing and matching kernel lines", _parse_rate(), "lines/s", 50_000, higher_is_better=True)]
    figures += _import_cost()
    with work_dir("bench-npd-") as work:
        return figures + asyncio.run(_measure(work))
