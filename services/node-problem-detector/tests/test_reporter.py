"""The Event queue and remediation against an API server that answers badly (issue 24): a create
answered 409, an Event refused for ever, an expired Event, and a long run of distinct Events."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuron_problem_detector import reporter as reporter_mod
from neuron_problem_detector.detector import ConditionStatus
from neuron_problem_detector.reporter import Reporter

pytestmark = pytest.mark.asyncio


class FakeCoreApi:
    """The CoreV1Api calls the reporter makes; `refuse` maps an Event reason to the HTTP status
    its create answers with (409: it exists already)."""

    def __init__(self) -> None:
        self.api_client = client.ApiClient()
        self.created: list[str] = []  # reasons
        self.patched_events: list[str] = []
        self.node_patches: list[dict[str, Any]] = []
        self.refuse: dict[str, int] = {}
        self.expired: set[str] = set()  # Event names whose patch answers 404

    def read_node(self, name: str, **_: Any) -> Any:
        return client.V1Node(
            metadata=client.V1ObjectMeta(name=name, uid="u", resource_version="1", annotations={}),
            spec=client.V1NodeSpec(taints=[]),
            status=client.V1NodeStatus(conditions=[]),
        )

    def patch_node_status(self, *_: Any, **__: Any) -> None:
        pass

    def patch_node(self, _name: str, body: dict[str, Any], **__: Any) -> None:
        self.node_patches.append(body)

    def create_namespaced_event(self, _ns: str, event: client.CoreV1Event, **_: Any) -> None:
        status = self.refuse.get(event.reason)
        if status is not None:
            raise ApiException(status=status, reason="refused")
        self.created.append(event.reason)

    def patch_namespaced_event(self, name: str, _ns: str, _body: Any, **_: Any) -> None:
        if name in self.expired:
            raise ApiException(status=404, reason="NotFound")
        self.patched_events.append(name)


def make(api: FakeCoreApi, **kw: Any) -> Reporter:
    return Reporter(api, "node-a", "neuron-problem-detector", event_burst=1000, **kw)  # type: ignore[arg-type]


async def test_a_create_answered_409_counts_as_delivered() -> None:
    api = FakeCoreApi()
    r = make(api)
    api.refuse["Lost"] = 409  # the first create landed, its reply did not
    r.event("Lost", "reply lost")
    r.event("Next", "behind it")
    assert await r.sync_once()
    assert api.created == ["Next"]
    assert not r.pending
    assert r.failed_events == 0


async def test_an_event_refused_for_ever_is_dropped_after_bounded_tries_and_the_rest_go_on() -> None:
    api = FakeCoreApi()
    r = make(api)
    api.refuse["Forbidden"] = 403
    r.event("Forbidden", "never allowed")
    r.event("Fine", "behind it")
    for _ in range(reporter_mod.EVENT_ATTEMPTS - 1):
        assert not await r.sync_once()
        assert api.created == []
    assert await r.sync_once()
    assert api.created == ["Fine"]
    assert r.failed_events == 1
    assert not r.pending


async def test_remediation_does_not_wait_on_events() -> None:
    api = FakeCoreApi()
    r = make(api, taint=True)
    api.refuse["Forbidden"] = 403
    r.event("Forbidden", "never allowed")
    r.set_conditions([ConditionStatus("NeuronHealth", "True", "NeuronHasError_X", "x", 0.0)])
    assert not await r.sync_once()  # the Event failed ...
    (patch,) = api.node_patches  # ... but the node is tainted already
    assert patch["spec"]["taints"][0]["key"] == reporter_mod.TAINT_KEY


async def test_an_expired_event_is_created_again() -> None:
    api = FakeCoreApi()
    r = make(api)
    r.event("Again", "same message")
    assert await r.sync_once()
    (name, _, _) = r.sent[next(iter(r.sent))]
    api.expired.add(name)
    r.event("Again", "same message")
    assert await r.sync_once()
    assert api.created == ["Again", "Again"]


async def test_the_dedupe_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporter_mod, "DEDUPE_ENTRIES", 50)
    api = FakeCoreApi()
    r = make(api, max_pending=10_000)
    for i in range(500):
        r.event("Distinct", f"message {i}")
    assert await r.sync_once()
    assert len(api.created) == 500
    assert len(r.sent) == 50


async def test_a_condition_decided_while_the_patch_is_on_its_way_is_sent_next() -> None:
    """The loop keeps deciding while a status patch runs in its thread: a change it makes then was
    marked sent without being sent, until the next heartbeat (a minute by default)."""
    api = FakeCoreApi()
    r = make(api)
    sent: list[list[str]] = []
    healthy = ConditionStatus("NeuronHealth", "False", "NeuronHasNoError", "ok", 0.0)
    broken = ConditionStatus("NeuronHealth", "True", "NeuronHasError_X", "x", 1.0)

    def patch_node_status(_name: str, body: dict[str, Any], **_: Any) -> None:
        sent.append([c["reason"] for c in body["status"]["conditions"]])
        if len(sent) == 1:
            r.set_conditions([broken])  # decided while this patch is on its way

    api.patch_node_status = patch_node_status  # type: ignore[method-assign]
    r.set_conditions([healthy])
    await r.sync_once()
    assert not r.up_to_date
    await r.sync_once()
    assert sent == [["NeuronHasNoError"], ["NeuronHasError_X"]]
    assert r.up_to_date
