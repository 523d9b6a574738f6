"""Issue 26 item 6: a group whose UltraServer has an unhealthy node is degraded; Events once per
transition; the whole group evicted when asked."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from extender_objects import NAMES, NOW, A, B, lws_pod, pod_object, report_object, trn2u_identity, view_of
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_common.kube import ApiError
from neuron_scheduler_extender import decisions
from neuron_scheduler_extender.failures import (
    CONDITION,
    DEGRADED_REASON,
    EVICTED_REASON,
    RECOVERED_REASON,
    TAINT_KEY,
    FailureMemory,
    GroupPlacement,
    GroupPod,
    NodeHealth,
    degraded_groups,
    node_failure,
    node_health,
    plan,
    retry_event,
    retry_eviction,
)
from neuron_scheduler_extender.group_health import GroupHealthMonitor, NodeHealthIndex
from neuron_scheduler_extender.groups import (
    GROUP_LABEL,
    GROUP_SIZE_ANNOTATION,
    group_request,
)
from neuron_scheduler_extender.metrics import Metrics
from neuron_scheduler_extender.pods import neuron_request
from neuron_scheduler_extender.state import ClusterView


def cluster(
    *, unhealthy: dict[str, tuple[int, ...]] | None = None, pods: list[dict[str, Any]] | None = None
) -> ClusterView:
    """UltraServers A (nodes a-0..3) and B, a plain node; the LWS group g1 on a-0..a-3 unless `pods`."""
    unhealthy = unhealthy or {}
    reports = [
        report_object(
            f"{s}-{i}", "trn2u.48xlarge", ultraserver=trn2u_identity(server, i), unhealthy=unhealthy.get(f"{s}-{i}", ())
        )
        for s, server in (("a", A), ("b", B))
        for i in range(4)
    ]
    reports.append(report_object("plain", unhealthy=unhealthy.get("plain", ())))
    if pods is None:
        pods = [lws_pod(f"llama-{i}", node=f"a-{i}", phase="Running") for i in range(4)]
    return view_of(*reports, pods=pods)


def node(
    name: str, *, condition: str | None = None, taint: bool = False, reason: str = "NeuronHwError"
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if condition is not None:
        conditions.append({"type": CONDITION, "status": condition, "reason": reason, "message": "device 3: SRAM"})
    taints = [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}] if taint else []
    taints.append({"key": "other", "effect": "NoSchedule"})
    return {"metadata": {"name": name}, "spec": {"taints": taints}, "status": {"conditions": conditions}}


def health(*nodes: dict[str, Any]) -> dict[str, NodeHealth]:
    found = (node_health(n) for n in nodes)
    return {h.node: h for h in found if h is not None}


class TestNodeHealth:
    def test_the_condition_true_is_unhealthy_with_its_reason_and_message(self) -> None:
        h = node_health(node("a-0", condition="True"))
        assert h == NodeHealth("a-0", "NeuronHwError: device 3: SRAM", False)
        assert h.unhealthy

    def test_the_condition_false_or_absent_and_other_taints_are_healthy(self) -> None:
        for obj in (node("a-0", condition="False"), node("a-0"), node("a-0", condition="Unknown")):
            h = node_health(obj)
            assert h is not None
            assert not h.unhealthy

    def test_the_problem_detectors_taint_is_unhealthy(self) -> None:
        h = node_health(node("a-0", taint=True))
        assert h == NodeHealth("a-0", "", True)
        assert h.unhealthy

    @pytest.mark.parametrize("obj", [{}, {"metadata": {}}, {"metadata": {"name": ""}}, {"metadata": "x"}])
    def test_a_node_without_a_name_is_nothing(self, obj: dict[str, Any]) -> None:
        assert node_health(obj) is None

    def test_malformed_fields_are_read_as_healthy(self) -> None:
        h = node_health({"metadata": {"name": "n"}, "spec": "x", "status": {"conditions": ["x", None]}})
        assert h == NodeHealth("n")

    def test_the_failure_says_each_thing_wrong(self) -> None:
        view = cluster(unhealthy={"a-1": (3, 5)})
        both = NodeHealth("a-1", "NeuronHwError: x", True)
        assert node_failure(view.reports["a-1"], both) == (
            f"condition {CONDITION}=True (NeuronHwError: x); taint {TAINT_KEY}; "
            "unhealthy devices 3, 5 in its NeuronNode report"
        )
        assert node_failure(view.reports["a-0"], None) == ""
        assert node_failure(None, NodeHealth("x")) == ""


def linked_cluster(unfit_node: str, devices: list[int], pods: list[dict[str, Any]] | None = None) -> ClusterView:
    """`cluster()`, with the firmware of `unfit_node` listing a link of `devices` failing."""
    reports = []
    for s, server in (("a", A), ("b", B)):
        for i in range(4):
            obj = report_object(f"{s}-{i}", "trn2u.48xlarge", ultraserver=trn2u_identity(server, i))
            if obj["metadata"]["name"] == unfit_node:
                obj["status"]["multiNodeUnfitDevices"] = devices
            reports.append(obj)
    if pods is None:
        pods = [lws_pod(f"llama-{i}", node=f"a-{i}", phase="Running") for i in range(4)]
    return view_of(*reports, pods=pods)


class TestFailingLinks:
    """Issue 57: a failing link keeps the node's devices in service and its UltraServer group from being chosen."""

    def test_a_failing_link_is_a_failure_for_groups_and_no_unhealthy_device(self) -> None:
        view = linked_cluster("a-1", [6])
        report = view.reports["a-1"]
        assert report.multi_node_unfit == {6}
        assert report.unhealthy_devices == frozenset()  # the node's own work is unaffected
        assert node_failure(report, None) == (
            "failing link on device 6 (unfit for multi-node work) in its NeuronNode report"
        )

    def test_the_group_over_it_is_degraded(self) -> None:
        view = linked_cluster("a-2", [0, 1])
        (group,) = degraded_groups(view.group_placements(), view.reports, {}).values()
        assert group.group.ultraserver == A
        assert [(f.node, f.what) for f in group.failures] == [
            ("a-2", "failing link on devices 0, 1 (unfit for multi-node work) in its NeuronNode report")
        ]


