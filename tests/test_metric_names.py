"""Every series an alert, a recording rule or a dashboard panel reads is one a component serves, by
the components' own catalogues (tools/metric_names.py): the chart's rules against the exporter's
catalogue, each board against those of its `sources` (tools/dashboards.py), AWS's vendored board
against the exporter's (its drop-in naming). promtool's unit tests see only the series they
synthesise, and a board's query against a real Prometheus only the series it happens to hold, so a
misspelt name passed both; here it fails, as the tests at the end show."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_server import AWS_DASHBOARD, DASHBOARDS, generator, grafana_queries

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import metric_names  # noqa: E402

RULES = REPO / "charts/neuron-helm-chart/rules/neuron-node-metrics.rules.yaml"
EXPORTER = "neuron-node-metrics"
# The rules are the exporter's; `up` is Prometheus's own record of scraping it.
RULE_SOURCES = (EXPORTER, "prometheus")
SERVED = metric_names.catalogues()


def board_exprs(path: Path) -> list[tuple[str, str]]:
    board = json.loads(path.read_text())
    return [(f"{path.name} {where}", metric_names.grafana_concrete(expr)) for where, expr, _ in grafana_queries(board)]


def rules_problems(document: dict[str, object]) -> list[str]:
    return metric_names.problems(
        metric_names.rule_exprs(document), RULE_SOURCES, SERVED, metric_names.recorded(document)
    )


def test_every_rule_reads_served_series() -> None:
    document = yaml.safe_load(RULES.read_text())
    exprs = metric_names.rule_exprs(document)
    assert len(exprs) >= 8, "the rules file's alerts were read"
    assert rules_problems(document) == []


@pytest.mark.parametrize("name", sorted(generator().BOARDS))
def test_every_panel_reads_series_its_sources_serve(name: str) -> None:
    board = generator().BOARDS[name]
    exprs = board_exprs(DASHBOARDS / name)
    assert exprs, name
    assert metric_names.problems(exprs, board.sources, SERVED) == []


def test_awss_board_reads_what_the_drop_in_serves() -> None:
    exprs = board_exprs(AWS_DASHBOARD)
    assert len(exprs) >= 10
    assert metric_names.problems(exprs, (EXPORTER,), SERVED) == []


def test_each_external_series_is_read() -> None:
    """The outside series allowed are those read: a name no longer read leaves the list."""
    read = {s.name for path in sorted(DASHBOARDS.glob("*.json")) for _, e in board_exprs(path)
            for s in metric_names.selectors(e)}  # fmt: skip
    read |= {s.name for _, e in metric_names.rule_exprs(yaml.safe_load(RULES.read_text()))
             for s in metric_names.selectors(e)}  # fmt: skip
    allowed = {s.name for series in metric_names.EXTERNAL.values() for s in series}
    assert sorted(allowed - read) == []


def test_no_outside_name_shadows_a_catalogue() -> None:
    ours = {name for component, names in SERVED.items() if component not in metric_names.EXTERNAL for name in names}
    outside = {s.name for series in metric_names.EXTERNAL.values() for s in series}
    assert not ours & outside


def _registered(registry: CollectorRegistry) -> tuple[set[str], dict[str, set[str]]]:
    """The family names a registry holds, and the samples it serves now with their label names."""
    families: set[str] = set()
    samples: dict[str, set[str]] = {}
    for family in registry.collect():
        families.add(family.name)
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return families, samples


def _base(name: str) -> str:
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count"):
        name = name.removesuffix(suffix)
    return name


def test_what_each_service_registers_is_its_catalogue() -> None:
    """The services' catalogues against their live registries (the exporter's: its own test,
    services/node-metrics/tests/test_catalogue_series.py): the same families, every sample served
    catalogued with its labels."""
    from neuron_dra_driver.metrics import DriverMetrics

    from neuron_common.metrics_auth import MetricsAuthorizer
    from neuron_device_plugin.metrics import PluginMetrics
    from neuron_problem_detector.app import Metrics as DetectorMetrics
    from neuron_problem_detector.rules import default_rules
    from neuron_remediation.metrics import Metrics as RemediatorMetrics
    from neuron_scheduler_extender.metrics import Metrics as ExtenderMetrics
    from neuron_scheduler_extender.state import ViewStats

    extender = ExtenderMetrics()
    extender.watch_view(lambda: ViewStats(1, 0, 0, 2, 0, 0), lambda: {"nodes": 1.5}, lambda: True)
    extender.watch_nodes(lambda: [])
    extender.watch_groups(lambda: {}, lambda: {"events": 1})
    for component, metrics in (
        ("neuron-device-plugin", PluginMetrics()),
        ("neuron-dra-driver", DriverMetrics()),
        ("neuron-problem-detector", DetectorMetrics(default_rules())),
        ("neuron-scheduler-extender", extender),
        ("neuron-remediator", RemediatorMetrics()),
    ):
        MetricsAuthorizer(None, metrics.registry)  # type: ignore[arg-type]  # what --metrics-auth adds
        families, samples = _registered(metrics.registry)
        catalogue = SERVED[component]
        assert families == {_base(name) for name in catalogue}, component
        assert samples, component
        for name, labels in samples.items():
            assert name in catalogue, f"{component} serves {name}, not catalogued"
            assert labels <= set(catalogue[name].labels), f"{component} {name}: {labels}"


# -- the check can fail ------------------------------------------------------------------------


def misspelt_rules() -> dict[str, object]:
    """The committed rules with one letter dropped from the first alert's metric."""
    document = yaml.safe_load(RULES.read_text())
    rule = document["groups"][0]["rules"][0]
    assert "neuron_device_ecc_errors_total" in rule["expr"]
    rule["expr"] = rule["expr"].replace("neuron_device_ecc_errors_total", "neuron_device_ecc_error_total")
    return document


