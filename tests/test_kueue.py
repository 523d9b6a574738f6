"""Kueue (issue 59 item 2): the real controller (`sigs.k8s.io/kueue` at the version tests/kueue/build.sh
pins, built by `make setup`) admitting Jobs by quota over `aws.amazon.com/neuron` and
`aws.amazon.com/neuroncore`, and placing them with its Topology Aware Scheduling (TAS) on AWS's
network node layers, our UltraServer label (`neuron_model.ultraserver.server_id_label(4)`) and the
hostname. The recipe's objects are tests/kueue/controller.py's; docs/scheduling.md#kueue shows them.

Real parts: etcd, kube-apiserver, kube-scheduler and kube-controller-manager (its Job and garbage
collector controllers) at the pinned release (tests/simcluster), Kueue's manager with its own CRDs
and webhooks (served from the host process by `clientConfig.url`, tests/kueue/controller.py says
how), `neuron-scheduler` and the extender. Simulated: the nodes (Node objects as a kubelet registers
them, with the device plugin's allocatable, and the UltraServer labels from the identity neuron-sim's
driver attributes give) and, in the `neuron-scheduler` test, their kubelets and device plugins. The
`topology.k8s.aws/network-node-layer-*` labels are set here as EKS sets them: the stack only reads
them.

What this asserts is what was observed on Kueue v0.17.0; a release that behaves otherwise fails it,
and the page has to change with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kueue import controller as kq
from polling import until_async
from simcluster.api import STRATEGIC, Api, ApiError
from simcluster.controlplane import control_plane, free_port, wait_until_ready
from simcluster.fleet import DEFAULT_SCHEDULER, NAMESPACE, NEURON, NodeSpec, PodSpec, SimulatedCluster, fleet
from simcluster.nodes import PODS, SimulatedNodes
from simcluster.schedulers import NEURON_SCHEDULER, extender_command, start_extender, start_scheduler
from simcluster.simulation import prepare
from skips import require

from neuron_model.placement_labels import NETWORK_NODE_LAYER_LABELS
from neuron_model.ultraserver import server_id_label
from neuron_scheduler_extender.groups import GROUP_LABEL, GROUP_SIZE_ANNOTATION

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

ULTRASERVER = server_id_label(4)
ULTRASERVER_TYPE = "trn2u.48xlarge"
JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
WORKLOADS = kq.kueue_path("workloads", namespace=NAMESPACE)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
DRA_QUOTA = "neuron.aws.com/devices"  # the quota name Kueue's deviceClassMappings give the class
DEVICE_CLASS = "neuron.aws.com"  # the chart's DeviceClass of whole devices
# Kueue's DRA gates (alpha in v0.17.0) and the mapping of the chart's device class to that quota name
DRA_CONFIG = {
    "featureGates": {"DynamicResourceAllocation": True, "DRAExtendedResources": True},
    "resources": {"deviceClassMappings": [{"name": DRA_QUOTA, "deviceClassNames": [DEVICE_CLASS]}]},
}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "scheduling.md"
# EKS's network node ids, as it writes them: every node under one layer-1, -2 and -3 network node,
# so within the flavor only the UltraServer level tells the two UltraServers apart
EKS_LAYERS = dict(zip(NETWORK_NODE_LAYER_LABELS, ("nn-8f1c2d3e4a5b6c7d8", "nn-2b3c4d5e6f7a8b9c0", "nn-5d6e7f8a9b0c1d2e3"), strict=True))  # fmt: skip


@dataclass(frozen=True)
class Cluster(SimulatedCluster):
    @property
    def whole(self) -> NodeSpec:
        return next(s for s in self.specs.values() if s.instance_type == ULTRASERVER_TYPE)


def require_kueue() -> None:
    require(kq.missing(), "make setup", f"Kueue {kq.kueue_version()}'s manager (tests/kueue/build.sh)")


async def label_as_eks(api: Api, specs: list[NodeSpec]) -> None:
    for spec in specs:
        await api.request(
            "PATCH", f"/api/v1/nodes/{spec.name}", {"metadata": {"labels": EKS_LAYERS}}, content_type=STRATEGIC
        )


async def install_recipe(api: Api, devices: int, cores: int, nodes: int) -> None:
    """The recipe: the Topology, a flavor over the UltraServer nodes, a ClusterQueue with their quota, a LocalQueue."""
    await api.create(kq.kueue_path("topologies"), kq.topology())
    await api.create(kq.kueue_path("resourceflavors"), kq.resource_flavor("trn2u", ULTRASERVER_TYPE))
    await api.create(
        kq.kueue_path("clusterqueues"), kq.cluster_queue("neuron", "trn2u", kq.device_quota(nodes, devices, cores))
    )
    await api.create(kq.kueue_path("localqueues", namespace=NAMESPACE), kq.local_queue("neuron", "neuron"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two UltraServers of 4 trn2u.48xlarge nodes (16 devices each) and 2 trn2.48xlarge nodes
    (16 devices too, outside the flavor); Kueue with the recipe over the UltraServers' 8 nodes;
    kube-scheduler, and `neuron-scheduler` with the extender."""
    require_kueue()
    command = extender_command()
    assert command is not None, "the extender's command, which make setup installs"
    specs = [*fleet(8, seed=59, ultraservers=2), *(NodeSpec(f"noise-{i}", "trn2.48xlarge", 2) for i in range(2))]
    with control_plane(tmp_path_factory.mktemp("kueue")) as cp:

        async def setup() -> None:
            async with Api(cp) as api:
                await prepare(api, specs, report_interval=30.0)
                await label_as_eks(api, specs)
                await kq.start_job_controller(cp)
                await kq.start_kueue(api, cp)
                topo = specs[0].topology
                await install_recipe(api, topo.device_count, topo.device_count * topo.cores_per_device, 8)
                start_scheduler(cp, DEFAULT_SCHEDULER)
                port = free_port()
                start_extender(cp, command, port, report_max_age=600.0)
                await asyncio.to_thread(wait_until_ready, cp.processes, "the extender", port, "/readyz", 60, None)
                start_scheduler(cp, NEURON_SCHEDULER, f"http://127.0.0.1:{port}")

        asyncio.run(setup())
        yield Cluster(cp, {s.name: s for s in specs})