class TestDegradedGroups:
    def test_a_healthy_ultraserver_degrades_nothing(self) -> None:
        view = cluster()
        assert degraded_groups(view.group_placements(), view.reports, {}) == {}

    def test_an_unhealthy_device_on_a_node_of_the_group_degrades_it(self) -> None:
        view = cluster(unhealthy={"a-2": (7,)})
        (group,) = degraded_groups(view.group_placements(), view.reports, {}).values()
        assert group.group.name == "LeaderWorkerSet default/llama group 1"
        assert group.group.ultraserver == A
        assert [p.key for p in group.group.pods] == [f"default/llama-{i}" for i in range(4)]
        assert [(f.node, f.runs_group) for f in group.failures] == [("a-2", True)]
        assert group.message() == (
            f"LeaderWorkerSet default/llama group 1 on UltraServer {A} is degraded: node a-2 (runs pods of the "
            "group): unhealthy device 7 in its NeuronNode report"
        )

    def test_a_node_of_its_ultraserver_without_a_pod_of_the_group_degrades_it_too(self) -> None:
        pods = [lws_pod(f"llama-{i}", node=f"a-{i}", size=2, phase="Running") for i in range(2)]
        view = cluster(pods=pods)
        (group,) = degraded_groups(
            view.group_placements(), view.reports, health(node("a-3", condition="True"))
        ).values()
        assert [(f.node, f.runs_group) for f in group.failures] == [("a-3", False)]
        assert "node a-3 (no pod of the group): condition NeuronHealth=True" in group.message()

    def test_other_ultraservers_and_plain_nodes_do_not_matter(self) -> None:
        view = cluster(unhealthy={"b-0": (1,), "plain": (0,)})
        unhealthy = health(node("b-1", condition="True"), node("plain", taint=True))
        assert degraded_groups(view.group_placements(), view.reports, unhealthy) == {}

    def test_the_condition_or_the_taint_degrade_it(self) -> None:
        view = cluster()
        for obj in (node("a-0", condition="True"), node("a-0", taint=True)):
            assert set(degraded_groups(view.group_placements(), view.reports, health(obj))) == {
                "default/leaderworkerset.sigs.k8s.io/group-key=hash-g1"
            }

    def test_a_group_on_nodes_of_no_ultraserver_watches_its_own_nodes(self) -> None:
        labels = {GROUP_LABEL: "train"}
        pods = [pod_object("t-0", devices=1, node="plain", labels=labels, annotations={GROUP_SIZE_ANNOTATION: "2"})]
        view = cluster(pods=pods, unhealthy={"plain": (2,)})
        (group,) = degraded_groups(view.group_placements(), view.reports, {}).values()
        assert group.group.ultraserver == ""
        assert group.group.nodes == ("plain",)
        assert " on its UltraServer is degraded" in group.message()

    def test_pods_of_no_group_are_not_groups(self) -> None:
        view = cluster(pods=[pod_object("x", devices=1, node="a-0")], unhealthy={"a-0": (0,)})
        assert view.group_placements() == []

    def test_a_very_long_message_is_cut(self) -> None:
        view = cluster()
        bad = {f"a-{i}": NodeHealth(f"a-{i}", "x" * 500, True) for i in range(4)}
        (group,) = degraded_groups(view.group_placements(), view.reports, bad).values()
        assert len(group.message()) == 1024
        assert group.message().endswith("...")


