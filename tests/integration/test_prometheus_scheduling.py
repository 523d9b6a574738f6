"""A real Prometheus scrapes two real scheduler extenders (a leader and a standby) and a real
neuron-scheduler (kube-scheduler) placing pods through them on a private control plane (etcd,
kube-apiserver: tests/simcluster); every query of every panel of the boards they serve must
return numbers.

The scheduler calls the standby, so every call is forwarded to the leader: both the forwarding and
the decisions show. The fleet is small and the pods more than it holds, so nodes are refused too.

STAND-IN: the nodes are tests/simcluster's simulated kubelets and device plugins (NeuronNode
reports written as the real plugin writes them); the real ones are exercised by the cluster tests.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from prometheus_server import check_panel_query, numbers, panel_queries, prometheus, query, wait_for
from simcluster.api import Api, bounded
from simcluster.controlplane import control_plane, free_port, wait_until_ready
from simcluster.fleet import PodSpec, fleet, pod_stream
from simcluster.nodes import PODS
from simcluster.schedulers import NEURON_SCHEDULER, extender_command, start_extender, start_scheduler
from simcluster.simulation import prepare
from skips import require

EXTENDER, SCHEDULER = "neuron-scheduler-extender", "kube-scheduler"
QUERIES = panel_queries(frozenset({EXTENDER, SCHEDULER}))
NODES, PODS_ASKED = 6, 40
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
    nodes: list[str]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    command = extender_command()
    require([] if command else ["neuron-scheduler-extender"], "make setup")
    assert command is not None
    work = Path(tempfile.mkdtemp(prefix="sched-prom-"))
    specs, stream = fleet(NODES, seed=3), pod_stream(PODS_ASKED, seed=3)
    try:
        with control_plane(work / "cluster") as cp:
            async with Api(cp) as api:
                nodes = await prepare(api, specs, report_interval=30.0)
                stop = asyncio.Event()
                kubelets = asyncio.create_task(nodes.run(stop))
                ports = {"leader": free_port(), "standby": free_port()}
                for role, port in ports.items():  # one at a time: the first takes the Lease
                    start_extender(cp, command, port, report_max_age=120.0, name=f"extender-{role}")
                    await asyncio.to_thread(wait_until_ready, cp.processes, f"the {role}", port, "/readyz", 60, None)
                # through the standby: every call is forwarded to the leader
                scheduler = start_scheduler(cp, NEURON_SCHEDULER, f"http://127.0.0.1:{ports['standby']}")
                scrapes = [
                    {
                        "job_name": EXTENDER,
                        "honor_labels": True,
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}],
                    },
                    {
                        "job_name": SCHEDULER,
                        "scheme": "https",
                        "tls_config": {"insecure_skip_verify": True},  # its self-signed serving certificate
                        "static_configs": [{"targets": [f"127.0.0.1:{scheduler.port}"]}],
                    },
                ]
                with prometheus(work / "prometheus", scrapes) as base:
                    await wait_for(base, "count(up == 1) == 3", "both extenders and the scheduler up")

                    async def create(pod: PodSpec) -> None:
                        await api.create(PODS, pod.pod_object(NEURON_SCHEDULER))

                    await bounded(stream, create, 8)  # only now: the counters were seen at zero
                    for expr, what in (
                        ("sum(neuron_scheduler_extender_pods_bound_total) > 0", "a pod bound"),
                        ("sum(neuron_scheduler_extender_nodes_refused_total) > 0", "a node refused"),
                        ('sum(neuron_scheduler_extender_forwarded_total{result="relayed"}) > 0', "a call forwarded"),
                        (f'sum(scheduler_unschedulable_pods{{profile="{NEURON_SCHEDULER}"}}) > 0', "a pod held back"),
                    ):
                        await wait_for(base, expr, what, timeout=120)
                    await asyncio.sleep(3)  # a few more scrapes
                    yield Stack(base, time.time(), [s.name for s in specs])
                stop.set()
                await kubelets
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=[f"{b}:{t}" for b, t, _ in QUERIES])
@one_prometheus
async def test_every_panel_query_returns_data(stack: Stack, board: str, title: str, expr: str) -> None:
    await check_panel_query(stack.prometheus, board, title, expr, stack.at, rate_interval=RATE_INTERVAL)


@one_prometheus
async def test_the_node_variable_lists_every_node_with_a_report(stack: Stack) -> None:
    match = "neuron_scheduler_extender_node_cores"
    async with aiohttp.ClientSession() as s, s.get(f"{stack.prometheus}/api/v1/label/node/values?match[]={match}") as r:
        assert sorted((await r.json())["data"]) == sorted(stack.nodes)


@one_prometheus
async def test_one_replica_leads_and_the_other_forwards_to_it(stack: Stack) -> None:
    assert numbers(await query(stack.prometheus, "sum(neuron_scheduler_extender_leader)", stack.at)) == [1.0]
    relayed = 'sum(neuron_scheduler_extender_forwarded_total{result="relayed"})'
    assert numbers(await query(stack.prometheus, relayed, stack.at))[0] > 0


@one_prometheus
async def test_pods_the_extender_holds_back_show_as_its_plugin(stack: Stack) -> None:
    held = f'sum by (plugin) (scheduler_unschedulable_pods{{profile="{NEURON_SCHEDULER}"}}) > 0'
    plugins = {r["metric"]["plugin"] for r in (await query(stack.prometheus, held, stack.at))["result"]}
    assert "Extender" in plugins, plugins  # kube-scheduler's name for every extender
