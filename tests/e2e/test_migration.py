"""The way over from AWS's chart (issue 31 item 3), on the real cluster: a release of AWS's
neuron-helm-chart installed as its install page does (release `neuron-helm-chart` in the current
namespace, `npd.enabled=false`), a pod holding two devices, then `tools/aws_handover.py` to this
chart under the same release name, and another time under a new one.

AWS's chart is not available at test time and its plugin image is closed source, so the old release
is a stand-in: AWS's chart 1.0.0 vendored unchanged in tests/e2e/aws-chart/ (Apache-2.0, from
aws-neuron/neuron-helm-charts @ 8172e5e) except its device plugin container, which runs this
project's plugin over the simulated node. Its objects keep AWS's names, namespaces, labels,
selectors and Helm ownership exactly as AWS's templates render them, which is what the handover
has to deal with.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml
from cluster_access import (
    REPO,
    SIM_ROOT,
    eventually,
    helm,
    kubectl,
    node,
    node_status_update_period,
    pod_phase,
    read,
    run,
    sim,
    workload_pod,
)

AWS_CHART = REPO / "tests" / "e2e" / "aws-chart" / "neuron-helm-chart"
CHART = REPO / "charts" / "neuron-helm-chart"
HANDOVER = REPO / "tools" / "aws_handover.py"
VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
PLUGIN_IMAGE = "localhost/neuron-helm-chart/device-plugin"
RELEASE = "neuron-helm-chart"  # the install page's
WORKLOADS = "neuron-migration-workloads"
AWS_POD_SELECTOR = "name=neuron-device-plugin-ds"  # AWS's DaemonSet selects its pods by this label
OURS_SELECTOR = "app.kubernetes.io/part-of=neuron-helm-chart,app.kubernetes.io/component=device-plugin"
HELD = "held-through-migration"


def one_node_status_period() -> float:
    """The longest gap between two of the kubelet's status writes: it waits its nodeStatusUpdateFrequency
    plus up to 4 % jitter after each write ends (`wait.JitterUntil(kl.syncNodeStatus,
    kl.nodeStatusUpdateFrequency, 0.04, true, ...)` in pkg/kubelet/kubelet.go), and the write itself and
    the sampler's own kubectl calls add under a second."""
    return node_status_update_period() * 1.04 + 1.0