def pods(n: int, prefix: str = "p") -> tuple[GroupPod, ...]:
    return tuple(GroupPod(f"ns/{prefix}-{i}", f"uid-{prefix}-{i}", f"a-{i}") for i in range(n))


def degraded(*failing: str, members: tuple[GroupPod, ...] | None = None, key: str = "g") -> dict[str, Any]:
    group = GroupPlacement(
        key, f"group {key}", A, members if members is not None else pods(4), ("a-0", "a-1", "a-2", "a-3")
    )
    health_ = {n: NodeHealth(n, "bad") for n in failing}
    return degraded_groups([group], {}, health_)


class TestPlan:
    def test_each_pod_is_told_once_per_transition(self) -> None:
        memory = FailureMemory()
        first = plan(degraded("a-1"), memory, evict=False)
        assert [(e.pod.key, e.reason, e.warning) for e in first.events] == [
            (f"ns/p-{i}", DEGRADED_REASON, True) for i in range(4)
        ]
        assert "node a-1" in first.events[0].message
        assert first.evictions == ()
        assert plan(degraded("a-1"), memory, evict=False).events == ()  # a resync is no transition

    def test_a_new_failure_is_a_new_transition(self) -> None:
        memory = FailureMemory()
        plan(degraded("a-1"), memory, evict=False)
        again = plan(degraded("a-1", "a-2"), memory, evict=False)
        assert len(again.events) == 4
        assert "node a-2" in again.events[0].message

    def test_a_pod_that_joins_a_degraded_group_is_told(self) -> None:
        memory = FailureMemory()
        plan(degraded("a-1", members=pods(3)), memory, evict=False)
        later = plan(degraded("a-1", members=pods(4)), memory, evict=False)
        assert [e.pod.key for e in later.events] == ["ns/p-3"]

    def test_recovery_is_told_once_as_normal(self) -> None:
        memory = FailureMemory()
        plan(degraded("a-1"), memory, evict=False)
        healed = plan({}, memory, evict=False)
        assert [(e.pod.key, e.reason, e.warning) for e in healed.events] == [
            (f"ns/p-{i}", RECOVERED_REASON, False) for i in range(4)
        ]
        assert plan({}, memory, evict=False).events == ()
        assert memory == FailureMemory()

    def test_eviction_only_when_asked_each_pod_once(self) -> None:
        memory = FailureMemory()
        first = plan(degraded("a-1"), memory, evict=True)
        assert [p.key for p, _ in first.evictions] == [f"ns/p-{i}" for i in range(4)]
        assert plan(degraded("a-1", "a-2"), memory, evict=True).evictions == ()

    def test_a_failed_eviction_or_event_is_tried_again(self) -> None:
        memory = FailureMemory()
        first = plan(degraded("a-1"), memory, evict=True)
        retry_eviction(memory, first.evictions[0][0])
        retry_event(memory, first.events[2])
        second = plan(degraded("a-1"), memory, evict=True)
        assert [p.key for p, _ in second.evictions] == ["ns/p-0"]
        assert [e.pod.key for e in second.events] == ["ns/p-2"]

    def test_gone_pods_are_forgotten(self) -> None:
        memory = FailureMemory()
        plan(degraded("a-1"), memory, evict=True)
        plan(degraded("a-1", members=pods(4, "q")), memory, evict=True)
        assert memory.evicted == {f"uid-q-{i}" for i in range(4)}

    def test_groups_are_independent(self) -> None:
        memory = FailureMemory()
        both = {**degraded("a-1", key="g1"), **degraded("a-1", key="g2", members=pods(2, "q"))}
        assert len(plan(both, memory, evict=False).events) == 6
        assert [e.reason for e in plan(degraded("a-1", key="g1"), memory, evict=False).events] == [RECOVERED_REASON] * 2

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(
            st.tuples(st.frozensets(st.sampled_from(["a-0", "a-1", "a-2", "a-3"])), st.integers(1, 4)), max_size=12
        )
    )
    def test_every_transition_acts_exactly_once(self, rounds: list[tuple[frozenset[str], int]]) -> None:
        """Over any sequence of rounds: a pod is told of a failure set exactly when that set differs
        from the last round's for its group (or it is new), each pod evicted once, recoveries told once."""
        memory = FailureMemory()
        before: frozenset[str] = frozenset()
        before_pods: tuple[GroupPod, ...] = ()
        evicted: set[str] = set()
        generation = [0] * 4  # a pod that leaves the group and comes back is a new pod: a new UID
        for failing, n in rounds:
            for i in range(n, 4):
                generation[i] += 1
            members = tuple(GroupPod(f"ns/p-{i}", f"uid-p-{i}-{generation[i]}", f"a-{i}") for i in range(n))
            now = degraded(*sorted(failing), members=members) if failing else {}
            actions = plan(now, memory, evict=True, live=[p.uid for p in members])
            told = [e.pod.uid for e in actions.events if e.reason == DEGRADED_REASON]
            recovered = [e.pod.uid for e in actions.events if e.reason == RECOVERED_REASON]
            if not failing:
                assert told == []
                assert actions.evictions == ()
                assert recovered == ([p.uid for p in before_pods] if before else [])
            elif failing != before:
                assert told == [p.uid for p in members]
                assert recovered == []
            else:
                assert told == [p.uid for p in members if p not in before_pods]
            for pod, _ in actions.evictions:
                assert pod.uid not in evicted
                evicted.add(pod.uid)
            if failing:
                assert {p.uid for p in members} <= evicted
            before, before_pods = failing, (members if failing else ())


