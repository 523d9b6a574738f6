"""Kubernetes' own gang scheduling on our UltraServer labels (issue 59 item 3): the Workload API's
PodGroup, with a topology constraint on `neuron.amazonaws.com/ultraserver-server-id-4`: first with
the default kube-scheduler alone (no extender, no Neuron component in the scheduling path), then with
`neuron-scheduler` and the extender.

What turns it on in 1.36 (kubernetes v1.36.3; docs/scheduling.md has the file paths): the alpha
gates GenericWorkload (the API, `spec.schedulingGroup` on Pods), GangScheduling (the all-or-nothing
Permit plugin) and TopologyAwareWorkloadScheduling (KEP-5732: the PodGroup's
`schedulingConstraints.topology` and the placement plugin), on both kube-apiserver and
kube-scheduler, and the API version `scheduling.k8s.io/v1alpha2`, off by default, served through
`--runtime-config`. The real etcd, kube-apiserver and kube-scheduler of tests/simcluster at the
pinned release (the test cluster's); Nodes labelled by `neuron_model.ultraserver.node_labels` from
the identity neuron-sim's driver attributes give.

What this asserts is what was observed; a release that behaves otherwise fails it, and the page
has to change with it:
- with the constraint, a gang of 4 one-node pods lands whole on one UltraServer, a second one on the
  other, and a third (no UltraServer left whole, noise nodes free but unlabelled) binds no pod at all;
- without the constraint, the gang binds where no UltraServer can hold it whole: GangScheduling
  counts pods, only the constraint brings topology;
- with the flags left out, the API server serves no `scheduling.k8s.io/v1alpha2`;
- `neuron-scheduler` (the extender) with the same gates places such gangs of pods smaller than a
  node whole on one UltraServer, each pod on a valid device set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import until_async
from simcluster.api import Api
from simcluster.controlplane import control_plane, free_port, k8s_version, wait_until_ready
from simcluster.fleet import DEFAULT_SCHEDULER, NAMESPACE, NEURON, NodeSpec, PodSpec, SimulatedCluster, fleet
from simcluster.nodes import PODS
from simcluster.schedulers import NEURON_SCHEDULER, extender_command, start_extender, start_scheduler
from simcluster.simulation import prepare

from neuron_model.ultraserver import server_id_label
from neuron_scheduler_extender.groups import GROUP_LABEL, GROUP_SIZE_ANNOTATION

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true"
RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1alpha2=true"
GROUP_VERSION = "scheduling.k8s.io/v1alpha2"
PODGROUPS = f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/podgroups"
TOPOLOGY = server_id_label(4)
DEVICES = 16  # a whole trn2u.48xlarge: one pod per node, so a group of 4 is a whole UltraServer
RELEASE = "v1.36.3"  # what was observed; the test cluster's pin (tests/cluster/k8s/go.mod)


def podgroup(name: str, pods: int, topology: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": pods}}}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {"apiVersion": GROUP_VERSION, "kind": "PodGroup", "metadata": {"name": name}, "spec": spec}


def member(
    name: str, group: str, devices: int = DEVICES, scheduler: str = DEFAULT_SCHEDULER, **spec: Any
) -> dict[str, Any]:
    pod = PodSpec(name, devices, 0).pod_object(scheduler)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    pod["spec"].update(spec)
    return pod


def observed_release() -> None:
    assert k8s_version() == RELEASE, f"observed on {RELEASE}; {k8s_version()} must be observed again"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedCluster]:
    """Two UltraServers of 4 trn2u.48xlarge nodes and 4 trn2.48xlarge noise nodes (16 devices each
    too, so they could hold any of the pods: only the label keeps a constrained group off them)."""
    observed_release()
    specs = [*fleet(8, seed=59, ultraservers=2), *(NodeSpec(f"noise-{i}", "trn2.48xlarge", 2) for i in range(4))]
    with control_plane(tmp_path_factory.mktemp("gang"), apiserver_args=[GATES, RUNTIME_CONFIG]) as cp:

        async def setup() -> None:
            async with Api(cp) as api:
                await prepare(api, specs, report_interval=30.0)

        asyncio.run(setup())
        start_scheduler(cp, DEFAULT_SCHEDULER, args=[GATES])
        yield SimulatedCluster(cp, {s.name: s for s in specs})


async def outcome(api: Api, group: str, pods: list[str], timeout: float = 60.0) -> tuple[bool, dict[str, str]]:
    """(the PodGroupScheduled condition's status, pod -> node for the pods bound) once the scheduler
    has decided on the group."""

    async def decided() -> dict[str, Any] | None:
        obj = await api.request("GET", f"{PODGROUPS}/{group}")
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodGroupScheduled"), None)

    condition = await until_async(decided, f"kube-scheduler's verdict on PodGroup {group}", timeout, 0.2)
    scheduled = condition["status"] == "True"
    placed = await bound(api, pods, timeout) if scheduled else await bound(api, pods, wait=False)
    return scheduled, placed


async def bound(api: Api, pods: list[str], timeout: float = 60.0, *, wait: bool = True) -> dict[str, str]:
    """pod -> node of those of `pods` bound; with `wait`, once all of them are."""
    found: dict[str, str] = {}

    async def all_bound() -> bool:
        items, _ = await api.list(PODS)
        found.clear()
        found.update({p["metadata"]["name"]: p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")})
        return all(p in found for p in pods)

    if wait:  # PodGroupScheduled turns True before the binds land
        await until_async(all_bound, f"{pods} bound", timeout, 0.2)
    else:
        await all_bound()
    return {p: n for p, n in found.items() if p in pods}


async def clear(api: Api) -> None:
    """Every pod deleted. The PodGroups stay (each test names its own): the API server gives each the
    finalizer `scheduling.k8s.io/podgroup-protection`, which kube-controller-manager lifts, and no
    controller manager runs here."""
    await api.request("DELETE", PODS, params={"gracePeriodSeconds": "0"})

    async def gone() -> bool:
        return not (await api.list(PODS))[0]

    await until_async(gone, "pods deleted", 30.0, 0.2)


def test_the_nodes_are_ours(cluster: SimulatedCluster) -> None:
    ultraservers = {cluster.ultraserver(n) for n in cluster.specs} - {None}
    assert len(ultraservers) == 2
    for spec in cluster.specs.values():
        node = spec.node_object()
        assert node["status"]["allocatable"][NEURON] == str(DEVICES)
        assert (TOPOLOGY in node["metadata"]["labels"]) == (spec.instance_type == "trn2u.48xlarge")


def test_the_flags_serve_the_workload_api(cluster: SimulatedCluster) -> None:
    async def run() -> set[str]:
        async with Api(cluster.cp) as api:
            found = await api.request("GET", f"/apis/{GROUP_VERSION}")
            return {r["name"] for r in found["resources"]}

    assert {"workloads", "podgroups", "podgroups/status"} <= asyncio.run(run())


def test_a_podgroup_with_the_ultraserver_constraint_lands_whole_on_one_ultraserver(cluster: SimulatedCluster) -> None:
    async def run() -> list[tuple[bool, dict[str, str]]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            results = []
            for g in ("first", "second", "third"):  # one after the other: each sees the others' nodes taken
                await api.create(PODGROUPS, podgroup(g, 4, TOPOLOGY))
                pods = [f"{g}-{i}" for i in range(4)]
                for name in pods:
                    await api.create(PODS, member(name, g))
                results.append(await outcome(api, g, pods))
            return results

    (ok1, first), (ok2, second), (ok3, third) = asyncio.run(run())
    assert ok1, first
    assert ok2, second
    servers = [{cluster.ultraserver(n) for n in placed.values()} for placed in (first, second)]
    assert all(len(placed) == 4 for placed in (first, second)), (first, second)
    assert all(len(s) == 1 and None not in s for s in servers), (first, second)
    assert servers[0] != servers[1]
    # no UltraServer left with 4 free nodes: the third waits whole, though 4 noise nodes are free
    assert not ok3
    assert third == {}, third  # all or nothing


def test_without_the_constraint_a_gang_only_counts_pods(cluster: SimulatedCluster) -> None:
    """One node of each UltraServer taken by a lone pod: no UltraServer can hold 4 more. The gang
    with the constraint waits; the same gang without it binds across UltraServers and noise nodes."""
    first_nodes = {}
    for name in sorted(cluster.specs):
        if (server := cluster.ultraserver(name)) is not None:
            first_nodes.setdefault(server, name)

    async def run() -> tuple[dict[str, str], tuple[bool, dict[str, str]], tuple[bool, dict[str, str]]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            lone = [f"lone-{i}" for i in range(len(first_nodes))]
            for name, node in zip(lone, first_nodes.values(), strict=True):
                pod = PodSpec(name, DEVICES, 0).pod_object(DEFAULT_SCHEDULER)
                pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
                await api.create(PODS, pod)
            lone_bound = await bound(api, lone)
            await api.create(PODGROUPS, podgroup("constrained", 4, TOPOLOGY))
            constrained = [f"constrained-{i}" for i in range(4)]
            for name in constrained:
                await api.create(PODS, member(name, "constrained"))
            with_constraint = await outcome(api, "constrained", constrained)
            await api.create(PODGROUPS, podgroup("free", 4, None))
            free = [f"free-{i}" for i in range(4)]
            for name in free:
                await api.create(PODS, member(name, "free"))
            return lone_bound, with_constraint, await outcome(api, "free", free)

    lone_bound, (ok_constrained, constrained), (ok_free, free) = asyncio.run(run())
    assert sorted(lone_bound.values()) == sorted(first_nodes.values()), lone_bound
    assert not ok_constrained
    assert constrained == {}, constrained
    assert ok_free
    assert len(free) == 4, free
    assert len({cluster.ultraserver(n) for n in free.values()}) > 1, free


def test_without_the_flags_the_api_is_not_served(tmp_path: Path) -> None:
    observed_release()
    with control_plane(tmp_path) as cp:

        async def run() -> list[str]:
            async with Api(cp) as api:
                found = await api.request("GET", "/apis/scheduling.k8s.io")
                return [v["groupVersion"] for v in found["versions"]]

        assert GROUP_VERSION not in asyncio.run(run())


def test_neuron_scheduler_with_the_gates_places_a_podgroup_of_smaller_pods_whole_and_valid(tmp_path: Path) -> None:
    """`neuron-scheduler` (kube-scheduler with the extender, the chart's stanza) with the same gates:
    two PodGroups of four 8-device pods, one named by the PodGroup alone, one by the PodGroup and the
    chart's label and size annotation (one group to the extender); each lands on one UltraServer
    and every pod gets a valid device set from the simulated device plugins."""
    observed_release()
    command = extender_command()
    assert command is not None, "the extender's command, which make setup installs"
    specs = [*fleet(8, seed=59, ultraservers=2), *(NodeSpec(f"noise-{i}", "trn2.48xlarge", 2) for i in range(4))]
    by_name = {s.name: s for s in specs}
    groups = {
        "bare": {},
        "labelled": {"labels": {GROUP_LABEL: "labelled"}, "annotations": {GROUP_SIZE_ANNOTATION: "4"}},
    }

    async def run() -> tuple[dict[str, tuple[bool, dict[str, str]]], list[Any]]:
        with control_plane(tmp_path, apiserver_args=[GATES, RUNTIME_CONFIG]) as cp:
            async with Api(cp) as api:
                nodes = await prepare(api, specs, report_interval=5.0)
                stop = asyncio.Event()
                kubelets = asyncio.create_task(nodes.run(stop))
                port = free_port()
                start_extender(cp, command, port, report_max_age=20.0)
                await asyncio.to_thread(wait_until_ready, cp.processes, "the extender", port, "/readyz", 60, None)
                start_scheduler(cp, NEURON_SCHEDULER, f"http://127.0.0.1:{port}", args=[GATES])
                results = {}
                for group, meta in groups.items():
                    await api.create(PODGROUPS, podgroup(group, 4, TOPOLOGY))
                    pods = [f"{group}-{i}" for i in range(4)]
                    for name in pods:
                        pod = member(name, group, devices=8, scheduler=NEURON_SCHEDULER)
                        pod["metadata"].update(meta)
                        await api.create(PODS, pod)
                    results[group] = await outcome(api, group, pods)
                await until_async(lambda: len(nodes.admissions) == 8, "8 pods admitted", 30.0, 0.2)
                stop.set()
                await kubelets
                return results, list(nodes.admissions)

    results, admissions = asyncio.run(run())
    for group, (scheduled, placed) in results.items():
        assert scheduled, group
        assert len(placed) == 4, (group, placed)
        servers = {by_name[n].domain(4) for n in placed.values()}
        assert len(servers) == 1, (group, placed)
        assert None not in servers, (group, placed)
    assert all(a.valid for a in admissions), [a for a in admissions if not a.valid]
