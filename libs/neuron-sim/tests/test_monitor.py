"""The neuron-monitor stand-in: its documents have the user guide's shape, for the simulated node."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_sim import monitor
from neuron_sim import node as sim

GUIDE_GROUPS = {"neuroncore_counters", "execution_stats", "memory_used", "neuron_runtime_vcpu_usage"}


def test_document_has_every_group_of_the_guide() -> None:
    node = monitor.node_from_type("trn2.48xlarge")
    doc = monitor.document(node, monitor.spread(node, 2, 3), random.Random(1), period=1.0)
    assert set(doc) == {"neuron_runtime_data", "system_data", "instance_info", "neuron_hardware_info"}
    first = doc["neuron_runtime_data"][0]
    assert (first["pid"], first["neuron_runtime_tag"], first["error"]) == (1000, "rt-0", "")
    assert set(first["report"]) == GUIDE_GROUPS
    assert all(g["error"] == "" and g["period"] == 1.0 for g in first["report"].values())
    in_use = first["report"]["neuroncore_counters"]["neuroncores_in_use"]
    assert list(in_use) == ["0", "1", "2"]
    assert set(in_use["1"]["v3d"]) == {"nc_v3.2", "nc_v3.3"}  # LNC=2: two physical cores behind logical core 1
    stats = first["report"]["execution_stats"]
    assert list(stats["latency_stats"]["total_latency"]) == list(monitor.PERCENTILES)
    used = first["report"]["memory_used"]["neuron_runtime_used_bytes"]
    breakdown = used["usage_breakdown"]["neuroncore_memory_usage"]
    assert used["neuron_device"] == sum(sum(c.values()) for c in breakdown.values())
    assert set(doc["system_data"]) == {"neuron_hw_counters", "vcpu_usage", "memory_info"}
    assert len(doc["system_data"]["neuron_hw_counters"]["neuron_devices"]) == 16
    hw = doc["neuron_hardware_info"]
    assert (hw["neuron_device_count"], hw["neuroncore_per_device_count"], hw["logical_neuroncore_config"]) == (16, 4, 2)
    assert doc["instance_info"]["instance_type"] == "trn2.48xlarge"


def test_runtimes_wrap_round_the_node_and_inf1_has_no_v3d() -> None:
    node = monitor.node_from_type("inf1.xlarge")
    assert node.cores == 4
    runtimes = monitor.spread(node, 3, 2)
    assert [r.cores for r in runtimes] == [(0, 1), (2, 3), (0, 1)]
    doc = monitor.document(node, runtimes, random.Random(0))
    assert "v3d" not in doc["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"]


def test_node_from_root_reads_the_simulated_node(tmp_path: Path) -> None:
    sim.create(tmp_path / "n", "trn2.48xlarge", lnc=1)
    node = monitor.node_from_root(tmp_path / "n")
    assert (node.devices, node.cores_per_device, node.lnc) == (16, 8, 1)
    with pytest.raises(ValueError, match="no simulated Neuron node"):
        monitor.node_from_root(tmp_path / "nothing")


def test_churn_malformed_lines_and_a_runtimes_file(tmp_path: Path) -> None:
    node = monitor.node_from_type("trn1.32xlarge")
    out = monitor.lines(node, monitor.Scenario(runtimes=2, churn_every=2, malformed_every=3), 1.0)
    produced = [next(out) for _ in range(8)]
    docs = [json.loads(line) for line in produced if line.startswith('{"neuron_runtime_data":[')]
    bad = [line for line in produced if not line.startswith('{"neuron_runtime_data":[')]
    assert bad == list(monitor.MALFORMED[:2])
    tags = [[r["neuron_runtime_tag"] for r in d["neuron_runtime_data"]] for d in docs]
    assert tags[:4] == [["rt-0", "rt-1"], ["rt-1", "rt-2"], ["rt-1", "rt-2"], ["rt-2", "rt-3"]]

    path = tmp_path / "runtimes.json"
    fed = monitor.lines(node, monitor.Scenario(runtimes_file=path), 1.0)
    assert json.loads(next(fed))["neuron_runtime_data"] == []  # no file yet: no runtimes
    monitor.write_runtimes(path, [monitor.Runtime(42, "job", (5, 6))])
    entry = json.loads(next(fed))["neuron_runtime_data"][0]
    assert (entry["pid"], list(entry["report"]["neuroncore_counters"]["neuroncores_in_use"])) == (42, ["5", "6"])
    path.write_text("{ not a list")
    assert json.loads(next(fed))["neuron_runtime_data"] == []


def test_an_idle_runtime_is_loaded_and_runs_nothing(tmp_path: Path) -> None:
    """A stuck job's runtime: its cores 0 % busy, no executions or errors, latency null (no model ran),
    memory still held; the runtimes file keeps `idle`, and the other runtimes' figures do not change."""
    node = monitor.node_from_type("trn2.48xlarge")
    path = tmp_path / "runtimes.json"
    monitor.write_runtimes(path, [monitor.Runtime(1, "stuck", (4, 5), idle=True), monitor.Runtime(2, "busy", (6,))])
    runtimes = monitor.read_runtimes(path)
    assert [r.idle for r in runtimes] == [True, False]
    doc = monitor.document(node, runtimes, random.Random(3))
    stuck, busy = (r["report"] for r in doc["neuron_runtime_data"])
    cores = stuck["neuroncore_counters"]["neuroncores_in_use"]
    assert {c["neuroncore_utilization"] for c in cores.values()} == {0}
    assert {v["neuroncore_utilization"] for c in cores.values() for v in c["v3d"].values()} == {0}
    stats = stuck["execution_stats"]
    assert set(stats["error_summary"].values()) == set(stats["execution_summary"].values()) == {0}
    assert stats["latency_stats"] == {"total_latency": None, "device_latency": None}
    assert stuck["memory_used"]["neuron_runtime_used_bytes"]["neuron_device"] > 0
    as_busy = monitor.document(node, [monitor.Runtime(1, "stuck", (4, 5)), runtimes[1]], random.Random(3))
    assert as_busy["neuron_runtime_data"][1]["report"] == busy


def test_config_file_period(tmp_path: Path) -> None:
    conf = tmp_path / "monitor.conf"
    conf.write_text('{"period": "250ms", "neuron_runtimes": []}')
    assert monitor.config_period(conf, 5.0) == 0.25
    conf.write_text('{"period": "2s"}')
    assert monitor.config_period(conf, 5.0) == 2.0
    assert monitor.config_period(None, 5.0) == 5.0


@pytest.mark.integration
def test_cli_writes_documents_and_exits_as_asked(tmp_path: Path) -> None:
    sim.create(tmp_path / "n", "inf2.xlarge")
    args = [sys.executable, "-m", "neuron_sim.cli", "monitor", "--root", str(tmp_path / "n"), "--period", "0"]
    done = subprocess.run([*args, "--count", "2"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["neuron_hardware_info"]["neuron_device_count"] == 1
    crashed = subprocess.run([*args, "--exit-after", "1"], capture_output=True, text=True, timeout=30, check=False)
    assert crashed.returncode == 1
    assert len(crashed.stdout.splitlines()) == 1
    missing = subprocess.run(
        [*args[:4], "--root", str(tmp_path / "none")], capture_output=True, text=True, timeout=30, check=False
    )
    assert missing.returncode == 2
    assert "no simulated Neuron node" in missing.stderr
