"""A node of an UltraServer that runs a group turns unhealthy (issue 26 item 6): against a real
kube-apiserver (tests/simcluster), the extender, run as in production (its loops under the
supervisor, the API server through neuron_common.kube), puts an `UltraServerGroupDegraded` Event on
each pod of the group once, and with `--evict-degraded-groups` evicts every one of them. Restarted,
it tells the group again on the same Events (their count 2), not on new ones.

No kubelet runs here: the group's pods are created bound (spec.nodeName), which is all the extender
watches; an evicted pod bound to a node gets a deletionTimestamp (the kubelet would finish it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from polling import until_async
from simcluster.api import Api
from simcluster.controlplane import control_plane
from simcluster.fleet import DEFAULT_SCHEDULER, NAMESPACE, GroupSpec, PodSpec, fleet
from simcluster.nodes import PODS
from simcluster.simulation import prepare

from neuron_scheduler_extender import config as extender_config
from neuron_scheduler_extender.app import Extender
from neuron_scheduler_extender.failures import CONDITION, DEGRADED_REASON, EVICTED_REASON

pytestmark = [
    pytest.mark.integration,
]

EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"


async def until(check: Any, timeout: float = 30.0) -> Any:
    return await until_async(check, getattr(check, "__name__", ""), timeout, 0.2, TimeoutError)


async def rounds_after(extender: Extender, rounds: int = 2) -> None:
    """Until the group-health monitor has acted on `rounds` more rounds: the positive marker after
    which what it has not done, it did not do for the state the test set (one round may have begun
    before that state, hence two)."""
    health = extender.group_health
    seen = health.rounds
    await until_async(lambda: health.rounds >= seen + rounds, "group-health rounds", 30, 0.05, TimeoutError)


async def scenario(work: Path, evict: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    specs = fleet(4, seed=3, ultraservers=1)
    group = GroupSpec(0, 4, 4)
    names = [f"lws-0-{i}" for i in range(4)]
    with control_plane(work) as cp:
        async with Api(cp) as api:
            await prepare(api, specs, report_interval=30.0)
            for name, spec in zip(names, specs, strict=True):
                pod = PodSpec(name, 16, 0, group).pod_object(DEFAULT_SCHEDULER)
                pod["spec"]["nodeName"] = spec.name
                await api.create(PODS, pod)
            argv = ["--kubeconfig", str(cp.kubeconfig), "--listen=127.0.0.1:0", "--no-leader-elect"]
            config = extender_config.parse([*argv, *(["--evict-degraded-groups"] if evict else [])], env={})
            stop = asyncio.Event()
            extender = Extender(config, stop)
            extender.group_health.interval = 0.2
            running = asyncio.create_task(extender.run())
            try:
                await until(lambda: _synced(extender))
                await rounds_after(extender)  # rounds over a healthy UltraServer: no Event
                assert (await api.list(EVENTS))[0] == []
                failed = specs[2].name
                condition = {"type": CONDITION, "status": "True", "reason": "NeuronSramEccUncorrected"}
                await api.patch_status(f"/api/v1/nodes/{failed}", {"conditions": [dict(condition, message="dev 3")]})

                async def degraded() -> list[dict[str, Any]]:
                    items = (await api.list(EVENTS))[0]
                    told = [e for e in items if e["reason"] == DEGRADED_REASON]
                    return items if len(told) >= 4 else []

                await until(degraded)
                if evict:

                    async def evicted() -> list[str]:
                        pods = (await api.list(PODS))[0]
                        live = [p for p in pods if p["metadata"]["name"] in names]
                        gone = [p for p in live if p["metadata"].get("deletionTimestamp")]
                        return names if len(gone) == len(live) else []

                    await until(evicted)
                await rounds_after(extender)  # further rounds announce nothing new (asserted below)
            finally:
                stop.set()
                assert await asyncio.wait_for(running, 30) == 0
            if not evict:
                # restarted, it remembers nothing and tells the group again: on the same Events, counted
                stop = asyncio.Event()
                restarted = Extender(config, stop)
                restarted.group_health.interval = 0.2
                running = asyncio.create_task(restarted.run())

                async def told_twice() -> bool:
                    items = (await api.list(EVENTS))[0]
                    return [e.get("count") for e in items if e["reason"] == DEGRADED_REASON] == [2] * 4

                try:
                    await until(told_twice)
                finally:
                    stop.set()
                    assert await asyncio.wait_for(running, 30) == 0
            events = (await api.list(EVENTS))[0]
            pods = [p for p in (await api.list(PODS))[0] if p["metadata"]["name"] in names]
    return events, pods, [failed, specs[0].ultraserver.server_id if specs[0].ultraserver else ""]


async def _synced(extender: Extender) -> bool:
    return extender.synced() and extender.nodes.synced


@pytest.mark.parametrize("evict", [False, True], ids=["report", "evict"])
def test_a_failed_node_is_told_to_every_pod_of_the_group_once(tmp_path: Path, evict: bool) -> None:
    events, pods, (failed, server) = asyncio.run(scenario(tmp_path, evict))
    told = [e for e in events if e["reason"] == DEGRADED_REASON]
    assert sorted(e["involvedObject"]["name"] for e in told) == [f"lws-0-{i}" for i in range(4)]
    assert all(e["type"] == "Warning" for e in told)
    assert all(e["involvedObject"]["kind"] == "Pod" for e in told)
    message = told[0]["message"]
    assert f"node {failed}" in message
    assert server in message
    assert "NeuronSramEccUncorrected" in message
    evictions = [e for e in events if e["reason"] == EVICTED_REASON]
    if evict:
        assert sorted(e["involvedObject"]["name"] for e in evictions) == [f"lws-0-{i}" for i in range(4)]
        assert all(p["metadata"].get("deletionTimestamp") for p in pods)
    else:  # told again by a restarted extender, as one Event a pod
        assert [e["count"] for e in told] == [2] * 4
        assert all(e["lastTimestamp"] >= e["firstTimestamp"] for e in told)
        assert evictions == []
        assert len(pods) == 4
        assert not any(p["metadata"].get("deletionTimestamp") for p in pods)
