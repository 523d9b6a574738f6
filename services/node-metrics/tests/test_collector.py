from __future__ import annotations

from pathlib import Path

import pytest
import sim_nodes
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_driver import layout
from neuron_node_metrics.attribution import Attribution, Owner
from neuron_node_metrics.catalogue import FAMILIES, Naming
from neuron_node_metrics.collector import NeuronCollector
from neuron_sim import node as sim

ALL = frozenset(FAMILIES)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def find(text: str, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in samples(text).items() if n == name and set(labels.items()) <= ls]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    sim.create(tmp_path, "trn2.48xlarge", lnc=2)
    return tmp_path


@pytest.fixture
def unchanged_node() -> Path:
    """The same node, for a test that only reads it: written once a run, shared with other modules."""
    return sim_nodes.node_root("trn2.48xlarge", 2)


def collector(root: Path, attribution: Attribution | None = None, **kw: object) -> NeuronCollector:
    return NeuronCollector(root, kw.pop("families", ALL), lambda: attribution or Attribution(), **kw)  # type: ignore[arg-type]


def test_render_and_collect_agree(node: Path) -> None:
    owner = Owner("ml", 'we"ird\\pod', "main")
    c = collector(node, Attribution({4: owner, 5: owner}, {2: owner}))
    sim.bump_counter(node, 2, "success", core=3, by=5)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    assert samples(c.render()) == samples(generate_latest(registry).decode())


def test_the_page_sent_in_pieces_is_the_page(unchanged_node: Path) -> None:
    """/metrics sends render_pieces as they are made: whatever the piece size, they join to the same
    page, and each piece but the last is at least that size and ends a line."""
    c = collector(unchanged_node, Attribution({4: Owner("ml", "pod", "main")}, {}))
    whole = c.render()
    for piece_size in (1, 1000, 64 * 1024, 10**9):
        pieces = list(c.render_pieces(piece_size))
        assert b"".join(pieces).decode() == whole
        assert all(p.endswith(b"\n") for p in pieces)
        assert all(len(p) >= piece_size for p in pieces[:-1])
    assert len(list(c.render_pieces(64 * 1024))) > 1  # a trn2.48xlarge's page is several pieces


def test_logical_cores_sum_their_physical_cores(node: Path) -> None:
    c = collector(node)
    sim.bump_counter(node, 1, "success", core=2, by=3)  # physical cores 2 and 3 form logical core 1 of device 1
    sim.bump_counter(node, 1, "success", core=3, by=4)
    text = c.render()
    assert find(text, "neuron_core_execution_status_total", device="1", core="5", status="success") == [7]
    assert len(find(text, "neuron_core_execution_status_total", status="success")) == 64


def test_attribution_labels(unchanged_node: Path) -> None:
    node = unchanged_node
    owner = Owner("ml", "trainer-0", "main")
    c = collector(node, Attribution({8: owner}, {}, {"aws.amazon.com/neuroncore": 1}))
    text = c.render()
    assert find(text, "neuron_core_execution_status_total", core="8", status="success", pod="trainer-0") == [0]
    assert find(text, "neuron_core_execution_status_total", core="9", status="success", pod="") == [0]
    assert find(text, "neuron_core_allocation_info", core="8", namespace="ml", container="main") == [1]


def test_hardware_ecc_power_memory_info(node: Path) -> None:
    c = collector(node)
    sim.bump_counter(node, 3, "mem_ecc_uncorrected", by=2)
    sim.bump_counter(node, 3, "hw_nc_ue_error", core=0)
    sim.set_power(node, 3, 10, 80, 45)
    sim.set_power(node, 4, 1, 2, 3, status=1)  # an invalid sample
    sim.set_memory(node, 3, "tensors", 1024, core=1)
    sim.set_memory(node, 3, "dma_buffers", 77)
    text = c.render()
    assert find(text, "neuron_device_ecc_errors_total", device="3", type="mem_uncorrected") == [2]
    assert find(text, "neuron_device_hardware_errors_total", device="3", kind="hw_nc_ue_error") == [1]
    assert find(text, "neuron_device_power_utilization_ratio", device="3", stat="avg") == [0.45]
    assert find(text, "neuron_device_power_utilization_ratio", device="4") == []
    assert find(text, "neuron_core_memory_used_bytes", core="12", category="tensors") == [1024]
    assert find(text, "neuron_device_host_memory_used_bytes", device="3", category="dma_buffers") == [77]
    assert find(text, "neuron_device_memory_total_bytes", device="3") == [96 * 2**30]
    [info] = find(text, "neuron_device_info", device="3", family="Trn2", instance_type="trn2.48xlarge", numa_node="0")
    assert info == 1
    assert find(text, "neuron_logical_core_config") == [2]


