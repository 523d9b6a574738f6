"""neuron-monitor's reports as metrics: both namings, pod attribution through cores, runtimes that
come and go, and the exporter's handling of a stream of lines (in-process; the process itself is
run in test_exporter_monitor.py)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_node_metrics import config as config_mod
from neuron_node_metrics.app import Exporter
from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import FAMILIES, RUNTIME_FAMILIES, Naming
from neuron_node_metrics.collector import Rows
from neuron_node_metrics.monitor_report import Report, Runtime, System, parse_document
from neuron_node_metrics.monitor_source import MonitorSource
from neuron_node_metrics.runtime_metrics import SHARED_NAMES, RuntimeState, quantile, runtime_owner, runtime_rows
from neuron_sim import monitor as standin
from neuron_sim import node as sim

ALL = frozenset(FAMILIES)
INSTANCE = {
    "instance_name": "n1",
    "instance_id": "i-1",
    "instance_type": "trn1.32xlarge",
    "instance_availability_zone": "us-west-2b",
    "instance_availability_zone_id": "usw2-az2",
    "instance_region": "us-west-2",
    "ami_id": "ami-1",
    "subnet_id": "subnet-1",
}
COMPAT_INSTANCE = {
    "instance_name": "n1",
    "instance_id": "i-1",
    "instance_type": "trn1.32xlarge",
    "availability_zone": "us-west-2b",
    "region": "us-west-2",
    "subnet_id": "subnet-1",
}
TRAINER = Owner("ml", "trainer-0", "main")
SERVER = Owner("web", "server-0", "app", "claim-1")
NOBODY = {"namespace": "", "pod": "", "container": "", "claim": ""}


def owner(o: Owner) -> dict[str, str]:
    return {"namespace": o.namespace, "pod": o.pod, "container": o.container, "claim": o.claim}


def rt(pid: int, tag: str, cores: tuple[int, ...], completed: float = 10, **kw: object) -> Runtime:
    return Runtime(
        pid,
        tag,
        utilization={c: 50.0 + c for c in cores},
        flops={c: 1e12 for c in cores},
        errors={"generic": 1, "hardware": 0},
        statuses={"completed": completed, "timed_out": 1},
        latency={"total": {"p0": 0.01, "p50": 0.02, "p99": 0.03, "p100": 0.04}, "device": {"p50": 0.015}},
        memory={"host": 100, "neuron_device": 2000},
        host_memory={"dma_buffers": 40, "tensors": 60},
        core_memory={c: {"constants": 10, "tensors": 20 + c} for c in cores},
        vcpu={"user": 42.0, "system": 8.0},
        **kw,  # type: ignore[arg-type]
    )


SYSTEM = System(
    vcpu_average={"user": 30.0, "nice": 5.0, "system": 10.0, "idle": 50.0, "io_wait": 2.0, "irq": 2.0, "soft_irq": 1.0},
    vcpu_count=128,
    memory={"memory_total_bytes": 1000, "memory_used_bytes": 400, "swap_total_bytes": 0, "swap_used_bytes": 0},
)


def report(*runtimes: Runtime) -> Report:
    return Report(runtimes, SYSTEM, INSTANCE, {"neuron_device_count": "16"})


def render(rows: list[Rows]) -> str:
    out = []
    for r in rows:
        base = r.name.removesuffix("_total") if r.type == "counter" else r.name
        out.append(f"# HELP {base} {r.help}\n# TYPE {base} {r.type}\n")
        out.extend(
            f"{r.name}{{{labels}}} {value}\n" if labels else f"{r.name} {value}\n" for labels, value in r.samples
        )
    return "".join(out)


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape(
    state: RuntimeState, attribution: Attribution, *, naming: Naming = Naming.NATIVE, families: frozenset[str] = ALL
):
    device_of = {c: c // 2 for c in range(32)}  # trn1.32xlarge: two cores a device
    return series(render(list(runtime_rows(state, families, attribution, device_of, naming=naming))))


def state_of(*reports: Report) -> RuntimeState:
    state = RuntimeState()
    for r in reports:
        state.update(r)
    return state


ATTRIBUTION = Attribution({0: TRAINER, 1: TRAINER, 2: SERVER, 3: SERVER})


def test_native_names_labels_and_values() -> None:
    s = scrape(state_of(report(rt(7, "job", (0, 1)))), ATTRIBUTION)
    head = {"runtime_tag": "job", "pid": "7"}
    assert s["neuron_core_utilization_ratio"] == [
        ({"device": "0", "core": "0", **head, **owner(TRAINER)}, 0.5),
        ({"device": "0", "core": "1", **head, **owner(TRAINER)}, 0.51),
    ]
    assert ({**head, "status": "completed", **owner(TRAINER)}, 10) in s["neuron_runtime_executions_total"]
    assert ({**head, "type": "generic", **owner(TRAINER)}, 1) in s["neuron_runtime_execution_errors_total"]
    latency = {(lb["latency"], lb["quantile"]): v for lb, v in s["neuron_runtime_execution_latency_seconds"]}
    assert latency == {
        ("total", "0"): 0.01,
        ("total", "0.5"): 0.02,
        ("total", "0.99"): 0.03,
        ("total", "1"): 0.04,
        ("device", "0.5"): 0.015,
    }
    assert s["neuron_runtime_memory_used_bytes"] == [
        ({**head, "location": "host", **owner(TRAINER)}, 100),
        ({**head, "location": "device", **owner(TRAINER)}, 2000),
    ]
    assert ({**head, "category": "dma_buffers", **owner(TRAINER)}, 40) in s["neuron_runtime_host_memory_used_bytes"]
    assert (
        {"device": "0", "core": "1", **head, "category": "tensors", **owner(TRAINER)},
        21,
    ) in s["neuron_runtime_core_memory_used_bytes"]
    assert ({**head, "mode": "user", **owner(TRAINER)}, 0.42) in s["neuron_runtime_vcpu_usage_ratio"]
    assert s["neuron_system_vcpu_count"] == [({}, 128)]
    assert ({"mode": "nice"}, 0.05) in s["neuron_system_vcpu_usage_ratio"]
    assert s["neuron_system_memory_size_bytes"] == [({"memory": "ram"}, 1000), ({"memory": "swap"}, 0)]
    assert s["neuron_system_memory_used_bytes"] == [({"memory": "ram"}, 400), ({"memory": "swap"}, 0)]
    assert s["neuron_instance_info"] == [
        (
            {
                "instance_name": "n1",
                "instance_id": "i-1",
                "instance_type": "trn1.32xlarge",
                "availability_zone": "us-west-2b",
                "availability_zone_id": "usw2-az2",
                "region": "us-west-2",
                "ami_id": "ami-1",
                "subnet_id": "subnet-1",
            },
            1,
        )
    ]


def test_native_label_names_are_the_catalogues() -> None:
    s = scrape(state_of(report(rt(7, "job", (0, 1)))), ATTRIBUTION)
    for f in RUNTIME_FAMILIES:
        assert f.name in s, f.name
        for labels, _ in s[f.name]:
            assert tuple(labels) == f.labels, f.name


def test_both_namings_side_by_side() -> None:
    """Every native series as it is, neuron-monitor-prometheus's beside them; the two families both
    name alike are served once, each series with both label sets (AWS's board selects
    memory_location and usage_type, this project's location and mode)."""
    state = state_of(report(rt(7, "job", (2, 3))))
    native, theirs, both = (
        scrape(state, ATTRIBUTION, naming=n) for n in (Naming.NATIVE, Naming.NEURON_MONITOR, Naming.BOTH)
    )
    for name in set(native) | set(theirs):
        if name in SHARED_NAMES:
            continue
        expected = native.get(name, []) + theirs.get(name, [])
        assert sorted(both[name], key=repr) == sorted(expected, key=repr), name
    for name in SHARED_NAMES:
        assert len(both[name]) == len(native[name]) == len(theirs[name]) > 0
        ours_names, their_names = set(native[name][0][0]), set(theirs[name][0][0])
        for labels, value in both[name]:
            assert set(labels) == ours_names | their_names
            assert ({k: labels[k] for k in native[name][0][0]}, value) in native[name]
            assert ({k: labels[k] for k in theirs[name][0][0]}, value) in theirs[name]
    assert set(both) == set(native) | set(theirs)


def test_neuron_monitor_prometheus_names_and_labels() -> None:
    s = scrape(state_of(report(rt(7, "job", (2, 3)))), ATTRIBUTION, naming=Naming.NEURON_MONITOR)
    head = {**COMPAT_INSTANCE, "runtime_tag": "job"}
    assert s["neuroncore_utilization_ratio"][0] == ({**head, "neuroncore": "2", **owner(SERVER)}, 0.52)
    assert ({**head, "status_type": "completed", **owner(SERVER)}, 10) in s["execution_status_total"]
    assert ({**head, "error_type": "hardware", **owner(SERVER)}, 0) in s["execution_errors_total"]
    assert [lb["percentile"] for lb, _ in s["execution_latency_seconds"]] == ["p0", "p50", "p99", "p100"]
    assert ({**head, "memory_location": "neuron_device", **owner(SERVER)}, 2000) in s[
        "neuron_runtime_memory_used_bytes"
    ]
    assert s["neuroncore_memory_usage_tensors"][1] == (
        {**head, "memory_location": "None", "neuroncore": "3", **owner(SERVER)},
        23,
    )
    assert "neuroncore_memory_usage_model_code" not in s  # the runtime reported none
    assert ({**head, "usage_type": "system", **owner(SERVER)}, 0.08) in s["neuron_runtime_vcpu_usage_ratio"]
    assert s["system_vcpu_count"] == [(COMPAT_INSTANCE, 128)]
    assert sorted(s["system_vcpu_usage_ratio"], key=lambda x: x[0]["usage_type"]) == [
        ({**COMPAT_INSTANCE, "usage_type": "system"}, 0.15),  # system + io_wait + irq + soft_irq
        ({**COMPAT_INSTANCE, "usage_type": "user"}, 0.35),  # user + nice
    ]
    assert s["system_memory_total_bytes"] == [(COMPAT_INSTANCE, 1000)]
    assert s["system_swap_used_bytes"] == [(COMPAT_INSTANCE, 0)]
    assert s["instance_info"] == [(COMPAT_INSTANCE, 1)]
    assert "neuron_runtime_host_memory_used_bytes" not in s
    assert not [name for name in s if name.startswith("neuron_core_") or name.startswith("neuron_system_")]


def test_a_runtime_is_attributed_through_its_cores() -> None:
    shared = rt(8, "split", (1, 2))  # cores of two pods
    s = scrape(state_of(report(rt(7, "job", (0, 1)), shared, rt(9, "stray", (5,)))), ATTRIBUTION)
    by_core = {lb["core"]: lb["pod"] for lb, _ in s["neuron_core_utilization_ratio"] if lb["runtime_tag"] == "split"}
    assert by_core == {"1": "trainer-0", "2": "server-0"}
    pods = {lb["runtime_tag"]: lb["pod"] for lb, _ in s["neuron_runtime_memory_used_bytes"]}
    assert pods == {"job": "trainer-0", "split": "", "stray": ""}
    assert runtime_owner((0, 1), ATTRIBUTION.cores) == TRAINER
    assert runtime_owner((1, 2), ATTRIBUTION.cores) is None
    assert runtime_owner((0, 5), ATTRIBUTION.cores) is None  # a core nobody holds: not the trainer's alone
    assert runtime_owner((), ATTRIBUTION.cores) is None
    s = scrape(state_of(report(rt(7, "job", (0, 1)))), Attribution())  # PodResources down
    assert all(lb["pod"] == "" for lb, _ in s["neuron_runtime_executions_total"])


def test_counts_add_up_and_runtimes_that_leave_take_their_series() -> None:
    state = state_of(report(rt(7, "job", (0,), completed=10)), report(rt(7, "job", (0,), completed=5)))
    s = scrape(state, Attribution())
    assert [v for lb, v in s["neuron_runtime_executions_total"] if lb["status"] == "completed"] == [15]
    state.update(report(rt(8, "next", (1,), completed=3)))
    s = scrape(state, Attribution())
    assert {lb["runtime_tag"] for name in s for lb, _ in s[name] if "runtime_tag" in lb} == {"next"}
    assert [v for lb, v in s["neuron_runtime_executions_total"] if lb["status"] == "completed"] == [3]
    state.update(report(rt(7, "job", (0,), completed=1)))  # back, as a new process would be: counted afresh
    s = scrape(state, Attribution())
    assert [v for lb, v in s["neuron_runtime_executions_total"] if lb["status"] == "completed"] == [1]
    state.update(report())
    assert "neuron_core_utilization_ratio" not in {n for n, v in scrape(state, Attribution()).items() if v}


def test_two_runtimes_of_one_tag_are_one_series_each_under_neuron_monitor_names() -> None:
    state = state_of(report(rt(7, "job", (0,), completed=4), rt(8, "job", (1,), completed=6)))
    native = scrape(state, ATTRIBUTION)
    assert sorted(v for lb, v in native["neuron_runtime_executions_total"] if lb["status"] == "completed") == [4, 6]
    text = render(list(runtime_rows(state, ALL, ATTRIBUTION, {}, naming=Naming.NEURON_MONITOR)))
    names = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(names) == len(set(names))
    compat = series(text)
    assert [v for lb, v in compat["execution_status_total"] if lb["status_type"] == "completed"] == [4]
    assert len(compat["neuroncore_utilization_ratio"]) == 2  # their cores still tell them apart


def test_a_runtime_listed_twice_counts_once() -> None:
    state = state_of(report(rt(7, "job", (0,)), rt(7, "job", (0,), completed=99)))
    assert state.duplicates == 1
    s = scrape(state, Attribution())
    assert [v for lb, v in s["neuron_runtime_executions_total"] if lb["status"] == "completed"] == [10]


def test_cleared_state_serves_only_the_instance() -> None:
    state = state_of(report(rt(7, "job", (0,))))
    state.clear()
    s = scrape(state, Attribution())
    assert set(s) == {"neuron_instance_info"}
    assert scrape(RuntimeState(), Attribution()) == {}


def test_metrics_flag_selects_runtime_families() -> None:
    families = frozenset({"neuron_core_utilization_ratio", "neuron_system_vcpu_count"})
    s = scrape(state_of(report(rt(7, "job", (0,)))), Attribution(), families=families)
    assert set(s) == {"neuron_core_utilization_ratio", "neuron_system_vcpu_count"}
    s = scrape(state_of(report(rt(7, "job", (0,)))), Attribution(), families=families, naming=Naming.NEURON_MONITOR)
    assert set(s) == {"neuroncore_utilization_ratio", "system_vcpu_count"}


@pytest.mark.parametrize(
    ("p", "q"),
    [("p0", "0"), ("p1", "0.01"), ("p25", "0.25"), ("p99", "0.99"), ("p100", "1"), ("p99.9", "0.999"), ("max", "max")],
)
def test_quantiles(p: str, q: str) -> None:
    assert quantile(p) == q


def test_label_values_are_escaped() -> None:
    s = scrape(state_of(report(rt(7, 'we"ird\\tag\n', (0,)))), Attribution())
    assert s["neuron_core_utilization_ratio"][0][0]["runtime_tag"] == 'we"ird\\tag\n'


def test_the_standins_stream_through_the_source() -> None:
    node = standin.node_from_type("trn2.48xlarge")
    source = MonitorSource(["neuron-monitor"])
    lines = standin.lines(node, standin.Scenario(runtimes=3, churn_every=2, malformed_every=2), 1.0)
    for _ in range(6):
        source.feed(next(lines) + "\n")
    assert source.state == "running"
    assert source.documents == 4
    assert source.problems == {"malformed": 2}
    assert {r.tag for r in source.runtime.report.runtimes} == {"rt-2", "rt-3", "rt-4"}  # type: ignore[union-attr]
    source.feed("   \n")  # a blank line is no document and no problem
    source.feed(standin.MALFORMED[3])
    assert (source.documents, source.problems["wrong_type"]) == (5, 3)
    assert source.runtime.report is not None
    assert source.runtime.report.runtimes == ()


def _exporter(root: Path, *args: str) -> Exporter:
    cfg = config_mod.parse(
        ["--host-root", str(root), "--pod-resources-socket", str(root / "none.sock"), "--listen", "127.0.0.1:0", *args],
        env={},
    )
    assert cfg is not None
    return Exporter(cfg, asyncio.Event())


def test_exporter_serves_runtime_metrics_with_the_device_metrics(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.32xlarge")
    exporter = _exporter(tmp_path, "--neuron-monitor-command", "neuron-monitor -c /etc/nm.json")
    assert exporter.monitor.command == ("neuron-monitor", "-c", "/etc/nm.json")
    exporter._attribution = Attribution({4: TRAINER, 5: TRAINER})
    node = standin.node_from_root(tmp_path)
    exporter.monitor.feed(json.dumps(standin.document(node, [standin.Runtime(3, "t", (4, 5))], random.Random(0))))
    s = series(exporter.collector.render())
    assert {lb["pod"] for lb, _ in s["neuron_core_utilization_ratio"]} == {"trainer-0"}
    assert {lb["device"] for lb, _ in s["neuron_core_utilization_ratio"]} == {"2"}
    assert {lb["status"] for lb, _ in s["neuron_core_execution_status_total"]} >= {"success"}  # sysfs as before
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter.collector)
    assert series(generate_latest(registry).decode()) == s  # prometheus-client's exposition agrees


def test_neuron_monitor_naming_gives_each_family_one_source(tmp_path: Path) -> None:
    sim.create(tmp_path, "trn1.32xlarge")
    plain = series(_exporter(tmp_path, "--naming", "neuron-monitor").collector.render())
    assert plain["execution_status_total"][0][0]["neuroncore"] == "0"  # no neuron-monitor: the driver's counters
    assert "neuron_device_count" in plain["neuron_hardware_info"][0][0]
    exporter = _exporter(tmp_path, "--naming", "neuron-monitor", "--neuron-monitor-command", "neuron-monitor")
    before = series(exporter.collector.render())
    assert "execution_status_total" not in before  # the runtime's, once it reports
    assert not [n for n in before if n.startswith("neuroncore_memory_usage_")]
    assert before["neuron_hardware_info"] == plain["neuron_hardware_info"]
    node = standin.node_from_root(tmp_path)
    exporter.monitor.feed(json.dumps(standin.document(node, [standin.Runtime(3, "t", (0,))], random.Random(0))))
    s = series(exporter.collector.render())
    assert {lb["runtime_tag"] for lb, _ in s["execution_status_total"]} == {"t"}
    assert {lb["neuroncore"] for lb, _ in s["neuroncore_memory_usage_constants"]} == {"0"}
    hardware = s["neuron_hardware_info"][0][0]
    assert (hardware["instance_id"], hardware["neuroncore_per_device_count"]) == ("i-0000000000000000a", "2")
    exporter.monitor.runtime.clear()  # neuron-monitor gone: the instance it named is still this one
    assert series(exporter.collector.render())["neuron_hardware_info"][0][0]["instance_id"] == "i-0000000000000000a"


def test_the_flag_is_split_like_a_shell_and_validated() -> None:
    cfg = config_mod.parse([], env={"NEURON_METRICS_NEURON_MONITOR_COMMAND": "'/opt/my tools/neuron-monitor' -c x"})
    assert cfg is not None
    assert cfg.neuron_monitor_command == ("/opt/my tools/neuron-monitor", "-c", "x")
    cfg = config_mod.parse([], env={})
    assert cfg is not None
    assert cfg.neuron_monitor_command == ()
    with pytest.raises(SystemExit):
        config_mod.parse(["--neuron-monitor-command", "neuron-monitor 'unclosed"], env={})


def test_parse_document_of_the_standin_matches_what_the_source_keeps() -> None:
    node = standin.node_from_type("inf2.xlarge")
    d = standin.document(node, standin.spread(node, 1, 2), random.Random(2))
    source = MonitorSource(["x"])
    source.feed(json.dumps(d).encode())
    assert source.runtime.report == parse_document(d)


async def test_a_line_over_the_limit_is_skipped_and_the_next_document_read() -> None:
    node = standin.node_from_type("inf2.xlarge")
    good = json.dumps(standin.document(node, standin.spread(node, 1, 1), random.Random(0)))
    source = MonitorSource(["x"], max_line=len(good) + 10)
    reader = asyncio.StreamReader(limit=source.max_line)
    reader.feed_data(b'{"neuron_runtime_data": [' + b" " * (3 * len(good)) + b"]}\n" + good.encode() + b"\n")
    reader.feed_eof()
    await source._pump(reader)
    assert source.problems["too_long"] >= 1
    assert source.documents == 1
    assert source.runtime.report is not None
    assert [r.tag for r in source.runtime.report.runtimes] == ["rt-0"]


@pytest.mark.parametrize("naming", ["native", "neuron-monitor"])
def test_every_family_is_served_once_with_neuron_monitor(tmp_path: Path, naming: str) -> None:
    sim.create(tmp_path, "trn2.48xlarge")
    exporter = _exporter(tmp_path, "--naming", naming, "--neuron-monitor-command", "neuron-monitor")
    node = standin.node_from_root(tmp_path)
    exporter.monitor.feed(json.dumps(standin.document(node, standin.spread(node, 4, 2), random.Random(0))))
    text = exporter.collector.render() + generate_latest(exporter.self_registry).decode()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == len(set(samples))


keys = st.sampled_from(["completed", "timed_out", "p0", "p50", "p50.0", "p99.9", "constants", "tensors", "user"])
labels_text = st.text(max_size=4) | keys
counts = st.dictionaries(labels_text, st.integers(0, 2**40), max_size=3)
cores = st.integers(0, 40)
runtimes = st.builds(
    Runtime,
    pid=st.integers(0, 3),
    tag=st.text(max_size=3) | st.just("job"),
    utilization=st.dictionaries(cores, st.floats(0, 100), max_size=3),
    errors=counts,
    statuses=counts,
    latency=st.dictionaries(st.sampled_from(["total", "device"]), st.dictionaries(labels_text, st.floats(0, 1))),
    memory=st.dictionaries(st.sampled_from(["host", "neuron_device"]), st.integers(0, 2**40)),
    host_memory=counts,
    core_memory=st.dictionaries(cores, counts, max_size=3),
    vcpu=st.dictionaries(st.sampled_from(["user", "system"]) | labels_text, st.floats(0, 100), max_size=2),
)
holders = st.dictionaries(cores, st.sampled_from([TRAINER, SERVER]), max_size=6)


@given(st.lists(runtimes, max_size=5), st.sampled_from([Naming.NATIVE, Naming.NEURON_MONITOR, Naming.BOTH]), holders)
@settings(max_examples=300, deadline=None)
def test_any_report_is_valid_exposition_with_one_sample_a_series(
    listed: list[Runtime], naming: Naming, held: dict[int, Owner]
) -> None:
    state = state_of(report(*listed))
    text = render(list(runtime_rows(state, ALL, Attribution(held), {c: c // 2 for c in range(32)}, naming=naming)))
    parsed = [
        (s.name, tuple(sorted(s.labels.items()))) for f in text_string_to_metric_families(text) for s in f.samples
    ]
    assert len(parsed) == len(set(parsed))
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(declared) == len(set(declared)), "a family declared twice"
    compat = naming is Naming.NEURON_MONITOR
    util = series(text).get("neuroncore_utilization_ratio" if compat else "neuron_core_utilization_ratio", [])
    for rt_ in state.report.runtimes if state.report else ():
        for core in rt_.utilization:
            pods = {
                lb["pod"]
                for lb, _ in util
                if lb["runtime_tag"] == rt_.tag and lb.get("core", lb.get("neuroncore")) == str(core)
            }
            assert pods == {held[core].pod if core in held else ""}  # the core's holder, whoever runs on it
