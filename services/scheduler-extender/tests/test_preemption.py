"""Choosing victims: the fewest pods (by kube-scheduler's order) whose silicon, once free, gives the
pod a valid set; checked against every subset of the candidates and the slow oracle of valid sets."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from itertools import chain, combinations
from typing import Any

import pytest
from extender_objects import NAMES, NOW, A, lws_pod, pod_object, report_object, ultraserver_reports, view_of
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.neuron_sets import exhaustive_fits, topology

from neuron_model.allocator import Topology
from neuron_model.placement import ContainerRequest, FreeState, PodRequest
from neuron_scheduler_extender import decisions
from neuron_scheduler_extender.groups import group_request
from neuron_scheduler_extender.pdbs import Subject, budget, violating
from neuron_scheduler_extender.pods import neuron_request, pod_record
from neuron_scheduler_extender.preemption import Candidate, Victims, choose, cost, fits
from neuron_scheduler_extender.protocol import NodeVictims
from neuron_scheduler_extender.state import HOLD_TTL, ClusterView, RefusalKind, report_record


def devices(n: int) -> PodRequest:
    return PodRequest((), (ContainerRequest(devices=n),))


def cores(n: int) -> PodRequest:
    return PodRequest((), (ContainerRequest(cores=n),))


def one_device_pods(topo: Topology, order: list[int], priority: int = 0) -> list[Candidate]:
    """A pod on each device, `order[d]` the binding order of the one on device d."""
    return [
        Candidate(f"uid-{d}", f"ml/p{d}", priority, frozenset(topo.cores_of(d)), order[d])
        for d in range(topo.device_count)
    ]


def freed(free: FreeState, usable: frozenset[int], victims: tuple[Candidate, ...]) -> set[int]:
    return set(free.cores) | {c for v in victims for c in v.cores & usable}


class TestTheIssuesCase:
    def test_a_full_trn1_node_gives_up_exactly_the_four_pods_of_one_torus_row(self) -> None:
        topo = topology("trn1.32xlarge")
        # the four pods bound last are on a diagonal, which is what counting alone would evict
        order = list(range(16))
        for d, latest in zip((0, 5, 10, 15), (100, 101, 102, 103), strict=True):
            order[d] = latest
        pods = one_device_pods(topo, order)
        usable = frozenset(range(32))
        found = choose(topo, FreeState.of(topo, ()), usable, devices(4), pods)
        assert found is not None
        held = {topo.device_of(min(v.cores)) for v in found.pods}
        assert held in [set(g) for g in topo.groups(4)]  # a row, not the diagonal
        assert held == {12, 13, 14, 15}  # of the rows, the one with the pod bound last (on 15)
        assert exhaustive_fits(topo, freed(FreeState.of(topo, ()), usable, found.pods), devices(4))

    def test_what_is_free_counts_so_a_row_with_free_devices_costs_fewer_victims(self) -> None:
        topo = topology("trn1.32xlarge")
        pods = [p for p in one_device_pods(topo, list(range(16))) if min(p.cores) // 2 not in (1, 2)]
        free = FreeState.of(topo, (2, 3, 4, 5))  # devices 1 and 2 free: row 0 needs two victims
        found = choose(topo, free, frozenset(range(32)), devices(4), pods)
        assert found is not None
        assert {v.key for v in found.pods} == {"ml/p0", "ml/p3"}

    def test_it_fits_already_and_nothing_is_evicted(self) -> None:
        topo = topology("trn1.32xlarge")
        found = choose(topo, FreeState.of(topo, range(8)), frozenset(range(32)), devices(4), [])
        assert found == Victims(())

    def test_no_victims_when_the_silicon_is_held_by_pods_that_may_not_be_evicted(self) -> None:
        topo = topology("trn1.32xlarge")
        # rows 0 and 1 held by candidates only in part: one pod per row may not go (not a candidate)
        pods = [p for p in one_device_pods(topo, list(range(16))) if min(p.cores) // 2 not in (0, 4, 8, 12)]
        assert choose(topo, FreeState.of(topo, ()), frozenset(range(32)), devices(4), pods) is None

    def test_unhealthy_silicon_is_never_counted_as_freed(self) -> None:
        topo = topology("trn1.32xlarge")
        pods = one_device_pods(topo, list(range(16)))
        usable = frozenset(c for c in range(32) if c // 2 not in (0, 4, 8, 12))  # one bad device per row
        assert choose(topo, FreeState.of(topo, ()), usable, devices(4), pods) is None
        found = choose(topo, FreeState.of(topo, ()), usable, devices(1), pods)
        assert found is not None
        assert len(found.pods) == 1
        assert found.pods[0].key not in {"ml/p0", "ml/p4"}

    def test_lower_priorities_go_first_even_when_more_pods_must_go(self) -> None:
        topo = topology("trn1.32xlarge")
        order = list(range(16))
        # rows 0 to 2: one pod of priority 5 each; row 3: four pods of priority 1
        pods = [
            Candidate(p.uid, p.key, 5 if min(p.cores) // 2 in (0, 4, 8) else 1, p.cores, p.order)
            for p in one_device_pods(topo, order)
        ]
        free = FreeState.of(topo, (c for d in range(12) if d not in (0, 4, 8) for c in topo.cores_of(d)))
        found = choose(topo, free, frozenset(range(32)), devices(4), pods)
        assert found is not None
        assert {v.key for v in found.pods} == {"ml/p12", "ml/p13", "ml/p14", "ml/p15"}

    def test_pods_a_disruption_budget_protects_are_spared_where_others_can_go(self) -> None:
        topo = topology("trn1.32xlarge")
        pods = [
            Candidate(p.uid, p.key, 0, p.cores, p.order, violates_pdb=min(p.cores) // 2 < 12)
            for p in one_device_pods(topo, list(range(16)))
        ]
        found = choose(topo, FreeState.of(topo, ()), frozenset(range(32)), devices(8), pods)
        assert found is not None
        assert found.pdb_violations == 4
        found = choose(topo, FreeState.of(topo, ()), frozenset(range(32)), devices(4), pods)
        assert found is not None
        assert found.pdb_violations == 0
        assert {v.key for v in found.pods} == {"ml/p12", "ml/p13", "ml/p14", "ml/p15"}

    def test_victims_are_listed_the_most_important_first(self) -> None:
        # kube-scheduler reads Pods[0] as the highest priority among them (pickOneNodeForPreemption)
        topo = topology("inf2.48xlarge")  # a ring of 12
        pods = [Candidate(f"u{d}", f"ml/p{d}", d % 3, frozenset(topo.cores_of(d)), d) for d in range(12)]
        found = choose(topo, FreeState.of(topo, ()), frozenset(range(24)), devices(12), pods)
        assert found is not None
        assert len(found.pods) == 12
        assert [v.priority for v in found.pods] == sorted((v.priority for v in found.pods), reverse=True)

    def test_among_as_few_core_pods_the_lowest_priorities_then_the_latest_bound_go(self) -> None:
        topo = topology("trn1.32xlarge")
        a, b, c, d = (Candidate(f"u{k}", f"ml/{k}", p, frozenset({core}), o) for k, p, core, o in
                      (("a", 1, 0, 2), ("b", 1, 1, 3), ("c", 1, 2, 4), ("d", 0, 3, 1)))  # fmt: skip
        # every other core held by pods that may not go: two of these four must, on connected devices 0 and 1
        found = choose(topo, FreeState.of(topo, ()), frozenset(range(32)), cores(2), [d, a, b, c])
        assert found is not None
        assert found.pods == (c, d)

    def test_past_the_search_limit_no_victim_is_one_the_pod_could_do_without(self) -> None:
        topo = topology("trn1.32xlarge")
        pods = [Candidate(f"u{c}", f"ml/c{c}", 0, frozenset({c}), c) for c in range(32)]
        found = choose(topo, FreeState.of(topo, ()), frozenset(range(32)), cores(6), pods, limit=1)
        assert found is not None
        chosen = set(found.pods)
        assert fits(topo, freed(FreeState.of(topo, ()), frozenset(range(32)), found.pods), cores(6))
        for spared in chosen:
            rest = tuple(chosen - {spared})
            assert not fits(topo, freed(FreeState.of(topo, ()), frozenset(range(32)), rest), cores(6))


# --- every subset ----------------------------------------------------------------------------------
FREE, OTHER = -1, -2  # a core that is free; one held by a pod that may not be evicted


@st.composite
def layouts(draw: st.DrawFn) -> tuple[Topology, FreeState, frozenset[int], list[Candidate], PodRequest]:
    """A node: each device free, held whole by one of up to 7 candidates or by a pod that may not
    go, or split core by core among them; some devices unhealthy; and a pod asking devices or cores."""
    name = draw(st.sampled_from(["inf2.24xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge"]))
    topo = topology(name)
    count = draw(st.integers(1, 7))
    owners = st.sampled_from([FREE, OTHER, *range(count)])
    owner_of: dict[int, int] = {}
    for d in range(topo.device_count):
        if draw(st.integers(0, 4)) == 0:
            for c in topo.cores_of(d):
                owner_of[c] = draw(owners)
        else:
            who = draw(owners)
            owner_of.update(dict.fromkeys(topo.cores_of(d), who))
    bad = draw(st.sets(st.integers(0, topo.device_count - 1), max_size=2))
    usable = frozenset(c for c in owner_of if topo.device_of(c) not in bad)
    candidates = [
        Candidate(
            f"u{i}",
            f"ml/p{i}",
            draw(st.integers(0, 2)),
            frozenset(c for c, who in owner_of.items() if who == i),
            draw(st.integers(0, 20)),
            draw(st.booleans()),
        )
        for i in range(count)
    ]
    candidates = [c for c in candidates if c.cores]
    free = FreeState.of(topo, (c for c, who in owner_of.items() if who == FREE and c in usable))
    if draw(st.booleans()):
        pod = devices(draw(st.sampled_from([s for s in topo.group_sizes if s <= 8] + [2, 3])))
    else:
        pod = cores(draw(st.integers(1, min(6, 2 * topo.cores_per_device))))
    return topo, free, usable, candidates, pod


def subsets(candidates: list[Candidate]) -> chain[tuple[Candidate, ...]]:
    return chain.from_iterable(combinations(candidates, k) for k in range(len(candidates) + 1))


@settings(max_examples=800, deadline=None)
@given(layouts())
def test_the_choice_is_the_best_of_every_subset_and_its_silicon_is_a_valid_set(
    layout: tuple[Topology, FreeState, frozenset[int], list[Candidate], PodRequest],
) -> None:
    topo, free, usable, candidates, pod = layout
    fitting = [s for s in subsets(candidates) if fits(topo, freed(free, usable, s), pod)]
    found = choose(topo, free, usable, pod, candidates)
    if not fitting:
        assert found is None  # nothing evicted where no valid set would follow
        return
    assert found is not None
    victims = found.pods
    assert set(victims) <= set(candidates)
    assert len(set(victims)) == len(victims)
    after = freed(free, usable, victims)
    assert fits(topo, after, pod)
    assert exhaustive_fits(topo, after, pod)  # valid by the slow oracle too, not only by the allocator
    if not victims:
        assert fits(topo, free.cores, pod)
        return
    # none of them could be spared
    for spared in victims:
        assert not fits(topo, freed(free, usable, tuple(v for v in victims if v is not spared)), pod)
    best = min(fitting, key=cost)
    if best and cost(best)[0] == 0:
        # a set within every budget exists: the choice is the best of all by kube-scheduler's order
        # (lowest highest priority, fewest pods, lowest sum of priorities, the latest bound)
        assert cost(victims)[:4] == cost(best)[:4]
    else:
        # every set takes a budget below its minimum: the lowest priority threshold still comes first
        assert max(v.priority for v in victims) == min(max(p.priority for p in s) for s in fitting if s)
    assert [v.priority for v in victims] == sorted((v.priority for v in victims), reverse=True)


@pytest.mark.parametrize("size", [1, 4, 8, 16])
def test_a_full_node_of_one_device_pods_gives_up_exactly_a_group(size: int) -> None:
    topo = topology("trn1.32xlarge")
    found = choose(topo, FreeState.of(topo, ()), frozenset(range(32)), devices(size), one_device_pods(topo, [0] * 16))
    assert found is not None
    assert len(found.pods) == size
    assert {min(v.cores) // 2 for v in found.pods} in [set(g) for g in topo.groups(size)]


# --- over the view: what the preempt verb answers ----------------------------------------------------
def full_node(node: str, *, priority: int = 0, listed: bool = True, cores_known: bool = True) -> tuple[
    dict[str, Any], list[dict[str, Any]]
]:  # fmt: skip
    """A trn1 node with a one-device pod of `priority` on each device, bound in device order."""
    topo = topology("trn1.32xlarge")
    pods = [
        pod_object(
            f"{node}-p{d}",
            namespace="batch",
            node=node,
            devices=1,
            phase="Running",
            priority=priority,
            scheduled_at=f"2026-03-01T11:00:{d:02d}Z",
        )
        for d in range(16)
    ]
    keys = [f"batch/{node}-p{d}" for d in range(16)] if listed else []
    holdings = {k: topo.cores_of(d) for d, k in enumerate(keys)} if cores_known else {}
    return report_object(node, free_devices=[], pods=keys, pod_cores=holdings), pods


def uid(node: str, device: int) -> str:
    return f"uid-batch-{node}-p{device}"


URGENT = pod_object("urgent", namespace="ml", devices=4, priority=1000)
BIG = pod_object("big", namespace="ml", devices=8, priority=1000)
DIAGONAL = [0, 5, 10, 15]  # what counting alone picks: the last bound, here made a diagonal


Answer = dict[str, NodeVictims]  # node -> the victims the preempt verb named there


def gone(view: ClusterView, pods: list[dict[str, Any]], uids: Iterable[str]) -> None:
    """The watch shows the pods of `pods` with these uids deleted."""
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    for u in uids:
        view.apply_pod("DELETED", pod_record(by_uid[u], NAMES))  # type: ignore[arg-type]


def urgent_then_big(asked: Iterable[str]) -> tuple[ClusterView, list[dict[str, Any]], Answer, Answer]:
    """Two full trn1 nodes, n1 and n2; the preempt verb asked for the 4-device URGENT ("ml/urgent"), then
    for the 8-device BIG ("ml/big"), each offered every pod of the nodes `asked`: kube-scheduler asks
    one pod after another before any victim goes. (The view, n1's pods, the two answers.)"""
    (r1, p1), (r2, p2) = full_node("n1"), full_node("n2")
    view = view_of(r1, r2, pods=[*p1, *p2])
    ask = {n: NodeVictims(tuple(uid(n, d) for d in range(16)), 0) for n in asked}
    four = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW, preemptor="ml/urgent")
    eight = decisions.preempt(view, neuron_request(BIG, NAMES), 1000, ask, NOW, preemptor="ml/big")
    return view, p1, four, eight


