"""The cluster's Neuron view: reports, pods in flight, pods this extender bound."""

from __future__ import annotations

import datetime as dt

from extender_objects import NAMES, NOW, pod_object, report_object, trn1, view_of

from neuron_model.placement import ContainerRequest, FreeState, PodRequest, place
from neuron_scheduler_extender.decisions import judge
from neuron_scheduler_extender.pods import pod_record
from neuron_scheduler_extender.state import ClusterView, RefusalKind, ReportRecord, report_record

EIGHT = PodRequest((), (ContainerRequest(devices=8),))


def record(pod: dict) -> object:  # type: ignore[type-arg]
    r = pod_record(pod, NAMES)
    assert r is not None
    return r


def record_of(report: dict) -> ReportRecord:  # type: ignore[type-arg]
    r = report_record(report)
    assert r is not None
    return r


def free_devices(view: ClusterView, node: str = "n1") -> list[int]:
    state = view.node(node, NOW)
    assert state.refusal is None, state.refusal
    assert state.free is not None
    return sorted(state.free.devices)


class TestReports:
    def test_a_node_without_a_report_is_refused_and_told_why(self) -> None:
        state = view_of(report_object("n1")).node("n2", NOW)
        assert state.refusal is not None
        assert state.refusal.kind is RefusalKind.MISSING_REPORT
        assert "no NeuronNode report for node n2" in state.refusal.reason

    def test_a_report_older_than_the_limit_is_refused_with_its_age(self) -> None:
        view = view_of(report_object("n1", age=120), report_object("n2", age=121), max_age=120)
        assert view.node("n1", NOW).refusal is None
        refusal = view.node("n2", NOW).refusal
        assert refusal is not None
        assert refusal.kind is RefusalKind.STALE_REPORT
        assert "report of node n2 is 2m01s old (heartbeatTime 2026-03-01T11:57:59Z, limit 2m00s)" in refusal.reason
        # staleness is judged at the time of asking, not when the report arrived
        assert view.node("n1", NOW + dt.timedelta(seconds=1)).refusal is not None

    def test_an_unreadable_report_refuses_its_node_with_the_reason(self) -> None:
        bad = report_object("n1")
        bad["status"]["freeCores"] = [99]
        view = view_of(bad)
        refusal = view.node("n1", NOW).refusal
        assert refusal is not None
        assert refusal.kind is RefusalKind.INVALID_REPORT
        assert refusal.reason == "NeuronNode n1: status.freeCores: expected indices below 32"
        good = report_record(report_object("n1"))
        assert good is not None
        view.apply_report("MODIFIED", good)
        assert view.node("n1", NOW).refusal is None

    def test_deleted_report(self) -> None:
        view = view_of(report_object("n1"))
        gone = report_record(report_object("n1"))
        assert gone is not None
        view.apply_report("DELETED", gone)
        assert view.node("n1", NOW).refusal is not None

    def test_unhealthy_devices_are_never_free_even_if_the_report_lists_their_cores(self) -> None:
        obj = report_object("n1", unhealthy=[3])
        obj["status"]["freeCores"] = list(range(32))
        assert 3 not in free_devices(view_of(obj))

    def test_the_topology_is_the_reports_own_adjacency(self) -> None:
        obj = report_object("n1", free_devices=[0, 1])
        obj["status"]["topology"]["adjacency"][0] = [4]  # the driver says device 0 links only to 4
        obj["status"]["topology"]["adjacency"][1] = [5]
        view = view_of(obj)
        state = view.node("n1", NOW)
        assert state.topology is not None
        assert state.topology.adjacency[0] == (4,)
        # same shape, one object: per-topology caches are shared between nodes
        view.replace_reports(r for r in (report_record(report_object(n)) for n in ("a", "b")) if r)
        assert view.node("a", NOW).topology is view.node("b", NOW).topology


