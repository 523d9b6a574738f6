"""The Event queue and remediation against an API server that answers badly (issue 24): a create
answered 409, an Event refused for ever, an expired Event, and a long run of distinct Events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from neuron_common.kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError
from neuron_problem_detector import config
from neuron_problem_detector import reporter as reporter_mod
from neuron_problem_detector.detector import ConditionStatus
from neuron_problem_detector.reporter import Reporter

pytestmark = pytest.mark.asyncio


NODE = "/api/v1/nodes/node-a"
EVENTS = "/api/v1/namespaces/default/events"


class FakeCoreApi:
    """The neuron_common.kube.Api calls the reporter makes, by path; `refuse` maps an Event reason
    to the HTTP status its create answers with (409: it exists already)."""

    def __init__(self) -> None:
        self.created: list[str] = []  # reasons
        self.patched_events: list[str] = []
        self.node_patches: list[dict[str, Any]] = []
        self.refuse: dict[str, int] = {}
        self.expired: set[str] = set()  # Event names whose patch answers 404

    async def get(self, path: str) -> dict[str, Any]:
        assert path == NODE, path
        return {
            "metadata": {"name": "node-a", "uid": "u", "resourceVersion": "1", "annotations": {}},
            "spec": {"taints": []},
            "status": {"conditions": []},
        }

    async def patch_node_status(self, _name: str, body: Mapping[str, Any]) -> None:
        pass

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]:
        if path == f"{NODE}/status":
            assert content_type == STRATEGIC_MERGE_PATCH  # the kubelet's conditions survive
            await self.patch_node_status("node-a", body)
        elif path == NODE:
            assert content_type == MERGE_PATCH
            self.node_patches.append(dict(body))
        else:
            name = path.removeprefix(f"{EVENTS}/")
            assert name != path, path
            assert content_type == MERGE_PATCH
            if name in self.expired:
                raise ApiError(404, f'events "{name}" not found')
            self.patched_events.append(name)
        return {}

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        assert path == EVENTS, path
        assert body["involvedObject"] == {"kind": "Node", "name": "node-a", "uid": "u", "apiVersion": "v1"}
        status = self.refuse.get(body["reason"])
        if status is not None:
            raise ApiError(status, "refused")
        self.created.append(body["reason"])
        return dict(body)


def make(api: FakeCoreApi, *flags: str) -> Reporter:
    reporting = config.parse(["--node-name=node-a", *flags], env={})
    return Reporter(api, "node-a", "neuron-problem-detector", reporting, event_burst=1000)


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
    r = make(api, "--taint")
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
    r = make(api, "--max-pending-events=10000")
    for i in range(500):
        r.event("Distinct", f"message {i}")
    assert await r.sync_once()
    assert len(api.created) == 500
    assert len(r.sent) == 50


async def test_a_condition_decided_while_the_patch_is_on_its_way_is_sent_next() -> None:
    """The loop keeps deciding while a status patch is awaited: a change it makes then was marked
    sent without being sent, until the next heartbeat (a minute by default)."""
    api = FakeCoreApi()
    r = make(api)
    sent: list[list[str]] = []
    healthy = ConditionStatus("NeuronHealth", "False", "NeuronHasNoError", "ok", 0.0)
    broken = ConditionStatus("NeuronHealth", "True", "NeuronHasError_X", "x", 1.0)

    async def patch_node_status(_name: str, body: Mapping[str, Any]) -> None:
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


def while_creating(api: FakeCoreApi, meanwhile: Any) -> None:
    """`meanwhile()` runs while the first create is on its way, as the detector's other loops do."""
    real_create = api.create

    async def create(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        api.create = real_create  # type: ignore[method-assign]
        meanwhile()
        return await real_create(path, body)

    api.create = create  # type: ignore[method-assign]


async def test_a_repeat_while_its_event_is_on_its_way_is_counted() -> None:
    api = FakeCoreApi()
    r = make(api)
    while_creating(api, lambda: r.event("Repeated", "same message"))
    r.event("Repeated", "same message")
    assert await r.sync_once()
    assert await r.sync_once()
    assert api.created == ["Repeated"]
    assert len(api.patched_events) == 1  # the repeat bumped the Event's count
    assert [count for _, _, count in r.sent.values()] == [2]


async def test_an_event_queued_while_a_full_queue_sends_its_oldest_is_not_lost() -> None:
    api = FakeCoreApi()
    r = make(api, "--max-pending-events=2")
    while_creating(api, lambda: r.event("C", "third"))  # the queue is full: the oldest, on its way, goes
    r.event("A", "first")
    r.event("B", "second")
    assert await r.sync_once()
    assert api.created == ["A", "B", "C"]
    assert r.dropped_events == 0