# -- reading Kueue's verdicts -------------------------------------------------------------------


async def workload_of(api: Api, job: str) -> dict[str, Any] | None:
    items, _ = await api.list(WORKLOADS)
    return next((w for w in items if any(o["name"] == job for o in w["metadata"].get("ownerReferences", []))), None)


def condition(workload: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


async def admitted(api: Api, job: str, timeout: float = 60.0) -> dict[str, Any]:
    """The Job's Workload once Kueue has admitted it."""

    async def check() -> dict[str, Any] | None:
        workload = await workload_of(api, job)
        found = condition(workload, "Admitted")
        return workload if found and found["status"] == "True" else None

    return await until_async(check, f"{job}'s Workload admitted", timeout, 0.2)  # type: ignore[no-any-return]


async def refused(api: Api, job: str, timeout: float = 60.0) -> dict[str, Any]:
    """The Workload's QuotaReserved condition once Kueue has tried and not reserved quota for it."""

    async def check() -> dict[str, Any] | None:
        found = condition(await workload_of(api, job), "QuotaReserved")
        return found if found and found["status"] == "False" and found.get("message") else None

    return await until_async(check, f"Kueue's verdict on {job}", timeout, 0.2)  # type: ignore[no-any-return]


async def job_pods(api: Api, job: str) -> list[dict[str, Any]]:
    items, _ = await api.list(PODS)
    return [p for p in items if p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) == job]


async def placed(api: Api, job: str, pods: int, timeout: float = 60.0) -> dict[str, str]:
    """pod -> node once the Job's `pods` pods are all bound; each pod's node is the one Kueue's
    TAS assigned it (the nodeSelector it added on lifting the pod's scheduling gate)."""

    async def check() -> list[dict[str, Any]] | None:
        found = await job_pods(api, job)
        return found if len(found) == pods and all(p["spec"].get("nodeName") for p in found) else None

    found = await until_async(check, f"{pods} pods of {job} bound", timeout, 0.2)
    for pod in found:
        assert pod["spec"]["nodeSelector"][kq.HOSTNAME] == pod["spec"]["nodeName"], pod["spec"]
        assert not pod["spec"].get("schedulingGates"), pod["spec"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in found}


async def suspended(api: Api, job: str) -> bool:
    return bool((await api.request("GET", f"{JOBS}/{job}"))["spec"].get("suspend"))


