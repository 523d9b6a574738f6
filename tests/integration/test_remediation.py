"""The remediation controller against a real kube-apiserver (tests/simcluster), run as in production
(its loops under the supervisor, leader election on a real Lease, the API server through
neuron_common.kube) under a service account holding exactly the permissions of
neuron_remediation.rbac, so those are shown to be enough.

Four Neuron nodes; an uncorrectable HBM fault on n1, then on n2 and n3, with a 25 % breaker. n1
holds two replicas of a Deployment under a PodDisruptionBudget (minAvailable 2 of its 3), a bare
pod, a DaemonSet's pod, a pod of the stack's own namespace and a pod without Neuron resources. The
controller cordons and taints n1, deletes the bare pod with an Event, evicts one replica (the budget
allows one) and is refused the other (429), and holds n2 and n3 with an Event naming the breaker.
It is stopped mid-drain and started again (a new process state: nothing in memory); it goes on from
the annotation, evicts the second replica once the first one's replacement runs elsewhere, and asks
for a new instance. Then: an admin's uncordon cancels a workflow for good; and run as its own
process, the controller serves its health and metrics and releases its Lease on SIGTERM.

STAND-IN: no kubelet runs. A pod is created bound (spec.nodeName) and its status is written Ready as
a kubelet would; an evicted or deleted pod bound to a node keeps its deletionTimestamp (the kubelet
would finish it), which is the evidence. kube-controller-manager runs with the disruption
controller alone, so the budget's status is Kubernetes' own; the first replica's replacement is
created by the test on n4, where the ReplicaSet controller and kube-scheduler would have put it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from polling import until_async
from simcluster.controlplane import ControlPlane, control_plane, free_port, k8s_bin, wait_until_ready
from skips import require

from neuron_common.kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, Api, ApiError
from neuron_health import faults
from neuron_model import node_health, remediation
from neuron_model.remediation import Phase, load
from neuron_remediation import config as remediation_config
from neuron_remediation import rbac
from neuron_remediation.app import Remediator

pytestmark = [pytest.mark.integration]

HBM = faults.BY_KIND["HBM_UNCORRECTABLE_ERROR"]
NS, STACK = "ml", "neuron-system"
NEURON = "aws.amazon.com/neuron"
PAUSE = "registry.k8s.io/pause:3.10"
NODES = ("n1", "n2", "n3", "n4")
SA = "neuron-remediation"


async def until(check: Any, what: str, timeout: float = 60.0) -> Any:
    return await until_async(check, what, timeout, 0.25, TimeoutError)


def node_object(name: str) -> dict[str, Any]:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", NEURON: "16"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated"}
    healthy = {"type": node_health.CONDITION, "status": "False", "reason": faults.HEALTHY_REASON, "message": "ok"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [ready, healthy],
            "nodeInfo": {"bootID": f"boot-{name}"},
        },
    }


def pod_object(
    name: str, node: str, *, ns: str = NS, owner: dict[str, Any] | None = None, neuron: bool = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    resources = {"limits": {NEURON: "1"}} if neuron else {}
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner, controller=True, blockOwnerDeletion=True)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": PAUSE, "resources": resources}],
        },
    }


class Cluster:
    def __init__(self, cp: ControlPlane, api: Api) -> None:
        self.cp, self.api = cp, api

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.api.create(path, obj)

    async def namespace(self, name: str) -> None:
        """A namespace with its default service account (no controller manager's token controller makes it)."""
        await self.create("/api/v1/namespaces", {"metadata": {"name": name}})
        await self.create(f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})

    async def pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A pod bound to its node, Running and Ready as its kubelet would report it."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        created = await self.create(f"/api/v1/namespaces/{ns}/pods", obj)
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        await self.api.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status}, STRATEGIC_MERGE_PATCH)
        return created

    async def fault(self, node: str, fault: faults.Fault = HBM) -> None:
        conditions = [
            {"type": node_health.CONDITION, "status": "True", "reason": fault.reason, "message": "neuron3: HBM UE"},
            {"type": node_health.ACCELERATED_HARDWARE_CONDITION, "status": "False",
             "reason": fault.accelerated_hardware_reason, "message": "neuron3"},
        ]  # fmt: skip
        await self.api.patch(
            f"/api/v1/nodes/{node}/status", {"status": {"conditions": conditions}}, STRATEGIC_MERGE_PATCH
        )

    async def node(self, name: str) -> dict[str, Any]:
        return await self.api.get(f"/api/v1/nodes/{name}")

    async def pods(self, ns: str = NS) -> dict[str, dict[str, Any]]:
        items = (await self.api.get(f"/api/v1/namespaces/{ns}/pods")).get("items") or []
        return {p["metadata"]["name"]: p for p in items}

    async def events(self, ns: str = "default") -> list[dict[str, Any]]:
        return list((await self.api.get(f"/api/v1/namespaces/{ns}/events")).get("items") or [])

    async def token_kubeconfig(self, work: Path) -> Path:
        """A kubeconfig of the controller's service account, bound to exactly rbac's rules."""
        await self.create(f"/api/v1/namespaces/{STACK}/serviceaccounts", {"metadata": {"name": SA}})
        rbac_api = "/apis/rbac.authorization.k8s.io/v1"
        subject = [{"kind": "ServiceAccount", "name": SA, "namespace": STACK}]
        await self.create(f"{rbac_api}/clusterroles", {
            "metadata": {"name": SA}, "rules": [r.as_object() for r in rbac.CLUSTER_RULES],
        })  # fmt: skip
        await self.create(f"{rbac_api}/clusterrolebindings", {
            "metadata": {"name": SA}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SA},
        })  # fmt: skip
        await self.create(f"{rbac_api}/namespaces/{STACK}/roles", {
            "metadata": {"name": SA}, "rules": [r.as_object() for r in rbac.LEASE_RULES],
        })  # fmt: skip
        await self.create(f"{rbac_api}/namespaces/{STACK}/rolebindings", {
            "metadata": {"name": SA}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
        })  # fmt: skip
        answer = await self.create(
            f"/api/v1/namespaces/{STACK}/serviceaccounts/{SA}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "sim", "cluster": {"server": self.cp.server,
                                                     "certificate-authority": str(self.cp.credentials.ca)}}],
            "users": [{"name": SA, "user": {"token": answer["status"]["token"]}}],
            "contexts": [{"name": "sa", "context": {"cluster": "sim", "user": SA}}],
        }  # fmt: skip
        path = work / "remediation.kubeconfig"
        path.write_text(json.dumps(config))
        return path


