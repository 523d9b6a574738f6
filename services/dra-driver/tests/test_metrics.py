"""The driver's metrics as Prometheus first reads them, before any claim."""

from __future__ import annotations

from neuron_dra_driver.metrics import DriverMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


def test_both_latency_histograms_are_served_at_zero_before_the_first_claim() -> None:
    families = text_string_to_metric_families(generate_latest(DriverMetrics().registry).decode())
    (latency,) = [f for f in families if f.name == "neuron_dra_prepare_duration_seconds"]
    counts = {s.labels["operation"]: s.value for s in latency.samples if s.name.endswith("_count")}
    assert counts == {"prepare": 0.0, "unprepare": 0.0}