async def delete_jobs(api: Api, *names: str) -> None:
    """The Jobs deleted, and their pods and Workloads (which the garbage collector would delete too,
    once its first sync of every API group is over: some 20 s after its start)."""
    for name in names:
        await api.request("DELETE", f"{JOBS}/{name}", {"propagationPolicy": "Background"})
        if (workload := await workload_of(api, name)) is not None:
            with contextlib.suppress(ApiError):  # gone meanwhile
                await api.request("DELETE", f"{WORKLOADS}/{workload['metadata']['name']}")

    async def gone() -> bool:
        pods = [p for p in (await api.list(PODS))[0] if p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) in names]
        for pod in pods:  # bound to a node with no kubelet: the API server waits for none
            with contextlib.suppress(ApiError):  # gone meanwhile
                await api.request("DELETE", f"{PODS}/{pod['metadata']['name']}", params={"gracePeriodSeconds": "0"})
        workloads = [await workload_of(api, n) for n in names]
        return not pods and all(w is None for w in workloads)

    await until_async(gone, f"the Jobs {names}, their pods and Workloads deleted", 60.0, 0.5)


async def clear(api: Api) -> None:
    items, _ = await api.list(JOBS)
    await delete_jobs(api, *(j["metadata"]["name"] for j in items))
    await api.request("DELETE", PODS, params={"gracePeriodSeconds": "0"})

    async def no_pods() -> bool:
        return not (await api.list(PODS))[0]

    await until_async(no_pods, "pods deleted", 30.0, 0.2)


def whole_node_job(cluster: Cluster, name: str, pods: int, queue: str = "neuron", **kw: Any) -> dict[str, Any]:
    return kq.job(name, queue, pods, {NEURON: cluster.whole.topology.device_count}, **kw)


# -- the tests ----------------------------------------------------------------------------------