def start_disruption_controller(cp: ControlPlane) -> None:
    binary = k8s_bin() / "kube-controller-manager"
    require([] if binary.exists() else [str(binary)], "make setup", "the PodDisruptionBudget controller")
    port = free_port()
    cp.processes.start(
        "kube-controller-manager",
        [
            binary, f"--kubeconfig={cp.kubeconfig}", "--controllers=disruption", "--leader-elect=false",
            f"--secure-port={port}", "--bind-address=127.0.0.1", f"--cert-dir={cp.dir / 'kcm-certs'}",
        ],
    )  # fmt: skip
    wait_until_ready(cp.processes, "kube-controller-manager", port, "/healthz", 60, _insecure())


def _insecure() -> Any:
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@contextlib.asynccontextmanager
async def controller(kubeconfig: Path, *extra: str) -> AsyncIterator[Remediator]:
    argv = [
        f"--kubeconfig={kubeconfig}", "--listen=127.0.0.1:0", "--max-nodes=10", "--max-percent=25",
        "--resync=1s", f"--lease-namespace={STACK}", f"--keep-namespaces={STACK}",
        "--lease-duration=4s", "--renew-deadline=3s", "--retry-period=1s", *extra,
    ]  # fmt: skip
    config = remediation_config.parse(argv, env={"POD_NAME": "remediator"})
    stop = asyncio.Event()
    r = Remediator(config, stop)
    running = asyncio.create_task(r.run())
    try:
        yield r
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


def deleting(pod: dict[str, Any] | None) -> bool:
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


