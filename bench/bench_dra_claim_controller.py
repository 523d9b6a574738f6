"""How fast kube-controller-manager's ResourceClaim controller sets pods up (issue 58 item 5).

A pod whose claim comes from a ResourceClaimTemplate (every example of docs/dra.md, AWS's published
templates) is not scheduled until kube-controller-manager's ResourceClaim controller has created
its claim and written the claim's name into the pod's status: two writes per pod, made with the
controller manager's own client, whose rate limit (`--kube-api-qps` 20, `--kube-api-burst` 30 by
default) it shares with every other controller. So however fast the scheduler is, pods with claim
templates start no faster than that. Measured here with the real kube-controller-manager and
kube-apiserver of the pinned release (only the ResourceClaim controller running, nothing else
writing): a burst of pods with one claim template each, created as fast as this process can, and
the time until every one's claim is set up; with the defaults, then with the client rate raised.
The floor beside them is the pod creation itself: the controller cannot set pods up faster than
they arrive.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import BenchError, Figure, scaled, until_async  # noqa: E402
from simcluster.api import Api  # noqa: E402
from simcluster.controlplane import ControlPlane, control_plane, k8s_version, start_controller_manager  # noqa: E402

TITLE = f"kube-controller-manager's ResourceClaim controller, pods with a claim template, Kubernetes {k8s_version()}"
PODS = scaled(1000, 20)
CREATORS = 16  # concurrent pod creations: the same as the scheduling harness's
TEMPLATE = "one-device"
# (name, kube-controller-manager flags): its defaults, then the client rate raised tenfold
SETTINGS = [
    ("defaults (--kube-api-qps 20, --kube-api-burst 30)", []),
    ("--kube-api-qps 200 --kube-api-burst 300", ["--kube-api-qps=200", "--kube-api-burst=300"]),
]


def claim_template(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": namespace},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "device", "exactly": {"deviceClassName": "neuron.aws.com"}}]}}
        },
    }


def pod(name: str, namespace: str) -> dict[str, Any]:
    """A pod no scheduler takes (its schedulerName has none): only the claim controller acts on it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": "no-scheduler",
            "resourceClaims": [{"name": "device", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "device"}]}}],
        },
    }


async def one_setting(api: Api, cp: ControlPlane, index: int, flags: list[str]) -> tuple[float, float]:
    """(pods created a second, pods set up a second) for one burst in a namespace of its own."""
    namespace = f"claims-{index}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    await api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}})
    await api.create(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", claim_template(namespace)
    )
    name = f"kube-controller-manager-{index}"
    await start_controller_manager(cp, ["resourceclaim-controller"], name=name, flags=flags)
    names = [f"pod-{i:05d}" for i in range(PODS)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in names:
        queue.put_nowait(n)

    async def creator() -> None:
        while not queue.empty():
            await api.create(f"/api/v1/namespaces/{namespace}/pods", pod(queue.get_nowait(), namespace))

    began = time.monotonic()
    await asyncio.gather(*(creator() for _ in range(CREATORS)))
    created = time.monotonic() - began

    async def all_set_up() -> bool:
        items, _ = await api.list(f"/api/v1/namespaces/{namespace}/pods")
        return len(items) == PODS and all(
            any(s.get("resourceClaimName") for s in p.get("status", {}).get("resourceClaimStatuses") or ())
            for p in items
        )

    await until_async(all_set_up, f"every pod's claim set up by {name}", timeout=600, interval=0.1)
    set_up = time.monotonic() - began
    claims, _ = await api.list(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")
    if len(claims) != PODS:
        raise BenchError(f"{len(claims)} claims for {PODS} pods in {namespace}")
    cp.processes.stop(name)
    return PODS / created, PODS / set_up


async def measure(work: Path) -> list[Figure]:
    figures: list[Figure] = []
    with control_plane(work) as cp:
        async with Api(cp, connections=CREATORS + 4) as api:
            for index, (label, flags) in enumerate(SETTINGS):
                created, set_up = await one_setting(api, cp, index, flags)
                if index == 0:
                    figures.append(
                        Figure(f"pods created ({CREATORS} at a time): the floor", created, "pods/s", None, True)
                    )
                figures.append(Figure(f"pods set up, {label}", set_up, "pods/s", None, True))
    return figures


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="claims-") as work:
        return asyncio.run(measure(Path(work)))
