"""The extender over HTTP, as kube-scheduler calls it: JSON shaped from the Go types by hand, the
whole service wired over the fake API server (sources, leader election, binding)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from extender_objects import NOW, binding_args, extender_args, pod_object, preemption_args, report_object
from fake_api import NEURON_NODES, PODS, FakeApi
from oracles.neuron_sets import topology
from polling import until_async
from prometheus_client.parser import text_string_to_metric_families

from neuron_common.kube import ApiError
from neuron_scheduler_extender import config as config_mod
from neuron_scheduler_extender.app import Extender
from neuron_scheduler_extender.endpoints import InOrder

ONE_BAD_PER_ROW = {"unhealthy": [1, 5, 9, 13]}


@dataclass
class Running:
    api: FakeApi
    extender: Extender
    session: aiohttp.ClientSession
    base: str

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with self.session.post(f"{self.base}/{verb}", data=data) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except json.JSONDecodeError:
                return response.status, text

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(f"{self.base}{path}") as response:
            return response.status, await response.text()

    def metric(self, text: str, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        raise AssertionError(f"no sample {name}{labels}")


async def until(predicate: Callable[[], Any], what: str) -> None:
    await until_async(predicate, what, 10.0, 0.005)


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Any]]:
    started: list[tuple[asyncio.Event, asyncio.Task[int], aiohttp.ClientSession]] = []

    async def _start(api: FakeApi, *flags: str, wait_ready: bool = True) -> Running:
        cfg = config_mod.parse(["--listen=127.0.0.1:0", "--retry-period=0.05s", *flags], env={})
        stop = asyncio.Event()
        extender = Extender(cfg, stop, api=api)  # type: ignore[arg-type]
        extender.endpoints.now = lambda: NOW
        task = asyncio.create_task(extender.run())
        session = aiohttp.ClientSession()
        started.append((stop, task, session))
        await until(lambda: extender.http.bound_port, "serving")
        running = Running(api, extender, session, f"http://127.0.0.1:{extender.http.bound_port}")
        if wait_ready:

            async def ready() -> bool:
                return (await running.get("/readyz"))[0] == 200

            await until(ready, "ready")
        return running

    yield _start
    for stop, task, session in started:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await session.close()


async def cluster(*reports: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> FakeApi:
    api = FakeApi()
    for r in reports:
        await api.put(NEURON_NODES, r)
    for p in pods:
        await api.put(PODS, p)
    return api


class TestFilter:
    @pytest.mark.parametrize("cache_capable", [True, False], ids=["NodeNames", "Nodes"])
    async def test_filter_answers_in_the_form_it_was_asked(
        self, start: Callable[..., Any], cache_capable: bool
    ) -> None:
        api = await cluster(report_object("n1", **ONE_BAD_PER_ROW), report_object("n2"))
        ext = await start(api)
        pod = pod_object("big", namespace="ml", devices=8)
        status, body = await ext.post("filter", extender_args(pod, ["n1", "n2", "n3"], cache_capable=cache_capable))
        assert status == 200
        assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        assert body["Error"] == ""
        if cache_capable:
            assert body["NodeNames"] == ["n2"]
            assert body["Nodes"] is None
        else:
            assert body["NodeNames"] is None
            # the Node objects go back untouched: kube-scheduler wraps them as they are
            assert body["Nodes"]["items"] == extender_args(pod, ["n2"], cache_capable=False)["Nodes"]["items"]
        assert body["FailedNodes"] == {}
        unresolvable = body["FailedAndUnresolvableNodes"]
        assert unresolvable["n1"].startswith("no connected set of 8 free devices (free: 0,2,3,4,6,7,8,10,11,12,14,15)")
        assert unresolvable["n3"].startswith("no NeuronNode report for node n3")
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_nodes_refused_total", reason="never_fits") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_nodes_refused_total", reason="missing_report") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_request_duration_seconds_count", verb="filter") == 1

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b"{not json", "the request body is not JSON"),
            ([], "expected ExtenderArgs, a JSON object, got list"),
            ({"NodeNames": ["n1"]}, "ExtenderArgs.Pod: missing or not an object"),
            ({"Pod": {"metadata": {"name": "p"}, "spec": {}}}, "neither NodeNames (nodeCacheCapable: true) nor Nodes"),
            ({"Pod": {}, "NodeNames": "n1"}, "ExtenderArgs.NodeNames: expected a list of node names"),
            ({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}, "ExtenderArgs.Nodes.items[0].metadata.name: missing"),
            ({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"aws.amazon.com/neuron": "0.5"}}}]}},
             "NodeNames": ["n1"]}, "spec.containers[0].resources aws.amazon.com/neuron: '0.5' must be a whole number"),
        ],
        ids=["not-json", "not-an-object", "no-pod", "no-nodes", "names-not-a-list", "node-without-name", "half-a-device"],
    )  # fmt: skip
    async def test_a_malformed_request_gets_an_error_never_a_crash(
        self, start: Callable[..., Any], body: Any, message: str
    ) -> None:
        ext = await start(await cluster(report_object("n1")))
        status, answer = await ext.post("filter", body)
        assert status == 200
        assert answer["Error"].startswith("neuron-scheduler-extender: ")
        assert message in answer["Error"]
        assert answer["NodeNames"] is None
        # still serving
        status, answer = await ext.post("filter", extender_args(pod_object("p", devices=1), ["n1"]))
        assert answer["NodeNames"] == ["n1"]
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_request_errors_total", verb="filter") == 1

    async def test_a_stale_report_is_refused_with_its_age(self, start: Callable[..., Any]) -> None:
        ext = await start(await cluster(report_object("n1", age=600)))
        _, body = await ext.post("filter", extender_args(pod_object("p", devices=1), ["n1"]))
        assert body["NodeNames"] == []
        assert "the NeuronNode report of node n1 is 10m00s old" in body["FailedAndUnresolvableNodes"]["n1"]
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_reports_stale") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_reports") == 1


class TestPrioritize:
    async def test_scores_as_a_host_priority_list(self, start: Callable[..., Any]) -> None:
        api = await cluster(report_object("row", free_devices=range(4)), report_object("empty"))
        ext = await start(api)
        status, body = await ext.post("prioritize", extender_args(pod_object("p", devices=4), ["empty", "row", "gone"]))
        assert status == 200
        assert body == [{"Host": "empty", "Score": 0}, {"Host": "row", "Score": 10}, {"Host": "gone", "Score": 0}]

    async def test_a_malformed_request_is_a_400_which_the_scheduler_ignores(self, start: Callable[..., Any]) -> None:
        ext = await start(await cluster())
        status, body = await ext.post("prioritize", {"Pod": 1})
        assert status == 400
        assert body == {"error": "ExtenderArgs.Pod: missing or not an object"}


class TestPreempt:
    """ExtenderPreemptionArgs in, ExtenderPreemptionResult out (k8s.io/kube-scheduler extender/v1 types.go)."""

    async def test_victims_by_uid_that_free_a_connected_set_and_a_node_dropped(self, start: Callable[..., Any]) -> None:
        topo = topology("trn1.32xlarge")
        pods, reports = [], []
        for node in ("full", "same"):
            keys = [f"batch/{node}-{d}" for d in range(16)]
            reports.append(
                report_object(
                    node, free_devices=[], pods=keys, pod_cores={k: topo.cores_of(d) for d, k in enumerate(keys)}
                )
            )
            pods += [
                pod_object(
                    f"{node}-{d}",
                    namespace="batch",
                    node=node,
                    devices=1,
                    phase="Running",
                    priority=0 if node == "full" else 1000,
                )
                for d in range(16)
            ]
        ext = await start(await cluster(*reports, pods=tuple(pods)))
        await until(lambda: ext.extender.view.bound_to("batch/same-15"), "pods seen")
        urgent = pod_object("urgent", namespace="ml", devices=4, priority=1000)
        diagonal = {n: [f"uid-batch-{n}-{d}" for d in (0, 5, 10, 15)] for n in ("full", "same")}
        status, body = await ext.post("preempt", preemption_args(urgent, diagonal, pdb=0))
        assert status == 200
        assert set(body) == {"NodeNameToMetaVictims"}
        assert set(body["NodeNameToMetaVictims"]) == {"full"}  # "same": nothing of lower priority frees a set
        victims = body["NodeNameToMetaVictims"]["full"]
        assert victims["NumPDBViolations"] == 0
        assert {v["UID"] for v in victims["Pods"]} == {f"uid-batch-full-{d}" for d in (12, 13, 14, 15)}
        _, metrics = await ext.get("/metrics")
        total = "neuron_scheduler_extender_preemption_nodes_total"
        assert ext.metric(metrics, total, result="changed") == 1
        assert ext.metric(metrics, total, result="dropped") == 1
        assert ext.metric(metrics, total, result="kept") == 0
        assert ext.metric(metrics, "neuron_scheduler_extender_request_duration_seconds_count", verb="preempt") == 1

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({"NodeNameToMetaVictims": {}}, "ExtenderPreemptionArgs.Pod: missing"),
            ({"Pod": {}, "NodeNameToMetaVictims": []}, "expected an object of node names"),
            ({"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}, "['n1'].Pods[0]: no UID"),
        ],
    )
    async def test_a_malformed_request_is_a_400_and_nothing_is_evicted(
        self, start: Callable[..., Any], body: Any, message: str
    ) -> None:
        ext = await start(await cluster(report_object("n1")))
        status, answer = await ext.post("preempt", body)
        assert status == 400
        assert message in answer["error"]

    async def test_the_whole_pods_of_a_cache_less_scheduler_are_read_by_their_uid(
        self, start: Callable[..., Any]
    ) -> None:
        ext = await start(await cluster(report_object("n1", free_devices=range(4))))
        victim = pod_object("v", node="n1", devices=1)
        args = {
            "Pod": pod_object("p", devices=4),
            "NodeNameToVictims": {"n1": {"Pods": [victim], "NumPDBViolations": 1}},
        }
        status, body = await ext.post("preempt", args)
        # the pod fits already: kube-scheduler's victims (for what it counts) stand, as it sent them
        assert (status, body) == (
            200,
            {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-default-v"}], "NumPDBViolations": 1}}},
        )


class TestBind:
    async def test_filter_then_bind_writes_the_binding_and_counts_the_pod_at_once(
        self, start: Callable[..., Any]
    ) -> None:
        pods = (pod_object("first", devices=8), pod_object("second", devices=8))
        api = await cluster(report_object("n1", free_devices=range(8, 16)), pods=pods)
        ext = await start(api)
        for pod in pods:  # both filtered before either is bound, as kube-scheduler may do
            _, body = await ext.post("filter", extender_args(pod, ["n1"]))
            assert body["NodeNames"] == ["n1"]
        api.watch_limit = 0  # the watch shows nothing: only the extender's own memory can tell
        status, body = await ext.post("bind", binding_args(pods[0], "n1"))
        assert (status, body) == (200, {"Error": ""})
        assert api.bindings == [("default/first", "n1")]
        status, body = await ext.post("bind", binding_args(pods[1], "n1"))
        assert body["Error"] == (
            "pod default/second no longer fits node n1: 8 devices requested, only 0 devices free (free: none)"
        )
        assert api.bindings == [("default/first", "n1")]
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_pods_bound_total") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_bind_failures_total", reason="no_longer_fits") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_pods_assumed") == 1

    async def test_the_watch_confirms_the_binding(self, start: Callable[..., Any]) -> None:
        pod = pod_object("p", devices=8)
        api = await cluster(report_object("n1"), pods=(pod,))
        ext = await start(api)
        await ext.post("bind", binding_args(pod, "n1"))  # not filtered by this replica: read from the API
        await until(lambda: ext.extender.view.stats(NOW).bound_pods == 1, "the watch shows the pod bound")
        stats = ext.extender.view.stats(NOW)
        assert (stats.assumed_pods, stats.in_flight_pods) == (0, 1)
        assert len(ext.extender.view.node("n1", NOW).free.devices) == 8  # type: ignore[union-attr]

    async def test_a_failed_binding_holds_nothing(self, start: Callable[..., Any]) -> None:
        pod = pod_object("p", devices=16)
        api = await cluster(report_object("n1"), pods=(pod,))
        ext = await start(api)
        await ext.post("filter", extender_args(pod, ["n1"]))
        await api.remove(PODS, "default", "p")  # deleted meanwhile
        _, body = await ext.post("bind", binding_args(pod, "n1"))
        assert body["Error"].startswith("binding default/p to n1 failed: HTTP 404")
        assert ext.extender.view.node("n1", NOW).free.devices == frozenset(range(16))  # type: ignore[union-attr]

    async def test_an_unknown_pod_and_a_replaced_one(self, start: Callable[..., Any]) -> None:
        ext = await start(await cluster(report_object("n1"), pods=(pod_object("p", uid="new", devices=1),)))
        _, body = await ext.post("bind", {"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": "n1"})
        assert body["Error"] == 'cannot read pod default/x: HTTP 404: pods "x" not found'
        _, body = await ext.post("bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "old", "Node": "n1"})
        assert body["Error"] == "pod default/p was replaced (uid new, binding asked for old)"

    @pytest.mark.parametrize(
        ("body", "message"),
        [(b"", "not JSON"), ({"PodName": "p"}, "ExtenderBindingArgs.PodNamespace: missing"), ("[]", "got list")],
    )
    async def test_a_malformed_binding(self, start: Callable[..., Any], body: Any, message: str) -> None:
        ext = await start(await cluster())
        status, answer = await ext.post("bind", body)
        assert status == 200
        assert message in answer["Error"]


class TestBindServesOnlyItsScheduler:
    """A caller that reaches /bind must not be able to place someone else's pod (issue 24)."""

    async def test_a_pod_of_another_scheduler_is_refused(self, start: Callable[..., Any]) -> None:
        pod = pod_object("theirs", devices=1)
        pod["spec"]["schedulerName"] = "default-scheduler"
        ext = await start(await cluster(report_object("n1"), pods=(pod,)))
        _, body = await ext.post("bind", binding_args(pod, "n1"))
        assert body["Error"] == (
            "pod default/theirs is scheduled by 'default-scheduler', not 'neuron-scheduler': "
            "this extender binds only its scheduler's pods"
        )
        assert ext.api.bindings == []
        # remembered from filter too: the schedulerName comes with the request
        await ext.post("filter", extender_args(pod, ["n1"]))
        _, body = await ext.post("bind", binding_args(pod, "n1"))
        assert "this extender binds only its scheduler's pods" in body["Error"]
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_bind_failures_total", reason="foreign_scheduler") == 2

    async def test_a_pod_that_asks_for_no_neuron_resource_is_refused(self, start: Callable[..., Any]) -> None:
        pod = pod_object("plain")
        ext = await start(await cluster(report_object("n1"), pods=(pod,)))
        _, body = await ext.post("bind", binding_args(pod, "n1"))
        assert body["Error"] == "pod default/plain asks for no Neuron resource: not this extender's to bind"
        assert ext.api.bindings == []

    async def test_a_binding_without_the_pods_uid_is_refused(self, start: Callable[..., Any]) -> None:
        pod = pod_object("p", devices=1)
        ext = await start(await cluster(report_object("n1"), pods=(pod,)))
        _, body = await ext.post("bind", {**binding_args(pod, "n1"), "PodUID": ""})
        assert body["Error"] == "neuron-scheduler-extender: ExtenderBindingArgs.PodUID: missing"
        assert ext.api.bindings == []

    async def test_a_body_over_the_limit_gets_413_and_the_extender_lives_on(self, start: Callable[..., Any]) -> None:
        pod = pod_object("p", devices=1)
        ext = await start(await cluster(report_object("n1"), pods=(pod,)))
        status, text = await ext.post("bind", b"{" + b" " * (65 * 1024) + b"}")
        assert status == 413
        assert "at most 65536 bytes" in text
        status, _ = await ext.post("filter", b"[" + b"0," * (3 * 1024**2) + b"0]")
        assert status == 413
        assert (await ext.get("/healthz"))[0] == 200
        _, metrics = await ext.get("/metrics")
        for verb in ("bind", "filter"):
            assert (
                ext.metric(metrics, "neuron_scheduler_extender_refused_requests_total", verb=verb, reason="too_large")
                == 1
            )
        assert (await ext.post("bind", binding_args(pod, "n1")))[1] == {"Error": ""}


