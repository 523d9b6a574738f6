"""The node boards read the same series on every family: what a trn2 node's exporter serves for the
boards' panels (tests/integration/test_prometheus_dashboards.py runs them on a real Prometheus over a
trn2.48xlarge), a Trainium3 node's serves too, with the same labels, so every panel has data there."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import metrics_read, panel_queries

from neuron_model.instance_types import INSTANCE_TYPES
from neuron_node_metrics.attribution import Attribution
from neuron_node_metrics.catalogue import FAMILIES
from neuron_node_metrics.collector import NeuronCollector
from neuron_sim import node as sim

READ = {m for _, _, expr in panel_queries(frozenset({"neuron-node-metrics"})) for m in metrics_read(expr)}


def served(root: Path, name: str) -> dict[str, set[frozenset[str]]]:
    """Each series name the exporter serves over a simulated `name` -> the label-name sets it has."""
    sim.create(root, name, driver_version="2.30.2.0")  # the newest tree: the corrected ECC panel's series too
    text = NeuronCollector(root, frozenset(FAMILIES), Attribution).render()
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).add(frozenset(s.labels))
    return out


@pytest.mark.parametrize("name", sorted(n for n, it in INSTANCE_TYPES.items() if it.family.name == "trn3"))
def test_a_trainium3_node_serves_every_series_the_boards_read_on_trn2(tmp_path: Path, name: str) -> None:
    reference = served(tmp_path / "trn2", "trn2.48xlarge")
    here = served(tmp_path / "trn3", name)
    read_on_trn2 = READ & set(reference)
    assert read_on_trn2, "the boards read sysfs series"
    missing = sorted(read_on_trn2 - set(here))
    assert not missing, f"{name} lacks series the boards read: {missing}"
    for metric in read_on_trn2:
        assert here[metric] == reference[metric], metric
    info = [s for f in text_string_to_metric_families(NeuronCollector(tmp_path / "trn3", frozenset(FAMILIES),
            Attribution).render()) for s in f.samples if s.name == "neuron_device_info"]  # fmt: skip
    assert {(s.labels["family"], s.labels["device_name"], s.labels["arch_type"]) for s in info} == {
        ("Trn3", "Trainium3", "NDv4")
    }
