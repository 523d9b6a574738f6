"""The problem detector's admission policy on a real kube-apiserver (issue 24): with the chart's
RBAC and ValidatingAdmissionPolicy installed, a detector's pod-bound token on node-a changes its
own node's NeuronHealth condition, its own taint and cordon, and Events about node-a; it cannot
touch node-b, other conditions, labels, or anything with a token bound to no pod. The detector's
own reporter, with that token, gets everything it sends admitted."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from chart import admission
from chart.test_chart import render, sets
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import Api
from neuron_model import node_health
from neuron_problem_detector import config
from neuron_problem_detector.detector import ConditionStatus
from neuron_problem_detector.reporter import CORDON_ANNOTATION, TAINT_KEY, Reporter

pytestmark = pytest.mark.integration  # starts external processes: make integration

DETECTOR = "neuron-helm-chart-problem-detector"
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("npd-policy-cp-") as cp:
        yield cp


def condition(ctype: str, status: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": ctype, "status": status, "reason": "R", "message": "m"}]}}


def event(node: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
        "reason": "NeuronHasError_X",
        "message": "m",
        "type": "Warning",
    }


@dataclass(frozen=True)
class Tokens:
    bound: str  # to the pod detector-a on node-a
    unbound: str


@pytest.fixture(scope="module")
def tokens(apiserver: ControlPlane) -> Tokens:
    return asyncio.run(_install(apiserver))


async def _install(cp: ControlPlane) -> Tokens:
    """The chart's RBAC and admission policy, node-a and node-b, a detector pod on node-a and tokens."""
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    docs = render(
        *sets(npd__remediation__taint=True, npd__remediation__cordon=True, remediation__validateAfterReboot=True)
    )
    try:
        for doc in docs:
            if doc["kind"] in admission.PATHS and doc["metadata"]["name"].startswith(DETECTOR):
                await admin.create(admission.PATHS[doc["kind"]], doc)
        await admin.create(
            "/api/v1/namespaces/kube-system/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": DETECTOR}},
        )
        for node in ("node-a", "node-b"):
            await admin.create(
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"zone": "a"}}},
            )
            await admin.request(
                "PATCH", f"/api/v1/nodes/{node}/status", body=condition("Ready", "True"), content_type=STRATEGIC
            )
        pod = await admin.create(
            "/api/v1/namespaces/kube-system/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "detector-a"},
                "spec": {
                    "nodeName": "node-a",
                    "serviceAccountName": DETECTOR,
                    "containers": [{"name": "c", "image": "x"}],
                },
            },
        )
        tokens = f"/api/v1/namespaces/kube-system/serviceaccounts/{DETECTOR}/token"
        bound = await admin.create(
            tokens,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "detector-a",
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        )
        unbound = await admin.create(
            tokens,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
        )
        detector = as_detector(cp, bound["status"]["token"])
        await admission.until_enforced(
            lambda: status(detector, "node-b", condition("NeuronHealth", "True")), "may not change node node-b"
        )
        await detector.close()
        return Tokens(bound["status"]["token"], unbound["status"]["token"])
    finally:
        await admin.close()


def as_detector(cp: ControlPlane, token: str) -> Api:
    context = ssl.create_default_context(cafile=str(cp.credentials.ca))
    return Api(cp.server, ssl_context=context, authorization=lambda: f"Bearer {token}")


def status(api: Api, node: str, body: dict[str, Any]) -> Any:
    return api.patch(f"/api/v1/nodes/{node}/status", body, STRATEGIC)


