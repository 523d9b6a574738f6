"""A LeaderWorkerSet's exclusive topology works with the default kube-scheduler on the UltraServer
labels alone (issue 26 item 4): no extender, no Neuron component in the scheduling path.

LeaderWorkerSet places a group exclusively on a topology domain in two steps (kubernetes-sigs/lws
`pkg/webhooks/pod_webhook.go` SetExclusiveAffinities and `pkg/controllers/pod_controller.go`
setNodeSelectorForWorkerPods): its webhook gives the leader pod a required pod affinity (label
`group-key` In [its group's key], topologyKey = the annotation's key) and a required pod
anti-affinity (`group-key` Exists and NotIn [its key], same topologyKey): the leader goes to a domain
no other group holds, and only to a node that has the label at all. Once the leader is bound, the
controller creates the workers with a nodeSelector on the leader's node's value of that key. The
LeaderWorkerSet module is not served by the Go module proxy, so this test writes both as they would:
the real etcd, kube-apiserver and kube-scheduler of tests/simcluster, with Nodes labelled by
`neuron_model.ultraserver.node_labels` from the identity neuron-sim's driver attributes give.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from polling import until_async
from simcluster.api import Api
from simcluster.controlplane import control_plane
from simcluster.fleet import DEFAULT_SCHEDULER, GroupSpec, NodeSpec, PodSpec, fleet
from simcluster.nodes import PODS
from simcluster.schedulers import start_scheduler
from simcluster.simulation import prepare

from neuron_model.ultraserver import server_id_label
from neuron_scheduler_extender.groups import LWS_GROUP_KEY

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

TOPOLOGY = server_id_label(4)  # as in AWS's example: exclusive-topology: ...ultraserver-server-id-4
ULTRASERVERS = 3


def webhook_affinity(group: GroupSpec) -> dict[str, Any]:
    """What LeaderWorkerSet's webhook writes into a leader pod of an exclusive-topology group."""
    key = group.labels()[LWS_GROUP_KEY]
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": LWS_GROUP_KEY, "operator": "In", "values": [key]}]},
                    "topologyKey": group.topology_key,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": LWS_GROUP_KEY, "operator": "Exists"},
                            {"key": LWS_GROUP_KEY, "operator": "NotIn", "values": [key]},
                        ]
                    },
                    "topologyKey": group.topology_key,
                }
            ]
        },
    }


def pod(name: str, group: GroupSpec, **spec: Any) -> dict[str, Any]:
    obj = PodSpec(name, 16, 0, group).pod_object(DEFAULT_SCHEDULER)
    obj["spec"].update(spec)
    return obj


async def placed(api: Api, names: list[str], timeout: float = 60.0) -> dict[str, str]:
    """pod -> node once each pod is bound or reported unschedulable ("" then)."""
    found: dict[str, str] = {}

    async def all_placed() -> bool:
        items, _ = await api.list(PODS)
        found.clear()
        for item in items:
            name = item["metadata"]["name"]
            if name not in names:
                continue
            conditions = (item.get("status") or {}).get("conditions") or []
            refused = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
            if item["spec"].get("nodeName") or refused:
                found[name] = item["spec"].get("nodeName", "")
        return len(found) == len(names)

    try:
        await until_async(all_placed, "every pod placed", timeout, 0.2, TimeoutError)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; not scheduled: {sorted(set(names) - set(found))}") from None
    return found


async def run(work: Path) -> tuple[list[NodeSpec], dict[str, str], dict[str, str]]:
    # plain nodes first (no UltraServer label), then the UltraServers: a leader must never go to a plain node
    specs = fleet(6 + 4 * ULTRASERVERS, seed=7, ultraservers=ULTRASERVERS)
    by_name = {s.name: s for s in specs}
    groups = [GroupSpec(i, 4, 4) for i in range(ULTRASERVERS + 1)]  # one group more than UltraServers
    with control_plane(work) as cp:
        async with Api(cp) as api:
            await prepare(api, specs, report_interval=30.0)
            start_scheduler(cp, DEFAULT_SCHEDULER)
            leaders = {f"lws-{g.index}": g for g in groups}
            for name, group in leaders.items():
                await api.create(PODS, pod(name, group, affinity=webhook_affinity(group)))
            leader_nodes = await placed(api, list(leaders))
            workers: dict[str, GroupSpec] = {}
            for name, group in leaders.items():
                node = leader_nodes[name]
                if not node:
                    continue  # LeaderWorkerSet creates the workers once the leader is bound
                value = by_name[node].node_object()["metadata"]["labels"][TOPOLOGY]
                for w in range(1, group.size):
                    workers[f"{name}-{w}"] = group
                    await api.create(PODS, pod(f"{name}-{w}", group, nodeSelector={TOPOLOGY: value}))
            worker_nodes = await placed(api, list(workers))
    return specs, leader_nodes, worker_nodes


def test_the_webhooks_affinity_on_the_ultraserver_labels_keeps_each_group_on_its_own_ultraserver(
    tmp_path: Path,
) -> None:
    specs, leaders, workers = asyncio.run(run(tmp_path))
    by_name = {s.name: s for s in specs}
    servers: dict[str, set[str | None]] = {}
    for pod_name, node in {**leaders, **workers}.items():
        leader = "-".join(pod_name.split("-")[:2])
        if node:
            servers.setdefault(leader, set()).add(by_name[node].domain(4))
    # three groups, each whole on one UltraServer, no two on the same one
    assert len(servers) == ULTRASERVERS, (leaders, workers)
    assert all(len(s) == 1 and None not in s for s in servers.values()), servers
    assert len({next(iter(s)) for s in servers.values()}) == ULTRASERVERS
    assert all(workers.values()), workers
    # the fourth leader waits: every UltraServer is another group's, and the plain nodes have no label
    waiting = [name for name, node in leaders.items() if not node]
    assert len(waiting) == 1