class TestReadinessAndLeadership:
    async def test_not_ready_until_listed_then_ready_as_leader(self, start: Callable[..., Any]) -> None:
        api = await cluster(report_object("n1"))
        api.fail_next(4)
        ext = await start(api, wait_ready=False)
        status, text = await ext.get("/readyz")
        assert status == 503
        assert text.startswith("listing")

        async def ready() -> bool:
            return (await ext.get("/readyz"))[0] == 200

        await until(ready, "ready")
        status, text = await ext.get("/readyz")
        assert text.startswith("leader; 1 NeuronNode reports (0 stale, 0 unreadable), 0 pods in flight")
        assert (await ext.get("/healthz"))[0] == 200
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_leader") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_view_age_seconds", source="pods") >= 0

    async def test_the_standby_forwards_to_the_leader_and_takes_over_when_it_leaves(
        self, start: Callable[..., Any]
    ) -> None:
        pods = [pod_object(f"p{i}", devices=1) for i in range(3)]
        api = await cluster(report_object("n1"), pods=tuple(pods))
        leader = await start(api, "--identity=one")
        standby = await start(api, "--identity=two")  # ready: it knows where the leader is
        status, text = await standby.get("/readyz")
        assert (status, text.split(";")[0]) == (200, f"standby, forwarding to the leader at {leader.base}")
        # a bind sent to the standby is the leader's: the leader remembers it
        assert await standby.post("bind", binding_args(pods[0], "n1")) == (200, {"Error": ""})
        assert api.bindings == [("default/p0", "n1")]
        assert leader.extender.view.bound_to("default/p0") == "n1"
        _, metrics = await standby.get("/metrics")
        assert standby.metric(metrics, "neuron_scheduler_extender_forwarded_total", verb="bind", result="relayed") == 1
        # a forwarded request is never forwarded again
        async with standby.session.post(
            f"{standby.base}/bind", json=binding_args(pods[1], "n1"), headers={"X-Neuron-Extender-Forwarded": "1"}
        ) as response:
            assert "is not the leader and the leader at" in (await response.json())["Error"]
        # the leader leaves and releases the lease: the standby takes over at once
        leader.extender.stop.set()

        async def leading() -> bool:
            return standby.extender.leader.leading

        await until(leading, "the standby leads")
        assert await standby.post("bind", binding_args(pods[2], "n1")) == (200, {"Error": ""})
        assert api.bindings[-1] == ("default/p2", "n1")

    async def test_a_standby_that_cannot_reach_the_leader_answers_filter_and_refuses_bind(
        self, start: Callable[..., Any]
    ) -> None:
        pod = pod_object("p", devices=1)
        api = await cluster(report_object("n1"), pods=(pod,))
        leader = await start(api, "--identity=one")
        standby = await start(api, "--identity=two")
        await leader.extender.http.stop()  # alive and leading, but unreachable
        _, body = await standby.post("filter", extender_args(pod, ["n1"]))
        assert body["NodeNames"] == ["n1"]
        _, body = await standby.post("bind", binding_args(pod, "n1"))
        assert body["Error"] == (
            f"this neuron-scheduler-extender replica is not the leader and the leader at {leader.base} did not answer; "
            "retrying"
        )
        assert api.bindings == []
        _, metrics = await standby.get("/metrics")
        assert standby.metric(metrics, "neuron_scheduler_extender_forwarded_total", verb="filter", result="failed") == 1