class TestPodsInFlight:
    def test_a_bound_pod_not_in_the_report_holds_what_the_plugin_will_give_it(self) -> None:
        view = view_of(report_object("n1"), pods=[pod_object("a", node="n1", devices=8)])
        free = view.node("n1", NOW).free
        expected = place(trn1(), FreeState.of(trn1(), range(32)), EIGHT).free_after
        assert free == expected
        assert view.node("n1", NOW).in_flight == ("default/a",)

    def test_once_the_report_lists_it_the_pod_is_not_counted_twice(self) -> None:
        view = view_of(report_object("n1"), pods=[pod_object("a", node="n1", devices=8)])
        held = set(range(16)) - set(free_devices(view))
        report = report_record(report_object("n1", free_devices=set(range(16)) - held, pods=["default/a"]))
        assert report is not None
        view.apply_report("MODIFIED", report)
        assert set(free_devices(view)) == set(range(16)) - held
        assert view.node("n1", NOW).in_flight == ()

    def test_pods_in_flight_are_placed_in_binding_order(self) -> None:
        # a core first takes device 0 (on an empty torus the plugin's choice), so the 8 go to the other half;
        # the other way round the 8 take 0-7 and the core goes to 8
        first = pod_object("core", node="n1", cores=1, scheduled_at="2026-03-01T11:59:01Z")
        second = pod_object("eight", node="n1", devices=8, scheduled_at="2026-03-01T11:59:02Z")
        core_then_eight = view_of(report_object("n1"), pods=[second, first])
        assert free_devices(core_then_eight) == list(range(1, 8))
        first["status"]["conditions"][0]["lastTransitionTime"] = "2026-03-01T11:59:03Z"
        eight_then_core = view_of(report_object("n1"), pods=[first, second])
        assert free_devices(eight_then_core) == list(range(9, 16))

    def test_watch_events_keep_binding_order(self) -> None:
        view = view_of(report_object("n1"))
        view.apply_pod("ADDED", record(pod_object("eight", node="n1", devices=8)))
        view.apply_pod("ADDED", record(pod_object("core", node="n1", cores=1)))
        before = free_devices(view)
        # a later status update of the first pod does not move it behind the second
        view.apply_pod("MODIFIED", record(pod_object("eight", node="n1", devices=8, phase="Running")))
        assert free_devices(view) == before

    def test_a_pod_in_flight_that_does_not_fit_holds_the_node_until_the_report_catches_up(self) -> None:
        view = view_of(report_object("n1", free_devices=range(4)), pods=[pod_object("big", node="n1", devices=8)])
        refusal = view.node("n1", NOW).refusal
        assert refusal is not None
        assert refusal.kind is RefusalKind.IN_FLIGHT_CONFLICT
        assert refusal.reason.startswith("pod default/big is bound to node n1 but not admitted yet")
        assert "8 devices requested, only 4 devices free" in refusal.reason
        # the kubelet refused it: Failed, it holds nothing
        view.apply_pod("MODIFIED", record(pod_object("big", node="n1", devices=8, phase="Failed")))
        assert free_devices(view) == [0, 1, 2, 3]

    def test_finished_deleted_and_unbound_pods_hold_nothing(self) -> None:
        view = view_of(
            report_object("n1"),
            pods=[
                pod_object("done", node="n1", devices=16, phase="Succeeded"),
                pod_object("failed", node="n1", devices=16, phase="Failed"),
                pod_object("pending", devices=16),
                pod_object("running", node="n1", devices=1, phase="Running"),
            ],
        )
        assert len(free_devices(view)) == 15
        view.apply_pod("DELETED", record(pod_object("running", node="n1", devices=1)))
        assert len(free_devices(view)) == 16

    def test_pods_on_other_nodes_do_not_count_here(self) -> None:
        view = view_of(report_object("n1"), report_object("n2"), pods=[pod_object("a", node="n2", devices=16)])
        assert len(free_devices(view, "n1")) == 16
        assert free_devices(view, "n2") == []


ONE = PodRequest((), (ContainerRequest(devices=1),))
ONE_PER_ROW = (1, 5, 9, 13)  # no free row of four: an 8-device pod never fits, the reason names what is free


def report_while_handed_out(handed_out: list[int]) -> dict:  # type: ignore[type-arg]
    """The report between the plugin's Allocate of `handed_out` and its next PodResources List: the
    devices are held, but by no pod it lists yet; it says which cores that is."""
    obj = report_object("n1", free_devices=set(range(16)) - set(handed_out), unhealthy=ONE_PER_ROW)
    obj["status"]["pendingCores"] = [c for d in handed_out for c in trn1().cores_of(d)]
    return obj


