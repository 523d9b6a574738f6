"""The `helm test` checks (files/helm_test.py) say why a component never became ready in the kubelet's own words:
a stuck container's waiting reason and message (a pull error names the reference and the registry's answer); and
the checks one pod runs together each run to their end and are named in every line and verdict."""

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
        self.asked: list[tuple[str, str]] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.asked.append((namespace, label_selector))
        return SimpleNamespace(items=self.pods)


def test_a_pull_error_is_quoted_with_pod_and_container() -> None:
    api = FakeApi(pod("metrics-abc", container("node-metrics", "ErrImagePull", PULL_ERROR)))
    stuck = helm_test.stuck_containers(api, "ns", "component=node-metrics")
    assert api.asked == [("ns", "component=node-metrics")]  # the component's own namespace, not the test pod's
    assert stuck == f"pod metrics-abc container node-metrics: ErrImagePull: {PULL_ERROR}"
    reason = helm_test.with_stuck("GET http://10.88.0.5:9400/metrics failed: refused", api, "ns", "x")
    assert reason == f"GET http://10.88.0.5:9400/metrics failed: refused [{stuck}]"


def test_starting_and_running_containers_are_not_stuck() -> None:
    api = FakeApi(
        pod("a", container("main", "ContainerCreating")),
        pod("b", container("main", None), init=(container("init", "PodInitializing"),)),
    )
    assert helm_test.stuck_containers(api, "ns", "x") == ""
    assert helm_test.with_stuck("not yet", api, "ns", "x") == "not yet"


def test_a_passing_check_stays_passing_whatever_the_pods_say() -> None:
    api = FakeApi(pod("a", container("main", "CrashLoopBackOff", "back-off 10s")))
    assert helm_test.with_stuck(None, api, "ns", "x") is None
    assert "init: ImagePullBackOff" in helm_test.stuck_containers(
        FakeApi(pod("b", init=(container("init", "ImagePullBackOff", "Back-off pulling image"),))), "ns", "x"
    )


# --- one pod, several checks ------------------------------------------------------------------


def test_every_check_runs_to_its_end_and_each_failure_is_named(capsys: Any) -> None:
    """The checks of one pod run at the same time; one failing (or crashing) stops none of the others, each line
    carries its check's name, and the process fails naming every failed check."""
    import threading

    started = threading.Barrier(3, timeout=10)  # all three running at once, or this test times out

    def passes() -> None:
        started.wait()
        helm_test.log("ok: all there")

    def fails() -> None:
        started.wait()
        helm_test.fail("node n has no NeuronHealth condition")

    def crashes() -> None:
        started.wait()
        raise KeyError("NODE_METRICS_SELECTOR")

    assert helm_test.run_checks({"capacity": passes, "health": fails, "metrics": crashes}) == ["health", "metrics"]
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == [
        "[capacity] ok: all there",
        "[health] FAIL: node n has no NeuronHealth condition",
        "[metrics] FAIL: KeyError: 'NODE_METRICS_SELECTOR'",
    ]


def test_the_process_exits_0_only_when_every_named_check_passed(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setitem(helm_test.MODES, "capacity", lambda: helm_test.log("ok: fine"))
    monkeypatch.setitem(helm_test.MODES, "health", lambda: helm_test.fail("no condition"))
    assert helm_test.main(["helm_test.py", "capacity"]) == 0
    assert helm_test.main(["helm_test.py", "capacity", "health"]) == 1
    assert "FAIL: 1 of 2 checks failed: health" in capsys.readouterr().out
    # a wrong command line is the chart's mistake, told apart from a failed check
    for argv in (["helm_test.py"], ["helm_test.py", "capacity", "capacity"], ["helm_test.py", "nonsense"]):
        assert helm_test.main(argv) == 2
    assert "usage: helm_test.py CHECK..." in capsys.readouterr().err


def test_the_slices_check_counts_cores_as_devices_and_as_capacity_alike() -> None:
    """helm test's slices check counts a node's cores whichever form the driver published: cores as
    devices, or as the capacity of shareable devices (draDriver.coresAsCapacity), to which the driver
    falls back where the API server drops shareable devices; an older generation is not counted."""
    import sim_nodes
    from neuron_dra_driver import slices

    inv = sim_nodes.inventory("trn2.48xlarge", 1)
    for capacity in (False, True):
        built = slices.build(slices.NodeDevices("node-a", inv, cores_as_capacity=capacity), 2)
        stale = slices.build(slices.NodeDevices("node-a", inv, publish_cores=False), 1)
        assert helm_test.published_devices_and_cores(built + stale, "node-a") == (16, 128)
        assert helm_test.published_devices_and_cores(built, "node-b") == (0, 0)
