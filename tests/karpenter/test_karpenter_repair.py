"""Karpenter's own node repair controller acts on our `AcceleratedHardwareReady` (issue 56, section 5).

A real kube-apiserver (tests/simcluster) with Karpenter's NodePool and NodeClaim CRDs, from the
sigs.k8s.io/karpenter module the peer pins. Two NodePools of five Nodes each, every Node with its
NodeClaim linked as Karpenter links them (spec.providerID = NodeClaim status.providerID, the
`karpenter.sh/nodepool` label, status.nodeName). Each Node's conditions are written by the problem
detector's own code: its rules match a kernel log line, its DetectorState decides the conditions
and its Reporter patches them onto the Node through the API server.

- `trn2`: one Node with an uncorrectable HBM error (20 % of the pool), four healthy.
- `trn2-correlated`: one HBM error and one repairable HBM error (a reboot rung), 40 % of the pool.

Then the peer (tests/karpenter/peer: Karpenter's controller with AWS's repair policies, the
AcceleratedHardwareReady toleration cut to a few seconds) runs. It deletes the faulty NodeClaim of
`trn2`, no earlier than the toleration, stamping the termination timestamp that makes the deletion
forceful and counting the disruption in its metrics; it leaves every healthy node; and it holds
`trn2-correlated` with a NodeRepairBlocked Event, because more than 20 % of that pool is unhealthy.

STAND-IN: no kubelet and no Karpenter termination controller run. The NodeClaims carry Karpenter's
termination finalizer, so a deleted one stays, with its deletionTimestamp, as the evidence; draining
and terminating the instance (cloudProvider.Delete) are the termination controller's, not shown here.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import until_async
from prometheus_client.parser import text_string_to_metric_families
from simcluster.controlplane import ControlPlane, free_port, private_control_plane
from skips import require

from karpenter import repair_peer
from neuron_common.kube import Api, ApiError
from neuron_health import faults
from neuron_model import node_health
from neuron_problem_detector import config, rules
from neuron_problem_detector.detector import DetectorState
from neuron_problem_detector.reporter import Reporter

pytestmark = [pytest.mark.integration]

TOLERATION = 8.0  # seconds; AWS's is 10 minutes
NODECLASS = {"group": "karpenter.test.sh", "kind": "TestNodeClass", "name": "default"}
NODECLASS_LABEL = "karpenter.test.sh/testnodeclass"  # Karpenter manages a Node with its provider's NodeClass label
FINALIZER = "karpenter.sh/termination"
TERMINATION_ANNOTATION = "karpenter.sh/nodeclaim-termination-timestamp"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
HBM = faults.BY_KIND["HBM_UNCORRECTABLE_ERROR"]  # replace rung
HBM_REPAIRABLE = faults.BY_KIND["HBM_REPAIRABLE_UNCORRECTABLE_ERROR"]  # reboot rung

POOLS: dict[str, dict[str, faults.Fault | None]] = {
    "trn2": {"trn2-a": HBM, "trn2-b": None, "trn2-c": None, "trn2-d": None, "trn2-e": None},
    "trn2-correlated": {"corr-a": HBM, "corr-b": HBM_REPAIRABLE, "corr-c": None, "corr-d": None, "corr-e": None},
}


@dataclass
class Observed:
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> AcceleratedHardwareReady
    deleted_seen_at: float = 0.0  # when the test first saw trn2-a's NodeClaim deleting
    nodeclaims: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> its NodeClaim at the end
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    policies: list[dict[str, Any]] = field(default_factory=list)  # the peer's --print-policies
    log: str = ""


def kernel_line(fault: faults.Fault) -> str:
    return f"neuron: NEURON_HW_ERR={fault.kind} instance-id=i-0 hostname=h nd-id=0 nc-id=-1 serial-num=s0"


async def install_crds(admin: Api, crds: list[dict[str, Any]]) -> None:
    for crd in crds:
        await admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

        async def established(name: str = crd["metadata"]["name"]) -> bool:
            got = await admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            return any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (got.get("status") or {}).get("conditions") or []
            )

        await until_async(established, f"CRD {crd['metadata']['name']} established", 30, 0.2, TimeoutError)
    # the API server serves the new kinds a moment after Established
    await until_async(lambda: admin.get(NODECLAIMS), "nodeclaims served", 30, 0.2, TimeoutError, (ApiError,))


def nodepool(name: str) -> dict[str, Any]:
    requirements = [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"nodeClassRef": NODECLASS, "requirements": requirements}}},
    }


def labels(node: str, pool: str) -> dict[str, str]:
    return {
        "karpenter.sh/nodepool": pool,
        NODECLASS_LABEL: "default",
        "karpenter.sh/capacity-type": "on-demand",
        "node.kubernetes.io/instance-type": "trn2.48xlarge",
        "kubernetes.io/hostname": node,
    }


async def create_node_and_claim(admin: Api, node: str, pool: str) -> None:
    provider_id = f"fake:///us-west-2a/{node}"
    claim = await admin.create(
        NODECLAIMS,
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": f"{node}-claim", "labels": labels(node, pool), "finalizers": [FINALIZER]},
            "spec": {
                "nodeClassRef": NODECLASS,
                "requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": [pool]}],
            },
        },
    )
    claim["status"] = {"providerID": provider_id, "nodeName": node}
    await admin.update(f"{NODECLAIMS}/{node}-claim/status", claim)
    await admin.create(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": labels(node, pool)},
            "spec": {"providerID": provider_id},
        },
    )


async def detect(admin: Api, node: str, fault: faults.Fault | None) -> None:
    """The detector's own path from a kernel log line to the Node's conditions."""
    detector_rules = rules.default_rules()
    state = DetectorState(boot_id=f"boot-{node}")
    now = time.time()
    if fault is not None:
        matches = rules.match_message(detector_rules, kernel_line(fault))
        assert matches, fault.kind
        assert all(state.add(m, now) for m in matches), fault.kind
    reporter = Reporter(admin, node, "neuron-problem-detector", config.parse([f"--node-name={node}"], env={}))
    reporter.set_conditions(state.conditions(detector_rules, now, accelerated_hardware=True))
    assert await reporter.sync_once(), reporter.api_errors
    assert reporter.up_to_date


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("karpenter_nodeclaims")
    }


async def scenario(cp: ControlPlane, peer: Path, crds: list[dict[str, Any]], observed: Observed) -> None:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        await install_crds(admin, crds)
        for pool, nodes in POOLS.items():
            await admin.create("/apis/karpenter.sh/v1/nodepools", nodepool(pool))
            for node in nodes:
                await create_node_and_claim(admin, node, pool)
        for nodes in POOLS.values():
            for node, fault in nodes.items():
                await detect(admin, node, fault)
                got = await admin.get(f"/api/v1/nodes/{node}")
                ours = [
                    c for c in got["status"]["conditions"] if c["type"] == node_health.ACCELERATED_HARDWARE_CONDITION
                ]
                observed.conditions[node] = ours[0]

        metrics_port = free_port()
        cp.processes.start(
            "karpenter-repair-peer",
            [
                peer, f"--kubeconfig={cp.kubeconfig}", f"--accelerated-hardware-toleration={TOLERATION}s",
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
            ],
        )  # fmt: skip

        async def deleting() -> bool:
            cp.processes.check()
            claim = await admin.get(f"{NODECLAIMS}/trn2-a-claim")
            return bool(claim["metadata"].get("deletionTimestamp"))

        await until_async(deleting, "Karpenter deletes trn2-a's NodeClaim", TOLERATION + 90, 0.2, TimeoutError)
        observed.deleted_seen_at = time.time()

        async def blocked() -> list[dict[str, Any]]:
            cp.processes.check()
            answer = await admin.get("/api/v1/namespaces/default/events")
            return [e for e in answer["items"] if e["reason"] == "NodeRepairBlocked"]

        await until_async(blocked, "a NodeRepairBlocked Event", 90, 0.5, TimeoutError)
        # the healthy nodes and the held pool had as long as trn2-a, and longer, to be acted on wrongly
        await asyncio.sleep(3)
        observed.events = await blocked()
        for nodes in POOLS.values():
            for node in nodes:
                observed.nodeclaims[node] = await admin.get(f"{NODECLAIMS}/{node}-claim")
        observed.metrics = await asyncio.to_thread(scrape, metrics_port)
        observed.log = cp.processes.log_tail("karpenter-repair-peer", 200_000)
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def observed() -> Observed:
    require(repair_peer.missing(), "make setup", "Karpenter's node repair peer (tests/karpenter/build-peer.sh)")
    peer = repair_peer.cache_dir() / repair_peer.BINARY
    printed = subprocess.run([peer, "--print-policies"], check=True, capture_output=True, text=True, timeout=60)
    result = Observed(policies=json.loads(printed.stdout))
    crds = [yaml.safe_load(p.read_text()) for p in sorted((repair_peer.cache_dir() / "crds").glob("*.yaml"))]
    with private_control_plane("karpenter-repair-") as cp:
        asyncio.run(scenario(cp, peer, crds, result))
    return result


def rfc3339(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def test_the_peer_runs_the_policies_the_contract_test_reads(observed: Observed) -> None:
    # Go's time.Duration marshals as nanoseconds
    running = {(p["ConditionType"], p["ConditionStatus"], p["ReasonRegex"], p["TolerationDuration"] / 1e9, p["Action"])
               for p in observed.policies}  # fmt: skip
    from_source = {
        (p.condition_type, p.condition_status, p.reason_regex, p.toleration_seconds or repair_peer.default_accelerated_hardware_toleration(), p.action)
        for p in repair_peer.policies()
    }  # fmt: skip
    assert running == from_source


def test_the_detector_wrote_our_condition(observed: Observed) -> None:
    for nodes in POOLS.values():
        for node, fault in nodes.items():
            c = observed.conditions[node]
            if fault is None:
                assert (c["status"], c["reason"]) == ("True", node_health.ACCELERATED_HARDWARE_READY_REASON), node
            else:
                assert (c["status"], c["reason"]) == ("False", fault.accelerated_hardware_reason), node


def test_karpenter_replaces_the_node_our_condition_marks_after_the_toleration(observed: Observed) -> None:
    claim = observed.nodeclaims["trn2-a"]
    assert claim["metadata"].get("deletionTimestamp"), claim["metadata"]
    # the legacy controller stamps the termination time just before it deletes: a forceful deletion
    stamped = rfc3339(claim["metadata"]["annotations"][TERMINATION_ANNOTATION])
    transition = rfc3339(observed.conditions["trn2-a"]["lastTransitionTime"])
    assert stamped >= transition + TOLERATION, (stamped, transition)
    # Karpenter counts from lastTransitionTime, which the API server holds to the second: the test saw
    # the NodeClaim whole until then (it polls from before the peer starts)
    assert observed.deleted_seen_at >= transition + TOLERATION, (observed.deleted_seen_at, transition)
    assert "deleting unhealthy node" in observed.log
    disrupted = {dict(k[1]).get("nodepool"): v for k, v in observed.metrics.items()
                 if k[0] == "karpenter_nodeclaims_disrupted_total" and dict(k[1]).get("reason") == "unhealthy"}  # fmt: skip
    assert disrupted == {"trn2": 1.0}, observed.metrics
    unhealthy = {
        dict(k[1])["condition"]: v for k, v in observed.metrics.items() if k[0] == "karpenter_nodeclaims_unhealthy_disrupted_total"
    }  # fmt: skip
    assert unhealthy == {"accelerated_hardware_ready": 1.0}, observed.metrics


def test_karpenter_leaves_a_node_whose_condition_is_true(observed: Observed) -> None:
    for node in ("trn2-b", "trn2-c", "trn2-d", "trn2-e", "corr-c", "corr-d", "corr-e"):
        assert not observed.nodeclaims[node]["metadata"].get("deletionTimestamp"), node


def test_karpenter_holds_a_pool_more_than_20_percent_unhealthy(observed: Observed) -> None:
    for node in POOLS["trn2-correlated"]:
        assert not observed.nodeclaims[node]["metadata"].get("deletionTimestamp"), node
    held = {e["involvedObject"]["name"] for e in observed.events}
    assert held, observed.events
    assert held <= {"corr-a", "corr-b"}, observed.events
    assert all("more than 20% nodes are unhealthy in the nodepool" in e["message"] for e in observed.events)
    assert all(e["type"] == "Warning" for e in observed.events)