def test_gangs_land_whole_on_one_ultraserver_each_and_the_third_waits_for_quota(cluster: Cluster) -> None:
    """Three Jobs of 4 whole-node pods requiring one UltraServer, in a ClusterQueue with the quota
    of the 8 nodes: the first two land each on one UltraServer, the third is not admitted (no quota
    left) and stays suspended; once the first is deleted, the third takes its UltraServer."""

    async def run() -> tuple[list[dict[str, str]], dict[str, Any], bool, int, dict[str, str], list[dict[str, Any]]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            placements, workloads = [], []
            for name in ("gang-1", "gang-2"):
                await api.create(JOBS, whole_node_job(cluster, name, 4, required=ULTRASERVER))
                workloads.append(await admitted(api, name))
                placements.append(await placed(api, name, 4))
            await api.create(JOBS, whole_node_job(cluster, "gang-3", 4, required=ULTRASERVER))
            verdict = await refused(api, "gang-3")
            waiting = await suspended(api, "gang-3")
            pods_while_waiting = len(await job_pods(api, "gang-3"))
            await delete_jobs(api, "gang-1")
            await admitted(api, "gang-3")
            third = await placed(api, "gang-3", 4)
            await clear(api)
            return placements, verdict, waiting, pods_while_waiting, third, workloads

    (first, second), verdict, waiting, pods_while_waiting, third, workloads = asyncio.run(run())
    servers = [{cluster.ultraserver(n) for n in p.values()} for p in (first, second, third)]
    assert all(len(p) == 4 and len(set(p.values())) == 4 for p in (first, second, third)), (first, second, third)
    assert all(len(s) == 1 and None not in s for s in servers), (first, second, third)
    assert servers[0] != servers[1]
    assert servers[2] == servers[0]  # the UltraServer the deleted gang freed
    # Kueue's admission: the flavor, the quota used, the TAS assignment down to the hostname level
    for workload in workloads:
        assignment = workload["status"]["admission"]["podSetAssignments"][0]
        assert assignment["flavors"] == {NEURON: "trn2u"}, assignment
        assert assignment["resourceUsage"][NEURON] == str(4 * cluster.whole.topology.device_count), assignment
        assert assignment["topologyAssignment"]["levels"] == [kq.HOSTNAME], assignment
    assert verdict["reason"] == "Pending", verdict
    assert f"insufficient unused quota for {NEURON} in flavor trn2u" in verdict["message"], verdict
    assert waiting  # created unsuspended: Kueue's webhook suspended it
    assert pods_while_waiting == 0


def test_a_gang_no_ultraserver_can_hold_waits_though_quota_would_admit_it(cluster: Cluster) -> None:
    """One node of each UltraServer taken by a pod outside Kueue: the quota still has room for 4
    nodes, but no UltraServer has 4 free. A gang requiring one UltraServer is not admitted, for
    the topology; the same gang only preferring one is admitted, across both UltraServers."""
    first_nodes: dict[str, str] = {}
    for name in sorted(cluster.specs):
        if (server := cluster.ultraserver(name)) is not None:
            first_nodes.setdefault(server, name)

    async def run() -> tuple[dict[str, Any], bool, dict[str, str]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            lone = [f"lone-{i}" for i in range(len(first_nodes))]
            for name, node in zip(lone, first_nodes.values(), strict=True):
                pod = PodSpec(name, cluster.whole.topology.device_count, 0).pod_object(DEFAULT_SCHEDULER)
                pod["spec"]["nodeSelector"] = {kq.HOSTNAME: node}
                await api.create(PODS, pod)

            async def lone_bound() -> bool:
                return all(p["spec"].get("nodeName") for p in (await api.list(PODS))[0])

            await until_async(lone_bound, "the lone pods bound", 30.0, 0.2)
            await api.create(JOBS, whole_node_job(cluster, "required", 4, required=ULTRASERVER))
            verdict = await refused(api, "required")
            await api.create(JOBS, whole_node_job(cluster, "preferred", 4, preferred=ULTRASERVER))
            await admitted(api, "preferred")
            spread = await placed(api, "preferred", 4)
            still_waiting = condition(await workload_of(api, "required"), "QuotaReserved")
            await clear(api)
            return verdict, bool(still_waiting and still_waiting["status"] == "False"), spread

    verdict, still_waiting, spread = asyncio.run(run())
    assert verdict["reason"] == "Pending", verdict
    # quota is not what stops it: the Topology is
    assert 'topology "aws-ultraserver" allows to fit only 3 out of 4 pod(s)' in verdict["message"], verdict
    assert still_waiting
    assert len(spread) == 4, spread
    assert not set(spread.values()) & set(first_nodes.values()), spread
    assert len({cluster.ultraserver(n) for n in spread.values()}) == 2, spread


def test_a_clusterqueue_too_small_refuses_admission(cluster: Cluster) -> None:
    """A second ClusterQueue with the quota of 2 nodes over the same flavor: a gang of 4 nodes is not
    admitted for quota, while one of 2 in the same queue is, on one UltraServer."""
    topo = cluster.whole.topology

    async def run() -> tuple[dict[str, Any], dict[str, str]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            await api.create(kq.kueue_path("clusterqueues"), kq.cluster_queue("small", "trn2u", kq.device_quota(2, topo.device_count, topo.device_count * topo.cores_per_device)))  # fmt: skip
            await api.create(kq.kueue_path("localqueues", namespace=NAMESPACE), kq.local_queue("small", "small"))
            await api.create(JOBS, whole_node_job(cluster, "too-big", 4, queue="small", required=ULTRASERVER))
            verdict = await refused(api, "too-big")
            await api.create(JOBS, whole_node_job(cluster, "fits", 2, queue="small", required=ULTRASERVER))
            await admitted(api, "fits")
            fits = await placed(api, "fits", 2)
            await clear(api)
            return verdict, fits

    verdict, fits = asyncio.run(run())
    assert verdict["reason"] == "Pending", verdict
    assert f"insufficient quota for {NEURON} in flavor trn2u" in verdict["message"], verdict
    assert f"> maximum capacity ({2 * cluster.whole.topology.device_count})" in verdict["message"], verdict
    assert len({cluster.ultraserver(n) for n in fits.values()} - {None}) == 1, fits


def test_kueue_tas_with_neuron_scheduler_places_valid_device_sets_on_the_ultraserver_it_chose(cluster: Cluster) -> None:
    """A Job of 8 half-node pods (8 devices each) scheduled by `neuron-scheduler`, requiring one
    UltraServer: Kueue's TAS picks the UltraServer and the node of each pod (2 to a node, by
    allocatable count); `neuron-scheduler` binds each pod to that node, and the simulated device
    plugins hand every pod a valid connected set."""
    specs = list(cluster.specs.values())
    half = cluster.whole.topology.device_count // 2

    async def run() -> tuple[dict[str, str], list[Any]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            nodes = SimulatedNodes(api, specs, report_interval=5.0)
            await nodes.register()  # the Nodes exist: their reports are written again
            stop = asyncio.Event()
            kubelets = asyncio.create_task(nodes.run(stop))
            job = kq.job("halves", "neuron", 8, {NEURON: half}, required=ULTRASERVER, scheduler=NEURON_SCHEDULER)
            await api.create(JOBS, job)
            await admitted(api, "halves")
            where = await placed(api, "halves", 8)
            await until_async(lambda: len(nodes.admissions) == 8, "8 pods admitted by the kubelets", 30.0, 0.2)
            stop.set()
            await kubelets
            await clear(api)
            return where, list(nodes.admissions)

    where, admissions = asyncio.run(run())
    assert len({cluster.ultraserver(n) for n in where.values()} - {None}) == 1, where
    assert sorted(list(where.values()).count(n) for n in set(where.values())) == [2, 2, 2, 2], where
    assert all(a.valid for a in admissions), [a for a in admissions if not a.valid]
    assert {a.node for a in admissions} == set(where.values())


def test_kueue_tas_pods_labelled_as_a_neuron_scheduler_group_never_bind(cluster: Cluster) -> None:
    """The same Job with its pods also labelled and annotated as one of the chart's UltraServer groups
    (`neuron.aws.com/ultraserver-group`): Kueue admits it and pins each pod to one node; the
    extender, offered that one node for each pod, finds no room there for the whole group and
    refuses every pod. The two do not compose: give Kueue TAS pods no group label."""
    half = cluster.whole.topology.device_count // 2
    reason = "must share one UltraServer group of 4 nodes: none of the 1 among the nodes offered has room for 8 more"

    async def run() -> list[dict[str, Any]]:
        async with Api(cluster.cp) as api:
            await clear(api)
            job = kq.job("labelled", "neuron", 8, {NEURON: half}, required=ULTRASERVER, scheduler=NEURON_SCHEDULER)
            job["spec"]["template"]["metadata"]["labels"] = {GROUP_LABEL: "labelled"}
            job["spec"]["template"]["metadata"]["annotations"][GROUP_SIZE_ANNOTATION] = "8"
            await api.create(JOBS, job)
            await admitted(api, "labelled")

            async def all_refused() -> list[dict[str, Any]] | None:
                pods = await job_pods(api, "labelled")
                refusals = [
                    c
                    for p in pods
                    for c in (p.get("status") or {}).get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False" and reason in c.get("message", "")
                ]
                return pods if len(pods) == 8 and len(refusals) == 8 else None

            pods = await until_async(all_refused, "every pod refused by the extender", 60.0, 0.2)
            await clear(api)
            return pods  # type: ignore[no-any-return]

    pods = asyncio.run(run())
    assert not [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
    assert all(p["spec"]["nodeSelector"].get(kq.HOSTNAME) for p in pods)  # Kueue did choose their nodes


def test_dra_quota_through_the_device_classes_extended_resource_name(tmp_path: Path) -> None:
    """DRA nodes (the DRA driver's ResourceSlices, the chart's DeviceClasses with
    `extendedResourceName: aws.amazon.com/neuron`), Kueue with its DRA gates and a mapping of the
    class `neuron.aws.com` to a quota name of its own: pods asking for `aws.amazon.com/neuron` are
    counted under that name, found through the DeviceClass (kube-scheduler makes their claims), and
    refused past the quota. The same pods in a flavor with the Topology are never admitted: Kueue's
    TAS counts a node's allocatable, where a DRA node has no `aws.amazon.com/neuron` (kueue#10548)."""
    require_kueue()
    specs = fleet(4, seed=59, ultraservers=1)
    devices = specs[0].topology.device_count

    async def run() -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        with control_plane(tmp_path) as cp:
            async with Api(cp) as api:
                await prepare(api, specs, report_interval=30.0, dra=True)
                await label_as_eks(api, specs)
                await kq.start_job_controller(cp)
                await kq.start_kueue(api, cp, DRA_CONFIG)
                await api.create(kq.kueue_path("topologies"), kq.topology())
                for name, topology in (("dra", None), ("dra-tas", "aws-ultraserver")):
                    await api.create(
                        kq.kueue_path("resourceflavors"), kq.resource_flavor(name, ULTRASERVER_TYPE, topology)
                    )
                    await api.create(
                        kq.kueue_path("clusterqueues"), kq.cluster_queue(name, name, {DRA_QUOTA: 2 * devices})
                    )
                    await api.create(kq.kueue_path("localqueues", namespace=NAMESPACE), kq.local_queue(name, name))
                start_scheduler(cp, DEFAULT_SCHEDULER)
                await api.create(JOBS, kq.job("dra-fits", "dra", 2, {NEURON: devices}))
                workload = await admitted(api, "dra-fits")
                where = await placed_by_dra(api, "dra-fits", 2)
                await api.create(JOBS, kq.job("dra-over", "dra", 1, {NEURON: devices}))
                verdict = await refused(api, "dra-over")
                claims, _ = await api.list(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims")
                await api.create(JOBS, kq.job("dra-tas", "dra-tas", 1, {NEURON: devices}, required=ULTRASERVER))
                tas_verdict = await refused(api, "dra-tas")
                return workload, where, verdict, claims, tas_verdict

    workload, where, verdict, claims, tas_verdict = asyncio.run(run())
    assignment = workload["status"]["admission"]["podSetAssignments"][0]
    assert assignment["resourceUsage"] == {DRA_QUOTA: str(2 * devices)}, assignment
    assert len(where) == 2, where
    assert verdict["reason"] == "Pending", verdict
    assert f"insufficient unused quota for {DRA_QUOTA} in flavor dra" in verdict["message"], verdict
    # the scheduler's claims for the extended resource, one per pod, each of a whole node's devices
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    assert len(allocated) == 2, claims
    assert all(len(c["status"]["allocation"]["devices"]["results"]) == devices for c in allocated), allocated
    # TAS finds no node with allocatable aws.amazon.com/neuron (and counts the DRA pods' requests against it)
    assert tas_verdict["reason"] == "Pending", tas_verdict
    assert 'topology "aws-ultraserver" allows to fit only' in tas_verdict["message"], tas_verdict
    assert f'excluded: resource "{NEURON}"' in tas_verdict["message"], tas_verdict


async def placed_by_dra(api: Api, job: str, pods: int, timeout: float = 60.0) -> dict[str, str]:
    async def check() -> list[dict[str, Any]] | None:
        found = await job_pods(api, job)
        return found if len(found) == pods and all(p["spec"].get("nodeName") for p in found) else None

    found = await until_async(check, f"{pods} pods of {job} bound", timeout, 0.2)
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in found}


def test_the_recipe_in_the_docs_is_the_one_tested() -> None:
    """docs/scheduling.md#kueue shows the objects these tests create (in a namespace of its own), the
    Job's Kueue fields and resources as the tests write them, and the DRA test's Configuration."""
    text = DOCS.read_text()
    start = text.index("\n## Kueue\n")
    section = text[start : text.index("\n## ", start + 1)]
    shown = [d for block in section.split("```yaml\n")[1:] for d in yaml.safe_load_all(block.split("```")[0]) if d]
    by_kind = {d["kind"]: d for d in shown if "kind" in d}
    for obj in by_kind.values():
        obj["metadata"].pop("namespace", None)
    topo = fleet(4, seed=59, ultraservers=1)[0].topology
    quota = kq.device_quota(8, topo.device_count, topo.device_count * topo.cores_per_device)
    assert by_kind["Topology"] == kq.topology()
    assert by_kind["ResourceFlavor"] == kq.resource_flavor("trn2u", ULTRASERVER_TYPE)
    assert by_kind["ClusterQueue"] == kq.cluster_queue("neuron", "trn2u", quota)
    local = kq.local_queue("neuron", "neuron")
    local["metadata"].pop("namespace")
    assert by_kind["LocalQueue"] == local
    shown_job, tested = by_kind["Job"], whole_node_job_spec(by_kind["Job"]["metadata"]["name"], topo.device_count)
    assert shown_job["metadata"]["labels"] == tested["metadata"]["labels"]
    for key in ("parallelism", "completions", "completionMode"):
        assert shown_job["spec"][key] == tested["spec"][key], key
    template, tested_template = shown_job["spec"]["template"], tested["spec"]["template"]
    assert template["metadata"] == tested_template["metadata"]
    assert [c["resources"] for c in template["spec"]["containers"]] == [
        c["resources"] for c in tested_template["spec"]["containers"]
    ]
    assert [d for d in shown if "featureGates" in d] == [DRA_CONFIG]


def whole_node_job_spec(name: str, devices: int) -> dict[str, Any]:
    return kq.job(name, "neuron", 4, {NEURON: devices}, required=ULTRASERVER)
