"""The exporter on every driver generation the simulator writes: it starts with nothing missing, reads
no directory as a counter (health_status/ sits in stats/hardware from 2.28), and on 2.30.2 serves the
corrected ECC counts under AWS's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from neuron_node_metrics.attribution import Attribution
from neuron_node_metrics.catalogue import FAMILIES, Naming
from neuron_node_metrics.collector import NeuronCollector
from neuron_sim import node as sim

ALL = frozenset(FAMILIES)


def ecc_events(text: str) -> dict[str, float]:
    """hardware_ecc_events_total of device 0, by event_type."""
    return {
        s.labels["event_type"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "hardware_ecc_events_total" and s.labels.get("neuron_device_index") == "0"
    }


@pytest.mark.parametrize("driver_version", [None, "2.28.0.0", "2.30.2.0"], ids=["pre-2.28", "2.28", "2.30.2"])
def test_each_generation_starts_clean_and_reads_its_counters(tmp_path: Path, driver_version: str | None) -> None:
    sim.create(tmp_path, "trn2.3xlarge", driver_version=driver_version)
    c = NeuronCollector(tmp_path, ALL, Attribution, naming=Naming.BOTH)
    assert c.layout.ok, c.layout.lines()
    sim.bump_counter(tmp_path, 0, "mem_ecc_uncorrected", by=2)
    events = ecc_events(c.render())
    assert events["mem_ecc_uncorrected"] == 2
    assert sum(c.read_errors.values()) == 0  # before 2.28's tree was known, health_status/ failed every scrape
    assert "health_status" not in events
    if driver_version == "2.30.2.0":
        sim.bump_counter(tmp_path, 0, "mem_ecc_corrected", by=7)
        sim.bump_counter(tmp_path, 0, "sram_ecc_corrected", by=1)
        events = ecc_events(c.render())
        assert (events["mem_ecc_corrected"], events["sram_ecc_corrected"]) == (7, 1)
    else:
        assert "mem_ecc_corrected" not in events
