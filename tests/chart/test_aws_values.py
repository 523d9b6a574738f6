"""Values written for AWS's neuron-helm-chart (issue 31 item 2): every key either works here with the
same meaning or is refused with this chart's equivalent, never a bare schema error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.test_chart import CHART, daemonset, refusal, render

pytestmark = pytest.mark.integration  # helm

AWS_VALUES = sorted((Path(__file__).parent / "aws-values").glob("*.yaml"))
AWS_ONLY = "a key of AWS's neuron-helm-chart"


def flatten(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        paths.append(f"{prefix}{key}")
        if isinstance(value, dict) and value:
            paths += flatten(value, f"{prefix}{key}.")
    return paths


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node = schema
    for part in path.split("."):
        props = node.get("properties")
        if props is None:
            return node  # inside a free-form object of this chart (resources, selectors, ...)
        if part not in props:
            return None
        node = props[part]
    return node


@pytest.mark.parametrize("values", AWS_VALUES, ids=[p.name for p in AWS_VALUES])
def test_every_aws_key_is_this_charts_or_refused_with_its_equivalent(values: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    message = refusal("-f", str(values))
    assert "values written for AWS's neuron-helm-chart" in message, message
    assert "additional properties" not in message, message
    refused = {line.split(" -> ")[0].strip() for line in message.splitlines() if " -> " in line}
    for path in flatten(yaml.safe_load(values.read_text())):
        node = schema_node(schema, path)
        assert node is not None, f"{path}: refused by the schema, with no equivalent named"
        if AWS_ONLY in node.get("description", ""):
            assert any(path == r or path.startswith(f"{r}.") for r in refused), f"{path} is not named in:\n{message}"
    # each refusal says what to write instead
    for line in message.splitlines():
        if " -> " in line:
            assert line.split(" -> ", 1)[1].strip(), line


def test_neuron_instances_is_read_as_placement_instance_types() -> None:
    types = ["trn2.48xlarge", "inf2.xlarge"]
    docs = render("--set-json", f"neuronInstances={json.dumps(types)}")
    terms = daemonset(docs, "device-plugin")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    expressions = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    (by_type,) = [e for e in expressions if e["key"] == "node.kubernetes.io/instance-type"]
    assert by_type["values"] == types


def test_an_aws_image_is_refused_with_why() -> None:
    message = refusal("--set", "devicePlugin.image.repository=public.ecr.aws/neuron/neuron-device-plugin")
    assert "devicePlugin.image.repository -> leave it unset" in message
    assert "does not take this chart's flags" in message