class RecordingApi:
    """The API server's answers to the monitor's calls: an object's name is taken once (409 after)."""

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any], str]] = []
        self.fail = fail or {}

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        for part, status in self.fail.items():
            if part in path:
                raise ApiError(status, "refused")
        name = f"{path}/{body['metadata']['name']}"
        if name in self.stored:
            raise ApiError(409, "already exists")
        self.created.append((path, dict(body)))
        self.stored[name] = dict(body)
        return dict(body)

    async def get(self, path: str) -> dict[str, Any]:
        if path not in self.stored:
            raise ApiError(404, "not found")
        return self.stored[path]

    async def patch(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        self.patches.append((path, dict(body), content_type))
        self.stored[path] = {**self.stored[path], **body}
        return self.stored[path]


def monitor(api: RecordingApi, view: ClusterView, nodes: dict[str, NodeHealth], **kw: Any) -> GroupHealthMonitor:
    index = NodeHealthIndex()
    index.replace(list(nodes.values()), 0.0)
    kw.setdefault("leading", lambda: True)
    return GroupHealthMonitor(api, view, index, synced=lambda: True, **kw)


class TestMonitor:
    def test_events_on_each_pod_once_then_none(self) -> None:
        api = RecordingApi()
        m = monitor(api, cluster(), health(node("a-3", condition="True")))
        asyncio.run(m.step())
        events = [b for p, b in api.created if p.endswith("/events")]
        assert [e["involvedObject"]["name"] for e in events] == [f"llama-{i}" for i in range(4)]
        assert {e["reason"] for e in events} == {DEGRADED_REASON}
        assert events[0]["involvedObject"]["uid"] == "uid-default-llama-0"
        assert "node a-3" in events[0]["message"]
        assert A in events[0]["message"]
        assert not [p for p, _ in api.created if p.endswith("/eviction")]
        asyncio.run(m.step())
        assert len(api.created) == 4
        assert m.events_sent == 4

    def test_eviction_when_on(self) -> None:
        api = RecordingApi()
        m = monitor(api, cluster(), health(node("a-3", condition="True")), evict=True)
        asyncio.run(m.step())
        evictions = [(p, b) for p, b in api.created if p.endswith("/eviction")]
        assert [p for p, _ in evictions] == [f"/api/v1/namespaces/default/pods/llama-{i}/eviction" for i in range(4)]
        assert evictions[0][1]["deleteOptions"] == {"preconditions": {"uid": "uid-default-llama-0"}}
        assert [b["reason"] for p, b in api.created if p.endswith("/events")].count(EVICTED_REASON) == 4

    def test_a_refused_eviction_is_tried_again_a_gone_pod_is_not(self) -> None:
        api = RecordingApi({"llama-0/eviction": 429, "llama-1/eviction": 404})
        m = monitor(api, cluster(), health(node("a-3", taint=True)), evict=True)
        asyncio.run(m.step())
        assert m.evictions == 2
        assert m.failures == 1
        api.fail = {}
        asyncio.run(m.step())
        assert m.evictions == 3

    def test_a_standby_does_nothing_and_remembers_nothing(self) -> None:
        api = RecordingApi()
        leading = [False]
        m = monitor(api, cluster(), health(node("a-3", taint=True)), leading=lambda: leading[0])
        asyncio.run(m.step())
        assert api.created == []
        leading[0] = True
        asyncio.run(m.step())
        assert len(api.created) == 4

    def test_a_new_leader_telling_the_same_news_counts_on_the_events_already_there(self) -> None:
        """The memory of what was told is the leader's alone: a new leader, or the same replica
        restarted, tells every degraded group again, on the Events already written."""
        api = RecordingApi()
        now = [NOW]
        first = monitor(api, cluster(), health(node("a-3", condition="True")), wall_clock=lambda: now[0])
        asyncio.run(first.step())
        assert len(api.created) == 4
        now[0] = NOW + dt.timedelta(minutes=5)
        successor = monitor(api, cluster(), health(node("a-3", condition="True")), wall_clock=lambda: now[0])
        asyncio.run(successor.step())
        assert len(api.created) == 4  # no second Event on any pod
        assert successor.events_sent == 4
        assert successor.failures == 0
        assert [(body, kind) for _, body, kind in api.patches] == [
            ({"count": 2, "lastTimestamp": "2026-03-01T12:05:00Z"}, "application/merge-patch+json")
        ] * 4
        assert all(e["count"] == 2 for e in api.stored.values())
        # other news on the same pod is another Event
        recovered = monitor(api, cluster(), health(), wall_clock=lambda: now[0])
        recovered.memory = successor.memory
        asyncio.run(recovered.step())
        assert [b["reason"] for _, b in api.created[4:]] == [RECOVERED_REASON] * 4

    def test_a_failed_event_is_sent_again(self) -> None:
        api = RecordingApi({"/events": 500})
        m = monitor(api, cluster(), health(node("a-3", taint=True)))
        asyncio.run(m.step())
        assert m.failures == 4
        assert api.created == []
        api.fail = {}
        asyncio.run(m.step())
        assert len(api.created) == 4

    def test_node_health_index_follows_the_watch(self) -> None:
        index = NodeHealthIndex()
        index.replace([NodeHealth("a"), NodeHealth("b", "x")], 0.0)
        index.apply("MODIFIED", NodeHealth("a", "y"))
        index.apply("DELETED", NodeHealth("b"))
        assert index.nodes == {"a": NodeHealth("a", "y")}


def test_metrics_name_the_degraded_groups() -> None:
    from prometheus_client import generate_latest

    m = monitor(RecordingApi(), cluster(), health(node("a-3", condition="True")))
    metrics = Metrics()
    metrics.watch_groups(m.degraded, lambda: {"events": 4})
    text = generate_latest(metrics.registry).decode()
    assert "neuron_scheduler_extender_groups_degraded 1.0" in text
    assert (
        'neuron_scheduler_extender_group_degraded{group="LeaderWorkerSet default/llama group 1",nodes="a-3",'
        f'ultraserver="{A}"}} 1.0'
    ) in text
    assert 'neuron_scheduler_extender_group_failure_actions_total{action="events"} 4.0' in text


class TestPlacementAvoidsFailedUltraServers:
    """A new group is never placed where it would be degraded at once (and, with eviction on,
    evicted again: a loop)."""

    def filter_first(self, view: ClusterView) -> Any:
        pod = lws_pod("new-0", "g2", phase="Running")
        nodes = [f"{s}-{i}" for s in "ab" for i in range(4)]
        return decisions.filter_nodes(view, neuron_request(pod, NAMES), nodes, NOW, group_request(pod), "default/new-0")

    def test_a_node_condition_moves_a_new_group_to_the_healthy_ultraserver(self) -> None:
        view = cluster(pods=[])
        view.health.update(health(node("a-1", condition="True")))
        assert view.unhealthy_in((4, A)) == ["a-1"]
        assert self.filter_first(view).passed == ["b-0", "b-1", "b-2", "b-3"]

    def test_a_failing_link_moves_a_new_group_to_the_other_ultraserver(self) -> None:
        """Issue 57: link_efa on one node of UltraServer A keeps a new group off A; the node's devices stay
        in service for its own work."""
        view = linked_cluster("a-1", [6], pods=[])
        assert view.reports["a-1"].unhealthy_devices == frozenset()
        assert view.unhealthy_in((4, A)) == ["a-1"]
        assert self.filter_first(view).passed == ["b-0", "b-1", "b-2", "b-3"]

    def test_an_unhealthy_device_too_and_the_reason_says_so_when_none_is_left(self) -> None:
        view = cluster(pods=[], unhealthy={"a-1": (0,)})
        view.health.update(health(node("b-3", taint=True)))
        outcome = self.filter_first(view)
        assert outcome.passed == []
        assert "none of the 2 among the nodes offered has room for 4 more; 2 with an unhealthy node" in (
            outcome.unresolvable["a-0"].reason
        )
