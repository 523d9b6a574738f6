"""The exporter over HTTP with the kubelet stand-in's PodResources server.

STAND-IN: tests/standins/kubelet.py serves the real podresources/v1 gRPC on a unix socket
(rate limit and restart behaviour included); the real kubelet is used in the cluster tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from broken_loop import break_loop_and_probe
from polling import until_async
from processes import run_module
from prometheus_client.parser import text_string_to_metric_families
from standins.kubelet import Allocation, FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from neuron_common.lifecycle import wait_any
from neuron_node_metrics import config as config_mod
from neuron_node_metrics.app import Exporter
from neuron_node_metrics.catalogue import markdown_table
from neuron_sim import node as sim

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
async def env() -> AsyncIterator[tuple[Path, FakeKubelet]]:
    async with FakeKubelet.on_simulated_node("trn2.48xlarge", "nm-") as work_and_kubelet:
        yield work_and_kubelet


def start(work: Path, kubelet: FakeKubelet, *args: str) -> tuple[Exporter, asyncio.Event, asyncio.Task[int]]:
    cfg = config_mod.parse(
        ["--host-root", str(work / "node"), "--pod-resources-socket", str(kubelet.pod_resources_socket),
         "--listen", "127.0.0.1:0", "--attribution-interval", "0.2", *args],
        env={},
    )  # fmt: skip
    assert cfg is not None
    stop = asyncio.Event()
    exporter = Exporter(cfg, stop)
    return exporter, stop, asyncio.create_task(exporter.run())


@contextlib.asynccontextmanager
async def running(work: Path, kubelet: FakeKubelet, *args: str) -> AsyncIterator[Exporter]:
    exporter, stop, task = start(work, kubelet, *args)
    await until_async(lambda: exporter.http.bound_port, "the exporter's HTTP port", interval=0.01)
    try:
        yield exporter
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def next_list(exporter: Exporter, timeout: float) -> None:
    """Until the exporter has taken in a PodResources List the kubelet answered after this call."""
    asked = time.monotonic()

    def taken() -> bool:
        latest = exporter.poller.latest
        return latest is not None and latest.started_at > asked

    await until_async(taken, "a PodResources List begun after the change", timeout=timeout, interval=0.01)


async def scrape(exporter: Exporter, path: str = "/metrics") -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{exporter.http.bound_port}{path}") as r:
        return r.status, await r.text()


def values(text: str, name: str, **labels: str) -> list[float]:
    return [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def hold(kubelet: FakeKubelet, pod: str, resource: str, ids: list[str]) -> None:
    kubelet.allocations.append(
        Allocation("ml", pod, "main", f"aws.amazon.com/{resource}", ids, dp.ContainerAllocateResponse())
    )


async def test_pod_labels_within_one_attribution_period(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    async with running(work, kubelet) as exporter:
        hold(kubelet, "trainer-0", "neuroncore", ["neuroncore8", "neuroncore9"])
        hold(kubelet, "infer-0", "neuron", ["neuron5"])
        changed = time.monotonic()
        await next_list(exporter, timeout=0.5)
        status, text = await scrape(exporter)
        since_change = time.monotonic() - changed
    assert status == 200
    assert values(text, "neuron_core_execution_status_total", core="8", status="success", pod="trainer-0") == [0]
    assert values(text, "neuron_core_allocation_info", core="21", pod="infer-0") == [1]  # device 5's cores 20-23
    assert values(text, "neuron_device_ecc_errors_total", device="5", type="mem_uncorrected", pod="infer-0") == [0]
    assert values(text, "neuron_exporter_podresources_up") == [1]
    assert values(text, "neuron_resource_allocated", resource="aws.amazon.com/neuroncore") == [2]
    # the attribution served is of a List taken after the change (not a wall-clock bound: under load the
    # scrape itself may take seconds)
    assert 0 <= values(text, "neuron_exporter_attribution_age_seconds")[0] <= since_change


async def test_podresources_down_still_serves_device_metrics(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env  # never started: no socket
    async with running(work, kubelet) as exporter:
        await until_async(lambda: exporter.poller.errors["UNAVAILABLE"], "a failed List", interval=0.01)
        status, text = await scrape(exporter)
        ready_status, ready = await scrape(exporter, "/readyz")
    assert status == 200
    assert len(values(text, "neuron_core_execution_status_total", status="success")) == 64
    assert set(values(text, "neuron_exporter_podresources_up")) == {0}
    assert values(text, "neuron_exporter_attribution_age_seconds") == [-1]
    assert values(text, "neuron_exporter_podresources_errors_total", code="UNAVAILABLE")[0] >= 1
    assert values(text, "neuron_resource_allocatable") == []  # unknown, not zero
    assert all(
        s.labels["pod"] == "" for f in text_string_to_metric_families(text) for s in f.samples if "pod" in s.labels
    )
    assert ready_status == 200
    assert "PodResources down" in ready


async def test_reconnects_after_a_kubelet_restart(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    async with running(work, kubelet) as exporter:
        await until_async(lambda: exporter.poller.up, "the first List", interval=0.01)
        hold(kubelet, "p", "neuroncore", ["neuroncore3"])
        allocations = list(kubelet.allocations)
        await kubelet.stop()  # the socket goes away; a new one (new inode) comes back
        await until_async(lambda: not exporter.poller.up, "a List failing", timeout=0.5, interval=0.01)
        assert not exporter.poller.up
        await kubelet.start()
        kubelet.allocations = allocations  # the kubelet restores allocations from its checkpoint
        await next_list(exporter, timeout=1.5)
        _, text = await scrape(exporter)
    assert values(text, "neuron_exporter_podresources_up") == [1]
    assert values(text, "neuron_core_allocation_info", core="3", pod="p") == [1]


async def test_backs_off_when_rate_limited(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    kubelet.bucket.qps, kubelet.bucket.burst, kubelet.bucket.tokens = 0.0, 0, 0.0
    await kubelet.start()
    exporter, stop, task = start(work, kubelet)
    # The poller's delays pass at once on a virtual clock; its attempts in the first 1.5 s of that
    # clock are counted, then it waits for real.
    virtual, attempts, window_over = 0.0, 0, asyncio.Event()

    async def skip(*events: asyncio.Event, timeout: float) -> None:
        nonlocal virtual, attempts
        if window_over.is_set():
            await wait_any(*events, timeout=timeout)
            return
        virtual += timeout
        if virtual >= 1.5:
            attempts = exporter.poller.errors["RESOURCE_EXHAUSTED"]
            window_over.set()

    exporter.poller.wait = skip  # before the poller's first step
    try:
        await asyncio.wait_for(window_over.wait(), 15)
        await until_async(lambda: exporter.http.bound_port, "the exporter's HTTP port", interval=0.01)
        _, text = await scrape(exporter)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert values(text, "neuron_exporter_podresources_errors_total", code="RESOURCE_EXHAUSTED")[0] >= 1
    assert attempts <= 6  # backed off from the 0.2 s interval, not hammering the kubelet


async def test_healthz_and_garbage(env) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    async with running(work, kubelet, "--metrics", "neuron_device_ecc_errors_total") as exporter:
        sim.set_counter_raw(work / "node", 2, "mem_ecc_uncorrected", "not a number\n")
        status, text = await scrape(exporter)
        health, _ = await scrape(exporter, "/healthz")
    assert (status, health) == (200, 200)
    assert values(text, "neuron_device_ecc_errors_total", device="2", type="mem_uncorrected") == []
    assert len(values(text, "neuron_device_ecc_errors_total")) == 16 * 3 - 1
    assert values(text, "neuron_exporter_read_errors_total", kind="malformed") == [1]
    assert values(text, "neuron_core_execution_status_total") == []  # not in --metrics


async def test_a_dead_loop_fails_the_probes_and_the_process(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    work, kubelet = env
    await kubelet.start()
    exporter, _, task = start(work, kubelet)

    def corrupt(*_: object, **__: object) -> None:
        raise RuntimeError("attribution corrupt")

    # the attribution loop has no per-tick guard: an error while attributing ends it
    code, probes = await break_loop_and_probe(
        exporter.http, task, lambda: monkeypatch.setattr("neuron_node_metrics.app.attribute", corrupt)
    )
    assert code == 1
    dead = "loop attribution failed: RuntimeError: attribution corrupt\n"
    assert probes == {"/healthz": (503, dead), "/readyz": (503, dead)}


run_cli = functools.partial(run_module, "neuron_node_metrics")


@pytest.mark.integration
def test_cli_help_list_and_validation() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    assert "NEURON_METRICS_ATTRIBUTION_INTERVAL" in out.stdout
    assert "0.0.0.0:9840" in out.stdout
    listed = run_cli("--list-metrics")
    assert listed.stdout.strip() == markdown_table()
    bad = run_cli("--metrics", "neuron_core_execution_status_total,nonsense")
    assert bad.returncode == 2
    assert "unknown family nonsense" in bad.stderr
    bad = run_cli(env={"NEURON_METRICS_NAMING": "dcgm"})
    assert bad.returncode == 2
    assert "NEURON_METRICS_NAMING='dcgm' must be one of native, neuron-monitor" in bad.stderr


@pytest.mark.integration
def test_attribution_interval_is_written_the_kubernetes_way() -> None:
    durations = set(re.findall(r"(--[\w-]+) DURATION", config_mod.parser({}).format_help()))
    assert durations == {"--attribution-interval", "--heartbeat-stale-after"}
    for argv, env in (
        (["--attribution-interval", "500ms"], {}),
        ([], {"NEURON_METRICS_ATTRIBUTION_INTERVAL": "500ms"}),
    ):
        cfg = config_mod.parse(argv, env=env)
        assert cfg is not None
        assert cfg.attribution_interval == 0.5
    cfg = config_mod.parse([], env={})
    assert cfg is not None
    assert cfg.attribution_interval == 10.0
    bad = run_cli("--attribution-interval", "10x")
    assert bad.returncode == 2
    assert "unknown unit 'x' in '10x'" in bad.stderr


def test_readme_metric_table_is_generated_from_the_code() -> None:
    readme = (REPO / "docs" / "node-metrics.md").read_text()
    begin, end = "<!-- metrics:begin (neuron-node-metrics --list-metrics) -->", "<!-- metrics:end -->"
    assert begin in readme, "docs/node-metrics.md lacks the generated metric table"
    table = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert table == markdown_table(), (
        "docs/node-metrics.md's metric table is stale: paste `neuron-node-metrics --list-metrics`"
    )