class TestHandOutsTheReportHoldsButDoesNotListYet:
    """The e2e run where an 8-device pod was refused naming 8 free devices of 10: two 1-device pods
    were admitted (devices 0 and 2), and the report held their devices before it listed them."""

    FREE = [3, 4, 6, 7, 8, 10, 11, 12, 14, 15]  # 12 healthy, less 0 and 2

    def test_pods_bound_there_are_counted_once(self) -> None:
        pods = [
            pod_object("one-a", node="n1", devices=1, scheduled_at="2026-03-01T11:59:01Z"),
            pod_object("one-b", node="n1", devices=1, scheduled_at="2026-03-01T11:59:02Z"),
        ]
        view = view_of(report_while_handed_out([0, 2]), pods=pods)
        assert free_devices(view) == self.FREE
        refusal = judge(view.node("n1", NOW), EIGHT)
        assert refusal is not None
        assert "no connected set of 8 free devices (free: 3,4,6,7,8,10,11,12,14,15)" in refusal.reason

    def test_pods_this_extender_bound_are_counted_once(self) -> None:
        view = view_of(report_while_handed_out([0, 2]))
        view.assume("default/one-a", "uid-a", "n1", ONE, now=10.0)
        view.assume("default/one-b", "uid-b", "n1", ONE, now=11.0)
        assert free_devices(view) == self.FREE

    def test_a_pod_handed_out_to_and_one_not_admitted_yet_each_hold_their_own(self) -> None:
        view = view_of(report_while_handed_out([0]))
        view.assume("default/one-a", "uid-a", "n1", ONE, now=10.0)  # admitted: device 0
        view.assume("default/one-b", "uid-b", "n1", ONE, now=11.0)  # not yet: the plugin will give it 2
        assert free_devices(view) == self.FREE

    def test_silicon_handed_out_to_a_pod_not_known_here_stays_held(self) -> None:
        # its binding not seen yet, or a pod the view cannot read: the report's word holds
        view = view_of(report_while_handed_out([0, 2]))
        assert free_devices(view) == self.FREE
        view.assume("default/one-a", "uid-a", "n1", ONE, now=10.0)  # one of the two
        assert free_devices(view) == self.FREE

    def test_once_the_list_names_the_pods_nothing_changes(self) -> None:
        view = view_of(report_while_handed_out([0, 2]))
        view.assume("default/one-a", "uid-a", "n1", ONE, now=10.0)
        view.assume("default/one-b", "uid-b", "n1", ONE, now=11.0)
        listed = report_object(
            "n1", free_devices=self.FREE, unhealthy=ONE_PER_ROW, pods=["default/one-a", "default/one-b"]
        )
        view.apply_report("MODIFIED", record_of(listed))
        assert free_devices(view) == self.FREE
        assert view.stats(NOW).assumed_pods == 0


class TestAssumedBindings:
    def test_a_pod_this_extender_bound_counts_before_the_watch_shows_it(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-a", "n1", EIGHT, now=10.0)
        assert len(free_devices(view)) == 8
        assert view.bound_to("default/a") == "n1"

    def test_the_watch_confirms_it_without_counting_it_twice(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-default-a", "n1", EIGHT, now=10.0)
        view.apply_pod("ADDED", record(pod_object("a", node="n1", devices=8)))
        assert len(free_devices(view)) == 8
        assert view.stats(NOW).assumed_pods == 0
        assert view.stats(NOW).bound_pods == 1

    def test_an_event_from_before_the_binding_does_not_undo_it(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-default-a", "n1", EIGHT, now=10.0)
        view.apply_pod("MODIFIED", record(pod_object("a", devices=8)))  # still unbound in that event
        assert len(free_devices(view)) == 8

    def test_the_report_listing_it_confirms_it_too(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-default-a", "n1", EIGHT, now=10.0)
        held = set(range(16)) - set(free_devices(view))
        report = report_record(report_object("n1", free_devices=set(range(16)) - held, pods=["default/a"]))
        assert report is not None
        view.apply_report("MODIFIED", report)
        assert view.stats(NOW).assumed_pods == 0
        assert set(free_devices(view)) == set(range(16)) - held

    def test_a_failed_binding_is_forgotten(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-a", "n1", EIGHT, now=10.0)
        view.forget("default/a", "uid-other")  # another pod of that name: not this one
        assert len(free_devices(view)) == 8
        view.forget("default/a", "uid-a")
        assert len(free_devices(view)) == 16

    def test_a_fresh_list_drops_assumptions_older_than_it_that_it_does_not_show(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/old", "uid-old", "n1", EIGHT, now=10.0)
        view.assume("default/new", "uid-new", "n1", EIGHT, now=30.0)
        view.replace_pods([], listed_after=20.0)  # the list began after "old" was bound, before "new"
        assert view.bound_to("default/old") == ""
        assert view.bound_to("default/new") == "n1"

    def test_assumptions_nothing_confirms_expire(self) -> None:
        view = ClusterView(report_max_age=120, assume_ttl=300)
        view.assume("default/a", "uid-a", "n1", EIGHT, now=10.0)
        assert view.expire_assumed(300.0) == []
        assert view.expire_assumed(311.0) == ["default/a"]
        assert view.bound_to("default/a") == ""

    def test_a_deleted_pod_is_no_longer_assumed(self) -> None:
        view = view_of(report_object("n1"))
        view.assume("default/a", "uid-default-a", "n1", EIGHT, now=10.0)
        view.apply_pod("DELETED", record(pod_object("a", devices=8)))
        assert len(free_devices(view)) == 16


def test_stats() -> None:
    view = view_of(
        report_object("n1"),
        report_object("n2", age=500),
        report_object("n3", pods=["default/b"]),
        pods=[pod_object("a", node="n1", devices=1), pod_object("b", node="n3", devices=1)],
    )
    bad = report_object("n4")
    bad["status"]["coresPerDevice"] = 0
    r = report_record(bad)
    assert r is not None
    view.apply_report("ADDED", r)
    view.assume("default/c", "uid-c", "n1", EIGHT, now=1.0)
    stats = view.stats(NOW)
    assert (stats.reports, stats.stale_reports, stats.invalid_reports) == (3, 1, 1)
    assert (stats.bound_pods, stats.assumed_pods, stats.in_flight_pods) == (2, 1, 2)
