"""AWS's documented neuron-monitor output (fixtures/neuron-monitor-user-guide-sample.json, its
provenance beside it) through the exporter's parser and runtime families: every other runtime test
parses what our own stand-in writes, this one what AWS says the real tool writes. The values
asserted are the sample's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import FAMILIES, Naming
from neuron_node_metrics.monitor_report import parse_line
from neuron_node_metrics.runtime_metrics import RuntimeState, runtime_rows

SAMPLE = Path(__file__).parent / "fixtures" / "neuron-monitor-user-guide-sample.json"
# the sample's instance: a trn2 at logical_neuroncore_config 2, two logical cores a device
DEVICE_OF = {core: core // 2 for core in range(64)}
HOLDER = Owner("n0", "p0", "c0")  # the pod the sample's neuron_k8s_info names for cores 0 and 1
WHO = {"runtime_tag": "my_app_1", "pid": "0", "namespace": "n0", "pod": "p0", "container": "c0", "claim": ""}


def document() -> str:
    """The sample as neuron-monitor writes it: one JSON document a line."""
    return json.dumps(json.loads(SAMPLE.read_text()))


def scrape(naming: Naming) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    state = RuntimeState()
    state.update(parse_line(document()))
    attribution = Attribution({0: HOLDER, 1: HOLDER})
    out: list[str] = []
    for rows in runtime_rows(state, frozenset(FAMILIES), attribution, DEVICE_OF, naming=naming):
        base = rows.name.removesuffix("_total") if rows.type == "counter" else rows.name
        out.append(f"# TYPE {base} {rows.type}\n")
        out.extend(f"{rows.name}{{{labels}}} {value!r}\n" for labels, value in rows.samples)
    series: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families("".join(out)):
        for s in family.samples:
            series.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return series


def labels(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


def test_the_sample_parses_whole() -> None:
    report = parse_line(document())
    assert report.problems == ()
    [runtime] = report.runtimes
    assert (runtime.pid, runtime.tag, runtime.cores) == (0, "my_app_1", (0, 1))
    assert runtime.flops == {0: 1234567891011, 1: 1234567891021}
    assert report.system.vcpu_count == 2  # usage_data lists vCPUs 0 and 1
    assert report.system.ecc == {
        0: {"mem_ecc_corrected": 0, "mem_ecc_uncorrected": 0, "sram_ecc_uncorrected": 0, "sram_ecc_corrected": 0}
    }
    assert report.hardware == {
        "neuron_device_type": "trainium2",
        "neuron_device_version": "v4",
        "neuroncore_version": "v3d",
        "neuron_device_count": "16",
        "neuron_device_memory_size": "103079215104",
        "neuroncore_per_device_count": "4",
        "logical_neuroncore_config": "2",
    }


def test_native_metrics_carry_the_samples_values() -> None:
    s = scrape(Naming.NATIVE)
    assert s["neuron_core_utilization_ratio"] == {
        labels(device="0", core="0", **WHO): pytest.approx(0.4201),
        labels(device="0", core="1", **WHO): pytest.approx(0.4202),
    }
    executions = s["neuron_runtime_executions_total"]
    assert executions[labels(status="completed", **WHO)] == 123
    assert {dict(k)["status"] for k in executions} == {
        "completed",
        "completed_with_err",
        "completed_with_num_err",
        "timed_out",
        "incorrect_input",
        "failed_to_queue",
    }
    assert sum(executions.values()) == 123
    errors = s["neuron_runtime_execution_errors_total"]
    assert {dict(k)["type"]: v for k, v in errors.items()} == dict.fromkeys(
        ("generic", "numerical", "transient", "model", "runtime", "hardware"), 0
    )
    latency = {(dict(k)["latency"], dict(k)["quantile"]): v for k, v in s[
        "neuron_runtime_execution_latency_seconds"].items()}  # fmt: skip
    quantiles = {"0": "p0", "0.01": "p1", "0.25": "p25", "0.5": "p50", "0.75": "p75", "0.99": "p99", "1": "p100"}
    total = {"p0": 0.01100001, "p1": 0.01100002, "p25": 0.01100004, "p50": 0.01100008, "p75": 0.01100010,
             "p99": 0.01100012, "p100": 0.01100013}  # fmt: skip
    device = {"p0": 0.01000001, "p1": 0.01000002, "p25": 0.01000004, "p50": 0.01000008, "p75": 0.01000010,
              "p99": 0.01000012, "p100": 0.01000013}  # fmt: skip
    assert latency == {("total", q): total[p] for q, p in quantiles.items()} | {
        ("device", q): device[p] for q, p in quantiles.items()
    }
    assert s["neuron_runtime_memory_used_bytes"] == {
        labels(location="host", **WHO): 6997643264,
        labels(location="device", **WHO): 12519788544,
    }
    assert {dict(k)["category"]: v for k, v in s["neuron_runtime_host_memory_used_bytes"].items()} == {
        "application_memory": 6996594688,
        "constants": 0,
        "dma_buffers": 1048576,
        "tensors": 0,
    }
    core_memory = s["neuron_runtime_core_memory_used_bytes"]
    assert len(core_memory) == 10  # five categories on each of the two cores
    for core in ("0", "1"):
        assert core_memory[labels(device="0", core=core, category="constants", **WHO)] == 193986816
        assert core_memory[labels(device="0", core=core, category="model_code", **WHO)] == 176285056
        assert core_memory[labels(device="0", core=core, category="tensors", **WHO)] == 20971520
    assert s["neuron_runtime_vcpu_usage_ratio"] == {
        labels(mode="user", **WHO): pytest.approx(0.4201),
        labels(mode="system", **WHO): pytest.approx(0.1234),
    }
    assert s["neuron_system_vcpu_count"] == {labels(): 2}
    assert {dict(k)["mode"]: v for k, v in s["neuron_system_vcpu_usage_ratio"].items()} == pytest.approx(
        {"user": 0.3277, "nice": 0, "system": 0.2287, "idle": 0.3936, "io_wait": 0, "irq": 0, "soft_irq": 0}
    )
    assert s["neuron_system_memory_size_bytes"] == {labels(memory="ram"): 49345835008, labels(memory="swap"): 0}
    assert s["neuron_system_memory_used_bytes"] == {labels(memory="ram"): 16042344448, labels(memory="swap"): 0}
    assert s["neuron_instance_info"] == {
        labels(
            instance_name="My_Instance",
            instance_id="i-0011223344556677a",
            instance_type="trn2n.48xlarge",
            availability_zone="us-west-2b",
            availability_zone_id="usw2-az2",
            region="us-west-2",
            ami_id="ami-0011223344556677b",
            subnet_id="subnet-112233ee",
        ): 1
    }


def test_neuron_monitor_prometheus_names_carry_the_samples_values() -> None:
    s = scrape(Naming.NEURON_MONITOR)
    instance = {
        "instance_name": "My_Instance",
        "instance_id": "i-0011223344556677a",
        "instance_type": "trn2n.48xlarge",
        "availability_zone": "us-west-2b",
        "region": "us-west-2",
        "subnet_id": "subnet-112233ee",
    }
    who = {**instance, "runtime_tag": "my_app_1", "namespace": "n0", "pod": "p0", "container": "c0", "claim": ""}
    assert s["neuroncore_utilization_ratio"] == {
        labels(neuroncore="0", **who): pytest.approx(0.4201),
        labels(neuroncore="1", **who): pytest.approx(0.4202),
    }
    assert s["execution_status_total"][labels(status_type="completed", **who)] == 123
    assert s["execution_latency_seconds"][labels(percentile="p99", **who)] == 0.01100012
    assert {dict(k)["percentile"] for k in s["execution_latency_seconds"]} == {
        "p0", "p1", "p25", "p50", "p75", "p99", "p100"
    }  # fmt: skip
    assert s["neuron_runtime_memory_used_bytes"][labels(memory_location="neuron_device", **who)] == 12519788544
    assert s["neuroncore_memory_usage_model_code"][labels(memory_location="None", neuroncore="1", **who)] == 176285056
    assert s["system_vcpu_usage_ratio"] == {
        labels(usage_type="user", **instance): pytest.approx(0.3277),  # user + nice
        labels(usage_type="system", **instance): pytest.approx(0.2287),  # system + io_wait + irq + soft_irq
    }
    assert s["system_memory_used_bytes"] == {labels(**instance): 16042344448}
    assert s["instance_info"] == {labels(**instance): 1}
