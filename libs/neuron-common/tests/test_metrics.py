from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_common.metrics import MetricSet


def series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for f in families
        for s in f.samples
        if not s.name.endswith("_created")
    }


def test_every_name_carries_the_prefix() -> None:
    m = MetricSet("neuron_x")
    m.counter("errors", "Errors", ["kind"]).labels("read").inc()
    m.gauge("up", "Up").set(1)
    m.histogram("duration_seconds", "Time", buckets=(0.1, 1.0)).observe(0.5)
    names = {name for name, _ in series(m.registry)}
    assert names == {
        "neuron_x_errors_total",
        "neuron_x_up",
        "neuron_x_duration_seconds_bucket",
        "neuron_x_duration_seconds_count",
        "neuron_x_duration_seconds_sum",
    }


def test_no_prefix_keeps_the_name_as_given() -> None:
    m = MetricSet("")
    m.counter("problem_counter", "Problems", ["reason"]).labels("A").inc()
    assert ("problem_counter_total", (("reason", "A"),)) in series(m.registry)


def test_shown_label_values_are_exposed_at_zero_before_any_step() -> None:
    m = MetricSet("neuron_x")
    m.counter("verdicts", "Verdicts", ["verdict"], shown=("allowed", "forbidden"))
    m.gauge("pairs", "Pairs", ["a", "b"], shown=[("1", "2"), ("3", "4")])
    m.histogram("t", "Time", ["op"], buckets=(1.0,), shown=["prepare"])
    got = series(m.registry)
    assert ("neuron_x_verdicts_total", (("verdict", "allowed"),)) in got
    assert ("neuron_x_verdicts_total", (("verdict", "forbidden"),)) in got
    assert ("neuron_x_pairs", (("a", "1"), ("b", "2"))) in got
    assert ("neuron_x_pairs", (("a", "3"), ("b", "4"))) in got
    assert ("neuron_x_t_count", (("op", "prepare"),)) in got
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    assert all(s.value == 0 for s in families["neuron_x_verdicts"].samples if s.name.endswith("_total"))


def test_a_given_registry_is_shared() -> None:
    registry = CollectorRegistry()
    MetricSet("neuron_a", registry).gauge("up", "Up")
    MetricSet("neuron_b", registry).gauge("up", "Up")
    assert {name for name, _ in series(registry)} == {"neuron_a_up", "neuron_b_up"}