def test_a_misspelt_alert_fails_naming_it() -> None:
    found = rules_problems(misspelt_rules())
    assert found == [
        "group neuron-hardware alert NeuronUncorrectableECC: neuron_device_ecc_error_total is served by none of "
        "neuron-node-metrics, prometheus (nor recorded)"
    ]


def test_a_label_the_series_lacks_fails() -> None:
    exprs = [("panel", 'sum(neuron_core_utilization_ratio{node=~".*", pod_name="x"})')]
    assert metric_names.problems(exprs, (EXPORTER,), SERVED) == [
        "panel: neuron_core_utilization_ratio has no label pod_name"
    ]


def test_a_series_of_another_component_fails_on_a_board_without_it() -> None:
    exprs = [("panel", "sum(neuron_dra_prepared_claims)")]
    assert metric_names.problems(exprs, (EXPORTER,), SERVED) == [
        "panel: neuron_dra_prepared_claims is served by none of neuron-node-metrics (nor recorded)"
    ]
    assert metric_names.problems(exprs, ("neuron-dra-driver",), SERVED) == []


def test_a_recording_rules_output_counts_as_served() -> None:
    document = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "record": "node:neuron_core_utilization:avg",
                        "expr": "avg by (node) (neuron_core_utilization_ratio)",
                    },
                    {"alert": "Busy", "expr": "node:neuron_core_utilization:avg > 0.9"},
                    {"alert": "Typo", "expr": "node:neuron_core_utilisation:avg > 0.9"},
                ],
            }
        ]
    }
    assert rules_problems(document) == [
        "group g alert Typo: node:neuron_core_utilisation:avg is served by none of neuron-node-metrics, prometheus "
        "(nor recorded)"
    ]


def test_what_does_not_parse_fails() -> None:
    assert metric_names.problems([("panel", "sum(rate(neuron_core_utilization_ratio[5m])")], (EXPORTER,), SERVED) != []


def test_selectors_are_read_through_the_whole_expression() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="1"}[5m]))) / on (node) group_left '
        'max({__name__="b", y=~"z"} offset 5m) or label_replace(c, "d", "$1", "e", "(.*)") or vector(0)'
    )
    assert {(s.name, s.labels) for s in metric_names.selectors(expr)} == {
        ("a_bucket", frozenset({"x"})),
        ("b", frozenset({"y"})),
        ("c", frozenset()),
    }
    [variable] = metric_names.selectors("label_values(neuron_device_info, node)")
    assert (variable.name, variable.labels) == ("neuron_device_info", frozenset({"node"}))


def test_the_generator_refuses_a_board_reading_what_its_sources_do_not_serve() -> None:
    tools = generator()
    text = tools.render(tools.BOARDS["neuron-dra.json"].build)
    assert tools.unserved("neuron-dra.json", text) == []
    wrong = text.replace("neuron_dra_prepared_claims", "neuron_dra_prepared_claim")
    assert tools.unserved("neuron-dra.json", wrong) == [
        f"neuron-dra.json {panel}: neuron_dra_prepared_claim is served by none of neuron-dra-driver (nor recorded)"
        for panel in ("Prepared claims", "Prepared claims by node")
    ]