SHOW_CORES = (
    "import os, time\nprint('cores=' + os.environ.get('NEURON_RT_VISIBLE_CORES', ''), flush=True)\ntime.sleep(3600)\n"
)
OUR_VALUES = (
    "--set",
    "simulation.enabled=true",
    "--set",
    f"simulation.hostRoot={SIM_ROOT}",
    "--set",
    "npd.enabled=false",
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def install_aws_release(namespace: str) -> None:
    helm(
        "upgrade", "--install", RELEASE, str(AWS_CHART), "-n", namespace, "--set", "npd.enabled=false",
        "--set", f"devicePlugin.image.repository={PLUGIN_IMAGE}", "--set", f"devicePlugin.image.tag={VERSION}",
        "--set", "devicePlugin.image.pullPolicy=Never", "--set", f"standIn.simRoot={SIM_ROOT}",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    wait_aws_plugin_registered()


def wait_aws_plugin_registered() -> None:
    """Until the kubelet has AWS's (stand-in) plugin registered: a pod bound before that would meet
    the kubelet's Allocate on a plugin not yet serving (UnexpectedAdmissionError), and the node's
    allocatable may still be the previous plugin's."""

    def registered() -> bool:
        pods = read("pods", namespace="kube-system", selector=AWS_POD_SELECTOR)["items"]
        ips = [p["status"].get("podIP") for p in pods if p["status"].get("phase") == "Running"]
        if len(ips) != 1 or not ips[0]:
            return False
        with urllib.request.urlopen(f"http://{ips[0]}:9841/readyz", timeout=3) as answer:
            return bool(answer.status == 200)

    eventually(registered, "AWS's plugin registered with the kubelet", 120)
    eventually(lambda: neuron_allocatable() == "16", "AWS's plugin advertising 16 devices", 120)


def neuron_allocatable() -> str | None:
    value: str | None = node()["status"].get("allocatable", {}).get("aws.amazon.com/neuron")
    return value


@dataclass
class AllocatableWatch:
    """Samples the node's allocatable devices in the background; `longest_gap` is the longest time the
    node advertised fewer than all 16 (the kubelet publishes a change with its next node status)."""

    samples: list[tuple[float, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> AllocatableWatch:
        def sample() -> None:
            while not self._stop.is_set():
                self.samples.append((time.monotonic(), neuron_allocatable()))
                self._stop.wait(0.25)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def longest_gap(self) -> float:
        longest, since = 0.0, None
        for at, value in self.samples:
            if value != "16":
                since = at if since is None else since
                longest = max(longest, at - since)
            else:
                since = None
        return longest


def held_pod() -> dict[str, object]:
    pod: dict[str, object] = read("pod", HELD, namespace=WORKLOADS)
    return pod


def start_held_pod() -> str:
    limits = {"limits": {"aws.amazon.com/neuron": 2}}
    kubectl("apply", "-f", "-", stdin=workload_pod(HELD, WORKLOADS, f"{PLUGIN_IMAGE}:{VERSION}", limits, SHOW_CORES))
    eventually(lambda: pod_phase(HELD, WORKLOADS) == "Running", "the pod holding 2 devices running", 120)
    eventually(lambda: bool(logged_cores()), "the pod printed its cores")
    return logged_cores()[0]


def logged_cores() -> list[str]:
    lines = kubectl("logs", "-n", WORKLOADS, HELD).splitlines()
    return [line.removeprefix("cores=") for line in lines if line.startswith("cores=")]


def restart_old_plugin() -> None:
    before = kubectl("get", "pods", "-n", "kube-system", "-l", AWS_POD_SELECTOR, "-o", "name").split()
    assert before, "no pod of AWS's device plugin"
    kubectl("delete", "-n", "kube-system", *before, "--wait=true", "--timeout=60s")
    wait_aws_plugin_registered()
    time.sleep(one_node_status_period())  # so a gap published with the next node status is counted too


def handover(from_namespace: str, release: str, namespace: str, *values: str) -> str:
    done = run(
        sys.executable, HANDOVER, "--from-release", RELEASE, "--from-namespace", from_namespace,
        "--release", release, "--namespace", namespace, "--", *OUR_VALUES, *values,
    )  # fmt: skip
    return done.stdout


def cleanup() -> None:
    for release, namespace in ((RELEASE, "default"), ("neuron", "neuron-system")):
        helm("uninstall", release, "-n", namespace, "--ignore-not-found", "--wait", check=False)
    for kind in ("ds", "sa"):
        kubectl("delete", kind, "-n", "kube-system", "neuron-device-plugin", "--ignore-not-found", check=False)
    kubectl("delete", "clusterrole,clusterrolebinding", "neuron-device-plugin", "--ignore-not-found", check=False)
    kubectl("delete", "pods", "-n", "kube-system", "-l", AWS_POD_SELECTOR, "--ignore-not-found", check=False)


@pytest.fixture
def aws_release() -> Iterator[str]:
    """AWS's release installed as its page does, in `default`, and a pod holding two devices; yields
    the cores that pod was given."""
    cleanup()
    sim("inject", "--root", SIM_ROOT, "reboot")
    kubectl("create", "namespace", WORKLOADS, check=False)
    install_aws_release("default")
    yield start_held_pod()
    kubectl("delete", "namespace", WORKLOADS, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
    cleanup()
    kubectl("delete", "namespace", "neuron-system", "--ignore-not-found", "--wait=false", check=False)


def check_after_handover(cores: str, uid: str, output: str, release: str, namespace: str) -> None:
    print(output)
    # Only this chart's release remains, at the name asked for.
    releases = json.loads(helm("list", "-A", "-o", "json").stdout)
    ours = [(r["name"], r["namespace"], r["chart"]) for r in releases if r["chart"].startswith("neuron-helm-chart")]
    assert ours == [(release, namespace, f"neuron-helm-chart-{VERSION}")], ours
    # No pod of AWS's plugin is left, and this chart's plugin serves the node.
    eventually(
        lambda: not kubectl("get", "pods", "-A", "-l", AWS_POD_SELECTOR, "-o", "name").strip(),
        "AWS's plugin pods gone",
        120,
    )
    ours_pods = read("pods", namespace=None, selector=OURS_SELECTOR)["items"]
    assert [p["status"]["phase"] for p in ours_pods] == ["Running"], [p["metadata"]["name"] for p in ours_pods]
    eventually(lambda: neuron_allocatable() == "16", "this chart's plugin advertising 16 devices", 120)
    # The pod that held two devices throughout is the same pod, never restarted, with the same cores.
    pod = held_pod()
    assert pod["metadata"]["uid"] == uid  # type: ignore[index]
    status = pod["status"]
    assert status["phase"] == "Running"  # type: ignore[index]
    assert status["containerStatuses"][0]["restartCount"] == 0  # type: ignore[index]
    assert logged_cores() == [cores]


@pytest.mark.parametrize(
    ("release", "namespace", "values"),
    [
        # AWS's names (the default): this chart's neuron-device-plugin adopts AWS's pods and rolls them
        (RELEASE, "default", ()),
        ("neuron", "neuron-system", ()),
        # release-scoped names: AWS's plugin pods serve until this chart's are ready, then go
        ("neuron", "neuron-system", ("--set", "objectNames=release")),
    ],
    ids=["same-release", "new-release-and-namespace", "release-scoped-names"],
)
def test_the_handover_from_awss_chart_keeps_a_running_pods_devices_and_the_node_advertised(
    aws_release: str, release: str, namespace: str, values: tuple[str, ...]
) -> None:
    uid = held_pod()["metadata"]["uid"]  # type: ignore[index]
    with AllocatableWatch() as restart:
        restart_old_plugin()
    with AllocatableWatch() as moving:
        output = handover("default", release, namespace, *values)
        eventually(lambda: neuron_allocatable() == "16", "the node advertising 16 devices after the handover", 120)
        time.sleep(one_node_status_period())  # as for the restart
    check_after_handover(aws_release, str(uid), output, release, namespace)
    # At most one plugin restart's worth of the node advertising fewer devices, measured against a
    # restart of AWS's own plugin pod in the same run (plus one node status period: a restart that
    # falls between two status writes shows no gap at all, one that straddles a write shows one period).
    print(f"longest gap: plugin restart {restart.longest_gap():.1f} s, handover {moving.longest_gap():.1f} s")
    assert moving.longest_gap() <= restart.longest_gap() + one_node_status_period()


def test_the_handover_refuses_a_release_that_is_not_awss() -> None:
    done = run(
        sys.executable, HANDOVER, "--from-release", "no-such-release", "--release", "x", check=False
    )  # fmt: skip
    assert done.returncode != 0
    assert "no release 'no-such-release' in namespace 'default'" in done.stderr
