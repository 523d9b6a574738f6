"""Filter, prioritize and the bind check: a node passes exactly when the plugin's allocator finds the sets."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from extender_objects import NAMES, NOW, container, pod_object, report_object, trn1, view_of
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.neuron_sets import exhaustive_fits, topology

from neuron_model.placement import ContainerRequest, FreeState, PodRequest, place, refusal
from neuron_scheduler_extender import decisions
from neuron_scheduler_extender.pods import neuron_request, pod_record
from neuron_scheduler_extender.state import ClusterView, RefusalKind, report_record

# one device unhealthy in each torus row: 12 free, no free row of 4
ONE_BAD_PER_ROW = {"unhealthy": [1, 5, 9, 13]}


def request(**kwargs: Any) -> PodRequest:
    return neuron_request(pod_object("p", **kwargs), NAMES)


class TestFilter:
    def test_eight_and_four_devices_need_an_aligned_group_and_one_does_not(self) -> None:
        view = view_of(report_object("n1", **ONE_BAD_PER_ROW), report_object("n2"))
        for size in (8, 4):
            outcome = decisions.filter_nodes(view, request(devices=size), ["n1", "n2"], NOW)
            assert outcome.passed == ["n2"]
            # not before the devices recover: preemption cannot help
            refusal = outcome.unresolvable["n1"]
            assert refusal.kind is RefusalKind.NEVER_FITS
            assert refusal.reason.startswith(
                f"no connected set of {size} free devices (free: 0,2,3,4,6,7,8,10,11,12,14,15); "
            )
        assert decisions.filter_nodes(view, request(devices=1), ["n1", "n2"], NOW).passed == ["n1", "n2"]

    def test_every_refusal_is_unresolvable_as_kube_schedulers_preemption_cannot_cure_it(self) -> None:
        view = view_of(
            report_object("stale", age=600),
            report_object("broken", unhealthy=range(8, 16)),
            report_object("busy", free_devices=range(4)),
        )
        outcome = decisions.filter_nodes(view, request(devices=16), ["stale", "broken", "busy", "absent"], NOW)
        assert outcome.passed == []
        assert {n: r.kind for n, r in outcome.unresolvable.items()} == {
            "stale": RefusalKind.STALE_REPORT,
            "broken": RefusalKind.NEVER_FITS,
            "absent": RefusalKind.MISSING_REPORT,
            "busy": RefusalKind.INSUFFICIENT,
        }
        assert outcome.unresolvable["broken"].reason == (
            "16 devices requested, only 8 devices free (free: 0,1,2,3,4,5,6,7); "
            "the node cannot hold it even with every healthy device free"
        )
        assert outcome.unresolvable["busy"].kind is RefusalKind.INSUFFICIENT
        assert outcome.unresolvable["busy"].reason == "16 devices requested, only 4 devices free (free: 0,1,2,3)"

    def test_a_pod_asking_for_no_neuron_resource_passes_every_node_with_a_fresh_report(self) -> None:
        view = view_of(report_object("n1", free_devices=[]))
        assert decisions.filter_nodes(view, request(), ["n1"], NOW).passed == ["n1"]

    def test_back_to_back_pods_never_count_on_the_same_silicon(self) -> None:
        # 8 devices free: one aligned pair of rows. Two 8-device pods filtered before either is visible as bound.
        view = view_of(report_object("n1", free_devices=range(8, 16)), report_object("n2", free_devices=range(8)))
        eight = request(devices=8)
        assert decisions.filter_nodes(view, eight, ["n1", "n2"], NOW).passed == ["n1", "n2"]
        # the first is bound to n1 by this extender: the second no longer sees n1's devices free
        view.assume("default/first", "uid-1", "n1", eight, now=1.0)
        outcome = decisions.filter_nodes(view, eight, ["n1", "n2"], NOW)
        assert outcome.passed == ["n2"]
        assert outcome.unresolvable["n1"].reason == "8 devices requested, only 0 devices free (free: none)"

    def test_a_trainium3_node_takes_any_k_free_devices_where_a_torus_has_no_group(self) -> None:
        scattered = [0, 5, 10, 15, 6]  # no row, no aligned pair of rows, not 4 or 8 devices
        view = view_of(report_object("trn3", "trn3.48xlarge", free_devices=scattered),
                       report_object("trn2", "trn2.48xlarge", free_devices=scattered))  # fmt: skip
        for size in range(1, 6):
            outcome = decisions.filter_nodes(view, request(devices=size), ["trn3", "trn2"], NOW)
            assert "trn3" in outcome.passed, size
            assert ("trn2" in outcome.passed) == (size == 1), size
        outcome = decisions.filter_nodes(view, request(devices=6), ["trn3"], NOW)
        assert outcome.unresolvable["trn3"].reason == "6 devices requested, only 5 devices free (free: 0,5,6,10,15)"

    def test_the_view_in_flight_and_the_report_agree(self) -> None:
        # the same node, seen before and after its plugin admitted a 4-device pod, gives the same answer
        before = view_of(report_object("n1", free_devices=range(8)), pods=[pod_object("a", node="n1", devices=4)])
        after = view_of(report_object("n1", free_devices=range(4, 8), pods=["default/a"]))
        for size in (1, 4, 8):
            assert decisions.filter_nodes(before, request(devices=size), ["n1"], NOW).passed == (
                decisions.filter_nodes(after, request(devices=size), ["n1"], NOW).passed
            ), size


SHAPES = ["inf1.6xlarge", "inf2.24xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge", "trn3e.24xlarge"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SHAPES), st.data())
def test_a_node_passes_exactly_when_an_exhaustive_search_finds_a_valid_set(name: str, data: st.DataObject) -> None:
    """Through the whole path: a NeuronNode object as the plugin publishes it, a Pod object as the
    scheduler sends it; for one container asking for one resource, `place` is exact."""
    lnc = 1 if name.startswith("trn2") else None  # 128 cores: few enough for the oracle at LNC 1 and small requests
    t = topology(name, lnc)
    total = t.device_count * t.cores_per_device
    free = data.draw(st.sets(st.integers(0, total - 1), max_size=12) | st.just(set(range(total))))
    unhealthy = data.draw(st.sets(st.integers(0, t.device_count - 1), max_size=2))
    free_healthy = {c for c in free if t.device_of(c) not in unhealthy}
    if data.draw(st.booleans()):
        pod = pod_object("p", devices=data.draw(st.integers(1, min(t.device_count, 8))))
    else:
        pod = pod_object("p", cores=data.draw(st.integers(1, 5)))
    view = view_of(report_object("n", name, free_cores=free, unhealthy=unhealthy, lnc=lnc))
    passed = decisions.filter_nodes(view, neuron_request(pod, NAMES), ["n"], NOW).passed == ["n"]
    assert passed == exhaustive_fits(t, free_healthy, neuron_request(pod, NAMES))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_with_pods_in_flight_a_node_passes_exactly_when_place_fits_after_them(data: st.DataObject) -> None:
    t = topology("inf2.48xlarge")
    in_flight = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), max_size=3))
    pods = [
        pod_object(f"f{i}", node="n", devices=d, cores=c, scheduled_at=f"2026-03-01T11:00:0{i}Z")
        for i, (d, c) in enumerate(in_flight)
        if d or c
    ]
    asked = ContainerRequest(devices=data.draw(st.integers(0, 4)), cores=data.draw(st.integers(0, 4)))
    free = FreeState.of(t, range(t.device_count * t.cores_per_device))
    expected_fits = True
    for p in pods:
        record = pod_record(p, NAMES)
        assert record is not None
        assert record.request is not None
        placement = place(t, free, record.request)
        if not placement.fits:
            expected_fits = False  # held until the report catches up
            break
        free = placement.free_after
    expected_fits = expected_fits and place(t, free, PodRequest((), (asked,))).fits
    view = view_of(report_object("n", "inf2.48xlarge"), pods=pods)
    pod = pod_object("p", containers=[container(devices=asked.devices, cores=asked.cores)])
    assert (decisions.filter_nodes(view, neuron_request(pod, NAMES), ["n"], NOW).passed == ["n"]) == expected_fits


class TestPrioritize:
    def test_the_node_the_placement_costs_least_scores_highest(self) -> None:
        view = view_of(
            report_object("empty"),  # a 4-device pod breaks the group of 16, a pair of rows and a row
            report_object("half", free_devices=range(8)),  # breaks the pair of rows 0-7 and a row
            report_object("row", free_devices=range(4)),  # breaks only the row it takes
            report_object("full", free_devices=[]),  # does not fit
        )
        scores = dict(decisions.prioritize(view, request(devices=4), ["row", "empty", "full", "half"], NOW))
        assert scores == {"row": 10, "half": 5, "empty": 0, "full": 0}

    def test_equal_cost_goes_to_the_node_left_with_more(self) -> None:
        # one core fits on device 0's last free core on both nodes, breaking no group; "more" keeps more
        more = report_object("more", free_cores=set(range(32)) - {0})
        less = report_object("less", free_cores=set(range(16)) - {0})
        view = view_of(more, less)
        assert decisions.prioritize(view, request(cores=1), ["less", "more"], NOW) == [("less", 0), ("more", 10)]
        assert decisions.group_loss(
            decisions.leftover_of(trn1(), FreeState.of(trn1(), range(32))),
            decisions.leftover_of(trn1(), FreeState.of(trn1(), range(1, 32))),
        ) == ((16, 1), (8, 1), (4, 1), (1, 1))

    def test_order_and_nodes_are_those_asked_about(self) -> None:
        view = view_of(report_object("a"), report_object("b"))
        assert decisions.prioritize(view, request(devices=1), ["b", "a", "c"], NOW) == [("b", 10), ("a", 10), ("c", 0)]

    def test_a_fragmented_node_is_preferred_for_a_small_pod_if_that_keeps_big_groups_elsewhere(self) -> None:
        # a single core on a node already split keeps the empty node whole for a large pod
        view = view_of(report_object("empty"), report_object("split", free_cores=set(range(32)) - {0}))
        scores = dict(decisions.prioritize(view, request(cores=1), ["empty", "split"], NOW))
        assert scores["split"] > scores["empty"]


class TestBindCheck:
    def test_bind_refuses_when_the_view_changed_since_filter(self) -> None:
        view = view_of(report_object("n1", free_devices=range(8)))
        eight = request(devices=8)
        assert decisions.filter_nodes(view, eight, ["n1"], NOW).passed == ["n1"]
        # meanwhile another scheduler's pod was bound there
        record = pod_record(pod_object("other", node="n1", devices=1), NAMES)
        assert record is not None
        view.apply_pod("ADDED", record)
        refusal = decisions.bind_refusal(view, eight, "default/p", "n1", NOW)
        assert refusal is not None
        assert refusal.reason == "8 devices requested, only 7 devices free (free: 1,2,3,4,5,6,7)"

    def test_a_retried_bind_does_not_count_the_pod_against_itself(self) -> None:
        view = view_of(report_object("n1", free_devices=range(8)))
        eight = request(devices=8)
        view.assume("default/p", "uid-default-p", "n1", eight, now=1.0)
        assert decisions.bind_refusal(view, eight, "default/p", "n1", NOW) is None
        assert decisions.bind_refusal(view, eight, "default/q", "n1", NOW) is not None


def _answers(view: ClusterView, pod: PodRequest, nodes: list[str]) -> tuple[Any, ...]:
    outcome = decisions.filter_nodes(view, pod, nodes, NOW)
    return (
        outcome.passed,
        {n: (r.kind, r.reason) for n, r in outcome.unresolvable.items()},
        decisions.prioritize(view, pod, nodes, NOW),
    )


def _slow_filter(view: ClusterView, pod: PodRequest, nodes: list[str]) -> list[str]:
    """The filter without any memo: the library's own answer, node by node."""
    passed = []
    for node in nodes:
        state = view.node(node, NOW)
        if state.refusal is None:
            assert state.topology is not None
            assert state.free is not None
            if not refusal(state.topology, state.free, pod):
                passed.append(node)
    return passed