async def _attempts(cp: ControlPlane, tokens: Tokens) -> dict[str, str]:
    detector, stranger = as_detector(cp, tokens.bound), as_detector(cp, tokens.unbound)
    try:

        def node_patch(api: Api, node: str, body: dict[str, Any]) -> Any:
            return api.request("PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE)

        taint = {
            "spec": {"taints": [{"key": "aws.amazon.com/neuron-unhealthy", "value": "true", "effect": "NoSchedule"}]}
        }
        attempts = {
            "own condition": status(detector, "node-a", condition("NeuronHealth", "True")),
            "EKS's AcceleratedHardwareReady": status(
                detector, "node-a", condition("AcceleratedHardwareReady", "False")
            ),
            "the verdict of the validation after a reboot": status(
                detector, "node-a", condition("NeuronValidated", "True")
            ),
            "the health sources' condition": status(
                detector, "node-a", condition(node_health.SOURCES_MISSING_CONDITION, "True")
            ),
            "another node's verdict": status(detector, "node-b", condition("NeuronValidated", "True")),
            "another condition type": status(detector, "node-a", condition("Ready", "False")),
            "another node's condition": status(detector, "node-b", condition("NeuronHealth", "True")),
            "a token bound to no pod": status(stranger, "node-a", condition("NeuronHealth", "True")),
            "own taint and cordon": node_patch(
                detector,
                "node-a",
                {**taint, "metadata": {"annotations": {"neuron.aws/cordoned-by": "neuron-problem-detector"}}}
                | {"spec": {**taint["spec"], "unschedulable": True}},
            ),
            "another node's taint": node_patch(detector, "node-b", taint),
            "a label": node_patch(detector, "node-a", {"metadata": {"labels": {"zone": "b"}}}),
            "another taint": node_patch(
                detector, "node-a", {"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}}
            ),
            "an Event about its node": detector.create("/api/v1/namespaces/default/events", event("node-a", "ev-a")),
            "an Event about another node": detector.create(
                "/api/v1/namespaces/default/events", event("node-b", "ev-b")
            ),
        }
        return await admission.outcomes(attempts)
    finally:
        await detector.close()
        await stranger.close()


def test_a_detector_changes_only_its_own_node(apiserver: ControlPlane, tokens: Tokens) -> None:
    outcomes = asyncio.run(_attempts(apiserver, tokens))
    allowed = {
        "own condition",
        "EKS's AcceleratedHardwareReady",
        "the verdict of the validation after a reboot",
        "the health sources' condition",
        "own taint and cordon",
        "an Event about its node",
    }
    for name, outcome in outcomes.items():
        if name in allowed:
            assert outcome == "allowed", f"{name}: {outcome}"
        else:
            assert outcome.startswith("403"), (name, outcome)
    assert (
        "only the node conditions of its rules (NeuronHealth, AcceleratedHardwareReady, NeuronHealthSourcesMissing, "
        "NeuronValidated)" in (outcomes["another condition type"])
    )
    assert "may not change node node-b" in outcomes["another node's taint"]
    assert "may not change node node-b" in outcomes["another node's verdict"]
    assert "names none" in outcomes["a token bound to no pod"]
    assert "only its own taint" in outcomes["a label"]
    assert "Events about its node only" in outcomes["an Event about another node"]


async def _report(cp: ControlPlane, tokens: Tokens) -> list[str]:
    """The detector's reporter on node-a, with remediation, through healthy, unhealthy and healthy
    again, two Events (the second a repeat: a patch of the first); what the API server then holds,
    read back as an administrator, each step."""
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    detector = as_detector(cp, tokens.bound)
    reporting = config.parse(["--node-name=node-a", "--taint", "--cordon"], env={})
    reporter = Reporter(detector, "node-a", "neuron-problem-detector", reporting)
    seen: list[str] = []

    async def step(health: str, *events: str) -> None:
        ready = "False" if health == "True" else "True"
        reporter.set_conditions(
            [
                ConditionStatus("NeuronHealth", health, f"Reason{health}", "m", 0.0),
                ConditionStatus("AcceleratedHardwareReady", ready, f"Reason{ready}", "m", 0.0, ready=True),
                # True throughout: admitted, and never the cause of a taint or cordon (the healthy steps have none)
                ConditionStatus(node_health.SOURCES_MISSING_CONDITION, "True", "R", "m", 0.0, remediates=False),
            ]
        )
        for message in events:
            reporter.event("NeuronHasError_X", message)
            assert await reporter.sync_once(), reporter.api_errors  # each Event sent before the next
        assert await reporter.sync_once(), reporter.api_errors
        assert reporter.up_to_date
        node = await admin.get("/api/v1/nodes/node-a")
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        cordoned = node["spec"].get("unschedulable", False)
        by = (node["metadata"].get("annotations") or {}).get(CORDON_ANNOTATION)
        seen.append(
            f"NeuronHealth={conditions['NeuronHealth']} AcceleratedHardwareReady={conditions['AcceleratedHardwareReady']}"
            f" Ready={conditions['Ready']} {taints} {cordoned} {by}"
            f" {node_health.SOURCES_MISSING_CONDITION}={conditions[node_health.SOURCES_MISSING_CONDITION]}"
        )

    try:
        await step("False")
        await step("True", "first", "first")
        await step("False")
        answer = await admin.get("/api/v1/namespaces/default/events")
        mine = [e for e in answer["items"] if e.get("reportingComponent") == "neuron-problem-detector"]
        seen += [f"{e['reason']} {e['involvedObject']['name']} count={e['count']}" for e in mine]
        return seen
    finally:
        await detector.close()
        await admin.close()


def test_the_detectors_own_reporter_is_admitted(apiserver: ControlPlane, tokens: Tokens) -> None:
    assert asyncio.run(_report(apiserver, tokens)) == [
        "NeuronHealth=False AcceleratedHardwareReady=True Ready=True [] False None NeuronHealthSourcesMissing=True",
        f"NeuronHealth=True AcceleratedHardwareReady=False Ready=True ['{TAINT_KEY}'] True neuron-problem-detector"
        " NeuronHealthSourcesMissing=True",
        "NeuronHealth=False AcceleratedHardwareReady=True Ready=True [] False None NeuronHealthSourcesMissing=True",
        "NeuronHasError_X node-a count=2",
    ]


def test_without_remediation_the_detector_changes_no_node() -> None:
    docs = render()
    (policy,) = [
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].startswith(DETECTOR)
    ]
    rules = {d["kind"]: d for d in docs if d["metadata"]["name"] == DETECTOR and d["kind"] == "ClusterRole"}
    (nodes,) = [r for r in rules["ClusterRole"]["rules"] if r["resources"] == ["nodes"]]
    assert nodes["verbs"] == ["get"]
    assert any("changes no Node without remediation" in v["messageExpression"] for v in policy["spec"]["validations"])


def test_the_verdict_condition_is_admitted_only_with_the_validation_after_a_reboot() -> None:
    def own(*values: str) -> str:
        (policy,) = [
            d
            for d in render(*values)
            if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].startswith(DETECTOR)
        ]
        (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "own"]
        return str(variable["expression"])

    assert "NeuronValidated" not in own()
    assert "NeuronValidated" in own(*sets(remediation__validateAfterReboot=True))
