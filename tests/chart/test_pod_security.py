"""The Pod Security table of docs/security.md is true (issue 24 item 4): every pod the chart renders, on a
real node and in simulation mode, is created (server-side dry run) in namespaces enforcing each Pod
Security Standards level on a real kube-apiserver; the strictest level that admits a component's
pods is the one the table gives. A component the table leaves out, or a level it overstates or
understates, fails."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from chart.test_chart import REPO, render
from chart_tools import sets
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import Api, ApiError

pytestmark = pytest.mark.integration  # starts external processes: make integration

LEVELS = ("restricted", "baseline", "privileged")  # strictest first
PAGE = REPO / "docs" / "security.md"
# The table's rows name components as people do; the pods carry app.kubernetes.io/component.
COMPONENTS = {
    "device plugin": "device-plugin",
    "node metrics": "node-metrics",
    "problem detector": "problem-detector",
    "DRA driver": "dra-driver",
    "scheduler extender": "scheduler-extender",
    "neuron-scheduler": "kube-scheduler",
    "remediation controller": "remediation-controller",
    "helm test pods": "tests",
}
EVERYTHING = sets(
    draDriver__enabled=True,
    devicePlugin__nodeSelector={"allocator": "device-plugin"},
    draDriver__nodeSelector={"allocator": "dra"},
    scheduler__enabled=True,
    remediation__enabled=True,
    tests__enabled=True,
)


def documented_levels() -> dict[str, str]:
    text = PAGE.read_text()
    section = text[text.index("**Pod Security Standards.**") :]
    table = section[: section.index("\n\n", section.index("| Component |"))]
    rows = re.findall(r"^\| ([^|]+?) \| `(\w+)` \|", table, re.MULTILINE)
    return {COMPONENTS[name]: level for name, level in rows}


def pods(*args: str) -> dict[str, list[dict[str, Any]]]:
    """Every pod the chart renders, by component, as the API server would receive them."""
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in render(*args):
        component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        if doc["kind"] in ("DaemonSet", "Deployment"):
            template = doc["spec"]["template"]
            spec, name = template["spec"], doc["metadata"]["name"]
        elif doc["kind"] == "Pod":
            spec, name = doc["spec"], doc["metadata"]["name"]
        else:
            continue
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name[:63]}, "spec": spec}
        found.setdefault(component, []).append(pod)
    return found


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    # privileged containers allowed, as on every real cluster's API server (kubeadm's, EKS's)
    with private_control_plane("pod-security-cp-", apiserver_args=["--allow-privileged=true"]) as cp:
        yield cp


async def strictest_admitting(cp: ControlPlane, rendered: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        for level in LEVELS:
            labels = {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/enforce-version": "latest",
            }
            namespace = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": f"pss-{level}", "labels": labels},
            }
            accounts = {p["spec"].get("serviceAccountName", "default") for ps in rendered.values() for p in ps}
            for path, body in [("/api/v1/namespaces", namespace)] + [
                (f"/api/v1/namespaces/pss-{level}/serviceaccounts", {"metadata": {"name": name}})
                for name in accounts | {"default"}  # no controller manager here makes "default"
            ]:
                try:
                    await admin.create(path, body)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
        result: dict[str, str] = {}
        for component, component_pods in rendered.items():
            for level in LEVELS:
                refusals = []
                for pod in component_pods:
                    try:
                        await admin.request(
                            "POST", f"/api/v1/namespaces/pss-{level}/pods", params={"dryRun": "All"}, body=pod
                        )
                    except ApiError as exc:
                        if "violates PodSecurity" not in exc.message:  # anything else is a pod the test got wrong
                            raise
                        refusals.append(exc.message)
                if not refusals:
                    result[component] = level
                    break
            else:
                result[component] = "none"
        return result
    finally:
        await admin.close()


@pytest.mark.parametrize("mode", ["real nodes", "simulation"])
def test_every_component_meets_exactly_the_documented_level(apiserver: ControlPlane, mode: str) -> None:
    args = [*EVERYTHING, *(sets(simulation__enabled=True) if mode == "simulation" else [])]
    rendered = pods(*args)
    expected = documented_levels()
    assert set(rendered) == set(expected), "docs/security.md's table and the rendered components differ"
    assert asyncio.run(strictest_admitting(apiserver, rendered)) == expected


def test_the_check_can_fail(apiserver: ControlPlane) -> None:
    """A hostPath in the extender's pod is refused under restricted and baseline: the dry run judges."""
    rendered = pods(*EVERYTHING)
    (extender,) = rendered["scheduler-extender"]
    extender["spec"]["volumes"] = [*extender["spec"].get("volumes", []), {"name": "h", "hostPath": {"path": "/etc"}}]
    levels = asyncio.run(strictest_admitting(apiserver, {"scheduler-extender": [extender]}))
    assert levels == {"scheduler-extender": "privileged"}