async def test_nothing_is_lost_on_restart(start: Callable[..., Any]) -> None:
    """A new process rebuilds everything from the API server: the pod it bound before is counted."""
    pod = pod_object("p", devices=8)
    api = await cluster(report_object("n1", free_devices=range(8)), pods=(pod,))
    first = await start(api)
    await first.post("bind", binding_args(pod, "n1"))
    first.extender.stop.set()
    second = await start(api)
    _, body = await second.post("filter", extender_args(pod_object("q", devices=8), ["n1"]))
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"]["n1"] == "8 devices requested, only 0 devices free (free: none)"


class TestBindingsInOrder:
    async def test_a_nodes_bindings_reach_the_api_server_in_the_order_decided(self) -> None:
        """The view simulates a node's pods in flight in binding order: a second binding to the node
        must not land before the first, however slow the first is; other nodes are not held up."""
        queue = InOrder()
        release_first = asyncio.Event()
        written: list[str] = []

        async def write(name: str, wait: asyncio.Event | None = None) -> None:
            if wait is not None:
                await wait.wait()
            written.append(name)

        first = asyncio.create_task(queue.run("n1", lambda: write("first", release_first)))
        second = asyncio.create_task(queue.run("n1", lambda: write("second")))
        elsewhere = asyncio.create_task(queue.run("n2", lambda: write("elsewhere")))
        await elsewhere
        for _ in range(5):
            await asyncio.sleep(0)
        assert written == ["elsewhere"]  # the second waits for the first, n2 did not
        release_first.set()
        await asyncio.gather(first, second)
        assert written == ["elsewhere", "first", "second"]
        assert not queue.busy

    async def test_bindings_of_one_shape_decided_in_a_row_are_written_at_once(self) -> None:
        """Identical requests get the same sets in any order: they need not wait for each other;
        a different shape waits for all before it, and the same shape after it waits for it."""
        queue = InOrder()
        releases = {name: asyncio.Event() for name in ("a1", "a2", "b", "a3")}
        started: list[str] = []

        async def write(name: str) -> None:
            started.append(name)
            await releases[name].wait()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = [
            asyncio.create_task(queue.run("n1", lambda n=name: write(n), shape))
            for name, shape in (("a1", "one core"), ("a2", "one core"), ("b", "one device"), ("a3", "one core"))
        ]
        await settle()
        assert started == ["a1", "a2"]  # the wave of two; b waits for both
        releases["a1"].set()
        await settle()
        assert started == ["a1", "a2"]
        releases["a2"].set()
        await settle()
        assert started == ["a1", "a2", "b"]  # a3 is a wave of its own after b
        releases["b"].set()
        await settle()
        assert started == ["a1", "a2", "b", "a3"]
        releases["a3"].set()
        await asyncio.gather(*tasks)
        assert not queue.busy

    async def test_a_failed_binding_does_not_block_the_next(self) -> None:
        queue = InOrder()

        async def fail() -> None:
            raise ApiError(500, "etcd timed out")

        written: list[str] = []

        async def write() -> None:
            written.append("next")

        failing = asyncio.create_task(queue.run("n1", fail))
        following = asyncio.create_task(queue.run("n1", write))
        with pytest.raises(ApiError):
            await failing
        await following
        assert written == ["next"]
        assert not queue.busy


