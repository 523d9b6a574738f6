from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_model.instance_types import INSTANCE_TYPES, TopologyKind
from neuron_model.report import NodeReport, ReportError
from neuron_model.ultraserver import Mode, State, UltraServerIdentity, UltraServerReading

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)


def trn1(free: set[int], unhealthy: set[int] = frozenset()) -> NodeReport:  # type: ignore[assignment]
    it = INSTANCE_TYPES["trn1.32xlarge"]
    return NodeReport(
        node="n1",
        instance_type=it.name,
        topology=it.topology,
        device_count=it.devices,
        torus_shape=it.torus_shape,
        adjacency=it.adjacency(),
        cores_per_device=2,
        logical_core_config=1,
        free_cores=frozenset(free),
        unhealthy_devices=frozenset(unhealthy),
        pods=frozenset({"ml/train-0"}),
        heartbeat=NOW,
    )


@given(st.sets(st.integers(0, 31)), st.sets(st.integers(0, 15)), st.sets(st.integers(0, 31)))
def test_round_trip(free: set[int], unhealthy: set[int], pending: set[int]) -> None:
    report = dataclasses.replace(trn1(free, unhealthy), pending_cores=frozenset(pending))
    assert NodeReport.from_object(report.to_object()) == report


def test_failing_links_round_trip_and_an_older_plugins_report_has_none() -> None:
    report = dataclasses.replace(trn1({0, 1}), multi_node_unfit=frozenset({3, 7}))
    obj = report.to_object()
    assert obj["status"]["multiNodeUnfitDevices"] == [3, 7]
    assert NodeReport.from_object(obj) == report
    del obj["status"]["multiNodeUnfitDevices"]  # a plugin older than the field
    assert NodeReport.from_object(obj).multi_node_unfit == frozenset()
    obj["status"]["multiNodeUnfitDevices"] = [16]
    with pytest.raises(ReportError, match="multiNodeUnfitDevices: expected indices below 16"):
        NodeReport.from_object(obj)


def test_a_report_from_a_plugin_older_than_pending_cores_has_none_pending() -> None:
    # during a rolling upgrade the extender reads reports of plugins that do not write the field yet
    obj = trn1({0, 1}).to_object()
    del obj["status"]["pendingCores"]
    assert NodeReport.from_object(obj).pending_cores == frozenset()


def test_free_devices_are_those_with_every_core_free_and_columns_read_at_a_glance() -> None:
    report = trn1({0, 1, 2, 5, 6, 7}, {9})
    assert report.free_devices == {0, 3}
    status = report.to_object()["status"]
    assert (status["devices"], status["cores"], status["health"]) == ("2/16", "6/32", "15/16 healthy")
    assert report.age(NOW + dt.timedelta(seconds=90)) == 90


def mutate(path: list[str], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(trn1({0, 1}).to_object())
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["metadata", "name"], KeyError, "metadata.name: missing"),
        (["status"], KeyError, "status: missing"),
        (["status", "topology", "kind"], "mesh", "unknown 'mesh'"),
        (["status", "topology", "deviceCount"], "16", "expected int"),
        (["status", "coresPerDevice"], 0, "out of range"),
        (["status", "topology", "adjacency"], [[1]], "expected 16 lists"),
        (["status", "freeCores"], [0, 32], "indices below 32"),
        (["status", "freeCores"], [True], "indices below 32"),
        (["status", "unhealthyDevices"], [-1], "indices below 16"),
        (["status", "pendingCores"], [32], "pendingCores: expected indices below 32"),
        (["status", "pendingCores"], "0", "pendingCores: expected list"),
        (["status", "pods"], ["nonamespace"], "namespace/name"),
        (["status", "heartbeatTime"], "yesterday", "not RFC 3339"),
        (["status", "topology", "torusShape"], [4], "[rows, columns]"),
    ],
)
def test_bad_reports_say_which_field(path: list[str], value: Any, message: str) -> None:
    with pytest.raises(ReportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        NodeReport.from_object(mutate(path, value))


def test_every_topology_kind_round_trips() -> None:
    for it in INSTANCE_TYPES.values():
        report = NodeReport(it.name.replace(".", "-"), it.name, it.topology, it.devices, it.torus_shape,
                            it.adjacency(), 2, 1, frozenset(), frozenset(), frozenset(), NOW)  # fmt: skip
        assert NodeReport.from_object(report.to_object()) == report
    assert {it.topology for it in INSTANCE_TYPES.values()} <= set(TopologyKind)


# --- the UltraServer identity (issue 26 item 2) -----------------------------------------------------------------

US4 = UltraServerIdentity(
    (Mode.X4, Mode.X2H, Mode.X2V, Mode.X1), {4: "00c0ffee12345678", 2: "0123456789abcdef"}, {4: 2, 2: 1}
)


@pytest.mark.parametrize(
    "reading",
    [
        UltraServerReading(State.IDENTIFIED, US4),
        UltraServerReading(State.PENDING, reason="ultraserver_mode: busy"),
        UltraServerReading(State.INVALID, reason="node_id_4: expected an integer"),
    ],
    ids=["identified", "pending", "invalid"],
)
def test_the_ultraserver_identity_round_trips(reading: UltraServerReading) -> None:
    report = dataclasses.replace(trn1({0, 1}), ultraserver=reading)
    obj = report.to_object()
    assert NodeReport.from_object(obj) == report
    summary = obj["status"]["ultraServer"]["summary"]
    assert summary == ("00c0ffee12345678/2 of 4" if reading.identity else str(reading.state))


def test_a_node_outside_any_ultraserver_reports_none_of_it() -> None:
    for reading in (None, UltraServerReading(State.NONE, reason="ultraserver_mode: empty")):
        obj = dataclasses.replace(trn1({0}), ultraserver=reading).to_object()
        assert "ultraServer" not in obj["status"]
        assert NodeReport.from_object(obj).ultraserver is None


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("X4", "expected an object"),
        ({"state": "elected"}, "'elected' is not a valid State"),
        ({"state": "identified", "modes": [9], "groups": []}, "9 is not a valid Mode"),
        ({"state": "identified", "modes": [1], "groups": [{"size": 4}]}, "serverId"),
    ],
)
def test_a_malformed_ultraserver_says_so(raw: Any, says: str) -> None:
    obj = trn1({0}).to_object()
    obj["status"]["ultraServer"] = raw
    with pytest.raises(ReportError, match=f"status.ultraServer: .*{re.escape(says)}"):
        NodeReport.from_object(obj)


def test_pod_holdings_round_trip_and_an_older_plugins_report_has_none() -> None:
    report = dataclasses.replace(trn1({0, 1}), pod_cores={"ml/train-0": frozenset({2, 3, 9})})
    obj = report.to_object()
    assert obj["status"]["podCores"] == [{"pod": "ml/train-0", "cores": [2, 3, 9]}]
    assert NodeReport.from_object(obj) == report
    obj["status"]["podCores"] = [{"pod": "ml/train-0", "cores": [32]}]
    with pytest.raises(ReportError, match="podCores: expected indices below 32"):
        NodeReport.from_object(obj)
    obj["status"]["podCores"] = [{"pod": "train-0", "cores": [1]}]
    with pytest.raises(ReportError, match="podCores: expected"):
        NodeReport.from_object(obj)
    del obj["status"]["podCores"]  # a plugin older than the field
    assert NodeReport.from_object(obj).pod_cores == {}