class TestOverTheView:
    def answer(self, view: ClusterView, victims: dict[str, list[str]], pod: dict[str, Any] = URGENT) -> dict[str, Any]:
        return decisions.preempt(
            view,
            neuron_request(pod, NAMES),
            pod["spec"].get("priority", 0),
            {n: NodeVictims(tuple(u), 0) for n, u in victims.items()},
            NOW,
        )

    def test_a_full_node_gives_up_one_rows_pods_not_kube_schedulers_count(self) -> None:
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        kube = [uid("n1", d) for d in DIAGONAL] + ["uid-cpu-only-pod"]  # one it chose for the CPU it frees
        found = self.answer(view, {"n1": kube})
        assert set(found) == {"n1"}
        chosen = found["n1"].uids
        assert chosen[-1] == "uid-cpu-only-pod"  # not a Neuron pod of the view: kube-scheduler's reason stands
        devices = {int(u.rsplit("p", 1)[1]) for u in chosen[:-1]}
        assert devices == {12, 13, 14, 15}  # a torus row: the one with the pods bound last
        # once they are gone the pod fits, by the filter's own judgement
        left = [f"batch/n1-p{d}" for d in range(16) if d not in devices]
        after = report_object("n1", free_devices=devices, pods=left)
        view.apply_report("MODIFIED", report_record(after))  # type: ignore[arg-type]
        for d in devices:
            view.apply_pod("DELETED", pod_record(pods[d], NAMES))  # type: ignore[arg-type]
        assert decisions.filter_nodes(view, neuron_request(URGENT, NAMES), ["n1"], NOW).passed == ["n1"]

    def test_the_victims_silicon_is_free_once_the_watch_shows_them_gone_before_the_report_does(self) -> None:
        # preemption's next attempt comes on the victims' deletion: refused there for a report a moment
        # old, the pod would preempt again elsewhere
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        urgent = neuron_request(URGENT, NAMES)
        found = self.answer(view, {"n1": [uid("n1", d) for d in DIAGONAL]})
        for victim in found["n1"].uids:
            assert decisions.filter_nodes(view, urgent, ["n1"], NOW).passed == []
            gone(view, pods, [victim])
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW).passed == ["n1"]
        # a pod of the same name bound again holds what the report lists for it
        again = pod_object("n1-p12", namespace="batch", node="n1", devices=1, uid="uid-again")
        view.apply_pod("ADDED", pod_record(again, NAMES))  # type: ignore[arg-type]
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW).passed == []

    def test_the_freed_set_is_held_from_pods_of_lower_priority_until_the_preemptor_is_bound(self) -> None:
        # kube-scheduler counts the nominated pod against pods of lower priority by count only: a core
        # pod is not counted against its devices, and would take the freed row
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        urgent, core_pod = neuron_request(URGENT, NAMES), neuron_request(pod_object("c", cores=2), NAMES)
        found = decisions.preempt(
            view,
            urgent,
            1000,
            {"n1": NodeVictims(tuple(uid("n1", d) for d in DIAGONAL), 0)},
            NOW,
            preemptor="ml/urgent",
        )
        gone(view, pods, found["n1"].uids)
        low, same = ("batch/c", 0), ("ml/other", 1000)
        refused = decisions.filter_nodes(view, core_pod, ["n1"], NOW, who=low).unresolvable["n1"]
        assert refused.kind is RefusalKind.PREEMPTION_HOLD
        assert "held for a pod that preempted for it" in refused.reason
        assert decisions.bind_refusal(view, core_pod, "batch/c", "n1", NOW, priority=0) is not None
        # as kube-scheduler counts a nominated pod: against pods of its priority too, not of a higher one
        assert decisions.filter_nodes(view, core_pod, ["n1"], NOW, who=same).passed == []
        assert decisions.filter_nodes(view, core_pod, ["n1"], NOW, who=("ml/top", 2000)).passed == ["n1"]
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW, who=("ml/urgent", 1000)).passed == ["n1"]
        assert decisions.bind_refusal(view, urgent, "ml/urgent", "n1", NOW, priority=1000) is None
        view.assume("ml/urgent", "uid-ml-urgent", "n1", urgent, 0.0)
        # bound: the row is its own now, and nothing else is held
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW, who=low).passed == []
        assert view.held_against("n1", 0, "batch/c", NOW) == frozenset()

    def test_the_hold_is_taken_on_the_node_whose_victims_go_only_and_lapses(self) -> None:
        # kube-scheduler picks one of the nodes answered: holding on all would keep the others' free
        # silicon from everyone, and their victims' from the pods preempting there next
        (r1, p1), (r2, p2) = full_node("n1"), full_node("n2")
        view = view_of(r1, r2, pods=[*p1, *p2])
        ask = {n: NodeVictims((uid(n, 0),), 0) for n in ("n1", "n2")}
        found = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW, preemptor="ml/u")
        assert set(found) == {"n1", "n2"}
        assert view.held_against("n1", 0, "batch/c", NOW) == view.held_against("n2", 0, "batch/c", NOW) == frozenset()
        (victim,) = [p for p in p2 if p["metadata"]["uid"] == found["n2"].uids[0]]
        view.apply_pod("DELETED", pod_record(victim, NAMES))  # type: ignore[arg-type]
        assert len(view.held_against("n2", 0, "batch/c", NOW)) == 8  # a row of trn1: 4 devices, 8 cores
        assert view.held_against("n1", 0, "batch/c", NOW) == frozenset()
        # a pod named for it on n1 goes too (evicted for another preemptor it was named for): held there
        # as well, until the pod is asked for again with the node it was nominated to
        (other,) = [p for p in p1 if p["metadata"]["uid"] == found["n1"].uids[0]]
        view.apply_pod("DELETED", pod_record(other, NAMES))  # type: ignore[arg-type]
        assert len(view.held_against("n1", 0, "batch/c", NOW)) == 8
        view.nominated("ml/u", "n2")
        assert view.held_against("n1", 0, "batch/c", NOW) == frozenset()
        assert len(view.held_against("n2", 0, "batch/c", NOW)) == 8
        assert view.held_against("n2", 0, "batch/c", NOW + dt.timedelta(seconds=HOLD_TTL + 1)) == frozenset()

    def test_room_is_held_not_cores_so_a_pod_the_plugin_would_place_on_the_freed_row_waits(self) -> None:
        # The victims often free more than the preemptor takes, and the plugin, which knows nothing of
        # holds, gives the next pod whichever cores it would anyway: kept off the held cores alone, a
        # 3-core pod passed beside the row, was given cores of it, and the preemptor preempted again
        # elsewhere (the fresh-clone run of 2026-12-02: needless preemptions, under load).
        topo = topology("trn1.32xlarge")
        holders = [d for d in range(16) if d not in (9, 10, 11, 12, 15)]
        pods = [
            pod_object(f"n1-p{d}", namespace="batch", node="n1", devices=1, phase="Running", priority=0)
            for d in holders
        ]
        keys = [f"batch/n1-p{d}" for d in holders]
        report = report_object(
            "n1",
            free_devices=[9, 10, 11, 12, 15],
            pods=keys,
            pod_cores={k: topo.cores_of(d) for d, k in zip(holders, keys, strict=True)},
        )
        view = view_of(report, pods=pods)
        found = decisions.preempt(
            view,
            neuron_request(URGENT, NAMES),
            1000,
            {"n1": NodeVictims((uid("n1", 8),), 0)},
            NOW,
            preemptor="ml/urgent",
        )
        assert found["n1"].uids == (uid("n1", 8),)
        (victim,) = [p for p in pods if p["metadata"]["name"] == "n1-p8"]
        view.apply_pod("DELETED", pod_record(victim, NAMES))  # type: ignore[arg-type]
        assert view.held_against("n1", 0, "batch/c", NOW) == frozenset(
            c for d in (8, 9, 10, 11) for c in topo.cores_of(d)
        )
        same = ("ml/other", 1000)
        three, two = (neuron_request(pod_object(n, cores=k), NAMES) for n, k in (("c3", 3), ("c2", 2)))
        # 3 cores fit on devices 12 and 15, beside the row; the plugin would give them cores of the row
        refused = decisions.filter_nodes(view, three, ["n1"], NOW, who=same).unresolvable["n1"]
        assert refused.kind is RefusalKind.PREEMPTION_HOLD
        assert decisions.bind_refusal(view, three, "ml/other", "n1", NOW, priority=1000) is not None
        # 2 cores the plugin gives on device 12: the row stays whole, and the pod goes
        assert decisions.filter_nodes(view, two, ["n1"], NOW, who=same).passed == ["n1"]
        assert decisions.filter_nodes(view, three, ["n1"], NOW, who=("ml/top", 2000)).passed == ["n1"]

    def test_a_hold_shared_by_the_preemptors_a_victim_was_named_for_is_the_nominated_ones(self) -> None:
        # kube-scheduler asks the preempt verb for one pod after another before any victim goes, and
        # each is answered the same pods; it evicts them for the one it nominates to the node. Held
        # for all of them together, their sets kept the node from the pods preempting next, which
        # preempted elsewhere for nothing: the watch of nominated pods tells whose it is.
        def preempted(*, nominated_first: bool) -> ClusterView:
            view, p1, four, eight = urgent_then_big(("n1", "n2"))
            assert set(four["n1"].uids) < set(eight["n1"].uids)  # a row, of the two rows the other takes
            if nominated_first:
                view.apply_nomination("ADDED", ("ml/urgent", "n1"))
            gone(view, p1, four["n1"].uids)
            return view

        row = 8  # cores: 4 devices of 2
        shared = preempted(nominated_first=False)
        assert len(shared.held_against("n1", 0, "batch/c", NOW)) > row
        assert {h.owners for h in shared.holds_against("n1", 0, "batch/c", NOW)} == {frozenset({"ml/urgent", "ml/big"})}
        shared.apply_nomination("ADDED", ("ml/big", "n2"))
        shared.apply_nomination("ADDED", ("ml/urgent", "n1"))
        assert len(shared.held_against("n1", 0, "batch/c", NOW)) == row
        assert {h.owners for h in shared.holds_against("n1", 0, "batch/c", NOW)} == {frozenset({"ml/urgent"})}
        # the nomination seen before the victims go: theirs is the nominated pod's from the start
        known = preempted(nominated_first=True)
        assert {h.owners for h in known.holds_against("n1", 0, "batch/c", NOW)} == {frozenset({"ml/urgent"})}
        assert len(known.held_against("n1", 0, "batch/c", NOW)) == row
        # the pod bound, its nomination leaves the watch: nothing is held, nothing remembered
        known.apply_nomination("DELETED", ("ml/urgent", "n1"))
        known.assume("ml/urgent", "uid-ml-urgent", "n1", neuron_request(URGENT, NAMES), 0.0)
        assert known.holds_against("n1", 0, "batch/c", NOW) == []
        assert known.nominations == {}

    def test_asked_again_with_its_nomination_a_shared_hold_shrinks_to_the_preemptors_own_set(self) -> None:
        view, p1, four, _ = urgent_then_big(("n1",))
        gone(view, p1, four["n1"].uids)
        view.nominated("ml/urgent", "n1")  # the filter's path: the nomination on the pod it is asked for
        assert len(view.held_against("n1", 0, "batch/c", NOW)) == 8

    def test_every_victim_of_one_preemption_gone_holds_the_preemptors_room_once(self) -> None:
        # each victim's deletion took the hold again: four holds of one 4-device pod, placed one after
        # the other, kept room for four of it, and every pod of no higher priority off the node
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        ask = {"n1": NodeVictims(tuple(uid("n1", d) for d in DIAGONAL), 0)}
        found = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW, preemptor="ml/urgent")
        assert len(found["n1"].uids) == 4
        view.apply_pod("DELETED", pod_record(pods[0], NAMES))  # type: ignore[arg-type]  # not a victim: ended
        gone(view, pods, found["n1"].uids)
        assert len(view.holds_against("n1", 0, "batch/c", NOW)) == 1
        two = neuron_request(pod_object("c", cores=2), NAMES)
        # device 0, beside the freed row: the row stays whole
        assert decisions.filter_nodes(view, two, ["n1"], NOW, who=("batch/c", 0)).passed == ["n1"]
        device = neuron_request(pod_object("d", devices=1), NAMES)
        assert decisions.filter_nodes(view, device, ["n1"], NOW, who=("batch/c", 0)).passed == ["n1"]

    def test_the_victims_of_the_larger_of_two_answers_gone_hold_its_room_alone_and_once(self) -> None:
        # the 4-device pod's victims are some of the 8-device pod's: evicted for the latter, the ones
        # named for both are its or the other's, the rest its alone; they are one eviction, its own,
        # not its room and then either's on what is left (two rows of trn1's four: the whole node)
        view, p1, four, eight = urgent_then_big(("n1", "n2"))
        assert set(four["n1"].uids) < set(eight["n1"].uids)
        spare = next(p for p in p1 if p["metadata"]["uid"] not in eight["n1"].uids)
        view.apply_pod("DELETED", pod_record(spare, NAMES))  # type: ignore[arg-type]  # not a victim: ended
        gone(view, p1, eight["n1"].uids)
        assert [h.owners for h in view.holds_against("n1", 0, "batch/c", NOW)] == [frozenset({"ml/big"})]
        two = neuron_request(pod_object("c", cores=2), NAMES)
        assert decisions.filter_nodes(view, two, ["n1"], NOW, who=("batch/c", 0)).passed == ["n1"]

    def test_the_nomination_shown_after_the_victims_go_makes_the_hold_the_nominated_pods_alone(self) -> None:
        # as it is when the nomination shows first (docs/scheduling.md: "once it shows, for that pod
        # alone"): kept for a preemptor never nominated, the hold keeps its room too until it lapses
        view, p1, four, _ = urgent_then_big(("n1",))
        gone(view, p1, four["n1"].uids)
        view.apply_nomination("ADDED", ("ml/urgent", "n1"))
        assert {h.owners for h in view.holds_against("n1", 0, "batch/c", NOW)} == {frozenset({"ml/urgent"})}
        assert len(view.held_against("n1", 0, "batch/c", NOW)) == 8

    def test_renominated_to_another_node_the_pod_holds_nothing_where_it_was_and_a_relist_tells_the_same(
        self,
    ) -> None:
        view, p1, four, _ = urgent_then_big(("n1",))
        gone(view, p1, four["n1"].uids)
        # the watch relisted: the nominations it lists decide, in whatever order they come
        view.replace_nominations([("ml/urgent", "n1"), ("ml/big", "n2")])
        assert [h.owners for h in view.holds_against("n1", 0, "batch/c", NOW)] == [frozenset({"ml/urgent"})]
        # its room there taken by another, kube-scheduler preempts for it on n2: n1 holds nothing more
        view.apply_nomination("MODIFIED", ("ml/urgent", "n2"))
        assert view.holds_against("n1", 0, "batch/c", NOW) == []
        # deleted while nominated (or bound): the watch forgets it
        view.apply_nomination("DELETED", ("ml/urgent", "n2"))
        assert view.nominations == {"ml/big": "n2"}

    def test_preempting_again_its_old_nomination_does_not_give_its_new_victims_room_to_another(self) -> None:
        # its room on n1 lost, kube-scheduler preempts for it again, on n2, and evicts there before the
        # watch shows the new nomination: taken by the old one as nominated elsewhere, the pod was left
        # out of the hold its own victims made, the other preemptor they were named for got it, and
        # once that one was nominated elsewhere nothing kept the pod's room
        (r1, p1), (r2, p2) = full_node("n1"), full_node("n2")
        view = view_of(r1, r2, pods=[*p1, *p2])
        urgent = neuron_request(URGENT, NAMES)
        first = decisions.preempt(
            view, urgent, 1000, {"n1": NodeVictims((uid("n1", 0),), 0)}, NOW, preemptor="ml/urgent"
        )
        view.apply_nomination("ADDED", ("ml/urgent", "n1"))
        gone(view, p1, first["n1"].uids)
        ask = {"n2": NodeVictims(tuple(uid("n2", d) for d in range(16)), 0)}
        other = neuron_request(pod_object("other", namespace="ml", devices=4, priority=1000), NAMES)
        decisions.preempt(view, other, 1000, ask, NOW, preemptor="ml/other")
        again = decisions.preempt(view, urgent, 1000, ask, NOW, preemptor="ml/urgent")
        gone(view, p2, again["n2"].uids)
        view.apply_nomination("MODIFIED", ("ml/urgent", "n2"))
        view.apply_nomination("ADDED", ("ml/other", "n1"))
        assert [h.owners for h in view.holds_against("n2", 0, "batch/c", NOW)] == [frozenset({"ml/urgent"})]
        assert view.holds_against("n1", 0, "batch/c", NOW) == []

    def test_while_some_victims_still_run_a_pod_off_the_preemptors_set_passes(self) -> None:
        # the preemptor fits only once every victim is gone: until then no pod placed here leaves it
        # room, and the room check alone kept every pod of no higher priority off the whole node
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        ask = {"n1": NodeVictims(tuple(uid("n1", d) for d in DIAGONAL), 0)}
        found = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW, preemptor="ml/urgent")
        view.apply_pod("DELETED", pod_record(pods[0], NAMES))  # type: ignore[arg-type]  # not a victim: ended
        (first,) = [p for p in pods if p["metadata"]["uid"] == found["n1"].uids[0]]
        view.apply_pod("DELETED", pod_record(first, NAMES))  # type: ignore[arg-type]
        two = neuron_request(pod_object("c", cores=2), NAMES)
        # device 0 is off the set held: the pod goes there
        assert decisions.filter_nodes(view, two, ["n1"], NOW, who=("batch/c", 0)).passed == ["n1"]
        # a pod that takes device 0 and the freed device can only take cores of the held set
        three = neuron_request(pod_object("c3", cores=3), NAMES)
        refused = decisions.filter_nodes(view, three, ["n1"], NOW, who=("batch/c", 0)).unresolvable["n1"]
        assert refused.kind is RefusalKind.PREEMPTION_HOLD

    def test_lapsed_holds_and_offers_are_dropped_on_nodes_never_asked_about_again(self) -> None:
        (r1, p1), (r2, p2) = full_node("n1"), full_node("n2")
        view = view_of(r1, r2, pods=[*p1, *p2])
        ask = {n: NodeVictims((uid(n, 0),), 0) for n in ("n1", "n2")}
        found = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW, preemptor="ml/u")
        (victim,) = [p for p in p1 if p["metadata"]["uid"] == found["n1"].uids[0]]
        view.apply_pod("DELETED", pod_record(victim, NAMES))  # type: ignore[arg-type]
        view.expire_holds(NOW)
        assert view._holds  # not lapsed yet
        assert view._offers
        view.expire_holds(NOW + dt.timedelta(seconds=HOLD_TTL + 1))
        assert view._holds == {}
        assert view._offers == {}

    def test_offers_of_a_preemptor_never_asked_for_again_are_forgotten(self) -> None:
        report, pods = full_node("n1")
        view = view_of(report, pods=pods)
        urgent = neuron_request(URGENT, NAMES)
        decisions.preempt(view, urgent, 1000, {"n1": NodeVictims((uid("n1", 0),), 0)}, NOW, preemptor="ml/gone")
        assert view._offers
        later = NOW + dt.timedelta(seconds=HOLD_TTL + 1)
        decisions.preempt(view, urgent, 1000, {}, later, preemptor="ml/other")
        assert view._offers == {}

    def test_asked_again_for_the_node_it_was_nominated_to_the_preemptor_finds_the_victims_gone(self) -> None:
        # kube-scheduler's cache, which passed the node's count before asking, has the victims deleted;
        # this view's watch may not yet
        (r1, p1), (r2, p2) = full_node("n1"), full_node("n2")
        view = view_of(r1, r2, pods=[*p1, *p2])
        urgent = neuron_request(URGENT, NAMES)
        ask = {n: NodeVictims((uid(n, 0),), 0) for n in ("n1", "n2")}
        decisions.preempt(view, urgent, 1000, ask, NOW, preemptor="ml/urgent")
        who = ("ml/urgent", 1000)
        view.nominated("ml/other", "n1")  # no answer for that pod: nothing changes
        assert decisions.filter_nodes(view, urgent, ["n1", "n2"], NOW, who=who).passed == []
        view.nominated("ml/urgent", "n1")
        assert decisions.filter_nodes(view, urgent, ["n1", "n2"], NOW, who=who).passed == ["n1"]
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW, who=("batch/c", 0)).passed == []  # held for it
        # the evicted pods are no victims again; a new pod of the same name holds what the report lists
        assert all(
            o.pod.key not in {f"batch/n1-p{d}" for d in range(12, 16)} for o in view.occupants(view.node("n1", NOW))
        )
        again = pod_object("n1-p12", namespace="batch", node="n1", devices=1, uid="uid-again", priority=0)
        view.apply_pod("ADDED", pod_record(again, NAMES))  # type: ignore[arg-type]
        assert decisions.filter_nodes(view, urgent, ["n1"], NOW, who=who).passed == []

    def test_a_pod_the_report_lists_but_the_watch_has_not_shown_holds_its_silicon(self) -> None:
        report, pods = full_node("n1")
        view = view_of(report, pods=pods[:12])  # the watch is behind the report
        assert decisions.filter_nodes(view, neuron_request(URGENT, NAMES), ["n1"], NOW).passed == []

    def test_no_pod_is_preempted_where_no_valid_set_would_follow(self) -> None:
        same, same_pods = full_node("same", priority=1000)  # nothing of lower priority
        old, old_pods = full_node("old", cores_known=False)  # a plugin that does not say who holds what
        stale = report_object("stale", free_devices=[], age=3600)
        view = view_of(same, old, stale, pods=[*same_pods, *old_pods])
        found = self.answer(view, {n: [uid(n, d) for d in DIAGONAL] for n in ("same", "old", "stale", "unknown")})
        assert found == {}

    def test_a_pod_bound_a_moment_ago_is_never_a_victim(self) -> None:
        report, pods = full_node("n1")
        view = view_of(report, pods=pods[:12])  # the last row's pods are not seen bound yet: assumed
        for d in range(12, 16):
            meta = pods[d]["metadata"]
            view.assume(f"batch/{meta['name']}", meta["uid"], "n1", neuron_request(pods[d], NAMES), 0.0)
        found = self.answer(view, {"n1": [uid("n1", d) for d in DIAGONAL]})
        devices = {int(u.rsplit("p", 1)[1]) for u in found["n1"].uids}
        assert devices in [{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}]

    def test_where_the_pod_fits_already_kube_schedulers_victims_stand(self) -> None:
        _report, _pods = full_node("n1")
        view = view_of(report_object("n1", free_devices=range(4), pods=[], pod_cores={}), pods=[])
        found = self.answer(view, {"n1": ["uid-a"]})
        assert found == {"n1": NodeVictims(("uid-a",), 0)}

    def test_a_groups_pod_preempts_only_where_the_whole_group_then_fits(self) -> None:
        reports = ultraserver_reports(A, free_devices=[])
        topo = topology("trn2u.48xlarge")
        batch = []
        for i, r in enumerate(reports):
            node = r["metadata"]["name"]
            keys = [f"batch/{node}-p{d}" for d in range(16)]
            r["status"]["pods"] = keys
            r["status"]["podCores"] = [{"pod": k, "cores": list(topo.cores_of(d))} for d, k in enumerate(keys)]
            batch += [
                pod_object(
                    f"{node}-p{d}",
                    namespace="batch",
                    node=node,
                    devices=1,
                    phase="Running",
                    priority=0 if i < 3 else 1000,
                )
                for d in range(16)
            ]
        placed = lws_pod("w0", size=4, devices=16, node="", priority=500)
        view = view_of(*reports, pods=batch)
        group = group_request(placed)
        assert group is not None
        request = neuron_request(placed, NAMES)
        ask = {f"{A}-{i}": NodeVictims((f"uid-batch-{A}-{i}-p0",), 0) for i in range(4)}
        # none of the group placed or reserved: it preempts nowhere
        assert decisions.preempt(view, request, 500, ask, NOW, group, "default/w0") == {}
        # reserved on this UltraServer, but a node of it runs pods of higher priority: 3 of 4 fit at most
        view.reserve(group, (4, A), NOW)
        assert decisions.preempt(view, request, 500, ask, NOW, group, "default/w0") == {}
        # at a priority above them all, the group fits once they are gone: each node gives up its 16 pods
        found = decisions.preempt(view, request, 2000, ask, NOW, group, "default/w0")
        assert set(found) == set(ask)
        assert all(len(v.uids) == 16 for v in found.values())