async def test_every_profile_name_of_the_second_scheduler_is_bound(start: Callable[..., Any]) -> None:
    """AWS's pods say `schedulerName: my-scheduler`: with the chart's additional name they bind too."""
    aws_pod = pod_object("aws-style", devices=1)
    aws_pod["spec"]["schedulerName"] = "my-scheduler"
    api = await cluster(report_object("n1"), pods=(aws_pod,))
    ext = await start(api, "--scheduler-name=neuron-scheduler,my-scheduler")
    status, body = await ext.post("bind", binding_args(aws_pod, "n1"))
    assert (status, body) == (200, {"Error": ""})
    assert api.bindings == [("default/aws-style", "n1")]


class TestUltraServerGroups:
    async def test_a_group_over_http_reserves_binds_inside_and_a_malformed_one_is_an_error(
        self, start: Callable[..., Any]
    ) -> None:
        from test_groups import ALL, fleet, lws_pod

        pods = tuple(lws_pod(f"llama-{i}") for i in range(2))
        api = await cluster(*fleet(), pods=pods)
        ext = await start(api)
        _, body = await ext.post("filter", extender_args(pods[0], ALL))
        assert body["NodeNames"] == ["a-0", "a-1", "a-2", "a-3"]
        assert "placed on UltraServer" in body["FailedAndUnresolvableNodes"]["b-0"]
        status, body = await ext.post("bind", binding_args(pods[0], "a-0"))
        assert (status, body) == (200, {"Error": ""})
        _, body = await ext.post("bind", binding_args(pods[1], "b-0"))
        assert "is placed on UltraServer aaaaaaaaaaaaaaa0" in body["Error"]
        _, metrics = await ext.get("/metrics")
        assert ext.metric(metrics, "neuron_scheduler_extender_group_reservations") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_groups_partial") == 1
        assert ext.metric(metrics, "neuron_scheduler_extender_nodes_refused_total", reason="group_elsewhere") == 6
        bad = lws_pod("bad-0")
        bad["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] = "many"
        _, body = await ext.post("filter", extender_args(bad, ALL))
        assert "annotation leaderworkerset.sigs.k8s.io/size: 'many' is not a number of pods" in body["Error"]
