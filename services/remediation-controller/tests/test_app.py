"""The controller's Node patches: conditional on the resourceVersion decided on, the other taints
kept (a Node's taints are an atomic list), the approval and request annotations cleared at the end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from neuron_common.kube import Api, news_name
from neuron_model import remediation
from neuron_model.remediation import Phase, WorkflowState
from neuron_remediation import config as config_mod
from neuron_remediation.app import Remediator
from neuron_remediation.fleet import NodeView
from neuron_remediation.planner import Action, Kind

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
STATE = WorkflowState("DMA_ERROR", "NeuronHasError_DMA_ERROR", "replace", "b", Phase.QUARANTINED, 1.0, 1.0, True)


def remediator() -> Remediator:
    config = config_mod.parse(["--no-leader-elect", "--listen=127.0.0.1:0"], env={})
    return Remediator(config, asyncio.Event(), Api("https://127.0.0.1:1"))


def test_a_start_cordons_taints_and_keeps_the_other_taints() -> None:
    node = NodeView("n", resource_version="41", taints=(OTHER,))
    action = Action(
        "n", Kind.START, "RemediationStarted", "m", state=STATE, resource_version="41", cordon=True, taint=True
    )
    body: dict[str, Any] = remediator()._patch(node, action)
    assert body["metadata"]["resourceVersion"] == "41"
    assert json.loads(body["metadata"]["annotations"][remediation.STATE_ANNOTATION])["phase"] == "quarantined"
    assert body["spec"]["unschedulable"] is True
    assert body["spec"]["taints"] == [OTHER, {"key": remediation.TAINT, "value": "replace", "effect": "NoSchedule"}]


def test_a_release_uncordons_untaints_and_clears_every_annotation() -> None:
    ours = {"key": remediation.TAINT, "value": "replace", "effect": "NoSchedule"}
    node = NodeView("n", resource_version="9", taints=(OTHER, ours), tainted=True)
    action = Action("n", Kind.RELEASE, "RemediationDone", "m", resource_version="9", cordon=False, taint=False)
    body: dict[str, Any] = remediator()._patch(node, action)
    assert body["metadata"]["annotations"] == {
        remediation.STATE_ANNOTATION: None,
        remediation.APPROVED_ANNOTATION: None,
        remediation.REQUEST_ANNOTATION: None,
    }
    assert body["spec"] == {"unschedulable": None, "taints": [OTHER]}
    alone = NodeView("n", taints=(ours,), tainted=True)
    assert remediator()._patch(alone, action)["spec"]["taints"] is None


def test_a_request_writes_its_annotation_and_leaves_the_cordon() -> None:
    request = {"action": "replace", "fault": "DMA_ERROR"}
    action = Action("n", Kind.REQUEST, "ReplacementRequested", "m", state=STATE, resource_version="3", request=request)
    body: dict[str, Any] = remediator()._patch(NodeView("n"), action)
    assert json.loads(body["metadata"]["annotations"][remediation.REQUEST_ANNOTATION]) == request
    assert "spec" not in body


def test_the_same_news_has_the_same_event_name() -> None:
    a = news_name("n1", "Node", "n1", "RemediationHeld", "breaker")
    assert a == news_name("n1", "Node", "n1", "RemediationHeld", "breaker")
    assert a != news_name("n1", "Node", "n1", "RemediationHeld", "rate limit")
    assert a.startswith("n1.")
    assert len(news_name("x" * 300, "Node", "x" * 300, "R", "m")) <= 253