# a few free states per shape, so that nodes share situations and memos, as a fleet's do
FREE_DEVICES = [range(16), range(8), range(4, 16), [0, 2, 3, 5, 8, 9, 10, 11], []]
FLEET_NODES = ["a", "b", "c", "d"]
ASKED = st.builds(
    lambda devices, cores: PodRequest((), (ContainerRequest(devices, cores),)),
    st.sampled_from([0, 1, 2, 4, 8]),
    st.sampled_from([0, 1, 3, 8]),
)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_remembered_answers_are_those_of_a_fresh_view_after_any_changes(data: st.DataObject) -> None:
    """Filter and prioritize remember answers per situation (nodes alike share them) and per call;
    whatever changed since (reports, pods bound, assumed, forgotten, gone), a long-lived view answers
    exactly as a view built afresh by the same changes in the same order (the order pods were bound in
    is the order their silicon is counted in), and filter as the library does node by node."""
    reports = {
        n: report_object(n, data.draw(st.sampled_from(["trn1.32xlarge", "inf2.48xlarge"])), free_devices=range(16))
        for n in FLEET_NODES
    }
    pods: dict[str, dict[str, Any]] = {}
    assumed: dict[str, tuple[str, PodRequest]] = {}  # pod key -> (node, request), bound by the extender
    initial = list(reports.values())
    history: list[Callable[[ClusterView], None]] = []  # every change so far, to replay into a fresh view
    view = view_of(*initial)
    for step in range(data.draw(st.integers(1, 8))):
        changes_before = len(history)
        change = data.draw(st.sampled_from(["report", "bound", "assume", "forget", "gone"]))
        node = data.draw(st.sampled_from(FLEET_NODES))
        if change == "report":
            kind = reports[node]["status"]["instanceType"]
            devices = [
                d for d in data.draw(st.sampled_from(FREE_DEVICES)) if d < (12 if kind.startswith("inf2") else 16)
            ]
            reports[node] = report_object(node, kind, free_devices=devices)
            record = report_record(reports[node])
            assert record is not None
            history.append(functools.partial(ClusterView.apply_report, event="MODIFIED", record=record))
        elif change in ("bound", "assume"):
            name = f"p{step}"
            pod = pod_object(
                name,
                node=node,
                devices=data.draw(st.sampled_from([1, 2, 4])),
                scheduled_at=f"2026-03-01T11:00:0{step}Z",
            )
            if change == "bound":
                pods[name] = pod
                pod_rec = pod_record(pod, NAMES)
                assert pod_rec is not None
                history.append(functools.partial(ClusterView.apply_pod, event="ADDED", record=pod_rec))
            else:
                assumed[f"default/{name}"] = (node, neuron_request(pod, NAMES))
                history.append(
                    functools.partial(
                        ClusterView.assume,
                        key=f"default/{name}",
                        uid=f"uid-default-{name}",
                        node=node,
                        request=neuron_request(pod, NAMES),
                        now=1.0,
                    )
                )
        elif change == "forget" and assumed:
            key = data.draw(st.sampled_from(sorted(assumed)))
            del assumed[key]
            history.append(functools.partial(ClusterView.forget, key=key, uid=f"uid-{key.replace('/', '-')}"))
        elif change == "gone" and pods:
            name = data.draw(st.sampled_from(sorted(pods)))
            pod_rec = pod_record(pods.pop(name), NAMES)
            assert pod_rec is not None
            history.append(functools.partial(ClusterView.apply_pod, event="DELETED", record=pod_rec))
        for apply in history[changes_before:]:
            apply(view)
        for pod in data.draw(st.lists(ASKED, min_size=1, max_size=3)):
            fresh = view_of(*initial)
            for apply in history:
                apply(fresh)
            assert _answers(view, pod, FLEET_NODES) == _answers(fresh, pod, FLEET_NODES)
            assert _answers(view, pod, FLEET_NODES)[0] == _slow_filter(fresh, pod, FLEET_NODES)
