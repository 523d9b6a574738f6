"""How the chart's templates are laid out (issue 29 item 4): each component's DaemonSet or Deployment is
written whole in its own file, and the helpers it includes return values (labels, an affinity, a probe,
a list of pull secrets), never the top half of a manifest that the including file continues."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml_streams

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
TEMPLATES = CHART / "templates"
HELM = str(REPO / ".venv" / "bin" / "helm")

WORKLOADS = {
    ("DaemonSet", "device-plugin"): "device-plugin/daemonset.yaml",
    ("DaemonSet", "dra-driver"): "dra-driver/daemonset.yaml",
    ("DaemonSet", "problem-detector"): "npd/daemonset.yaml",
    ("DaemonSet", "node-metrics"): "node-metrics/daemonset.yaml",
    ("Deployment", "scheduler-extender"): "scheduler/extender.yaml",
    ("Deployment", "kube-scheduler"): "scheduler/kube-scheduler.yaml",
}

# Every workload of the chart: the device plugin and the DRA driver on nodes of their own, and the scheduler.
ALL_ON = [
    *("--set", "draDriver.enabled=true", "--set", "scheduler.enabled=true"),
    *("--set", "devicePlugin.nodeSelector.allocator=device-plugin", "--set", "draDriver.nodeSelector.allocator=dra"),
]


def _rendered(*args: str) -> dict[str, str]:
    """The rendered documents, by `# Source:` file, concatenated per file."""
    result = subprocess.run(
        [HELM, "template", "neuron-helm-chart", str(CHART), "--namespace", "kube-system", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    by_source: dict[str, str] = {}
    for doc in result.stdout.split("\n---\n"):
        if match := re.search(r"^# Source: neuron-helm-chart/templates/(\S+)$", doc, re.M):
            by_source[match[1]] = by_source.get(match[1], "") + doc + "\n"
    return by_source


def test_no_helper_emits_a_workload() -> None:
    for helpers in TEMPLATES.rglob("_*.tpl"):
        text = helpers.read_text()
        assert not re.search(r"^\s*kind: (DaemonSet|Deployment)\s*$", text, re.M), helpers


@pytest.mark.parametrize(("kind", "component"), WORKLOADS, ids=[c for _, c in WORKLOADS])
def test_each_workload_is_written_in_its_own_file(kind: str, component: str) -> None:
    source = (TEMPLATES / WORKLOADS[kind, component]).read_text()
    assert re.search(rf"^kind: {kind}$", source, re.M)
    assert re.search(r"^      containers:$", source, re.M)


@pytest.mark.integration  # helm
def test_each_workload_renders_from_its_file_without_blank_lines() -> None:
    """From the file named for it, and without the whitespace-only lines `nindent` of an empty helper leaves."""
    by_source = _rendered(*ALL_ON, "--set", "placement.mode=none", "--set", "placement.excludeComputeTypes=null")
    for (kind, component), path in WORKLOADS.items():
        docs = [d for d in yaml_streams.load_all(by_source[path]) if d and d["kind"] == kind]
        assert [d["metadata"]["labels"]["app.kubernetes.io/component"] for d in docs] == [component], path
        blank = [n for n, line in enumerate(by_source[path].splitlines()) if line and not line.strip()]
        assert blank == [], f"{path}: whitespace-only lines {blank}"
