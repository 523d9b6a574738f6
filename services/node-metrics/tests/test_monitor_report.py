"""Parsing neuron-monitor's documents: the guide's documents whole, bad parts skipped, nothing else lost."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_model.instance_types import INSTANCE_TYPES
from neuron_node_metrics.monitor_report import MalformedDocument, Problem, parse_document, parse_line
from neuron_sim import monitor as standin

NODE = standin.node_from_type("trn2.48xlarge")


def doc(runtimes: int = 2, seed: int = 0) -> dict[str, Any]:
    return standin.document(NODE, standin.spread(NODE, runtimes, 2), random.Random(seed), period=1.0)


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_the_standins_documents_parse_whole(instance_type: str) -> None:
    node = standin.node_from_type(instance_type)
    d = standin.document(node, standin.spread(node, 3, 2), random.Random(3))
    report = parse_line(json.dumps(d))
    assert report.problems == ()
    assert [r.tag for r in report.runtimes] == ["rt-0", "rt-1", "rt-2"]
    entry, rt = d["neuron_runtime_data"][1], report.runtimes[1]
    assert rt.cores == tuple(sorted(standin.spread(node, 3, 2)[1].cores))
    rep = entry["report"]
    core = str(rt.cores[0])
    assert (
        rt.utilization[rt.cores[0]] == rep["neuroncore_counters"]["neuroncores_in_use"][core]["neuroncore_utilization"]
    )
    assert rt.flops[rt.cores[0]] == rep["neuroncore_counters"]["neuroncores_in_use"][core]["flops"]
    assert rt.statuses == rep["execution_stats"]["execution_summary"]
    assert rt.errors == rep["execution_stats"]["error_summary"]
    assert rt.latency["total"] == rep["execution_stats"]["latency_stats"]["total_latency"]
    assert rt.latency["device"] == rep["execution_stats"]["latency_stats"]["device_latency"]
    used = rep["memory_used"]["neuron_runtime_used_bytes"]
    assert rt.memory == {"host": used["host"], "neuron_device": used["neuron_device"]}
    assert rt.host_memory == used["usage_breakdown"]["host"]
    assert rt.core_memory[rt.cores[0]] == used["usage_breakdown"]["neuroncore_memory_usage"][core]
    assert rt.vcpu == rep["neuron_runtime_vcpu_usage"]["vcpu_usage"]
    system = d["system_data"]
    assert report.system.vcpu_average == system["vcpu_usage"]["average_usage"]
    assert report.system.vcpu_count == len(system["vcpu_usage"]["usage_data"])
    assert report.system.memory["memory_total_bytes"] == system["memory_info"]["memory_total_bytes"]
    assert set(report.system.ecc) == set(range(node.devices))
    assert report.system.ecc[0]["sram_ecc_corrected"] == 0
    assert report.instance["instance_type"] == instance_type
    assert report.hardware["neuron_device_count"] == str(node.devices)


@pytest.mark.parametrize("line", [*standin.MALFORMED[:3], "", "null", '"text"', b"\xff\xfe"])
def test_lines_that_are_not_a_json_object_are_refused_whole(line: str | bytes) -> None:
    with pytest.raises(MalformedDocument):
        parse_line(line)


def test_wrong_types_at_the_top_are_named_and_the_rest_kept() -> None:
    report = parse_line(standin.MALFORMED[3])
    assert report.runtimes == ()
    assert {p.where for p in report.problems} == {"neuron_runtime_data", "system_data", "instance_info"}
    assert {p.kind for p in report.problems} == {"wrong_type"}


def test_a_group_with_an_error_is_skipped_and_its_siblings_kept() -> None:
    d = doc()
    d["neuron_runtime_data"][0]["report"]["execution_stats"]["error"] = "runtime unreachable"
    d["system_data"]["memory_info"]["error"] = "no /proc/meminfo"
    report = parse_document(d)
    first = report.runtimes[0]
    assert (first.statuses, first.errors, first.latency, first.has_execution_stats) == ({}, {}, {}, False)
    assert first.utilization
    assert first.core_memory
    assert first.vcpu
    assert report.runtimes[1].statuses  # the other runtime is whole
    assert report.system.memory == {}
    assert report.system.vcpu_average
    assert set(report.problems) == {
        Problem("group_error", "neuron_runtime_data[0].report.execution_stats"),
        Problem("group_error", "system_data.memory_info"),
    }


def test_a_runtime_error_is_named_and_what_it_reported_kept() -> None:
    d = doc()
    d["neuron_runtime_data"][1]["error"] = "lost contact"
    report = parse_document(d)
    assert report.problems == (Problem("runtime_error", "neuron_runtime_data[1]"),)
    assert report.runtimes[1].utilization


def test_partial_documents() -> None:
    only_info = {"instance_info": {"instance_id": "i-1", "instance_type": "trn1.2xlarge"}}
    report = parse_document(only_info)
    assert (report.runtimes, report.problems) == ((), ())
    assert report.instance == {"instance_id": "i-1", "instance_type": "trn1.2xlarge"}
    bare = parse_document({"neuron_runtime_data": [{"pid": 7, "report": {}}]})
    assert [(r.pid, r.tag, r.cores) for r in bare.runtimes] == [(7, "7", ())]  # the tag defaults to the pid
    assert bare.problems == ()


def test_null_latency_while_no_model_ran() -> None:
    d = doc()
    d["neuron_runtime_data"][0]["report"]["execution_stats"]["latency_stats"] = {
        "total_latency": None,
        "device_latency": None,
    }
    report = parse_document(d)
    assert report.runtimes[0].latency == {}
    assert report.problems == ()


def test_unknown_fields_are_ignored_and_new_count_keys_pass_through() -> None:
    d = doc()
    d["future_section"] = {"x": 1}
    rt = d["neuron_runtime_data"][0]
    rt["new_field"] = [1, 2]
    rt["report"]["new_group"] = {"period": 1, "error": "", "value": 3}
    rt["report"]["execution_stats"]["error_summary"]["cosmic_ray"] = 2
    rt["report"]["execution_stats"]["latency_stats"]["total_latency"]["p99.9"] = 0.5
    report = parse_document(d)
    assert report.problems == ()
    assert report.runtimes[0].errors["cosmic_ray"] == 2
    assert report.runtimes[0].latency["total"]["p99.9"] == 0.5


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("report", "execution_stats", "execution_summary", "completed"), "12", "execution_summary.completed"),
        (("report", "execution_stats", "execution_summary", "timed_out"), True, "execution_summary.timed_out"),
        (("report", "execution_stats", "execution_summary", "completed"), float("nan"), "execution_summary.completed"),
        (("report", "execution_stats", "execution_summary", "completed"), -3, "execution_summary.completed"),
        (("report", "execution_stats", "error_summary", "generic"), 10**30, "error_summary.generic"),
        (("report", "memory_used", "neuron_runtime_used_bytes", "host"), -(2**70), "used_bytes.host"),
        (("report", "neuroncore_counters", "neuroncores_in_use", "x7"), {"neuroncore_utilization": 1}, "in_use.x7"),
        (("report", "neuroncore_counters", "neuroncores_in_use", "0", "neuroncore_utilization"), None, "utilization"),
        (("report", "memory_used", "neuron_runtime_used_bytes", "host"), [1], "used_bytes.host"),
        (("report", "neuron_runtime_vcpu_usage", "vcpu_usage"), 5, "vcpu_usage.vcpu_usage"),
    ],
)
def test_a_wrong_value_skips_that_value_only(path: tuple[str, ...], value: Any, where: str) -> None:
    d = doc()
    target = d["neuron_runtime_data"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    report = parse_document(d)
    assert len(report.problems) == 1
    assert report.problems[0].kind == "wrong_type"
    assert report.problems[0].where.endswith(where.rsplit(".", maxsplit=1)[-1])
    whole = parse_document(doc())
    assert report.runtimes[1] == whole.runtimes[1]
    assert report.system == whole.system


def test_a_runtime_without_a_pid_is_dropped_and_named() -> None:
    d = doc()
    del d["neuron_runtime_data"][0]["pid"]
    d["neuron_runtime_data"].append("not an object")
    report = parse_document(d)
    assert [r.tag for r in report.runtimes] == ["rt-1"]
    assert [p.where for p in report.problems] == ["neuron_runtime_data[0].pid", "neuron_runtime_data[2]"]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**60, max_value=10**400)
    | st.floats()
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_any_json_parses_or_is_refused_cleanly(value: Any) -> None:
    line = json.dumps(value)
    if isinstance(value, dict):
        parse_line(line)
    else:
        with pytest.raises(MalformedDocument):
            parse_line(line)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


BASE = doc(runtimes=2, seed=5)
BASE["neuron_runtime_data"][1]["report"]["neuroncore_counters"]["neuroncores_in_use"] = {}  # so runtime 0 is apart
PATHS = [p for p in _paths(BASE) if p[:2] == ("neuron_runtime_data", 1)]


@given(st.sampled_from(PATHS), json_values)
@settings(max_examples=400, deadline=None)
def test_damage_to_one_runtime_leaves_the_other_and_the_system_whole(path: tuple[Any, ...], junk: Any) -> None:
    d = copy.deepcopy(BASE)
    target: Any = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = junk
    report = parse_line(json.dumps(d))
    whole = parse_document(BASE)
    assert report.runtimes[0] == whole.runtimes[0]
    assert report.system == whole.system
    assert report.instance == whole.instance
    assert report.hardware == whole.hardware
