"""tools/aws_handover.py's plan, from the manifests of AWS's chart (the vendored 1.0.0 stand-in)
and of this chart, both rendered by the real helm. The handover itself runs on the real cluster in
tests/e2e/test_migration.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
HELM = REPO / ".venv" / "bin" / "helm"
AWS_CHART = REPO / "tests" / "e2e" / "aws-chart" / "neuron-helm-chart"
CHART = REPO / "charts" / "neuron-helm-chart"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aws_handover", REPO / "tools" / "aws_handover.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["aws_handover"] = module
    spec.loader.exec_module(module)
    return module


handover = load_tool()


def template(release: str, chart: Path, namespace: str, *args: str) -> str:
    return subprocess.run(
        [HELM, "template", release, chart, "-n", namespace, *args], capture_output=True, text=True, check=True
    ).stdout


def test_a_manifest_is_read_with_each_objects_namespace_and_without_hooks() -> None:
    text = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: b, namespace: ignored}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: c, namespace: kube-system}
spec: {selector: {matchLabels: {x: "1"}}}
---
apiVersion: v1
kind: Pod
metadata: {name: t, annotations: {helm.sh/hook: test}}
"""
    got = handover.parse_manifest(text, "default")
    Ref = handover.Ref
    assert got.refs == {
        Ref("ServiceAccount", "a", "default"),
        Ref("ClusterRole", "b", ""),
        Ref("DaemonSet", "c", "kube-system"),
    }
    assert got.selectors == {Ref("DaemonSet", "c", "kube-system"): {"x": "1"}}


def test_the_plan_orphans_awss_plugin_relabels_it_to_a_daemonset_of_the_same_name_and_adopts_shared_objects() -> None:
    Ref = handover.Ref
    old = handover.Rendered(
        refs={Ref("DaemonSet", "neuron-device-plugin", "kube-system"), Ref("ServiceAccount", "neuron-device-plugin", "kube-system"),
              Ref("ClusterRole", "neuron-device-plugin", ""), Ref("Deployment", "k8s-neuron-scheduler", "kube-system")},
        selectors={Ref("DaemonSet", "neuron-device-plugin", "kube-system"): {"name": "neuron-device-plugin-ds"}},
    )  # fmt: skip
    new = handover.Rendered(
        refs={Ref("DaemonSet", "neuron-device-plugin", "kube-system"), Ref("ServiceAccount", "neuron-device-plugin", "kube-system"),
              Ref("Deployment", "k8s-neuron-scheduler", "kube-system")},
        selectors={Ref("DaemonSet", "neuron-device-plugin", "kube-system"): {"app.kubernetes.io/component": "device-plugin"}},
    )  # fmt: skip
    p = handover.plan(old, new, same_release=False)
    ds = Ref("DaemonSet", "neuron-device-plugin", "kube-system")
    assert p.orphan == [ds]
    assert p.relabel == {ds: ({"name": "neuron-device-plugin-ds"}, {"app.kubernetes.io/component": "device-plugin"})}
    assert p.delete_now == [Ref("Deployment", "k8s-neuron-scheduler", "kube-system")]
    assert p.adopt == [Ref("ServiceAccount", "neuron-device-plugin", "kube-system")]
    assert p.delete_after == [Ref("ClusterRole", "neuron-device-plugin", "")]
    assert p.forget_old_release
    assert not handover.plan(old, new, same_release=True).forget_old_release


@pytest.mark.integration
def test_the_plan_for_awss_rendered_chart_and_this_ones() -> None:
    """What the handover would do to AWS's release as its install page makes it, moving to this
    chart's defaults: every AWS DaemonSet is orphaned (never deleted with its pods), and every
    object either is handed over or deleted after the upgrade; none is left behind."""
    old = handover.parse_manifest(
        template("neuron-helm-chart", AWS_CHART, "default", "--set", "npd.enabled=false"), "default"
    )
    new = handover.parse_manifest(template("neuron-helm-chart", CHART, "default"), "default")
    p = handover.plan(old, new, same_release=True)
    Ref = handover.Ref
    plugin = Ref("DaemonSet", "neuron-device-plugin", "kube-system")
    assert p.orphan == [plugin]
    # this chart names its plugin as AWS's does (objectNames: aws), so it adopts AWS's pods
    assert p.relabel[plugin][1] == new.selectors[plugin]
    assert p.relabel[plugin][1]["app.kubernetes.io/component"] == "device-plugin"
    assert Ref("ServiceAccount", "neuron-device-plugin", "kube-system") in p.adopt
    accounted = set(p.orphan) | set(p.delete_now) | set(p.adopt) | set(p.delete_after)
    assert accounted == old.refs
    lines = list(handover.describe(p, "neuron-helm-chart", "default"))
    assert lines[0] == "delete DaemonSet kube-system/neuron-device-plugin with --cascade=orphan (its pods keep serving)"
    assert lines[-len(p.delete_after) - 1] == "helm upgrade --install neuron-helm-chart -n default --wait"