# --- PodDisruptionBudgets, as kube-scheduler weighs them ----------------------------------------------
def pdb_object(name: str, allowed: int, selector: dict[str, Any] | None, namespace: str = "batch",
               disrupted: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    spec = {"selector": selector} if selector is not None else {}
    status = {"disruptionsAllowed": allowed, "disruptedPods": dict.fromkeys(disrupted, "2026-03-01T11:59:00Z")}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec, "status": status}


class TestBudgets:
    def subject(self, name: str, labels: dict[str, str], namespace: str = "batch") -> Subject:
        return Subject(f"u-{name}", name, namespace, labels)

    def test_selectors_as_kube_scheduler_reads_them(self) -> None:
        by_labels = budget(pdb_object("b", 0, {"matchLabels": {"app": "train"}}))
        by_expressions = budget(pdb_object("b", 0, {"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["batch", "low"]},
            {"key": "keep", "operator": "DoesNotExist"},
        ]}))  # fmt: skip
        assert by_labels is not None
        assert by_expressions is not None
        assert by_labels.matches({"app": "train", "x": "y"})
        assert not by_labels.matches({"app": "serve"})
        assert by_expressions.matches({"tier": "low"})
        assert not by_expressions.matches({"tier": "low", "keep": "1"})
        assert not by_expressions.matches({"tier": "prod"})
        # nil and empty selectors match nothing there (selector.Empty()), nor does one it cannot parse
        for selector in (None, {}, {"matchExpressions": [{"key": "a", "operator": "In"}]}):
            found = budget(pdb_object("b", 0, selector))
            assert found is not None
            assert not found.matches({"app": "train"})

    def test_each_victim_takes_one_disruption_the_most_important_first(self) -> None:
        budgets = [budget(pdb_object("b", 1, {"matchLabels": {"app": "train"}}))]
        pods = [self.subject(n, {"app": "train"}) for n in ("first", "second", "third")]
        assert violating(pods, [b for b in budgets if b]) == {"u-second", "u-third"}
        # a pod already counted disrupted takes none; another namespace's budget and a pod without labels never count
        disrupted = [budget(pdb_object("b", 0, {"matchLabels": {"app": "train"}}, disrupted=("first",)))]
        other = [budget(pdb_object("b", 0, {"matchLabels": {"app": "train"}}, namespace="ml"))]
        assert violating(pods, [b for b in disrupted if b]) == {"u-second", "u-third"}
        assert violating(pods, [b for b in other if b]) == frozenset()
        assert violating([self.subject("bare", {})], [b for b in budgets if b]) == frozenset()

    def test_a_row_of_unprotected_pods_goes_before_a_protected_one_and_the_count_is_returned(self) -> None:
        topo = topology("trn1.32xlarge")
        pods = [
            pod_object(
                f"n1-p{d}",
                namespace="batch",
                node="n1",
                devices=1,
                phase="Running",
                priority=0,
                labels={"app": "protected" if d >= 12 else "free"},
            )
            for d in range(16)
        ]
        keys = [f"batch/n1-p{d}" for d in range(16)]
        report = report_object(
            "n1", free_devices=[], pods=keys, pod_cores={k: topo.cores_of(d) for d, k in enumerate(keys)}
        )
        view = view_of(report, pods=pods)
        view.replace_budgets([b for b in [budget(pdb_object("keep", 0, {"matchLabels": {"app": "protected"}}))] if b])
        ask = {"n1": NodeVictims((uid("n1", 15),), 0)}
        found = decisions.preempt(view, neuron_request(URGENT, NAMES), 1000, ask, NOW)
        # without the budget the row bound last (12 to 15) would go; with it, the next row
        assert {int(u.rsplit("p", 1)[1]) for u in found["n1"].uids} == {8, 9, 10, 11}
        assert found["n1"].pdb_violations == 0
        whole = neuron_request(pod_object("big", devices=16), NAMES)
        found = decisions.preempt(view, whole, 1000, ask, NOW)
        assert len(found["n1"].uids) == 16
        assert found["n1"].pdb_violations == 4
