"""The chart's NodeFeatureRule evaluated by the real node-feature-discovery worker (built from the
pinned Go module by tests/nfd/build-nfd.sh) over simulated nodes: a Neuron node of each family gets
the placement label from its simulated PCI functions, a node without Neuron devices does not.

The worker runs its `custom` label source with the rule's rules: the same matcher nfd-master applies
to a NodeFeatureRule (nodefeaturerule.Execute), without an API server. tests/e2e runs the real
nfd-master with the NodeFeatureRule object on the test cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml_streams
from nfd_tools import run_worker_offline

from neuron_model.instance_types import FAMILIES, INSTANCE_TYPES
from neuron_sim import node as sim

pytestmark = pytest.mark.integration  # starts external processes: make integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
HELM = str(REPO / ".venv" / "bin" / "helm")
NFD_LABEL = "feature.node.kubernetes.io/aws-neuron"
# The worker's own PCI labels for the classes below: proof of which functions it read.
PCI_LABELS = {"deviceClassWhitelist": ["0880", "03"], "deviceLabelFields": ["class", "vendor"]}
NEURON_CLASS_LABEL = "feature.node.kubernetes.io/pci-0880_1d0f.present"
AMAZON_VGA_LABEL = "feature.node.kubernetes.io/pci-0300_1d0f.present"
SMALLEST_OF_EACH_FAMILY = {f: next(it.name for it in INSTANCE_TYPES.values() if it.family.name == f) for f in FAMILIES}


def chart_rules(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [HELM, "template", "nfd-test", str(CHART), "-f", str(CHART / "ci" / "nfd-values.yaml"), *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (rule,) = [d for d in yaml_streams.load_all(out) if d and d["kind"] == "NodeFeatureRule"]
    return list(rule["spec"]["rules"])


def labels_of(root: Path, rules: list[dict[str, Any]], work: Path) -> dict[str, str]:
    return run_worker_offline(root, {"sources": {"custom": rules, "pci": PCI_LABELS}}, work)


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return chart_rules()


@pytest.mark.parametrize("instance_type", SMALLEST_OF_EACH_FAMILY.values(), ids=SMALLEST_OF_EACH_FAMILY)
def test_a_neuron_node_gets_the_label_from_its_pci_functions(
    tmp_path: Path, rules: list[dict[str, Any]], instance_type: str
) -> None:
    sim.create(tmp_path / "node", instance_type)
    labels = labels_of(tmp_path / "node", rules, tmp_path / "work")
    assert labels.get(NFD_LABEL) == "true", labels
    assert labels.get(NEURON_CLASS_LABEL) == "true", "the worker read the simulated Neuron functions"


def test_a_node_without_neuron_devices_gets_no_label(tmp_path: Path, rules: list[dict[str, Any]]) -> None:
    sim.create_non_neuron(tmp_path / "node")
    labels = labels_of(tmp_path / "node", rules, tmp_path / "work")
    # it read this node's functions (Amazon's VGA stub, vendor 1d0f like its NIC) and found no Neuron one
    assert labels.get(AMAZON_VGA_LABEL) == "true", labels
    assert NFD_LABEL not in labels
    assert NEURON_CLASS_LABEL not in labels


def test_the_rule_matches_only_the_device_ids_it_lists(tmp_path: Path) -> None:
    without_trn2 = chart_rules("--set-json", 'placement.nodeFeatureRule.deviceIds=["7064","7164","7264"]')
    for instance_type, labelled in (("trn2.3xlarge", False), ("trn1.2xlarge", True)):
        sim.create(tmp_path / instance_type, instance_type)
        labels = labels_of(tmp_path / instance_type, without_trn2, tmp_path / "work")
        assert (NFD_LABEL in labels) is labelled, instance_type


def test_the_worker_reads_its_working_directory_as_the_host(tmp_path: Path, rules: list[dict[str, Any]]) -> None:
    """Not this machine's /sys: from an empty directory it finds no PCI function at all."""
    (tmp_path / "empty").mkdir()
    labels = labels_of(tmp_path / "empty", rules, tmp_path / "work")
    assert not [k for k in labels if "/pci-" in k or k == NFD_LABEL], labels
