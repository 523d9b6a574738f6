"""The watch layer over a fake API server: list, watch, resume, relist on 410 Gone, back-off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from extender_objects import NAMES, NOW, pod_object, report_object
from fake_api import NEURON_NODES, PODS, FakeApi
from polling import until_async

from neuron_common.backoff import Backoff
from neuron_common.reflector import Reflector, Resource
from neuron_scheduler_extender.pods import PodRecord, pod_record
from neuron_scheduler_extender.state import ClusterView, report_record


class Recorder:
    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str, str]] = []  # (type, key, node)

    def replace(self, records: list[PodRecord], _: float) -> None:
        self.lists.append(sorted(r.key for r in records))

    def apply(self, event: str, record: PodRecord) -> None:
        self.events.append((event, record.key, record.node))


async def until(predicate: Callable[[], bool], what: str) -> None:
    await until_async(predicate, what, 10.0, 0.005)


@pytest.fixture
async def running() -> AsyncIterator[Callable[..., Any]]:
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def start(reflector: Reflector[Any]) -> Reflector[Any]:
        tasks.append(asyncio.create_task(reflector.run(stop)))
        return reflector

    yield start
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)


def pods_reflector(api: FakeApi, recorder: Recorder) -> Reflector[PodRecord]:
    return Reflector(
        api,
        Resource("pods", PODS),
        reduce=lambda o: pod_record(o, NAMES),
        replace=recorder.replace,
        apply=recorder.apply,
        backoff=Backoff(initial=0.001, maximum=0.01),
    )


async def test_lists_in_pages_then_watches_every_change(running: Callable[..., Any]) -> None:
    api = FakeApi()
    for name in ("a", "b", "c"):
        await api.put(PODS, pod_object(name, node="n1", devices=1))
    await api.put(PODS, pod_object("plain", node="n1"))  # no Neuron request: not kept
    await api.put(PODS, pod_object("pending", devices=1))  # not bound: the field selector leaves it out
    recorder = Recorder()
    reflector = running(pods_reflector(api, recorder))
    await until(lambda: reflector.synced, "synced")
    assert recorder.lists == [["default/a", "default/b", "default/c"]]
    await api.put(PODS, pod_object("pending", node="n2", devices=1))  # now bound: starts matching
    await api.put(PODS, pod_object("a", node="n1", devices=1, phase="Succeeded"))  # stops matching
    await until(lambda: len(recorder.events) == 2, "two events")
    assert recorder.events == [("ADDED", "default/pending", "n2"), ("DELETED", "default/a", "n1")]
    assert reflector.resource_version == str(api.rv)
    assert reflector.age() is not None


async def test_a_watch_the_server_ends_resumes_from_the_last_version(running: Callable[..., Any]) -> None:
    api = FakeApi()
    api.watch_limit = 1
    recorder = Recorder()
    reflector = running(pods_reflector(api, recorder))
    await until(lambda: reflector.synced, "synced")
    for name in ("a", "b", "c"):
        await api.put(PODS, pod_object(name, node="n1", devices=1))
    await until(lambda: len(recorder.events) == 3, "three events")
    assert [e[1] for e in recorder.events] == ["default/a", "default/b", "default/c"]
    assert reflector.lists == 1, "resumed by watching again, not by listing"


async def test_gone_lists_again(running: Callable[..., Any]) -> None:
    api = FakeApi()
    recorder = Recorder()
    reflector = running(pods_reflector(api, recorder))
    await until(lambda: reflector.synced, "synced")
    await api.put(PODS, pod_object("a", node="n1", devices=1))
    await until(lambda: len(recorder.events) == 1, "one event")
    await api.expire_watches()
    await api.put(PODS, pod_object("b", node="n1", devices=1))
    await until(lambda: reflector.lists == 2, "a second list")
    assert recorder.lists == [[], ["default/a", "default/b"]]
    assert reflector.failures == 0, "410 is not a failure: it is how the server asks for a list"


async def test_an_unreachable_server_is_retried_with_back_off_and_the_view_kept(running: Callable[..., Any]) -> None:
    api = FakeApi()
    await api.put(NEURON_NODES, report_object("n1"))
    view = ClusterView(report_max_age=120)
    api.fail_next(3)  # the first list attempts fail
    reflector = running(
        Reflector(
            api,
            Resource("neuronnodes", NEURON_NODES),
            reduce=report_record,
            replace=lambda records, _: view.replace_reports(records),
            apply=view.apply_report,
            backoff=Backoff(initial=0.001, maximum=0.01),
        )
    )
    await until(lambda: reflector.synced, "synced after the failures")
    assert reflector.failures == 3
    assert view.node("n1", NOW).refusal is None
    api.fail_next(1)  # the watch breaks after the next change
    await api.put(NEURON_NODES, report_object("n2"))
    await until(lambda: "n2" in view.reports, "n2 seen")
    await until(lambda: reflector.failures == 4, "the broken watch counted")
    await api.put(NEURON_NODES, report_object("n3"))
    await until(lambda: "n3" in view.reports, "n3 seen after the re-watch")
    assert reflector.lists == 1
    assert set(view.reports) == {"n1", "n2", "n3"}


async def test_not_synced_before_the_first_list() -> None:
    api = FakeApi()
    api.fail_next(10**6)
    reflector = pods_reflector(api, Recorder())
    stop = asyncio.Event()
    task = asyncio.create_task(reflector.run(stop))
    await until(lambda: reflector.failures >= 3, "a few failed attempts")
    assert not reflector.synced
    assert "connection refused" in reflector.last_error
    assert reflector.age() is None
    stop.set()
    await asyncio.wait_for(task, 5)
