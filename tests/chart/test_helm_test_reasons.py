"""The `helm test` checks (files/helm_test.py) say why a component never became ready in the kubelet's own words:
a stuck container's waiting reason and message (a pull error names the reference and the registry's answer)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def load_helm_test() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_test", REPO / "charts/neuron-helm-chart/files/helm_test.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helm_test = load_helm_test()
PULL_ERROR = (
    'failed to pull and unpack image "127.0.0.1:5000/neuron/node-metrics:1.0.0@sha256:00": failed to resolve '
    'reference "127.0.0.1:5000/neuron/node-metrics:1.0.0@sha256:00": not found'
)


def container(name: str, reason: str | None, message: str | None = None) -> SimpleNamespace:
    waiting = SimpleNamespace(reason=reason, message=message) if reason else None
    return SimpleNamespace(name=name, state=SimpleNamespace(waiting=waiting))


def pod(name: str, *containers: SimpleNamespace, init: tuple[SimpleNamespace, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name),
        spec=SimpleNamespace(node_name="node-1"),
        status=SimpleNamespace(container_statuses=list(containers), init_container_statuses=list(init) or None),
    )


class FakeApi:
    def __init__(self, *pods: SimpleNamespace) -> None:
        self.pods = list(pods)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        return SimpleNamespace(items=self.pods)


def test_a_pull_error_is_quoted_with_pod_and_container() -> None:
    api = FakeApi(pod("metrics-abc", container("node-metrics", "ErrImagePull", PULL_ERROR)))
    stuck = helm_test.stuck_containers(api, "component=node-metrics")
    assert stuck == f"pod metrics-abc container node-metrics: ErrImagePull: {PULL_ERROR}"
    reason = helm_test.with_stuck("GET http://10.88.0.5:9400/metrics failed: refused", api, "x")
    assert reason == f"GET http://10.88.0.5:9400/metrics failed: refused [{stuck}]"


def test_starting_and_running_containers_are_not_stuck() -> None:
    api = FakeApi(
        pod("a", container("main", "ContainerCreating")),
        pod("b", container("main", None), init=(container("init", "PodInitializing"),)),
    )
    assert helm_test.stuck_containers(api, "x") == ""
    assert helm_test.with_stuck("not yet", api, "x") == "not yet"


def test_a_passing_check_stays_passing_whatever_the_pods_say() -> None:
    api = FakeApi(pod("a", container("main", "CrashLoopBackOff", "back-off 10s")))
    assert helm_test.with_stuck(None, api, "x") is None
    assert "init: ImagePullBackOff" in helm_test.stuck_containers(
        FakeApi(pod("b", init=(container("init", "ImagePullBackOff", "Back-off pulling image"),))), "x"
    )
