"""The series each component serves, from the components' own catalogues, and the series a PromQL
expression reads, parsed by Rust's promql-parser (through its Python binding, pinned in
constraints.txt): one check that an expression names only served series and their labels.

`make dashboards` (tools/dashboards.py) refuses to write a board whose panels read a series its
`sources` do not serve; tests/test_metric_names.py holds the committed boards, the chart's alert and
recording rules and AWS's vendored board to the same check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import promql_parser

from neuron_common.metrics import Series

# Components outside this project whose series the boards and rules read, each kept to the few
# names read, with its reason. Nothing else outside the catalogues is accepted.
EXTERNAL: dict[str, tuple[Series, ...]] = {
    # Prometheus's own series for every scrape target: 1 when its last scrape succeeded (the
    # exporter-down alert); Prometheus writes it, no exporter can
    "prometheus": (Series("up"),),
    # kube-scheduler's own (the chart's second scheduler, neuron-scheduler, on the scheduling board);
    # integration/test_prometheus_scheduling.py reads them from a real kube-scheduler
    "kube-scheduler": (
        Series("scheduler_pending_pods", ("queue",)),
        Series("scheduler_schedule_attempts_total", ("profile", "result")),
        Series("scheduler_unschedulable_pods", ("plugin", "profile")),
    ),
}
# Labels a series gains from its scrape, not from its exporter: Prometheus's `job` and `instance`,
# and `node`, which the chart's ServiceMonitors and PodMonitors set from the pod's node name.
SCRAPE_LABELS = frozenset({"job", "instance", "node"})
# Grafana's template variables, as a concrete query has them (the boards' $node, $namespace, ...)
_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def catalogues() -> dict[str, dict[str, Series]]:
    """Each component's series by name: this project's services' (`catalogue()` of each) and EXTERNAL's."""
    from neuron_dra_driver.metrics import catalogue as dra_driver

    from neuron_device_plugin.metrics import catalogue as device_plugin
    from neuron_node_metrics.catalogue import series as node_metrics
    from neuron_problem_detector.app import catalogue as problem_detector
    from neuron_remediation.metrics import catalogue as remediator
    from neuron_scheduler_extender.metrics import catalogue as scheduler_extender

    ours = {
        "neuron-node-metrics": node_metrics(),
        "neuron-device-plugin": device_plugin(),
        "neuron-dra-driver": dra_driver(),
        "neuron-scheduler-extender": scheduler_extender(),
        "neuron-problem-detector": problem_detector(),
        "neuron-remediator": remediator(),
    }
    return {component: _by_name(s) for component, s in {**ours, **EXTERNAL}.items()}


def _by_name(series: Iterable[Series]) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for s in series:
        known = out.get(s.name)
        out[s.name] = s if known is None else Series(s.name, tuple(dict.fromkeys((*known.labels, *s.labels))))
    return out


@dataclass(frozen=True)
class Selector:
    name: str  # '' when the selector names no metric by equality
    labels: frozenset[str]  # the label names its matchers test (not __name__)
    text: str


def grafana_concrete(expr: str) -> str:
    """A Grafana target as PromQL: its time variables as durations, every other variable as a regex
    matching anything (the boards use them only as label values: `node=~"$node"`)."""
    for variable, value in _VARIABLES.items():
        expr = expr.replace(variable, value)
    return _VARIABLE.sub(".*", expr)


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of a PromQL expression, or of a Grafana `label_values(selector, label)`
    variable query (its label counted as tested); raises ValueError for what does not parse."""
    extra: frozenset[str] = frozenset()
    if m := _LABEL_VALUES.match(expr):
        expr, extra = m.group(1), frozenset({m.group(2)})
    try:
        tree = promql_parser.parse(expr)
    except Exception as exc:  # the binding raises its own error types
        raise ValueError(f"not PromQL: {expr!r}: {exc}") from None
    found: list[Selector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or ""
            labels = set(extra)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    if matcher.op == promql_parser.MatchOp.Equal and not name:
                        name = matcher.value
                else:
                    labels.add(matcher.name)
            found.append(Selector(name, frozenset(labels), str(node)))

    promql_parser.walk(tree, visit)
    return found


def problems(
    exprs: Iterable[tuple[str, str]],
    sources: Iterable[str],
    served: Mapping[str, Mapping[str, Series]],
    recorded: Iterable[str] = (),
) -> list[str]:
    """What is wrong with each (where, expr), read against the series of the components in
    `sources` (names in `served`) and those `recorded` by recording rules (their labels are the
    rule's result's, not checked): a selector that names no such series, or tests a label that
    series does not carry (nor its scrape gives it). Empty when all is well."""
    names = sorted(sources)
    written = frozenset(recorded)
    known = _by_name(s for source in names for s in served[source].values())
    out: list[str] = []
    for where, expr in exprs:
        try:
            found = selectors(expr)
        except ValueError as exc:
            out.append(f"{where}: {exc}")
            continue
        for sel in found:
            if not sel.name:
                out.append(f"{where}: {sel.text} names no metric (checked by name only)")
                continue
            if sel.name in written:
                continue
            series = known.get(sel.name)
            if series is None:
                out.append(f"{where}: {sel.name} is served by none of {', '.join(names)} (nor recorded)")
                continue
            unknown = sorted(sel.labels - set(series.labels) - SCRAPE_LABELS)
            if unknown:
                out.append(f"{where}: {sel.name} has no label {', '.join(unknown)}")
    return out


def recorded(rule_groups: Mapping[str, object]) -> list[str]:
    """The series a rules file's recording rules write."""
    groups = rule_groups.get("groups") or []
    assert isinstance(groups, list)
    return [rule["record"] for g in groups for rule in g.get("rules", []) if "record" in rule]


def rule_exprs(rule_groups: Mapping[str, object]) -> list[tuple[str, str]]:
    """(where, expr) of every alert and recording rule of a rules file."""
    groups = rule_groups.get("groups") or []
    assert isinstance(groups, list)
    return [
        (f"group {g['name']} {'alert' if 'alert' in r else 'record'} {r.get('alert') or r.get('record')}", r["expr"])
        for g in groups
        for r in g.get("rules", [])
    ]
