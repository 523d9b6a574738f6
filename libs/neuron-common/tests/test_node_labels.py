"""NodeLabeler: one server-side apply per change of the set (and per refresh), owning only its labels;
an API server that refuses or is down is retried with back-off, with the set as it is then, and one
warning per outage. The clock and the waits are injected: nothing sleeps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from neuron_common.backoff import Backoff
from neuron_common.kube import ApiError
from neuron_common.node_labels import NodeLabeler

ID = "neuron.amazonaws.com/ultraserver-server-id-4"


class FakeApi:
    """Records applies; fails the next `failures` of them."""

    def __init__(self) -> None:
        self.applies: list[tuple[str, dict[str, Any], str]] = []
        self.failures = 0

    async def apply(self, path: str, body: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        if self.failures:
            self.failures -= 1
            raise ApiError(503, "the API server is shutting down")
        self.applies.append((path, dict(body), field_manager))
        return dict(body)


class Script:
    """Drives the loop: each wait advances the clock by its timeout and runs the next step."""

    def __init__(self, stop: asyncio.Event, steps: list[Any]) -> None:
        self.stop, self.steps, self.now, self.waits = stop, steps, 0.0, []

    def clock(self) -> float:
        return self.now

    async def wait(self, *events: asyncio.Event, timeout: float) -> None:
        self.waits.append(timeout)
        self.now += timeout
        if self.steps:
            self.steps.pop(0)()
        if not self.steps:
            self.stop.set()


def labeler(api: FakeApi, desired: dict[str, str], script: Script, writes: list[str]) -> NodeLabeler:
    return NodeLabeler(
        api,  # type: ignore[arg-type]
        "node-a",
        lambda: desired,
        field_manager="neuron-ultraserver-labels",
        interval=30,
        refresh=600,
        on_write=writes.append,
        clock=script.clock,
        wait=script.wait,
        backoff=Backoff(initial=1, maximum=8),
    )


async def test_applies_once_per_change_and_again_after_refresh() -> None:
    api, desired, writes, stop = FakeApi(), {ID: "aaaaaaaaaaaaaaaa"}, [], asyncio.Event()
    script = Script(stop, [lambda: None, lambda: desired.update({ID: "bbbbbbbbbbbbbbbb"}), lambda: None])
    script.steps += [lambda: None] * 20  # enough idle intervals to pass the refresh
    await labeler(api, desired, script, writes).run(stop)
    bodies = [body["metadata"]["labels"] for _, body, _ in api.applies]
    # first set, the change, then one refresh 600 s after the change: never the same set twice in between
    assert bodies == [{ID: "aaaaaaaaaaaaaaaa"}, {ID: "bbbbbbbbbbbbbbbb"}, {ID: "bbbbbbbbbbbbbbbb"}]
    path, body, manager = api.applies[0]
    assert (path, manager) == ("/api/v1/nodes/node-a", "neuron-ultraserver-labels")
    assert body["apiVersion"] == "v1"
    assert body["kind"] == "Node"
    assert body["metadata"]["name"] == "node-a"
    assert set(writes) == {"success"}


async def test_an_empty_set_is_applied_once_so_earlier_labels_are_removed() -> None:
    """The field manager owned the labels it applied before a restart: applying none removes them."""
    api, writes, stop = FakeApi(), [], asyncio.Event()
    script = Script(stop, [lambda: None] * 50)
    await labeler(api, {}, script, writes).run(stop)
    # once, and not again at each refresh: there is nothing to restore
    assert [body["metadata"]["labels"] for _, body, _ in api.applies] == [{}]
    assert script.now >= 1200


async def test_refusals_are_retried_with_backoff_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    api, desired, writes, stop = FakeApi(), {ID: "aaaaaaaaaaaaaaaa"}, [], asyncio.Event()
    api.failures = 3
    # while the API server refuses, the identity changes: the retry applies the set as it is then
    script = Script(stop, [lambda: desired.update({ID: "cccccccccccccccc"}), lambda: None, lambda: None, lambda: None])
    with caplog.at_level(logging.INFO):
        await labeler(api, desired, script, writes).run(stop)
    # growing back-off (jittered within half of each ceiling), then the interval once written
    assert [ceiling / 2 <= w <= ceiling for w, ceiling in zip(script.waits[:3], (1, 2, 4), strict=True)] == [True] * 3
    assert script.waits[3] == 30
    assert [body["metadata"]["labels"] for _, body, _ in api.applies] == [{ID: "cccccccccccccccc"}]
    assert writes == ["error", "error", "error", "success"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot label node node-a" in warnings[0].getMessage()
    assert any(r.getMessage() == "node node-a labelled" for r in caplog.records)
