"""A real Prometheus (Debian's) scrapes the exporter over a simulated trn2.48xlarge; every query
of every dashboard panel must return data, and the alert rules must load and fire.

STAND-IN: the PodResources source is the protocol-faithful kubelet stand-in
(tests/standins/kubelet.py, real podresources/v1 gRPC); the real kubelet is exercised by the
cluster tests. neuron-monitor, which needs Neuron hardware, is `neuron-sim monitor`
(libs/neuron-sim/src/neuron_sim/monitor.py), run by the exporter as its --neuron-monitor-command,
so the runtime panels and alerts read the exporter's real runtime series.

AWS's own published dashboard (tests/integration/aws-dashboard/, vendored unchanged) is checked
the same way against a second exporter over the same node in drop-in mode (`--naming
neuron-monitor`), scraped by a Prometheus of its own: its queries select no job or node, so any
series of the native exporter would answer them too. A third exporter serves both namings
(`--naming both`), with a third Prometheus: AWS's board and this project's boards must both answer
on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import processes
import pytest
import pytest_asyncio
import yaml
from polling import until_async
from prometheus_server import (
    AWS_DASHBOARD,
    DASHBOARDS,
    TESTED_SOURCES,
    awss_queries,
    check_awss_query,
    check_panel_query,
    concrete,
    generator,
    metrics_read,
    panel_queries,
    prometheus,
    query,
    series_read,
    wait_for,
)
from simcluster.controlplane import free_port
from standins.kubelet import Allocation, FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from neuron_sim import monitor as monitor_standin
from neuron_sim import node as sim

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts/neuron-helm-chart/rules/neuron-node-metrics.rules.yaml"
NODE = "sim-node-1"
SOURCE = "neuron-node-metrics"
QUERIES = panel_queries(frozenset({SOURCE}))
AWS_QUERIES = awss_queries()

pytestmark = [
    pytest.mark.integration,
]
one_prometheus = pytest.mark.asyncio(loop_scope="module")  # the async tests share one Prometheus


@dataclass(frozen=True)
class Stacks:
    native: str  # the Prometheus scraping the exporter with its own names
    drop_in: str  # the one scraping the exporter with neuron-monitor-prometheus's names
    both: str  # the one scraping the exporter serving both (--naming both)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stacks() -> AsyncIterator[Stacks]:
    work = Path(tempfile.mkdtemp(prefix="prom-"))
    root = work / "node"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")  # the newest tree: corrected ECC counts too
    kubelet = FakeKubelet(work / "dp", work / "pr")
    await kubelet.start()
    for pod, resource, ids in (
        ("trainer-0", "neuroncore", ["neuroncore8", "neuroncore9"]),
        ("infer-0", "neuron", ["neuron3"]),
        ("infer-1", "neuroncore", ["neuroncore40"]),
        ("stuck-0", "neuroncore", ["neuroncore20", "neuroncore21"]),
    ):
        kubelet.allocations.append(
            Allocation("ml", pod, "main", f"aws.amazon.com/{resource}", ids, dp.ContainerAllocateResponse())
        )
    # Runtimes on trainer-0's cores, on infer-0's device (logical cores 12-15 of 4 a device), on a
    # core no pod holds, and stuck-0's, loaded and running nothing; infer-1 holds core 40 and runs
    # none. stuck-0 and infer-1 are idle while held.
    runtimes = work / "runtimes.json"
    monitor_standin.write_runtimes(
        runtimes,
        [
            monitor_standin.Runtime(100, "train", (8, 9)),
            monitor_standin.Runtime(200, "infer", (12, 13, 14, 15)),
            monitor_standin.Runtime(300, "batch", (0,)),
            monitor_standin.Runtime(400, "stuck", (20, 21), idle=True),
        ],
    )
    monitor = shlex.join(
        [sys.executable, "-m", "neuron_sim.cli", "monitor", "--root", str(root), "--period", "0.5",
         "--runtimes-file", str(runtimes)]
    )  # fmt: skip
    exporters = []
    scrapes = []
    for naming in ("native", "neuron-monitor", "both"):
        metrics_port = free_port()
        exporters.append(subprocess.Popen(
            [sys.executable, "-m", "neuron_node_metrics", "--host-root", str(root),
             "--pod-resources-socket", str(kubelet.pod_resources_socket), "--listen", f"127.0.0.1:{metrics_port}",
             "--attribution-interval", "1", "--log-level", "warning", "--neuron-monitor-command", monitor,
             "--naming", naming],
        ))  # fmt: skip
        scrapes.append(
            {
                "job_name": SOURCE,
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"node": NODE}}],
            }
        )
    try:
        with contextlib.ExitStack() as running:
            base = running.enter_context(prometheus(work / "prometheus", [scrapes[0]], [RULES]))
            drop_in = running.enter_context(prometheus(work / "prometheus-drop-in", [scrapes[1]]))
            both = running.enter_context(prometheus(work / "prometheus-both", [scrapes[2]]))
            # counters must be seen before they move, or increase() sees nothing
            await wait_for(base, f'neuron_exporter_podresources_up{{job="{SOURCE}"}} == 1', "attribution up")
            await wait_for(base, 'neuron_core_utilization_ratio{pod="trainer-0"}', "neuron-monitor's runtimes")
            await wait_for(drop_in, 'neuroncore_utilization_ratio{pod="trainer-0"}', "the drop-in's runtimes")
            await wait_for(both, 'neuroncore_utilization_ratio{pod="trainer-0"}', "both namings' runtimes")
            await wait_for(both, f'neuron_exporter_podresources_up{{job="{SOURCE}"}} == 1', "attribution up (both)")
            # Activity over time, so rates and increases have something to show.
            for step in range(8):
                for device in range(16):
                    sim.bump_counter(root, device, "success", core=step % 8, by=3)
                sim.bump_counter(root, 3, "failure", core=1)
                sim.bump_counter(root, 2, "execute_completed_with_error", core=0)  # a pod-held core
                sim.set_memory(root, 2, "tensors", 1 << (20 + step), core=0)
                sim.set_memory(root, 3, "model_code", 1 << (20 + step), core=2)
                sim.set_memory(root, 3, "dma_buffers", 4096 * (step + 1))
                sim.set_power(root, 3, 10, 80, 40 + step)
                sim.bump_counter(root, 3, "mem_ecc_corrected", by=2)
                if step == 4:
                    sim.bump_counter(root, 3, "mem_ecc_uncorrected")
                    sim.bump_counter(root, 3, "hw_nc_ue_error", core=2)
                    sim.set_counter_raw(root, 9, "timeout", "garbage\n", core=0)
                await asyncio.sleep(1)
            await asyncio.sleep(3)
            yield Stacks(base, drop_in, both)
    finally:
        for exporter in exporters:
            processes.stop(exporter)
        await kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(stacks: Stacks) -> str:
    return stacks.native


def test_dashboards_are_what_the_generator_writes() -> None:
    dashboards = generator()
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(dashboards.BOARDS)
    for name, board in dashboards.BOARDS.items():
        assert (DASHBOARDS / name).read_text() == dashboards.render(board.build), (
            f"{name} is stale: run make dashboards"
        )


def test_every_board_is_checked_against_real_exporters_of_all_its_sources() -> None:
    for name, board in generator().BOARDS.items():
        assert any(board.sources <= scraped for scraped in TESTED_SOURCES), (
            f"{name}: no test scrapes real {sorted(board.sources)} together; add one before the board"
        )
    assert QUERIES, "no board of the exporter"


def test_every_board_has_the_shared_variables_and_data_source() -> None:
    for path in DASHBOARDS.glob("*.json"):
        board = json.loads(path.read_text())
        names = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "node"} <= names, path.name
        for panel in board["panels"]:
            for target in panel["targets"]:
                assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (
                    path.name,
                    panel["title"],
                )
    pods = json.loads((DASHBOARDS / "neuron-pods.json").read_text())
    assert "namespace" in {v["name"] for v in pods["templating"]["list"]}


def test_the_dra_board_reads_only_the_drivers_metrics_contract() -> None:
    """The series the driver promises (its README), and nothing else: test_prometheus_dra.py checks
    they come from a real driver."""
    dashboards = generator()
    board = json.loads(dashboards.render(dashboards.dra))
    assert {"datasource", "node"} <= {v["name"] for v in board["templating"]["list"]}
    contract = {
        "neuron_dra_prepare_duration_seconds_bucket",
        "neuron_dra_prepared_claims",
        "neuron_dra_published_devices",
        "neuron_dra_unhealthy_devices",
        "neuron_dra_slice_updates_total",
    }
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert all("$node" in e for e in exprs)
    assert set().union(*map(metrics_read, exprs)) == contract


@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=[f"{b}:{t}" for b, t, _ in QUERIES])
@one_prometheus
async def test_every_panel_query_returns_data(stack: str, board: str, title: str, expr: str) -> None:
    await check_panel_query(stack, board, title, expr)


@one_prometheus
async def test_variables_resolve(stack: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{stack}/api/v1/label/node/values?match[]=neuron_device_info") as r:
            assert (await r.json())["data"] == [NODE]
        async with s.get(f"{stack}/api/v1/label/namespace/values?match[]=neuron_core_allocation_info") as r:
            assert (await r.json())["data"] == ["ml"]


async def alerts_once(stack: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float) -> list[dict[str, Any]]:
    """Prometheus's alerts once `done` holds of them or, at the deadline, as they are then: the
    caller's assertions say what is missing."""
    last: list[dict[str, Any]] = []

    async def answered() -> bool:
        nonlocal last
        async with aiohttp.ClientSession() as s, s.get(f"{stack}/api/v1/alerts") as r:
            last = (await r.json())["data"]["alerts"]
        return done(last)

    with contextlib.suppress(TimeoutError):
        await until_async(answered, "the alerts", timeout, 1.0, TimeoutError)
    return last