def test_garbage_and_vanishing_files_skip_series_not_the_scrape(node: Path) -> None:
    c = collector(node)
    before = len(samples(c.render()))
    sim.set_counter_raw(node, 0, "success", "lots\n", core=0)
    text = c.render()
    assert find(text, "neuron_core_execution_status_total", core="0", status="success") == []
    assert len(samples(text)) == before - 1
    assert c.read_errors["malformed"] == 1
    sim.vanish(node, 5)
    text = c.render()  # the inventory is rescanned: device 5 is gone, the rest still served
    assert find(text, "neuron_device_info", device="5") == []
    assert find(text, "neuron_device_info", device="6") == [1]


def test_allowlist_prunes_reading(unchanged_node: Path) -> None:
    node = unchanged_node
    full = collector(node)
    lean = collector(node, families=frozenset({"neuron_device_ecc_errors_total", "neuron_device_info"}))
    assert lean.reader.file_count < full.reader.file_count / 50
    names = {n for n, _ in samples(lean.render())}
    assert names == {"neuron_device_ecc_errors_total", "neuron_device_info"}


def test_neuron_monitor_naming(node: Path) -> None:
    c = collector(node, naming=Naming.NEURON_MONITOR)
    sim.set_memory(node, 0, "model_code", 4096, core=0)
    sim.bump_counter(node, 0, "success", core=0, by=2)
    text = c.render()
    assert find(text, "neuroncore_memory_usage_model_code", neuroncore="0", memory_location="device") == [4096]
    assert find(text, "execution_status_total", neuroncore="0", status_type="completed") == [2]
    assert find(text, "hardware_ecc_events_total", neuron_device_index="0", event_type="sram_ecc_uncorrected") == [0]
    [hw] = [ls for (n, ls), _ in samples(text).items() if n == "neuron_hardware_info"]
    assert ("neuron_device_count", "16") in hw
    assert ("logical_neuroncore_config", "2") in hw


def test_both_namings_serve_the_native_families_and_neuron_monitors_beside_them(node: Path) -> None:
    sim.set_memory(node, 0, "model_code", 4096, core=0)
    sim.bump_counter(node, 0, "success", core=0, by=2)
    sim.bump_counter(node, 3, "mem_ecc_uncorrected", by=5)
    native, both = collector(node).render(), collector(node, naming=Naming.BOTH).render()
    declared = [line.split()[2] for line in both.splitlines() if line.startswith("# TYPE ")]
    assert len(declared) == len(set(declared)), "a family declared twice"
    # every native sample as it is without neuron-monitor's names...
    assert set(samples(native).items()) <= set(samples(both).items())
    # ...and neuron-monitor's, with its labels, for the same figures
    assert find(both, "neuroncore_memory_usage_model_code", neuroncore="0", memory_location="device") == [4096]
    assert find(both, "execution_status_total", neuroncore="0", status_type="completed") == [2]
    assert find(both, "neuron_core_execution_status_total", device="0", core="0", status="success") == [2]
    assert find(both, "hardware_ecc_events_total", neuron_device_index="3", event_type="mem_ecc_uncorrected") == [5]
    assert find(both, "neuron_device_ecc_errors_total", device="3", type="mem_uncorrected") == [5]
    assert [n for (n, _), _ in samples(both).items() if n == "neuron_hardware_info"] == ["neuron_hardware_info"]
    # the families neuron-monitor does not have keep the native labels
    assert find(both, "neuron_device_host_memory_used_bytes", device="3")
    assert not find(both, "neuron_device_host_memory_used_bytes", neuron_device_index="3")


def test_with_neuron_monitor_its_names_for_status_and_core_memory_are_the_runtimes(node: Path) -> None:
    """The runtime's execution_status_total and neuroncore_memory_usage_* take those names (see
    runtime_metrics); the driver's figures are then served under the native names only."""
    for naming in (Naming.NEURON_MONITOR, Naming.BOTH):
        text = collector(node, naming=naming, runtime_rows=lambda _: iter(())).render()
        names = {n for (n, _), _ in samples(text).items()}
        assert "execution_status_total" not in names
        assert not [n for n in names if n.startswith("neuroncore_memory_usage_")]
        assert ("neuron_core_execution_status_total" in names) is (naming == "both")


def test_resource_counts(unchanged_node: Path) -> None:
    node = unchanged_node
    c = collector(
        node,
        Attribution({}, {}, {"aws.amazon.com/neuron": 2}),
        resources_capacity=lambda inv: {"aws.amazon.com/neuron": len(inv.devices)},
        allocatable=lambda: {"aws.amazon.com/neuron": 13},
    )
    text = c.render()
    assert find(text, "neuron_resource_capacity") == [16]
    assert find(text, "neuron_resource_allocatable") == [13]
    assert find(text, "neuron_resource_allocated") == [2]
    assert find(text, "neuron_resource_unhealthy") == [3]


def test_no_driver(tmp_path: Path) -> None:
    c = collector(tmp_path)
    text = c.render()
    assert find(text, "neuron_device_info") == []
    assert layout.HostLayout(tmp_path).class_dir.exists() is False
