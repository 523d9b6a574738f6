"""values.schema.json is generated (tools/chart_schema.py) from values.yaml's annotations and the
services' flag declarations: the committed file is the generator's output, a value annotated with a
flag is checked against that flag, and the generated schema refuses what a flag's validator refuses.

When it replaced the hand-written schema (this file's first commit), the two were compared on every
ci/ values file and every rejection case of the chart's schema tests, with the same verdicts except
NARROWED; the hand-written copy was then dropped: a frozen second schema would refuse every value
added after it."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loading import load

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
HELM = str(REPO / ".venv" / "bin" / "helm")
SCHEMA_REFUSAL = "values don't meet the specifications of the schema"

chart_schema = load("chart_schema", REPO / "tools" / "chart_schema.py")


def values_text() -> str:
    return (CHART / "values.yaml").read_text()


def aws_template() -> str:
    return (CHART / "templates" / "_aws.tpl").read_text()


def generate(text: str, flags: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = chart_schema.generate(text, aws_template(), flags)
    return result


def node(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    for part in dotted.split("."):
        schema = schema["properties"][part]
    return schema


def edited(old: str, new: str) -> str:
    text = values_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


# --- generation: pure Python ------------------------------------------------------------------


def test_the_committed_schema_is_the_generated_one() -> None:
    assert (CHART / "values.schema.json").read_text() == chart_schema.render(), (
        "values.schema.json is stale: run `make chart-docs`"
    )


def test_every_flag_annotation_names_a_declared_flag_and_most_values_of_the_services_have_one() -> None:
    flags = chart_schema.service_flags()
    pairs = list(chart_schema.walk_flags(values_text()))
    for dotted, ref in pairs:
        assert ref.flag in flags[ref.prog], f"{dotted}: {ref}"
    # each service's log level, port and /metrics protection, at least
    for component in ("devicePlugin", "draDriver", "nodeMetrics", "npd", "scheduler.extender", "remediation"):
        for value in ("logLevel", "port", "secureMetrics"):
            assert any(d == f"{component}.{value}" for d, _ in pairs), f"{component}.{value} has no # @flag"


def test_a_default_that_is_not_the_flags_is_refused() -> None:
    text = edited("  attributionInterval: 10\n", "  attributionInterval: 20\n")
    with pytest.raises(chart_schema.ChartSchemaError, match="not neuron-node-metrics --attribution-interval's"):
        generate(text)


def test_a_default_the_flag_refuses_is_refused() -> None:
    text = edited("  naming: native\n", "  naming: prometheus\n")
    with pytest.raises(chart_schema.ChartSchemaError, match="not one of"):
        generate(text)


def test_a_chart_default_said_to_differ_must_differ() -> None:
    text = edited("  heartbeat: 300\n", "  heartbeat: 60\n")
    with pytest.raises(chart_schema.ChartSchemaError, match="says its default is the chart's own"):
        generate(text)


def test_an_annotation_may_narrow_a_flags_bounds_but_not_widen_them() -> None:
    annotated = '  # @schema {"minimum": 1}\n  # @flag neuron-node-metrics --listen'
    assert node(generate(values_text()), "nodeMetrics.port")["minimum"] == 1
    with pytest.raises(chart_schema.ChartSchemaError, match="widens"):
        generate(edited(annotated, annotated.replace('"minimum": 1', '"minimum": -1')))
    with pytest.raises(chart_schema.ChartSchemaError, match="widens"):
        generate(edited(annotated, annotated.replace('"minimum": 1', '"minimum": 1, "maximum": 70000')))


def test_an_unknown_flag_is_refused() -> None:
    text = edited("# @flag neuron-node-metrics --naming\n", "# @flag neuron-node-metrics --nameing\n")
    with pytest.raises(chart_schema.ChartSchemaError, match="no flag of that program"):
        generate(text)


def test_enum_and_bounds_follow_the_flags_declaration() -> None:
    """Change a declaration (not values.yaml): the schema follows it."""
    from neuron_common.config import positive_duration

    flags = chart_schema.service_flags()
    metrics, detector = flags["neuron-node-metrics"], flags["neuron-problem-detector"]
    metrics["--naming"] = dataclasses.replace(metrics["--naming"], choices=[*metrics["--naming"].choices, "otel"])
    detector["--lookback"] = dataclasses.replace(detector["--lookback"], type=positive_duration)
    schema = generate(values_text(), flags)
    assert node(schema, "nodeMetrics.naming")["enum"] == ["native", "neuron-monitor", "both", "otel"]
    lookback = node(schema, "npd.lookback")
    assert lookback["exclusiveMinimum"] == 0
    assert "minimum" not in lookback
    # as declared: zero is a valid lookback
    assert node(generate(values_text()), "npd.lookback")["minimum"] == 0


def test_the_aws_keys_are_the_ones_the_template_refuses() -> None:
    schema = generate(values_text())
    keys = chart_schema.aws_keys(aws_template())
    assert "scheduler.customScheduler" in keys
    assert "monitor" in keys
    for dotted in keys:
        assert node(schema, dotted) == {"description": chart_schema.AWS_ONLY}


# --- what the flags' validators refuse, the schema refuses: helm decides -------------------


# (value, --set-json value): refused by the generated schema only, because the flag's validator refuses it
# (positive_duration: not zero); the service would stop at start with it, so the chart now refuses it at install
NARROWED = [
    ("devicePlugin.healthQuietPeriod", 0),
    ("draDriver.healthQuietPeriod", 0),
    ("scheduler.extender.reportMaxAge", "0s"),
    ("scheduler.extender.groupReservationTtl", "0m"),
    ("scheduler.extender.leaderElection.leaseDuration", "0s"),
    ("scheduler.extender.leaderElection.renewDeadline", "0ms"),
    ("scheduler.extender.leaderElection.retryPeriod", "0s0m"),
]


@functools.cache
def _verdict(chart: Path, args: tuple[str, ...]) -> str:
    result = subprocess.run([HELM, "template", "x", str(chart), *args], capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return "accepted"
    return "refused by the schema" if SCHEMA_REFUSAL in result.stderr else f"refused otherwise: {result.stderr}"


CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


@pytest.mark.integration
@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_the_schema_accepts_every_ci_values_file(values: Path) -> None:
    assert _verdict(CHART, ("-f", str(values))) == "accepted"


@pytest.mark.integration
@pytest.mark.parametrize(("dotted", "value"), NARROWED, ids=[d for d, _ in NARROWED])
def test_the_schema_refuses_what_the_flags_validator_refuses(dotted: str, value: Any) -> None:
    assert _verdict(CHART, ("--set-json", f"{dotted}={json.dumps(value)}")) == "refused by the schema"
    flags = chart_schema.service_flags()
    (ref,) = [r for d, r in chart_schema.walk_flags(values_text()) if d == dotted]
    with pytest.raises(argparse.ArgumentTypeError, match="must be greater than 0"):
        flags[ref.prog][ref.flag].type(ref.word(value))


# --- each `# @flag` line is true: the value reaches that flag ---------------------------------

# what renders each program's container
ENABLE = {
    "neuron-dra-driver": ["--set", "draDriver.enabled=true,devicePlugin.enabled=false"],
    "neuron-scheduler-extender": ["--set", "scheduler.enabled=true"],
    "neuron-remediator": ["--set", "remediation.enabled=true"],
}
# what a value needs to be rendered, or to differ from its default
NEEDS = {
    "devicePlugin.cdi.specDir": ["--set", "devicePlugin.cdi.enabled=true"],
    "scheduler.extender.leaderElection.enabled": ["--set", "scheduler.extender.replicas=1"],
    "remediation.leaderElection.enabled": ["--set", "remediation.replicas=1"],
    "npd.remediation.deviceReset.validationWindow": ["--set", "npd.remediation.deviceReset.enabled=true"],
    "npd.remediation.deviceReset.validationCommand": ["--set", "npd.remediation.deviceReset.enabled=true"],
    "remediation.verdictTimeout": ["--set", "remediation.validateAfterReboot=true"],
}
FLAG_PAIRS = list(chart_schema.walk_flags(values_text()))
# another value of each one another_value cannot make up: lists, maps and patterns of their own
OTHER_VALUES: dict[str, Any] = {
    "remediation.drainPolicy": "finish:2h",
    "remediation.namespaceDrainPolicy": {"training": "delete-after:30m"},
    "remediation.keepNamespaces": ["training"],
    # "auto" renders --publish-cores at Helm's own Kubernetes version: only false changes the flag there
    "draDriver.publishCores": False,
}


def another_value(schema: dict[str, Any], default: Any, dotted: str = "") -> Any:
    """A value the schema admits that is not the default."""
    if dotted in OTHER_VALUES:
        return OTHER_VALUES[dotted]
    if "enum" in schema:
        return next(v for v in schema["enum"] if v != default)
    if schema["type"] == "boolean":
        return not default
    if schema["type"] in ("integer", "number"):
        return default + 7
    if schema.get("pattern") in (chart_schema.DURATION, chart_schema.POSITIVE_DURATION):
        return "17s"
    return f"{default}x"


def container_args(args: list[str]) -> list[list[str]]:
    import yaml_streams

    result = subprocess.run([HELM, "template", "x", str(CHART), *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    workloads = [d for d in yaml_streams.load_all(result.stdout) if d and d["kind"] in ("DaemonSet", "Deployment")]
    return [c.get("args", []) for w in workloads for c in w["spec"]["template"]["spec"]["containers"]]


@pytest.mark.integration
@pytest.mark.parametrize(("dotted", "ref"), FLAG_PAIRS, ids=[f"{d}->{r.prog}{r.flag}" for d, r in FLAG_PAIRS])
def test_the_value_is_rendered_into_its_flag(dotted: str, ref: Any) -> None:
    import yaml

    default: Any = yaml.safe_load(values_text())
    for part in dotted.split("."):
        default = default[part]
    value = another_value(node(generate(values_text()), dotted), default, dotted)
    enable = [*ENABLE.get(ref.prog, []), *NEEDS.get(dotted, [])]
    if dotted.startswith("scheduler."):
        enable += ["--set", "scheduler.enabled=true"]
    before = container_args(enable)
    after = container_args([*enable, "--set-json", f"{dotted}={json.dumps(value)}"])
    changed = [a for a in after if a not in before]
    spec = chart_schema.service_flags()[ref.prog][ref.flag]
    if spec.switch:
        negated = "--no-" + ref.flag.removeprefix("--")
        expected: Callable[[list[str]], bool] = (
            (lambda a: ref.flag in a) if value else (lambda a: negated in a or ref.flag not in a)
        )
    else:
        word = f"{ref.flag}={ref.word(value)}"
        if isinstance(value, list):
            # a list leads the flag's list, which the chart may extend (remediation.keepNamespaces: its own namespaces)
            expected = lambda a: word in a or any(x.startswith(f"{word},") for x in a)  # noqa: E731
        else:
            expected = lambda a: word in a  # noqa: E731
    assert any(expected(a) for a in changed), f"{dotted}={value!r} changed no container's {ref.flag}: {changed}"


# --- README.md is helm-docs' rendering ----------------------------------------------------------

chart_docs = load("chart_docs", REPO / "tools" / "chart_docs.py")


@pytest.mark.integration
def test_the_readme_is_helm_docs_rendering_and_follows_values_yaml(tmp_path: Path) -> None:
    binary = chart_docs.helm_docs_binary()
    readme = (CHART / "README.md").read_text()
    assert chart_docs.render(binary) == readme, "README.md is stale: run `make chart-docs`"
    # a description changed in values.yaml changes its row and nothing else
    chart = tmp_path / "neuron-helm-chart"
    shutil.copytree(CHART, chart)
    old = "# -- Seconds each test waits for what it checks."
    (chart / "values.yaml").write_text(edited(old, "# -- Seconds each helm test waits."))
    changed = [
        (a, b)
        for a, b in zip(readme.splitlines(), chart_docs.render(binary, chart).splitlines(), strict=True)
        if a != b
    ]
    assert changed == [
        (
            "| tests.timeoutSeconds | int | `120` | Seconds each test waits for what it checks. |",
            "| tests.timeoutSeconds | int | `120` | Seconds each helm test waits. |",
        )
    ]
