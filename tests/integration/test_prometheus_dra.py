"""A real Prometheus scrapes a real `neuron-dra-driver` process on a simulated trn1.32xlarge,
registered and called over its real gRPC sockets and publishing to a private kube-apiserver
(tests/simcluster); every query of every panel of the boards it serves must return numbers, and the
board's counts must be the node's.

Claims are prepared and one unprepared over the DRA socket only once Prometheus has seen the
latency histograms at zero, so both quantile panels have a rate to read; a device then fails, so
the node's slices are written again without it and its cores.

STAND-IN: the kubelet's side of registration and of the DRA calls, and the scheduler's allocation
of the claims (tests/standins/dra_kubelet.py); the real ones are exercised by the cluster tests.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from polling import until_async
from prometheus_server import check_panel_query, numbers, panel_queries, prometheus, query, wait_for
from simcluster.controlplane import ControlPlane, control_plane, free_port, wait_until_ready
from standins.dra_kubelet import Kubelet, allocated_claim

from neuron_common.kube import Api
from neuron_driver import layout
from neuron_model.instance_types import get_instance_type
from neuron_sim import node as sim

DRIVER = "neuron-dra-driver"
QUERIES = panel_queries(frozenset({DRIVER}))
NODE = "dra-node-1"
INSTANCE_TYPE = get_instance_type("trn1.32xlarge")
PREPARED_DEVICES, FAILED_DEVICE = (0, 1, 2), 9
RATE_INTERVAL = "1m"  # the queries are evaluated just after the activity, over all of it

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]
one_prometheus = pytest.mark.asyncio(loop_scope="module")  # the async tests share one Prometheus


@dataclass(frozen=True)
class Stack:
    prometheus: str  # base URL
    at: float  # Unix seconds to evaluate the queries at: just after the activity


def start_driver(cp: ControlPlane, work: Path, root: Path, port: int) -> Path:
    """The driver as the chart runs it, on this machine's paths; returns its registry directory."""
    registry = work / "registry"
    cp.processes.start(
        DRIVER,
        [sys.executable, "-m", "neuron_dra_driver", f"--kubeconfig={cp.kubeconfig}", f"--node-name={NODE}",
         f"--host-root={root}", f"--plugin-dir={work / 'plugins'}", f"--registry-dir={registry}",
         f"--cdi-spec-dir={work / 'cdi'}", f"--listen=127.0.0.1:{port}", "--log-level=warning"],
    )  # fmt: skip
    return registry


async def registration_socket(cp: ControlPlane, registry: Path) -> None:
    socket = registry / Path(layout.DRA_REGISTRATION_SOCKET).name

    def served() -> bool:
        cp.processes.check()  # the driver died: its log, at once
        return socket.exists()

    await until_async(served, f"{DRIVER} to serve {socket}", 60, 0.1, TimeoutError)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    # unix socket paths must stay under 108 bytes
    work = Path(tempfile.mkdtemp(prefix="dra-prom-"))
    root = work / "node"
    sim.create(root, INSTANCE_TYPE.name)
    try:
        with control_plane(work / "cluster") as cp:
            port = free_port()
            registry = start_driver(cp, work, root, port)
            await registration_socket(cp, registry)
            kubelet = Kubelet(registry)
            await kubelet.register()
            # ready: registered, and the slices published
            await asyncio.to_thread(wait_until_ready, cp.processes, DRIVER, port, "/readyz", 60, None)
            api = Api(cp.server, ssl_context=cp.credentials.ssl_context())
            # as the chart's scrape config: `node` from the pod's node
            scrape = {
                "job_name": DRIVER,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": NODE}}],
            }
            try:
                with prometheus(work / "prometheus", [scrape]) as base:
                    zero = 'neuron_dra_prepare_duration_seconds_count{operation="unprepare"} == 0'
                    await wait_for(base, zero, "the latency histograms at zero")
                    claims = [
                        await allocated_claim(api, NODE, [f"neurondevice{d}"], name=f"claim-{d}")
                        for d in PREPARED_DEVICES
                    ]
                    refs = [(c["metadata"]["uid"], "default", c["metadata"]["name"]) for c in claims]
                    prepared = await kubelet.prepare(*refs)
                    assert [prepared.claims[uid].error for uid, _, _ in refs] == [""] * len(refs)
                    unprepared = await kubelet.unprepare(refs[0])
                    assert unprepared.claims[refs[0][0]].error == ""
                    sim.inject_fault(root, "NC_UNCORRECTABLE_ERROR", FAILED_DEVICE, via="kernel")
                    for expr, what in (
                        (f"neuron_dra_prepared_claims == {len(refs) - 1}", "the claims prepared"),
                        ('neuron_dra_prepare_duration_seconds_count{operation="unprepare"} == 1', "a claim unprepared"),
                        ("neuron_dra_unhealthy_devices == 1", "the device failed"),
                    ):
                        await wait_for(base, expr, what)
                    await asyncio.sleep(3)  # a few more scrapes
                    yield Stack(base, time.time())
            finally:
                await kubelet.close()
                await api.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=[f"{b}:{t}" for b, t, _ in QUERIES])
@one_prometheus
async def test_every_panel_query_returns_data(stack: Stack, board: str, title: str, expr: str) -> None:
    await check_panel_query(stack.prometheus, board, title, expr, stack.at, rate_interval=RATE_INTERVAL)


def test_the_driver_serves_a_board() -> None:
    assert QUERIES, "no board of the DRA driver"


@one_prometheus
async def test_the_node_variable_lists_the_drivers_node(stack: Stack) -> None:
    match = "neuron_dra_published_devices"
    async with aiohttp.ClientSession() as s, s.get(f"{stack.prometheus}/api/v1/label/node/values?match[]={match}") as r:
        assert (await r.json())["data"] == [NODE]


@one_prometheus
async def test_the_counts_are_the_nodes_with_the_failed_device_tainted(stack: Stack) -> None:
    per_device = INSTANCE_TYPE.logical_cores_per_device(INSTANCE_TYPE.family.default_lnc)
    for expr, expected in (
        # the failed device stays published, tainted with its cores (device taints are on by default)
        ('sum(neuron_dra_published_devices{kind="device"})', INSTANCE_TYPE.devices),
        ('sum(neuron_dra_published_devices{kind="core"})', INSTANCE_TYPE.devices * per_device),
        ("sum(neuron_dra_tainted_devices)", 1 + per_device),
        ("sum(neuron_dra_unhealthy_devices)", 1),
        ("sum(neuron_dra_prepared_claims)", len(PREPARED_DEVICES) - 1),
        ('sum(neuron_dra_prepare_duration_seconds_count{operation="prepare"})', len(PREPARED_DEVICES)),
    ):
        assert numbers(await query(stack.prometheus, expr, stack.at)) == [expected], expr
    # published once, then again with the failed device tainted
    assert numbers(await query(stack.prometheus, "sum(neuron_dra_slice_updates_total)", stack.at))[0] >= 2
