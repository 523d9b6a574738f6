"""The exporter running neuron-monitor: runtime metrics over HTTP with pod labels, runtimes that
come and go, a monitor that crashes or is missing, and the exporter as its own process.

STAND-IN: `neuron-sim monitor` (libs/neuron-sim/src/neuron_sim/monitor.py) writes neuron-monitor's
documents for the simulated node, as the real binary (which needs Neuron hardware) would; the
kubelet's PodResources is tests/standins/kubelet.py, as in test_exporter.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from polling import until, until_async
from processes import stop as stop_process
from prometheus_client.parser import text_string_to_metric_families
from standins.kubelet import Allocation, FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from neuron_node_metrics import config as config_mod
from neuron_node_metrics.app import Exporter
from neuron_sim import monitor as standin
from neuron_sim import node as sim

pytestmark = pytest.mark.integration


@pytest.fixture
async def env() -> AsyncIterator[tuple[Path, FakeKubelet]]:
    async with FakeKubelet.on_simulated_node("trn1.32xlarge", "nmm-") as work_and_kubelet:
        yield work_and_kubelet


def monitor_command(work: Path, *args: str) -> str:
    return shlex.join([sys.executable, "-m", "neuron_sim.cli", "monitor", "--root", str(work / "node"), *args])


@contextlib.asynccontextmanager
async def running(work: Path, kubelet: FakeKubelet, *args: str) -> AsyncIterator[Exporter]:
    cfg = config_mod.parse(
        [
            "--host-root",
            str(work / "node"),
            "--pod-resources-socket",
            str(kubelet.pod_resources_socket),
            "--listen",
            "127.0.0.1:0",
            "--attribution-interval",
            "0.2",
            *args,
        ],
        env={},
    )
    assert cfg is not None
    stop = asyncio.Event()
    exporter = Exporter(cfg, stop)
    task = asyncio.create_task(exporter.run())
    await asyncio.sleep(0.1)
    try:
        yield exporter
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 20) == 0


async def scrape(exporter: Exporter, path: str = "/metrics") -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{exporter.http.bound_port}{path}") as r:
        return r.status, await r.text()


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def hold(kubelet: FakeKubelet, pod: str, ids: list[str]) -> None:
    kubelet.allocations.append(
        Allocation("ml", pod, "main", "aws.amazon.com/neuroncore", ids, dp.ContainerAllocateResponse())
    )


async def test_runtime_metrics_with_pod_labels_and_runtimes_that_come_and_go(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    hold(kubelet, "trainer-0", ["neuroncore8", "neuroncore9"])
    runtimes = work / "runtimes.json"
    standin.write_runtimes(runtimes, [standin.Runtime(100, "train", (8, 9)), standin.Runtime(200, "other", (3,))])
    command = monitor_command(work, "--period", "0.1", "--runtimes-file", str(runtimes))
    async with running(work, kubelet, "--neuron-monitor-command", command) as exporter:

        async def has(tag: str, present: bool = True) -> bool:
            _, text = await scrape(exporter)
            tags = {lb["runtime_tag"] for lb, _ in series(text, "neuron_core_utilization_ratio")}
            return (tag in tags) == present and bool(series(text, "neuron_core_allocation_info"))

        await until_async(lambda: has("train"), "the runtime's series with attribution")
        _, text = await scrape(exporter)
        util = {lb["core"]: (lb["pod"], lb["device"]) for lb, _ in series(text, "neuron_core_utilization_ratio")}
        assert util == {"8": ("trainer-0", "4"), "9": ("trainer-0", "4"), "3": ("", "1")}
        pods = {lb["runtime_tag"]: lb["pod"] for lb, _ in series(text, "neuron_runtime_memory_used_bytes")}
        assert pods == {"train": "trainer-0", "other": ""}
        assert series(text, "neuron_exporter_monitor_state") == [
            ({"state": s}, 1.0 if s == "running" else 0.0)
            for s in ("disabled", "not_found", "starting", "running", "exited")
        ]
        assert series(text, "neuron_device_ecc_errors_total")  # the driver's metrics as ever
        status, ready = await scrape(exporter, "/readyz")
        assert status == 200
        assert "neuron-monitor running" in ready

        standin.write_runtimes(runtimes, [standin.Runtime(200, "other", (3,))])  # the trainer exits
        await until_async(lambda: has("train", present=False), "the runtime's series to go")
        _, text = await scrape(exporter)
        assert {lb["runtime_tag"] for lb, _ in series(text, "neuron_runtime_executions_total")} == {"other"}
        pid = exporter.monitor.pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped with the exporter, and reaped


async def test_a_crashing_monitor_is_restarted_and_the_exporter_lives_on(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    command = monitor_command(work, "--period", "0.05", "--malformed-every", "2", "--exit-after", "3")
    async with running(work, kubelet, "--neuron-monitor-command", command) as exporter:
        await until_async(lambda: exporter.monitor.restarts >= 2, "two restarts", timeout=20)
        _, text = await scrape(exporter)
        health, _ = await scrape(exporter, "/healthz")
        assert health == 200
        assert series(text, "neuron_exporter_monitor_restarts_total")[0][1] >= 2
        # the monitor keeps writing while we look: the scraped count is at least 2 and at most what the
        # exporter counts a moment later (comparing the two for equality raced: 2 scraped, 3 counted)
        ((labels, malformed),) = series(text, "neuron_exporter_monitor_problems_total")
        assert labels == {"kind": "malformed"}
        assert 2 <= malformed <= exporter.monitor.problems["malformed"]
        assert series(text, "neuron_exporter_monitor_documents_total")[0][1] >= 4
        assert series(text, "neuron_core_execution_status_total")
        await until_async(lambda: exporter.monitor.state == "exited", "the exited state")
        _, text = await scrape(exporter)
        assert series(text, "neuron_core_utilization_ratio") == []  # a dead monitor's figures are not served


async def test_a_fault_while_reading_restarts_the_monitor_not_the_exporter(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()

    def broken(line: object) -> object:
        raise RuntimeError("parser bug")

    monkeypatch.setattr("neuron_node_metrics.monitor_source.parse_line", broken)
    command = monitor_command(work, "--period", "0.05")
    async with running(work, kubelet, "--neuron-monitor-command", command) as exporter:
        await until_async(lambda: exporter.monitor.restarts >= 1, "a restart", timeout=10)
        # the restarted monitor faults again on its own time: the scrape shows the count as it was then
        before = exporter.monitor.problems["exporter_error"]
        _, text = await scrape(exporter)
        after = exporter.monitor.problems["exporter_error"]
        health, _ = await scrape(exporter, "/healthz")
    assert health == 200
    [(labels, scraped)] = series(text, "neuron_exporter_monitor_problems_total")
    assert labels == {"kind": "exporter_error"}
    assert before <= scraped <= after
    assert before >= 1
    assert series(text, "neuron_device_info")


async def test_a_missing_monitor_is_said_once_and_sysfs_is_served(env, caplog) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    caplog.set_level(logging.INFO, logger="neuron_node_metrics.monitor_source")
    async with running(work, kubelet, "--neuron-monitor-command", str(work / "no-such-neuron-monitor")) as exporter:
        await until_async(lambda: exporter.monitor.restarts >= 1, "a second attempt", timeout=10)
        _, text = await scrape(exporter)
    assert [lb for lb, v in series(text, "neuron_exporter_monitor_state") if v == 1] == [{"state": "not_found"}]
    assert len(series(text, "neuron_device_info")) == 16
    assert series(text, "neuron_core_execution_status_total")
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and "cannot start neuron-monitor" in r.message]
    assert len(said) == 1


async def test_neuron_monitor_naming_end_to_end(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    hold(kubelet, "trainer-0", ["neuroncore0", "neuroncore1"])
    command = monitor_command(work, "--period", "0.1", "--runtimes", "1", "--cores-per-runtime", "2")
    async with running(work, kubelet, "--naming", "neuron-monitor", "--neuron-monitor-command", command) as exporter:

        async def attributed() -> bool:
            _, text = await scrape(exporter)
            return {lb["pod"] for lb, _ in series(text, "neuroncore_utilization_ratio")} == {"trainer-0"}

        await until_async(attributed, "neuroncore_utilization_ratio with the pod")
        _, text = await scrape(exporter)
    util = series(text, "neuroncore_utilization_ratio")
    assert {(lb["neuroncore"], lb["runtime_tag"], lb["instance_type"]) for lb, _ in util} == {
        ("0", "rt-0", "trn1.32xlarge"),
        ("1", "rt-0", "trn1.32xlarge"),
    }
    assert {lb["status_type"] for lb, _ in series(text, "execution_status_total")} >= {"completed", "timed_out"}
    assert {lb["percentile"] for lb, _ in series(text, "execution_latency_seconds")} >= {"p50", "p99"}
    assert series(text, "instance_info")[0][0]["instance_id"] == "i-0000000000000000a"
    assert series(text, "neuron_hardware_info")[0][0]["neuron_device_count"] == "16"
    assert series(text, "system_vcpu_count")
    assert series(text, "neuroncore_memory_usage_tensors")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_exporter_process_with_the_standin(tmp_path: Path) -> None:
    sim.create(tmp_path / "node", "inf2.xlarge")
    port = _free_port()
    command = shlex.join(
        [sys.executable, "-m", "neuron_sim.cli", "monitor", "--root", str(tmp_path / "node"), "--period", "0.1"]
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "neuron_node_metrics",
            "--host-root",
            str(tmp_path / "node"),
            "--pod-resources-socket",
            str(tmp_path / "none.sock"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "NEURON_METRICS_NEURON_MONITOR_COMMAND": command},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def runtime_series() -> str:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            return text if "neuron_core_utilization_ratio{" in text else ""

        text = until(runtime_series, "the exporter to serve the runtimes' series", 20, 0.2, ignore=(OSError,))
        cores = {lb["core"] for lb, _ in series(text, "neuron_core_utilization_ratio")}
        assert cores == {"0", "1"}  # inf2.xlarge: one device of two cores, which both runtimes use
    finally:
        stop_process(proc)
    assert proc.returncode == 0