def alert_names(alerts: list[dict[str, Any]]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts}


@one_prometheus
async def test_rules_load_and_the_ecc_alert_fires(stack: str) -> None:
    alerts = await alerts_once(
        stack, lambda alerts: {"NeuronUncorrectableECC", "NeuronHardwareErrors"} <= alert_names(alerts), 20
    )
    names = alert_names(alerts)
    assert {"NeuronUncorrectableECC", "NeuronHardwareErrors"} <= names
    ecc = next(a for a in alerts if a["labels"]["alertname"] == "NeuronUncorrectableECC")
    assert ecc["labels"]["device"] == "3"
    assert ecc["labels"]["pod"] == "infer-0"  # the device's holder
    async with aiohttp.ClientSession() as s, s.get(f"{stack}/api/v1/rules") as r:
        groups = (await r.json())["data"]["groups"]
    assert {g["name"] for g in groups} == {"neuron-hardware", "neuron-exporter", "neuron-runtime"}
    assert all(rule["health"] == "ok" for g in groups for rule in g["rules"])


@one_prometheus
async def test_runtime_alerts_wait_on_the_idle_pod_and_the_errors(stack: str) -> None:
    """From the exporter's real runtime series: stuck-0's runtime runs nothing and infer-1 holds a core
    no runtime uses, so they alone are idle while held (pending: the rule waits 30 minutes); the
    stand-in's working runtimes report errors, the idle one none."""

    def idle_and_errors(alerts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
        idle = [a for a in alerts if a["labels"]["alertname"] == "NeuronCoresIdleWhileHeld"]
        errors = {a["labels"].get("pod", "") for a in alerts if a["labels"]["alertname"] == "NeuronExecutionErrors"}
        return idle, errors

    def fired(alerts: list[dict[str, Any]]) -> bool:
        idle, errors = idle_and_errors(alerts)
        return len(idle) >= 2 and {"trainer-0", "infer-0", ""} <= errors

    idle, errors = idle_and_errors(await alerts_once(stack, fired, 30))
    assert sorted((a["labels"]["namespace"], a["labels"]["pod"], a["state"]) for a in idle) == [
        ("ml", "infer-1", "pending"),
        ("ml", "stuck-0", "pending"),
    ]
    assert {"trainer-0", "infer-0", ""} <= errors
    assert "stuck-0" not in errors
    # the working pods are not idle: the alert's expression, without its 30 minutes, names only these
    expr = next(
        rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "NeuronCoresIdleWhileHeld"
    )
    assert sorted(r["metric"]["pod"] for r in (await query(stack, expr))["result"]) == ["infer-1", "stuck-0"]


@one_prometheus
async def test_utilization_panels_are_shares_of_the_cores(stack: str) -> None:
    """The utilization panels' arithmetic, at one instant: a core no runtime uses counts as idle (0)
    where neuron-monitor runs, the node's and a device's share is over all their logical cores."""
    at = time.time() - 1
    panels = {title: expr for _, title, expr in QUERIES}

    async def values(expr: str, *by: str) -> dict[tuple[str, ...], float]:
        data = await query(stack, concrete(expr), at)
        return {tuple(r["metric"].get(b, "") for b in by): float(r["value"][1]) for r in data["result"]}

    cores = await values("neuron_core_utilization_ratio", "core")
    assert set(cores) == {(c,) for c in ("0", "8", "9", "12", "13", "14", "15", "20", "21")}
    assert cores["20",] == cores["21",] == 0  # stuck-0's runtime
    pods = await values(panels["NeuronCore utilization by pod"], "pod")
    assert pods == {
        ("trainer-0",): pytest.approx((cores["8",] + cores["9",]) / 2),
        ("infer-0",): pytest.approx(sum(cores[c,] for c in ("12", "13", "14", "15")) / 4),
        ("infer-1",): 0,
        ("stuck-0",): 0,
    }
    devices = await values(panels["NeuronCore utilization by device"], "device")
    assert len(devices) == 16
    assert devices["2",] == pytest.approx((cores["8",] + cores["9",]) / 4)
    assert devices["10",] == 0  # infer-1's device: held, no runtime
    nodes = await values(panels["NeuronCore utilization by node"], "node")
    assert nodes == {(NODE,): pytest.approx(sum(cores.values()) / 64)}


@one_prometheus
async def test_pod_labels_reach_prometheus(stack: str) -> None:
    data = await query(stack, 'neuron_core_allocation_info{pod="trainer-0"}')
    assert sorted(r["metric"]["core"] for r in data["result"]) == ["8", "9"]
    data = await query(stack, 'neuron_exporter_read_errors_total{kind="malformed"}')
    assert float(data["result"][0]["value"][1]) >= 1


def test_every_query_of_awss_dashboard_is_checked() -> None:
    """The walk over AWS's board finds every `expr` the JSON holds (and it has no query variables)."""

    def exprs(node: object) -> int:
        if isinstance(node, dict):
            return ("expr" in node) + sum(exprs(v) for v in node.values())
        return sum(exprs(v) for v in node) if isinstance(node, list) else 0

    board = json.loads(AWS_DASHBOARD.read_text())
    assert len(AWS_QUERIES) == exprs(board) == 21
    assert [v["type"] for v in board["templating"]["list"]] == ["adhoc"]
    assert set().union(*(series_read(expr) for _, expr, _ in AWS_QUERIES)) == {
        "instance_info",
        "system_vcpu_count",
        "system_vcpu_usage_ratio",
        "system_memory_used_bytes",
        "system_memory_total_bytes",
        "neuroncore_utilization_ratio",
        "execution_status_total",
        "execution_latency_seconds",
        "neuron_runtime_vcpu_usage_ratio",
        "neuron_runtime_memory_used_bytes",
    }


@pytest.mark.parametrize(("where", "expr", "shown"), AWS_QUERIES, ids=[where for where, _, _ in AWS_QUERIES])
@one_prometheus
async def test_every_query_of_awss_dashboard_returns_data_in_drop_in_mode(
    stacks: Stacks, where: str, expr: str, shown: frozenset[str]
) -> None:
    """Series, and on each the labels the panel shows (its legend's, its table's columns)."""
    await check_awss_query(stacks.drop_in, where, expr, shown)


@pytest.mark.parametrize(("where", "expr", "shown"), AWS_QUERIES, ids=[where for where, _, _ in AWS_QUERIES])
@one_prometheus
async def test_every_query_of_awss_dashboard_returns_data_with_both_namings(
    stacks: Stacks, where: str, expr: str, shown: frozenset[str]
) -> None:
    """`--naming both`: AWS's board works as in drop-in mode (including its two families whose names
    the native ones share, served once with both label sets)..."""
    await check_awss_query(stacks.both, where, expr, shown)


@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=[f"{b}:{t}" for b, t, _ in QUERIES])
@one_prometheus
async def test_every_panel_query_returns_data_with_both_namings(
    stacks: Stacks, board: str, title: str, expr: str
) -> None:
    """...and so do this project's boards, on the same exporter."""
    await check_panel_query(stacks.both, board, title, expr)