async def scenario(work: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with control_plane(work) as cp:
        start_disruption_controller(cp)
        api = Api.from_kubeconfig(str(cp.kubeconfig), 10)
        try:
            c = Cluster(cp, api)
            for ns in (NS, STACK):
                await c.namespace(ns)
            for name in NODES:
                await c.create("/api/v1/nodes", node_object(name))
            deployment = await c.create(f"/apis/apps/v1/namespaces/{NS}/deployments", {
                "metadata": {"name": "train"},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "train"}},
                         "template": {"metadata": {"labels": {"app": "train"}},
                                      "spec": {"containers": [{"name": "main", "image": PAUSE}]}}},
            })  # fmt: skip
            replicaset = await c.create(f"/apis/apps/v1/namespaces/{NS}/replicasets", {
                "metadata": {"name": "train-5d4f", "labels": {"app": "train"}, "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                    "uid": deployment["metadata"]["uid"], "controller": True}]},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "train"}},
                         "template": {"metadata": {"labels": {"app": "train"}},
                                      "spec": {"containers": [{"name": "main", "image": PAUSE}]}}},
            })  # fmt: skip
            rs_owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-5d4f",
                        "uid": replicaset["metadata"]["uid"]}  # fmt: skip
            daemonset = await c.create(f"/apis/apps/v1/namespaces/{NS}/daemonsets", {
                "metadata": {"name": "agent"},
                "spec": {"selector": {"matchLabels": {"app": "agent"}},
                         "template": {"metadata": {"labels": {"app": "agent"}},
                                      "spec": {"containers": [{"name": "main", "image": PAUSE}]}}},
            })  # fmt: skip
            ds_owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                        "uid": daemonset["metadata"]["uid"]}  # fmt: skip
            await c.create(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", {
                "metadata": {"name": "train"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "train"}}},
            })  # fmt: skip
            train = {"app": "train"}
            for name, node in (("train-a", "n1"), ("train-b", "n1"), ("train-c", "n2")):
                await c.pod(pod_object(name, node, owner=rs_owner, labels=train))
            await c.pod(pod_object("scratch", "n1"))  # no controller
            await c.pod(pod_object("agent-n1", "n1", owner=ds_owner, labels={"app": "agent"}))
            await c.pod(pod_object("web", "n1", owner=rs_owner, neuron=False))
            await c.pod(pod_object("detector", "n1", ns=STACK))

            async def budget_allows(n: int) -> bool:
                status = (await api.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/train")).get("status")
                return bool(status) and status.get("disruptionsAllowed") == n and status.get("currentHealthy") == 3

            await until(lambda: budget_allows(1), "the disruption controller's budget status")
            kubeconfig = await c.token_kubeconfig(work)
            for node in ("n1", "n2", "n3"):
                await c.fault(node)

            async with controller(kubeconfig) as first:
                n1 = await until(lambda: _phase(c, "n1", Phase.DRAINING), "n1 cordoned and draining")
                seen["n1_draining"] = n1
                await until(lambda: _one_evicted(c), "one replica evicted, the bare pod deleted")

                async def refused() -> bool:
                    told = [e for e in await c.events() if e["reason"] == "RemediationDrainWaiting"]
                    return any("train-" in e["message"] and "eviction refused" in e["message"] for e in told)

                await until(refused, "the other replica's eviction refused by the budget, told in an Event")

                async def breaker_told() -> list[dict[str, Any]]:
                    held = [e for e in await c.events() if e["reason"] == "RemediationHeld"]
                    return held if {e["involvedObject"]["name"] for e in held} >= {"n2", "n3"} else []

                seen["held"] = await until(breaker_told, "n2 and n3 held by the breaker")
                seen["first_blocked"] = first.metrics.registry.get_sample_value(
                    "neuron_remediation_pod_operations_total", {"operation": "evict", "outcome": "blocked"}
                )
                seen["started_events_before"] = [e for e in await c.events() if e["reason"] == "RemediationStarted"]
            seen["state_before_restart"] = load(
                (await c.node("n1"))["metadata"]["annotations"][remediation.STATE_ANNOTATION]
            )
            seen["pods_mid"] = await c.pods()

            async with controller(kubeconfig) as second:
                await until(lambda: second.synced and second.passes >= 2, "the restarted controller's passes")
                # the first replica's replacement runs elsewhere: the budget allows one more disruption
                await c.pod(pod_object("train-d", "n4", owner=rs_owner, labels=train))
                n1 = await until(
                    lambda: _phase(c, "n1", Phase.REQUESTED), "n1 drained and marked for a new instance", 90
                )
                seen["n1_requested"] = n1
                seen["pods_end"] = await c.pods()
                seen["stack_pods"] = await c.pods(STACK)
                seen["events"] = await c.events()
                seen["pod_events"] = await c.events(NS)
                seen["n2"], seen["n3"], seen["n4"] = [await c.node(n) for n in ("n2", "n3", "n4")]
                seen["second_passes"] = second.passes
        finally:
            await api.close()
    return seen


async def _phase(c: Cluster, name: str, phase: Phase) -> dict[str, Any] | None:
    node = await c.node(name)
    raw = (node["metadata"].get("annotations") or {}).get(remediation.STATE_ANNOTATION)
    return node if raw and load(raw).phase is phase else None


async def _one_evicted(c: Cluster) -> bool:
    pods = await c.pods()
    replicas = [deleting(pods.get(n)) for n in ("train-a", "train-b")]
    return replicas.count(True) == 1 and deleting(pods.get("scratch"))


def test_a_faulty_node_is_drained_within_its_budget_and_the_breaker_holds_the_others(tmp_path: Path) -> None:
    seen = asyncio.run(scenario(tmp_path))
    n1 = seen["n1_draining"]
    assert n1["spec"].get("unschedulable") is True
    assert {"key": remediation.TAINT, "value": "replace", "effect": "NoSchedule"} in n1["spec"]["taints"]

    # the budget: one replica went at once, the other was refused, the third (on n2) never touched
    mid = seen["pods_mid"]
    assert [deleting(mid[n]) for n in ("train-a", "train-b")].count(True) == 1
    assert seen["first_blocked"] >= 1
    assert not deleting(mid["train-c"])
    # the bare pod: deleted, with a Warning Event on it and one on the node
    assert deleting(mid["scratch"])
    pod_events = seen["pod_events"]
    [bare] = [e for e in pod_events if e["reason"] == "RemediationPodDeleted"]
    assert (bare["involvedObject"]["name"], bare["type"]) == ("scratch", "Warning")
    assert "kubectl drain --force" in bare["message"]
    evicted = sorted(e["involvedObject"]["name"] for e in pod_events if e["reason"] == "RemediationPodEvicted")
    assert evicted == ["train-a", "train-b"]
    events = seen["events"]
    assert any(e["reason"] == "RemediationPodDeleted" and e["involvedObject"]["name"] == "n1" for e in events)

    # what stays: the DaemonSet's pod, the stack's own, the pod without Neuron resources, the other nodes' pods
    end = seen["pods_end"]
    for name in ("agent-n1", "web", "train-c", "train-d"):
        assert not deleting(end[name]), name
    assert not deleting(seen["stack_pods"]["detector"])
    assert deleting(end["train-a"])
    assert deleting(end["train-b"])

    # the breaker: n2 and n3 wait, uncordoned, with the Event naming it
    for e in seen["held"]:
        assert "breaker: 1 of 4 Neuron nodes (25 %) already remediating, limit 25 %" in e["message"], e["message"]
        assert e["type"] == "Warning"
    for n in ("n2", "n3", "n4"):
        assert not seen[n]["spec"].get("unschedulable"), n
        assert remediation.STATE_ANNOTATION not in (seen[n]["metadata"].get("annotations") or {})

    # the restart resumed the workflow from the annotation: started once, the same start time
    [started] = [e for e in events if e["reason"] == "RemediationStarted"]
    assert started["count"] == 1
    assert seen["started_events_before"][0]["metadata"]["uid"] == started["metadata"]["uid"]
    before = seen["state_before_restart"]
    assert before.phase is Phase.DRAINING
    n1 = seen["n1_requested"]
    after = load(n1["metadata"]["annotations"][remediation.STATE_ANNOTATION])
    assert after.started == before.started
    assert (after.fault, after.rung, after.boot_id) == (HBM.kind, "replace", "boot-n1")
    request = json.loads(n1["metadata"]["annotations"][remediation.REQUEST_ANNOTATION])
    assert request["action"] == "replace"
    assert request["acceleratedHardwareReason"] == "NeuronHBMUncorrectableError"
    assert n1["spec"].get("unschedulable") is True
    assert any(e["reason"] == "ReplacementRequested" and e["involvedObject"]["name"] == "n1" for e in events)


async def _uncordon_scenario(work: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with control_plane(work) as cp:
        api = Api.from_kubeconfig(str(cp.kubeconfig), 10)
        try:
            c = Cluster(cp, api)
            await c.namespace(STACK)
            for name in NODES:
                await c.create("/api/v1/nodes", node_object(name))
            kubeconfig = await c.token_kubeconfig(work)
            await c.fault("n1")
            async with controller(kubeconfig) as r:
                await until(lambda: _phase(c, "n1", Phase.REQUESTED), "n1 (no pods) drained and marked")
                # an admin uncordons: the workflow is cancelled, the taint goes, and it is not cordoned again
                await api.patch("/api/v1/nodes/n1", {"spec": {"unschedulable": None}}, MERGE_PATCH)
                seen["cancelled"] = await until(lambda: _phase(c, "n1", Phase.CANCELLED), "the workflow cancelled")
                passes = r.passes
                await until(lambda: r.passes >= passes + 3, "three more passes")
                seen["after"] = await c.node("n1")
                seen["events"] = await c.events()
        finally:
            with contextlib.suppress(ApiError):
                await api.close()
    return seen


def test_an_admins_uncordon_cancels_the_workflow_for_good(tmp_path: Path) -> None:
    seen = _run(_uncordon_scenario(tmp_path))
    after = seen["after"]
    assert not after["spec"].get("unschedulable")
    assert not any(t["key"] == remediation.TAINT for t in after["spec"].get("taints") or [])
    assert load(after["metadata"]["annotations"][remediation.STATE_ANNOTATION]).phase is Phase.CANCELLED
    [cancelled] = [e for e in seen["events"] if e["reason"] == "RemediationCancelled"]
    assert "an admin uncordoned the node" in cancelled["message"]
    [started] = [e for e in seen["events"] if e["reason"] == "RemediationStarted"]
    assert started["count"] == 1
    held = [e for e in seen["events"] if e["reason"] == "RemediationHeld"]
    assert any("not started again" in e["message"] for e in held)


REPAIRABLE = faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"]


async def _validation_scenario(work: Path) -> dict[str, Any]:
    """--validate-after-reboot: n1, n2 and n3 drained and their reboot or new instance asked for, then
    booted again (the fault gone from the detector's conditions, as on a new boot): n1's validation
    fails, n2's passes, n3's never comes."""
    seen: dict[str, Any] = {}
    with control_plane(work) as cp:
        api = Api.from_kubeconfig(str(cp.kubeconfig), 10)
        try:
            c = Cluster(cp, api)
            await c.namespace(STACK)
            for name in NODES:
                await c.create("/api/v1/nodes", node_object(name))
            kubeconfig = await c.token_kubeconfig(work)
            for name, fault in (("n1", REPAIRABLE), ("n2", REPAIRABLE), ("n3", HBM)):
                await c.fault(name, fault)
            extra = ("--max-percent=100", "--validate-after-reboot", "--verdict-timeout=4s")
            async with controller(kubeconfig, *extra):
                for name in ("n1", "n2", "n3"):
                    await until(functools.partial(_phase, c, name, Phase.REQUESTED), f"{name} drained and marked")
                for name, verdict in (("n1", False), ("n2", True), ("n3", None)):
                    boot = f"boot-{name}-2"
                    status: dict[str, Any] = {
                        "nodeInfo": {"bootID": boot},
                        "conditions": [
                            {"type": node_health.CONDITION, "status": "False", "reason": faults.HEALTHY_REASON,
                             "message": "ok"},
                            {"type": node_health.ACCELERATED_HARDWARE_CONDITION, "status": "True",
                             "reason": node_health.ACCELERATED_HARDWARE_READY_REASON, "message": "ok"},
                        ],
                    }  # fmt: skip
                    if verdict is not None:
                        # written with the new boot: the controller still takes the `validating` step first
                        status["conditions"].append({
                            "type": remediation.VALIDATED_CONDITION, "status": str(verdict),
                            "reason": remediation.VALIDATION_PASSED_REASON if verdict
                            else remediation.VALIDATION_FAILED_REASON,
                            "message": remediation.verdict_message(boot, "passed" if verdict else "exit 3"),
                        })  # fmt: skip
                    await api.patch(f"/api/v1/nodes/{name}/status", {"status": status}, STRATEGIC_MERGE_PATCH)
                seen["validating"] = await until(lambda: _phase(c, "n3", Phase.VALIDATING), "n3 held for its verdict")

                async def released() -> dict[str, Any] | None:
                    node = await c.node("n2")
                    return None if remediation.STATE_ANNOTATION in node["metadata"].get("annotations", {}) else node

                seen["n2"] = await until(released, "n2 released on its pass")

                async def escalated(name: str) -> dict[str, Any] | None:
                    node = await _phase(c, name, Phase.REQUESTED)
                    raw = node and node["metadata"]["annotations"][remediation.STATE_ANNOTATION]
                    return node if raw and load(raw).rung == "replace" and load(raw).escalated else None

                seen["n1"] = await until(lambda: escalated("n1"), "n1 escalated on its failure")
                seen["n3"] = await until(lambda: escalated("n3"), "n3 escalated without a verdict", timeout=30)
                seen["events"] = await c.events()
        finally:
            with contextlib.suppress(ApiError):
                await api.close()
    return seen


def test_after_a_reboot_the_node_is_held_until_its_validation_then_released_or_replaced(tmp_path: Path) -> None:
    seen = _run(_validation_scenario(tmp_path))
    held = seen["validating"]
    assert held["spec"].get("unschedulable") is True
    assert any(t["key"] == remediation.TAINT for t in held["spec"].get("taints") or [])
    n2 = seen["n2"]
    assert not n2["spec"].get("unschedulable")
    assert not any(t["key"] == remediation.TAINT for t in n2["spec"].get("taints") or [])
    assert remediation.REQUEST_ANNOTATION not in n2["metadata"].get("annotations", {})
    for name in ("n1", "n3"):
        node = seen[name]
        state = load(node["metadata"]["annotations"][remediation.STATE_ANNOTATION])
        assert (state.rung, state.boot_id) == ("replace", f"boot-{name}-2")
        assert node["spec"].get("unschedulable") is True
        assert {"key": remediation.TAINT, "value": "replace", "effect": "NoSchedule"} in node["spec"]["taints"]
        request = json.loads(node["metadata"]["annotations"][remediation.REQUEST_ANNOTATION])
        assert request["action"] == "replace"
    events = seen["events"]

    def about(name: str, reason: str) -> list[str]:
        return [e["message"] for e in events if e["involvedObject"]["name"] == name and e["reason"] == reason]

    for name in ("n1", "n2", "n3"):
        assert about(name, "RemediationValidating"), name
    assert any("passed its validation (boot boot-n2-2: passed)" in m for m in about("n2", "RemediationDone"))
    assert any("validation after the reboot failed (boot boot-n1-2: exit 3)" in m
               for m in about("n1", "ReplacementRequested"))  # fmt: skip
    assert any("no validation verdict (NeuronValidated) for boot boot-n3-2 within 4s" in m
               for m in about("n3", "ReplacementRequested"))  # fmt: skip


def _run(coroutine: Any) -> dict[str, Any]:
    result: dict[str, Any] = asyncio.run(coroutine)
    return result


def _get(port: int, path: str) -> tuple[int, str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        conn.close()


def test_as_its_own_process_it_serves_health_and_releases_its_lease_on_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from polling import until as until_sync

    with control_plane(tmp_path) as cp:
        port = free_port()
        argv = [sys.executable, "-m", "neuron_remediation", f"--kubeconfig={cp.kubeconfig}",
                f"--listen=127.0.0.1:{port}", "--lease-namespace=default", "--identity=solo"]  # fmt: skip
        with open(tmp_path / "remediator.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            until_sync(lambda: _get(port, "/readyz")[0] == 200, "/readyz", 30, 0.2)
            status, body = _get(port, "/readyz")
            assert status == 200
            assert "Neuron nodes" in body
            assert _get(port, "/healthz")[0] == 200

            def leading() -> bool:
                return "neuron_remediation_leader 1.0" in _get(port, "/metrics")[1]

            until_sync(leading, "the process leading", 30, 0.2)
            metrics = _get(port, "/metrics")[1]
            assert "neuron_remediation_passes_total" in metrics
            assert 'neuron_remediation_holds_total{why="breaker"}' in metrics
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        lease = _run(_read(cp, "/apis/coordination.k8s.io/v1/namespaces/default/leases/neuron-remediation"))
    assert lease["spec"]["holderIdentity"] == "", "released on SIGTERM, so a standby takes over at once"
    text = (tmp_path / "remediator.log").read_text()
    assert "received SIGTERM" in text


async def _read(cp: ControlPlane, path: str) -> dict[str, Any]:
    api = Api.from_kubeconfig(str(cp.kubeconfig), 10)
    try:
        return await api.get(path)
    finally:
        await api.close()
