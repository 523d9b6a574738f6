"""UltraServer groups: a group's pods all on one UltraServer group of nodes, or none placed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from extender_objects import (
    NAMES,
    NOW,
    SERVER_ID_4,
    A,
    B,
    lws_pod,
    pod_object,
    report_object,
    trn2u_identity,
    ultraserver_reports,
    view_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_model.placement import place
from neuron_scheduler_extender import decisions
from neuron_scheduler_extender.groups import (
    GROUP_LABEL,
    GROUP_NODES_ANNOTATION,
    GROUP_SIZE_ANNOTATION,
    LWS_EXCLUSIVE,
    LWS_GROUP_KEY,
    LWS_NAME,
    LWS_SIZE,
    GroupError,
    GroupRequest,
    group_request,
)
from neuron_scheduler_extender.pods import neuron_request
from neuron_scheduler_extender.state import ClusterView, RefusalKind


def fleet(*, busy_a: int = 0) -> list[dict[str, Any]]:
    """UltraServers A and B (4 trn2u nodes each; on A, `busy_a` nodes fully used) and two plain trn1 nodes."""
    a = ultraserver_reports(A, "a")
    for i in range(busy_a):
        a[i] = report_object(f"a-{i}", "trn2u.48xlarge", free_devices=(), ultraserver=trn2u_identity(A, i))
    return [*a, *ultraserver_reports(B, "b"), report_object("plain-0"), report_object("plain-1")]


ALL = [f"{s}-{i}" for s in "ab" for i in range(4)] + ["plain-0", "plain-1"]


def filter_pod(
    view: ClusterView, pod: dict[str, Any], nodes: list[str] = ALL, now: dt.datetime = NOW
) -> decisions.FilterOutcome:
    group = group_request(pod)
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    return decisions.filter_nodes(view, neuron_request(pod, NAMES), nodes, now, group, key)


def bind(view: ClusterView, pod: dict[str, Any], node: str, now: dt.datetime = NOW) -> None:
    group = group_request(pod)
    meta = pod["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    request = neuron_request(pod, NAMES)
    assert decisions.bind_refusal(view, request, key, node, now, group) is None
    view.assume(key, meta["uid"], node, request, 0.0, group)


class TestGroupRequest:
    def test_a_leaderworkerset_group_on_an_ultraserver_topology(self) -> None:
        assert group_request(lws_pod("llama-0")) == GroupRequest(
            f"default/{LWS_GROUP_KEY}=hash-g1", "LeaderWorkerSet default/llama group 1", 4, 4
        )
        two = group_request(lws_pod("llama-0", size=2, topology="neuron.amazonaws.com/ultraserver-server-id-2"))
        assert two is not None
        assert (two.size, two.nodes) == (2, 2)

    def test_other_topologies_and_plain_pods_are_no_group(self) -> None:
        assert group_request(lws_pod("x", topology="topology.kubernetes.io/zone")) is None
        assert group_request(pod_object("x", devices=1)) is None

    def test_the_charts_own_label_and_annotations(self) -> None:
        pod = pod_object("w", labels={GROUP_LABEL: "train"}, annotations={GROUP_SIZE_ANNOTATION: "8"})
        assert group_request(pod) == GroupRequest(f"default/{GROUP_LABEL}=train", "group default/train", 8, 4)
        pod["metadata"]["annotations"][GROUP_NODES_ANNOTATION] = "2"
        assert group_request(pod) == GroupRequest(f"default/{GROUP_LABEL}=train", "group default/train", 8, 2)

    @pytest.mark.parametrize(
        ("labels", "annotations", "says"),
        [
            ({GROUP_LABEL: "t"}, {}, f"annotation {GROUP_SIZE_ANNOTATION}: missing"),
            ({GROUP_LABEL: "t"}, {GROUP_SIZE_ANNOTATION: "four"}, "is not a number of pods"),
            ({GROUP_LABEL: "t"}, {GROUP_SIZE_ANNOTATION: "0"}, "expected 1 to"),
            ({GROUP_LABEL: "t"}, {GROUP_SIZE_ANNOTATION: "4", GROUP_NODES_ANNOTATION: "3"}, "expected 2 or 4"),
            ({LWS_NAME: "l"}, {LWS_SIZE: "4", LWS_EXCLUSIVE: SERVER_ID_4}, f"label {LWS_GROUP_KEY}: missing"),
        ],
    )
    def test_a_group_said_wrongly_is_an_error_naming_the_key(
        self, labels: dict[str, str], annotations: dict[str, str], says: str
    ) -> None:
        with pytest.raises(GroupError, match=says):
            group_request(pod_object("p", labels=labels, annotations=annotations))


class TestGroupFilter:
    def test_the_first_pod_reserves_an_ultraserver_where_the_whole_group_fits(self) -> None:
        view = view_of(*fleet(busy_a=1))  # A has 3 free nodes: a group of 4 whole nodes fits only B
        outcome = filter_pod(view, lws_pod("llama-0"))
        assert outcome.passed == ["b-0", "b-1", "b-2", "b-3"]
        assert outcome.unresolvable["a-1"].kind is RefusalKind.GROUP_ELSEWHERE
        assert "placed on UltraServer bbbbbbbbbbbbbbb0" in outcome.unresolvable["plain-0"].reason
        # other pods are kept off B while the group is not whole; A and the plain nodes stay theirs
        plain = filter_pod(view, pod_object("other", devices=16))
        assert plain.passed == ["a-1", "a-2", "a-3", "plain-0", "plain-1"]
        assert plain.unresolvable["b-2"].kind is RefusalKind.RESERVED
        assert "LeaderWorkerSet default/llama group 1 (4 pods)" in plain.unresolvable["b-2"].reason

    def test_the_rest_of_the_group_follows_its_bound_pods_and_the_reservation_ends_when_whole(self) -> None:
        view = view_of(*fleet())
        for i in range(4):
            if i:
                stats = view.stats(NOW)
                assert (stats.group_reservations, stats.groups_partial) == (1, 1)
            outcome = filter_pod(view, lws_pod(f"llama-{i}"))
            assert set(outcome.passed) <= {f"a-{n}" for n in range(4)}, outcome.passed
            bind(view, lws_pod(f"llama-{i}"), outcome.passed[0])
        assert sorted(p.node for p in view.members(f"default/{LWS_GROUP_KEY}=hash-g1")) == [f"a-{n}" for n in range(4)]
        assert view.reserved(NOW) == {}
        assert (view.stats(NOW).group_reservations, view.stats(NOW).groups_partial) == (0, 0)
        assert filter_pod(view, pod_object("other", devices=16)).passed == [
            "b-0",
            "b-1",
            "b-2",
            "b-3",
            "plain-0",
            "plain-1",
        ]

    def test_a_group_that_fits_nowhere_is_refused_on_every_node_with_why(self) -> None:
        view = view_of(*fleet(busy_a=1))
        filter_pod(view, lws_pod("first-0", "g1"))  # holds B
        outcome = filter_pod(view, lws_pod("second-0", "g2"))
        assert outcome.passed == []
        assert {r.kind for r in outcome.unresolvable.values()} == {RefusalKind.GROUP_NO_FIT}
        assert outcome.unresolvable["plain-0"].reason == (
            "LeaderWorkerSet default/llama group 2 (4 pods of 16 devices) must share one UltraServer group of "
            "4 nodes: none of the 2 among the nodes offered has room for 4 more (the roomiest has room for 3); "
            "1 held for other groups until their pods are bound; waiting, with none of its pods placed"
        )
        none = filter_pod(view_of(report_object("plain-0")), lws_pod("x-0", "g3"), ["plain-0"])
        assert "none of the 1 nodes offered is in one" in none.unresolvable["plain-0"].reason

    def test_the_tightest_fit_is_chosen_so_empty_ultraservers_stay_whole(self) -> None:
        view = view_of(*fleet(busy_a=2))  # A has room for 2 whole nodes, B for 4
        outcome = filter_pod(view, lws_pod("pair-0", size=2))
        assert outcome.passed == ["a-2", "a-3"]

    def test_a_pair_on_server_id_2_stays_on_one_pair(self) -> None:
        view = view_of(*fleet())
        topology = "neuron.amazonaws.com/ultraserver-server-id-2"
        first = filter_pod(view, lws_pod("p-0", size=2, topology=topology))
        pair = {n for n in first.passed}
        assert len(pair) == 2
        assert {n[0] for n in pair} == {"a"}
        bind(view, lws_pod("p-0", size=2, topology=topology), sorted(pair)[0])
        second = filter_pod(view, lws_pod("p-1", size=2, topology=topology))
        assert set(second.passed) <= pair

    def test_bound_pods_say_where_the_group_is_after_a_restart(self) -> None:
        bound = [lws_pod(f"llama-{i}", node=f"b-{i}", phase="Running") for i in range(2)]
        view = view_of(*fleet(), pods=bound)  # a fresh extender: no reservation in memory
        assert filter_pod(view, pod_object("other", devices=16)).unresolvable["b-3"].kind is RefusalKind.RESERVED
        outcome = filter_pod(view, lws_pod("llama-2"))
        assert outcome.passed == ["b-2", "b-3"]

    def test_a_leader_asking_for_no_neuron_resource_counts_as_placed(self) -> None:
        """A LeaderWorkerSet leader without a Neuron request is never filtered here (kube-scheduler
        calls an extender only for its managed resources), but it is bound, on the UltraServer its
        injected affinity chose: its workers follow it there and need room for size - 1, not size."""
        leader = lws_pod("llama-0", devices=0, node="a-1", phase="Running")
        view = view_of(*fleet(busy_a=1), pods=[leader])  # A: room for 3 whole nodes, the leader on a-1
        on_a = [f"a-{i}" for i in range(4)]  # the nodes LeaderWorkerSet's affinity leaves the workers
        for i in (1, 2, 3):
            outcome = filter_pod(view, lws_pod(f"llama-{i}"), on_a)
            assert outcome.passed, outcome.unresolvable
            bind(view, lws_pod(f"llama-{i}"), outcome.passed[0])
        assert sorted(p.node for p in view.members(f"default/{LWS_GROUP_KEY}=hash-g1")) == ["a-1", "a-1", "a-2", "a-3"]
        assert view.stats(NOW).in_flight_pods == 3  # the workers, until the plugin reports them; never the leader

    def test_a_reservation_lapses_after_its_ttl_while_none_of_the_group_is_bound(self) -> None:
        view = view_of(*fleet())
        view.group_ttl = 60.0
        filter_pod(view, lws_pod("llama-0"))
        later = NOW + dt.timedelta(seconds=61)
        assert len(filter_pod(view, pod_object("other", devices=16), now=later).passed) == len(ALL)

    def test_a_partly_bound_group_keeps_its_ultraserver_past_the_ttl(self) -> None:
        view = view_of(*fleet())
        view.group_ttl = 60.0
        bind(view, lws_pod("llama-0"), filter_pod(view, lws_pod("llama-0")).passed[0])
        past_ttl = NOW + dt.timedelta(seconds=100)  # the reports still fresh (2 minutes)
        outcome = filter_pod(view, pod_object("other", devices=16), now=past_ttl)
        assert outcome.passed == ["b-0", "b-1", "b-2", "b-3", "plain-0", "plain-1"]
        assert outcome.unresolvable["a-3"].kind is RefusalKind.RESERVED

    def test_bind_refuses_to_split_a_group_or_take_another_groups_ultraserver(self) -> None:
        view = view_of(*fleet())
        outcome = filter_pod(view, lws_pod("llama-0"))
        assert outcome.passed[0].startswith("a-")
        bind(view, lws_pod("llama-0"), "a-0")
        request = neuron_request(lws_pod("llama-1"), NAMES)
        split = decisions.bind_refusal(view, request, "default/llama-1", "b-0", NOW, group_request(lws_pod("llama-1")))
        assert split is not None
        assert split.kind is RefusalKind.GROUP_ELSEWHERE
        plain = decisions.bind_refusal(view, request, "default/other", "a-1", NOW)
        assert plain is not None
        assert plain.kind is RefusalKind.RESERVED
        nowhere = decisions.bind_refusal(
            view, request, "default/x-0", "plain-0", NOW, group_request(lws_pod("x-0", "g9"))
        )
        assert nowhere is not None
        assert "reports none" in nowhere.reason


# -- property: whole or nothing, and never waiting beside room ----------------------------------------

group_shapes = st.tuples(st.integers(1, 8), st.sampled_from([4, 8, 16]))  # (pods, devices each)


@settings(max_examples=60, deadline=None)
@given(
    busy=st.lists(st.lists(st.integers(0, 15), max_size=16), min_size=3, max_size=3),
    groups=st.lists(group_shapes, min_size=1, max_size=6),
)
def test_every_group_lands_whole_on_one_ultraserver_or_waits_only_when_none_has_room(
    busy: list[list[int]], groups: list[tuple[int, int]]
) -> None:
    servers = [f"{c * 15}{i}" for i, c in enumerate("cde")]
    reports = []
    for s, server in enumerate(servers):
        for i in range(4):
            free = set(range(16)) - set(busy[s]) if i == 0 else None
            reports.append(
                report_object(
                    f"{server}-{i}", "trn2u.48xlarge", free_devices=free, ultraserver=trn2u_identity(server, i)
                )
            )
    view = view_of(*reports)
    nodes = [r["metadata"]["name"] for r in reports]
    for g, (size, devices) in enumerate(groups):
        pods = [lws_pod(f"g{g}-{i}", f"g{g}", size=size, devices=devices) for i in range(size)]
        placed: list[str] = []
        for pod in pods:
            outcome = filter_pod(view, pod, nodes)
            if not outcome.passed:
                reasons = {r.kind for r in outcome.unresolvable.values()}
                if placed:
                    pytest.fail(f"group {g} placed {len(placed)} of {size}, then refused: {outcome.unresolvable}")
                assert reasons == {RefusalKind.GROUP_NO_FIT}
                # no UltraServer held for no one has room for the group (the oracle: the plugin's allocator)
                held = view.reserved(NOW)
                for server in servers:
                    names = [f"{server}-{i}" for i in range(4)]
                    if any(n in held for n in names):
                        continue
                    room = 0
                    for state in view.nodes(names, NOW):
                        assert state.topology is not None
                        assert state.free is not None
                        free = state.free
                        while (p := place(state.topology, free, neuron_request(pod, NAMES))).fits:
                            free, room = p.free_after, room + 1
                    assert room < size, f"group {g} waits though {server} has room for {room} of {size}"
                break
            bind(view, pod, outcome.passed[0])
            placed.append(outcome.passed[0])
        assert len({n.rsplit("-", 1)[0] for n in placed}) <= 1, f"group {g} split: {placed}"
        assert len(placed) in (0, size)


def podgroup_pod(
    name: str, pod_group: object, labels: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    """A pod naming a PodGroup as Kubernetes 1.36 does (`spec.schedulingGroup.podGroupName`)."""
    pod = pod_object(name, devices=16, labels=labels, annotations=dict(annotations))
    pod["spec"]["schedulingGroup"] = {"podGroupName": pod_group}
    return pod


class TestPodGroupReference:
    """A PodGroup reference and the chart's label name one group: never counted as two."""

    def test_the_label_and_a_reference_to_the_same_name_are_the_labels_group(self) -> None:
        labelled = pod_object("w", labels={GROUP_LABEL: "train"}, annotations={GROUP_SIZE_ANNOTATION: "4"})
        both = podgroup_pod("w", "train", {GROUP_LABEL: "train"}, **{GROUP_SIZE_ANNOTATION: "4"})
        assert (
            group_request(both)
            == group_request(labelled)
            == GroupRequest(f"default/{GROUP_LABEL}=train", "group default/train", 4, 4)
        )

    def test_the_label_and_a_reference_to_another_name_are_an_error_naming_both(self) -> None:
        pod = podgroup_pod("w", "other", {GROUP_LABEL: "train"}, **{GROUP_SIZE_ANNOTATION: "4"})
        with pytest.raises(GroupError, match=r"'train'.*spec\.schedulingGroup\.podGroupName: 'other'"):
            group_request(pod)

    def test_a_reference_with_the_size_annotation_is_the_group_of_that_name(self) -> None:
        pod = podgroup_pod("w", "train", **{GROUP_SIZE_ANNOTATION: "2", GROUP_NODES_ANNOTATION: "2"})
        assert group_request(pod) == GroupRequest(f"default/{GROUP_LABEL}=train", "group default/train", 2, 2)
        pod["metadata"]["namespace"] = "other"  # names are per namespace, as PodGroups are
        found = group_request(pod)
        assert found is not None
        assert found.key == f"other/{GROUP_LABEL}=train"
        with pytest.raises(GroupError, match=f"annotation {GROUP_NODES_ANNOTATION}"):
            group_request(podgroup_pod("w", "train", **{GROUP_SIZE_ANNOTATION: "2", GROUP_NODES_ANNOTATION: "8"}))

    @pytest.mark.parametrize("pod_group", ["train", "", None, 7])
    def test_a_reference_alone_or_malformed_is_no_group_here(self, pod_group: object) -> None:
        assert group_request(podgroup_pod("w", pod_group)) is None
        # a malformed one does not stand in for the label either
        if pod_group != "train":
            assert group_request(podgroup_pod("w", pod_group, **{GROUP_SIZE_ANNOTATION: "4"})) is None

    def test_a_leaderworkerset_group_keeps_its_own_key(self) -> None:
        pod = lws_pod("llama-0")
        pod["spec"]["schedulingGroup"] = {"podGroupName": "llama-group-1"}
        assert group_request(pod) == group_request(lws_pod("llama-0"))

    def test_pods_saying_their_group_either_way_fill_one_ultraserver_as_one_group(self) -> None:
        size = {GROUP_SIZE_ANNOTATION: "4"}
        pods = [
            pod_object("w-0", devices=16, labels={GROUP_LABEL: "train"}, annotations=size),
            podgroup_pod("w-1", "train", {GROUP_LABEL: "train"}, **size),
            podgroup_pod("w-2", "train", **size),
            podgroup_pod("w-3", "train", **size),
        ]
        view = view_of(*fleet(busy_a=1))  # only B holds 4 whole nodes
        for i, pod in enumerate(pods):
            outcome = filter_pod(view, pod)
            assert outcome.passed == [f"b-{n}" for n in range(i, 4)], (pod["metadata"]["name"], outcome.passed)
            bind(view, pod, outcome.passed[0])
        members = view.members(f"default/{GROUP_LABEL}=train")
        assert sorted(p.node for p in members) == ["b-0", "b-1", "b-2", "b-3"]
        stats = view.stats(NOW)
        assert (stats.group_reservations, stats.groups_partial) == (0, 0)
