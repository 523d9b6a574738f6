"""AWS's install page for the Neuron device plugin (issue 31 item 1), run verbatim on the real cluster: its install
command, its `kubectl get ds neuron-device-plugin -n kube-system` and its two allocatable queries, with the chart's
default names (`objectNames: aws`: the plugin is `neuron-device-plugin` in kube-system wherever the release is).

The page (aws-neuron-sdk, "Deploy Neuron Device Plugin") installs `oci://public.ecr.aws/neuron/neuron-helm-chart`;
here the chart is this checkout's, and simulation mode (the simulated trn1.32xlarge) is the only thing added, as
in every other e2e test. No `-n`: the release goes to the kubeconfig's current namespace, as for a new user.
"""

from __future__ import annotations

import json
import re

import pytest
from cluster_access import NODE, SIM_ROOT, eventually, helm, helm_test_checks, helm_test_suites, kubectl, node, run

RELEASE = "neuron-helm-chart"
# The page's commands, character for character but the chart's location
INSTALL = 'helm upgrade --install neuron-helm-chart charts/neuron-helm-chart --set "npd.enabled=false"'
VERIFY = "kubectl get ds neuron-device-plugin -n kube-system"
CORES = 'kubectl get nodes "-o=custom-columns=NAME:.metadata.name,NeuronCore:.status.allocatable.aws\\.amazon\\.com/neuroncore"'
DEVICES = 'kubectl get nodes "-o=custom-columns=NAME:.metadata.name,NeuronDevice:.status.allocatable.aws\\.amazon\\.com/neuron"'
# What the test cluster needs besides: its node is simulated
SIMULATION = f" --set simulation.enabled=true --set simulation.hostRoot={SIM_ROOT}"
# The simulated node is a trn1.32xlarge, as the page's example nodes are
NEURONCORES, NEURON_DEVICES = "32", "16"
# Every kind a release of the chart can leave behind (test_e2e.py's list)
KINDS = ",".join([
    "all", "configmaps", "secrets", "serviceaccounts", "roles", "rolebindings", "clusterroles", "clusterrolebindings",
    "networkpolicies", "validatingadmissionpolicies", "validatingadmissionpolicybindings",
])  # fmt: skip

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def shell(command: str, check: bool = True) -> str:
    """A command line as a user types it (bash, in the checkout, with the cluster's kubeconfig)."""
    return run("bash", "-c", command, check=check).stdout


def current_namespace() -> str:
    return kubectl("config", "view", "--minify", "-o", "jsonpath={..namespace}").strip() or "default"


def allocatable() -> tuple[str | None, str | None]:
    a = node()["status"].get("allocatable", {})
    return a.get("aws.amazon.com/neuron"), a.get("aws.amazon.com/neuroncore")


def ds_row(output: str) -> dict[str, str]:
    """`kubectl get ds`'s table as header -> value (NODE SELECTOR is one column)."""
    header, *rows = output.splitlines()
    columns = re.split(r"\s{2,}", header.strip())
    assert columns[:7] == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR"], header
    (row,) = rows
    return dict(zip(columns, re.split(r"\s{2,}", row.strip()), strict=True))


def column(output: str, name: str) -> dict[str, str]:
    """A custom-columns table (NAME and one column) as node -> value."""
    header, *rows = output.splitlines()
    assert header.split() == ["NAME", name], header
    table: dict[str, str] = {}
    for row in rows:
        name, value = row.split()
        table[name] = value
    return table


@pytest.fixture(scope="module", autouse=True)
def no_other_release() -> None:
    """Nothing left of an earlier run, and no other release of the chart: two device plugins on one node would
    take the kubelet's registration from each other."""
    helm("uninstall", RELEASE, "-n", current_namespace(), "--ignore-not-found", "--wait", "--timeout", "300s")
    releases = json.loads(helm("list", "-A", "-o", "json").stdout)
    others = [f"{r['name']} ({r['namespace']})" for r in releases if r["chart"].startswith("neuron-helm-chart-")]
    assert not others, f"another release of the chart is installed: {others}"


def test_the_install_pages_commands_hold_verbatim() -> None:
    installed = shell(INSTALL + SIMULATION)
    assert "kube-system/neuron-device-plugin" in installed, f"NOTES name where the plugin is:\n{installed}"

    def ready() -> bool:
        result = run("bash", "-c", VERIFY, check=False)
        if result.returncode != 0:
            return False
        row = ds_row(result.stdout)
        counts = {row[c] for c in ("DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE")}
        return row["NAME"] == "neuron-device-plugin" and len(counts) == 1 and counts != {"0"}

    eventually(ready, f"`{VERIFY}` shows the plugin ready", 180)
    assert ds_row(shell(VERIFY))["NODE SELECTOR"] == "<none>", "as on the page: placement is a node affinity"

    eventually(lambda: allocatable() == (NEURON_DEVICES, NEURONCORES), "the node's Neuron resources advertised")
    assert column(shell(CORES), "NeuronCore")[NODE] == NEURONCORES
    assert column(shell(DEVICES), "NeuronDevice")[NODE] == NEURON_DEVICES

    # the release's own checks find the plugin in kube-system (and the exporter in the release namespace)
    tested = helm("test", RELEASE, "-n", current_namespace(), "--logs", "--timeout", "300s")
    assert helm_test_suites(tested.stdout) == {"components": "Succeeded", "allocation": "Succeeded"}, tested.stdout
    # no health check: npd.enabled=false
    assert helm_test_checks(tested.stdout) == dict.fromkeys(
        ("capacity", "metrics", "monitoring", "allocation"), True
    ), tested.stdout


def test_uninstall_leaves_nothing_in_kube_system_or_anywhere() -> None:
    helm("uninstall", RELEASE, "-n", current_namespace(), "--wait", "--timeout", "300s")
    eventually(
        lambda: kubectl("get", KINDS, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name").strip() == "",
        "every object of the release gone, in kube-system and the release namespace",
        timeout=90,
    )
    gone = run("bash", "-c", VERIFY, check=False)
    assert gone.returncode != 0
    assert 'daemonsets.apps "neuron-device-plugin" not found' in gone.stderr, gone.stderr
    eventually(lambda: allocatable() in (("0", "0"), (None, None)), "no Neuron resource advertised")
